"""`plan` predicts `reconcile`: both run the reconciler's one step (reconciler.step).

For random commit sequences in a real git repository (jobs added, edited, withdrawn,
broken; quotas and priorities changed; the solver switched between greedy and HiGHS),
the events `plan` computes for each new commit, planned against the log before it is
reconciled, are exactly the events `reconcile` then appends: ids, types, actors,
causes and payloads, all but the solve's measured wall time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gitsched.engine.placement.solvers import solve_changed
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from tests.support.cluster_repo import (
    CLUSTER_YAML,
    POLICY_YAML,
    POOL_YAML,
    ClusterRepo,
    job_yaml,
    queue_yaml,
)
from tests.support.plan import payload, predicted

QUEUES = ("ml", "cv")
NAMES = ("a", "b", "c", "d", "e", "f")
BROKEN = "teams/ml/jobs/broken.yaml"

Event = tuple[str, str, str, str, str]  # id, type, actor, cause, payload


def policy(solver: str) -> str:
    return POLICY_YAML.replace("name: greedy", f"name: {solver}")


def queue(name: str, nominal: int) -> str:
    return queue_yaml(name, nominal, extra="  cohort: research\n")


jobs = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from(NAMES),
    st.integers(1, 3),  # replicas
    st.sampled_from((1, 2, 4, 8)),  # GPUs a replica
    st.sampled_from((None, "low", "normal", "high")),
    st.sampled_from((None, "nvlink")),
).map(lambda t: ("put", *t))
operations = st.one_of(
    jobs,
    jobs,  # twice as likely: a commit that only adds or edits jobs may be solved incrementally
    st.tuples(st.just("drop"), st.integers(0, 20)),
    st.tuples(st.just("quota"), st.sampled_from(QUEUES), st.sampled_from((0, 8, 16, 24, 32))),
    st.tuples(st.just("solver"), st.sampled_from(("greedy", "highs"))),
    st.tuples(st.just("broken")),
)


def apply(repo: ClusterRepo, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "put":
        _, q, name, replicas, gpu, priority, topology = op
        repo.write(
            f"teams/{q}/jobs/{name}.yaml",
            job_yaml(name, replicas=replicas, gpu=gpu, priority=priority, topology=topology),
        )
    elif kind == "drop":
        present = sorted(p for p in repo.path.glob("teams/*/jobs/*.yaml"))
        if present:
            present[op[1] % len(present)].unlink()
    elif kind == "quota":
        repo.write(f"teams/{op[1]}/queue.yaml", queue(op[1], op[2]))
    elif kind == "solver":
        repo.write("policies/default.yaml", policy(op[1]))
    else:  # a job the schema refuses: the reconciler rejects the commit
        repo.write(BROKEN, job_yaml("broken").replace("replicas: 1", "replicas: 0"))


def check_plan_predicts_reconcile(
    root: Path,
    solver: str,
    initial: list[tuple[Any, ...]],
    commits: list[list[tuple[Any, ...]]],
) -> list[bool]:
    """Whether reconcile applied each commit, once plan predicted its events exactly."""
    outcomes: list[bool] = []
    repo = ClusterRepo(root)
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": policy(solver),
            **{f"teams/{q}/queue.yaml": queue(q, 16) for q in QUEUES},
        }
    )
    for op in initial:
        apply(repo, op)
    repo.commit("Bootstrap")
    with SQLiteEventLog(repo.log_path) as event_log:
        # One watching reconciler, snapshotting often: plan reads the log from the
        # newest snapshot, as a reconciler that restarts would.
        reconciler = Reconciler(GitRepo(repo.path), event_log, snapshot_every=7)
        reconciler.run_once()
        for i, ops in enumerate(commits):
            if (repo.path / BROKEN).exists():
                (repo.path / BROKEN).unlink()  # the next commit fixes what the last broke
            for op in ops:
                apply(repo, op)
            sha = repo.commit(f"change {i}", allow_empty=True)

            plan = plan_change(GitRepo(repo.path), event_log, None, sha)
            seq = event_log.last_seq()
            report = reconciler.run_once()

            appended = [
                (s.id, s.type, s.actor, s.cause, payload(s.type, s.data))
                for s in event_log.read(seq)
            ]
            assert appended, "every commit appends at least its CommitApplied or CommitRejected"
            assert predicted(plan.groups) == appended, f"commit {i}: {ops}"
            # no approvals are asked for here: a commit is rejected iff its files are invalid
            assert plan.valid == report.commits[-1].applied
            outcomes.append(report.commits[-1].applied)
    return outcomes


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    solver=st.sampled_from(("greedy", "highs")),
    initial=st.lists(jobs, min_size=3, max_size=10),
    commits=st.lists(st.lists(operations, min_size=1, max_size=3), min_size=1, max_size=4),
)
def test_plan_predicts_the_events_reconcile_appends(
    solver: str, initial: list[tuple[Any, ...]], commits: list[list[tuple[Any, ...]]]
) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="gitsched-plan-vs-reconcile-") as scratch,
        _counting_incremental_solves() as incremental,
    ):
        outcomes = check_plan_predicts_reconcile(
            Path(scratch) / "cluster", solver, initial, commits
        )
    event("some commit rejected" if not all(outcomes) else "every commit applied")
    event(f"incremental solves: {'some' if incremental.call_count else 'none'}")


# The Policy's solver block is `{name: <this>}`: the last cases solve level by level, with
# every engine.
@pytest.mark.parametrize(
    "solver",
    [
        "highs",
        "cpsat",
        "highs, levels: sequential",
        "cbc, levels: sequential",
        "cpsat, levels: sequential",
    ],
)
def test_plan_predicts_an_incremental_solve_and_a_withdrawal(tmp_path: Path, solver: str) -> None:
    """The incremental path (one job of eight added) and a full re-solve after a withdrawal,
    each planned first: the step the prediction runs is the one reconcile runs, with HiGHS
    and with CP-SAT (whose deterministic-time stop must give reconcile the planned plan)."""
    initial = [("put", QUEUES[i % 2], NAMES[i % 6] + str(i), 1, 2, None, None) for i in range(8)]
    with _counting_incremental_solves() as incremental:
        check_plan_predicts_reconcile(
            tmp_path / "cluster",
            solver,
            initial,
            [
                [("put", "ml", "late", 1, 4, "high", None)],
                [("drop", 0)],
                [("quota", "cv", 8)],
            ],
        )
    # plan and reconcile each solved the added job incrementally
    assert incremental.call_count == 2


def _counting_incremental_solves() -> Any:
    spy: Callable[..., Any] = solve_changed
    return mock.patch("gitsched.reconciler.step.solve_changed", wraps=spy)
