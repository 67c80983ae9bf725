"""Fair share over time: usage from the log's history, decayed, steers contended GPUs."""

from __future__ import annotations

import math

import pytest

from gitsched.engine import events as ev
from gitsched.engine.core import (
    ApplyCommit,
    ApplyPlan,
    DesiredState,
    decide,
    fair_usage,
    placement_instance,
)
from gitsched.engine.fairshare import QueueUsage, advance, decay_window_s, fair_share_rows, runs
from gitsched.engine.model import CommitInfo, Job, Policy
from gitsched.engine.placement.objective import instance_fair_targets, usage_weights
from gitsched.engine.placement.solvers import solve
from gitsched.engine.state import ClusterState, fold
from tests.support.factories import CLUSTER, job, node, queue

POLICY = Policy(solver="highs", fairness_weight=1.0, usage_half_life_hours=24.0, gap_tolerance=0.0)
DAY = "2026-11-20"


def commit(n: int, at: str) -> CommitInfo:
    return CommitInfo(f"{n:040x}", "Ana", "ana@example.com", at, f"commit {n}")


def desired(*jobs: Job) -> DesiredState:
    return DesiredState(
        cluster=CLUSTER,
        policy=POLICY,
        nodes={"n1": node("n1")},
        queues={q.name: q for q in (queue("a", cohort="lab"), queue("b", cohort="lab"))},
        jobs={j.key: j for j in jobs},
    )


def step(state: ClusterState, n: int, at: str, *jobs: Job) -> ClusterState:
    """A commit at `at` declaring `jobs`, and the solve the reconciler runs after it."""
    state = fold(decide(state, ApplyCommit(commit(n, at), desired(*jobs))), state)
    plan = solve(placement_instance(state, at))
    return fold(decide(state, ApplyPlan(plan, solve_id=f"{n}/solve", at=at)), state)


def a_ran_a_day() -> ClusterState:
    """Team a kept the whole node busy for a day; team b ran nothing."""
    big = job("big", queue="a", gpu=8)
    state = step(ClusterState(), 1, f"{DAY}T10:00:00+00:00", big)
    assert "a/big" in state.placements
    return fold([ev.JobFinished("a/big", at=f"{DAY}T23:59:00+00:00")], state)


def contention(state: ClusterState, at: str) -> set[str]:
    """a and b each ask for the whole node at `at`: whose job runs."""
    later = [job("next", queue="a", gpu=8), job("next", queue="b", gpu=8)]
    state = step(state, 2, at, *later)
    return set(state.placements)


def split(state: ClusterState, at: str) -> dict[str, int]:
    """a and b each ask for eight one-GPU jobs on the one 8-GPU node at `at`: GPUs per team."""
    later = [job(f"j{i}", queue=q, gpu=1) for q in ("a", "b") for i in range(8)]
    state = step(state, 2, at, *later)
    running = [key.split("/")[0] for key in state.placements]
    return {q: running.count(q) for q in ("a", "b")}


def test_the_team_that_used_less_lately_wins_the_next_contention() -> None:
    at = "2026-11-21T00:00:00+00:00"
    # Without history the two teams tie and the first queue by name wins ...
    assert contention(ClusterState(), at) == {"a/next"}
    # ... after a day of a's work, b's job wins.
    assert contention(a_ran_a_day(), at) == {"b/next"}


def test_after_several_half_lives_the_history_evens_out() -> None:
    state = a_ran_a_day()
    soon = fair_usage(state, "2026-11-21T00:00:00+00:00")
    later = fair_usage(state, "2026-12-01T00:00:00+00:00")  # ten half-lives on
    assert soon["a"] > 0.3 and "b" not in soon
    assert later["a"] == pytest.approx(soon["a"] / 2**10, rel=1e-6)
    queues = [queue("a"), queue("b")]
    weights = usage_weights(queues, later)
    assert weights["a"] == pytest.approx(weights["b"], rel=0.01)
    assert split(state, "2026-11-21T00:00:00+00:00") == {"a": 3, "b": 5}
    assert split(state, "2026-12-01T00:00:00+00:00") == {"a": 4, "b": 4}
    assert split(ClusterState(), "2026-11-21T00:00:00+00:00") == {"a": 4, "b": 4}


def test_usage_counts_gpu_seconds_with_decay_from_event_times_only() -> None:
    state = a_ran_a_day()
    # 8 GPUs from 10:00 to 23:59, each second decayed from when it was used, to 23:59.
    hours = 13 + 59 / 60
    half_life_s = 24 * 3600.0
    used = 8 * decay_window_s(24.0) * (1 - 2 ** (-hours * 3600 / half_life_s))
    assert state.usage["a"].gpu_seconds == pytest.approx(used, rel=1e-9)
    assert state.usage["a"].running_gpu_milli == 0
    # Replaying the same events gives the same usage, whenever it is replayed.
    assert fold_again(state) == state.usage


def fold_again(state: ClusterState) -> object:
    big = job("big", queue="a", gpu=8)
    again = step(ClusterState(), 1, f"{DAY}T10:00:00+00:00", big)
    return fold([ev.JobFinished("a/big", at=f"{DAY}T23:59:00+00:00")], again).usage


def test_a_stop_without_a_time_of_its_own_ends_at_the_last_time_the_log_told() -> None:
    big = job("big", queue="a", gpu=8)
    state = step(ClusterState(), 1, f"{DAY}T10:00:00+00:00", big)
    state = fold([ev.JobFinished("a/big")], state)  # a v1 event: no `at`
    assert state.usage["a"].gpu_seconds == 0.0 and state.usage["a"].running_gpu_milli == 0


def test_advance_and_runs_compose() -> None:
    u = runs(QueueUsage(), 2000, 1000.0, 1.0)
    one_hour = advance(u, 1000.0 + 3600.0, 1.0)
    # Two GPUs for one half-life: 2 * H/ln2 * (1 - 1/2) GPU-seconds.
    assert one_hour.gpu_seconds == pytest.approx(2 * 3600 / math.log(2) / 2)
    stopped = runs(one_hour, -2000, 1000.0 + 3600.0, 1.0)
    assert advance(stopped, 1000.0 + 7200.0, 1.0).gpu_seconds == pytest.approx(
        one_hour.gpu_seconds / 2
    )


def test_usage_lowers_the_fair_share_target_of_the_team_that_used_more() -> None:
    state = a_ran_a_day()
    later = [job("next", queue="a", gpu=8), job("next", queue="b", gpu=8)]
    state = fold(
        decide(state, ApplyCommit(commit(2, "2026-11-21T00:00:00+00:00"), desired(*later))), state
    )
    targets = instance_fair_targets(placement_instance(state, "2026-11-21T00:00:00+00:00"))
    assert targets["b"].share > 0.5 > targets["a"].share


def test_fair_share_rows_per_queue_and_cohort() -> None:
    state = a_ran_a_day()
    usage = {"a": state.usage["a"].gpu_seconds}
    rows, cohorts = fair_share_rows(dict(state.queues), usage, 8, 24.0)
    assert [(r.name, r.share) for r in rows] == [("a", 0.5), ("b", 0.5)]
    assert rows[0].usage_gpu_hours == pytest.approx(usage["a"] / 3600)
    assert rows[1].usage_share == 0.0
    assert [(c.name, c.share) for c in cohorts] == [("lab", 1.0)]
    assert cohorts[0].usage_share == pytest.approx(rows[0].usage_share)
