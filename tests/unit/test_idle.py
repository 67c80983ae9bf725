"""Idle GPU reclamation, from recorded telemetry: a DCGM exporter scrape, a scrape series
and the NVML node agent's samples (tests/unit/telemetry/)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gitsched.engine import events as ev
from gitsched.engine.core import (
    ApplyCommit,
    ApplyPlan,
    ApplyTelemetry,
    DesiredState,
    decide,
    placement_instance,
)
from gitsched.engine.model import CommitInfo, IdleAction, IdlePolicy, Policy, ReplicaPlacement
from gitsched.engine.placement.plan import OutcomeStatus
from gitsched.engine.placement.solvers import solve
from gitsched.engine.state import ClusterState, fold
from gitsched.reconciler.telemetry import aggregate, parse_dcgm, parse_nvml_record, sample_nvml
from tests.support.factories import CLUSTER, job, node, queue

DATA = Path(__file__).parent / "telemetry"
SCRAPE_AT = 1795251600.0  # 2026-11-21T09:00:00Z, when the single scrape was taken
IDLE = IdlePolicy(enabled=True, threshold_percent=5.0, window_minutes=60.0, grace_minutes=30.0)


def policy(**idle: object) -> Policy:
    return Policy(solver="highs", fairness_weight=1.0, idle=dataclasses.replace(IDLE, **idle))


def cluster(p: Policy, placed_at: str = "2026-11-21T08:30:00+00:00") -> ClusterState:
    """n1: q/stuck on GPUs 0-3 (it does nothing), q/busy on 4-7; n2: q/train; q/wait waits."""
    jobs = [job("stuck", gpu=4), job("busy", gpu=4), job("train", gpu=8), job("wait", gpu=4)]
    commit = CommitInfo("a" * 40, "Ana", "ana@example.com", placed_at, "jobs")
    desired = DesiredState(
        cluster=CLUSTER,
        policy=p,
        nodes={n: node(n) for n in ("n1", "n2")},
        queues={"q": queue("q")},
        jobs={j.key: j for j in jobs},
    )
    state = fold(decide(ClusterState(), ApplyCommit(commit, desired)), ClusterState())

    def placed(key: str, n: str, gpus: tuple[int, ...]) -> ev.PlacementDecided:
        replicas = (ReplicaPlacement(n, gpus, 1000),)
        return ev.PlacementDecided(key, "h100", replicas, "admitted", "", "s1", placed_at)

    return fold(
        [
            placed("q/stuck", "n1", (0, 1, 2, 3)),
            placed("q/busy", "n1", (4, 5, 6, 7)),
            placed("q/train", "n2", tuple(range(8))),
            ev.JobPending("q/wait", "no GPUs free", "capacity", "s1"),
            ev.SolveCompleted("s1", "highs", "optimal", 0.0, 0.0, 0.0, 0.0, 0, 0, 3, 0, 0, 0, 1),
        ],
        state,
    )


def series() -> tuple[ev.GpuUtilizationReported, ...]:
    samples, problems = parse_dcgm((DATA / "dcgm_series.prom").read_text())
    assert problems == []
    return aggregate(samples, 300.0)


def test_a_dcgm_exporter_scrape_gives_one_sample_per_gpu_and_ignores_other_metrics() -> None:
    samples, problems = parse_dcgm((DATA / "dcgm_scrape.prom").read_text(), SCRAPE_AT)
    assert problems == []
    assert len(samples) == 16
    assert {(s.node, s.gpu) for s in samples} == {(n, g) for n in ("n1", "n2") for g in range(8)}
    assert all(s.at == SCRAPE_AT and s.source == "dcgm" for s in samples)
    assert max(s.percent for s in samples if s.node == "n1" and s.gpu < 4) <= 2
    assert min(s.percent for s in samples if s.node == "n2") >= 82


def test_samples_without_a_time_or_a_node_are_reported_not_guessed() -> None:
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 3\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1"} 3 1795251600000\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="x",Hostname="n1"} 3 1795251600000\n'
    )
    samples, problems = parse_dcgm(text)
    assert samples == []
    assert problems == [
        "line 1: no time",
        "line 2: no node label",
        "line 3: no GPU index or a value that is not a number",
    ]


def test_a_series_is_aggregated_per_node_and_window_not_per_sample() -> None:
    reports = series()
    # 19 scrapes five minutes apart, 2 nodes: one report per node and window.
    assert len(reports) == 38
    first = reports[0]
    assert (first.node, first.start, first.end) == (
        "n1",
        "2026-11-21T09:00:00.000000Z",
        "2026-11-21T09:00:00.000000Z",
    )
    assert [g.index for g in first.gpus] == list(range(8))
    assert all(g.samples == 1 for g in first.gpus)
    wide = aggregate(parse_dcgm((DATA / "dcgm_series.prom").read_text())[0], 3600.0)
    assert {(r.node, r.start, r.end) for r in wide} >= {
        ("n1", "2026-11-21T09:00:00.000000Z", "2026-11-21T09:55:00.000000Z")
    }
    assert all(g.samples == 12 for g in wide[0].gpus)


def test_a_job_below_the_threshold_for_the_window_is_flagged_and_loses_its_gpus() -> None:
    state = cluster(policy())
    events = decide(state, ApplyTelemetry(series()))
    flags = [e for e in events if isinstance(e, ev.JobIdle)]
    assert [(f.job, f.action) for f in flags] == [("q/stuck", "preemptible")]
    # Judged from the end of its grace (09:00), idle for the window by 10:00.
    assert flags[0].since == "2026-11-21T09:00:00.000000Z"
    assert flags[0].until >= "2026-11-21T10:00:00.000000Z"
    assert flags[0].utilization_percent < 5
    after = fold(events, state)
    assert after.needs_placement
    plan = solve(placement_instance(after, flags[0].until))
    assert plan.outcome("q/wait").status is OutcomeStatus.PLACED
    stopped = plan.outcome("q/stuck")
    assert stopped.status is OutcomeStatus.PREEMPTED
    assert {plan.outcome(k).status for k in ("q/busy", "q/train")} == {OutcomeStatus.KEPT}


def test_a_preemptible_idle_job_stays_while_nobody_waits() -> None:
    state = cluster(policy())
    state = fold([ev.JobWithdrawn("q/wait")], state)
    after = fold(decide(state, ApplyTelemetry(series())), state)
    assert "q/stuck" in after.idle
    plan = solve(placement_instance(after, "2026-11-21T10:30:00+00:00"))
    assert plan.outcome("q/stuck").status is OutcomeStatus.KEPT


def test_reclaim_stops_the_idle_job_at_once_and_it_waits_until_its_owner_changes_it() -> None:
    state = cluster(policy(action=IdleAction.RECLAIM))
    events = decide(state, ApplyTelemetry(series()))
    stops = [e for e in events if isinstance(e, ev.JobPreempted)]
    assert [(s.job, s.rule, s.preempted_by) for s in stops] == [("q/stuck", "idle", None)]
    assert "below 5% utilisation" in stops[0].reason
    # 4 GPUs since its placement at 08:30, and no checkpoint: two hours of work lost.
    assert stops[0].lost_gpu_seconds > 4 * 3600
    after = fold(events, state)
    assert "q/stuck" not in after.placements and "q/stuck" in after.pending
    at = "2026-11-21T10:30:00+00:00"
    plan = solve(placement_instance(after, at))
    assert plan.outcome("q/wait").status is OutcomeStatus.PLACED
    assert plan.outcome("q/stuck") is None  # not placed again behind its owner's back
    after = fold(decide(after, ApplyPlan(plan, "s2", at)), after)
    changed = dataclasses.replace(after.jobs["q/stuck"], checkpoint_interval_minutes=10)
    after = fold([ev.JobChanged(changed, ("checkpoint_interval_minutes",))], after)
    assert "q/stuck" not in after.idle
    assert any(j.key == "q/stuck" for j in placement_instance(after, at).jobs)


def test_no_job_is_judged_during_its_grace_after_a_placement() -> None:
    state = cluster(policy(), placed_at="2026-11-21T09:50:00+00:00")
    events = decide(state, ApplyTelemetry(series()))
    assert not [e for e in events if isinstance(e, ev.JobIdle)]
    assert "q/stuck" in fold(events, state).idle_streaks


@pytest.mark.parametrize("exempt", [{"exempt_queues": ("q",)}, {"exempt_priority_classes": ("x",)}])
def test_exempt_queues_and_priority_classes_are_never_flagged(exempt: dict[str, object]) -> None:
    state = cluster(policy(**exempt))
    assert not [e for e in decide(state, ApplyTelemetry(series())) if isinstance(e, ev.JobIdle)]


def test_a_policy_without_idle_reclamation_flags_nothing() -> None:
    state = cluster(Policy(solver="highs"))
    events = decide(state, ApplyTelemetry(series()))
    assert all(isinstance(e, ev.GpuUtilizationReported) for e in events)


def test_a_flagged_job_that_works_again_is_cleared() -> None:
    state = cluster(policy())
    state = fold(decide(state, ApplyTelemetry(series())), state)
    assert "q/stuck" in state.idle
    busy = ev.GpuUtilizationReported(
        "n1",
        "dcgm",
        "2026-11-21T10:35:00.000000Z",
        "2026-11-21T10:35:00.000000Z",
        tuple(ev.GpuUtilization(i, 60.0, 70.0, 1) for i in range(8)),
    )
    events = decide(state, ApplyTelemetry((busy,)))
    assert events[1:] == (ev.JobIdleCleared("q/stuck", "2026-11-21T10:35:00.000000Z", 60.0),)
    assert "q/stuck" not in fold(events, state).idle


def test_recorded_nvml_samples_flag_the_same_job() -> None:
    samples = parse_nvml_record((DATA / "nvml_samples.jsonl").read_text())
    assert len(samples) == 91 * 8
    reports = aggregate(samples, 300.0)
    assert {r.source for r in reports} == {"nvml"} and all(g.samples == 5 for g in reports[0].gpus)
    state = cluster(policy())
    flags = [e for e in decide(state, ApplyTelemetry(reports)) if isinstance(e, ev.JobIdle)]
    assert [f.job for f in flags] == ["q/stuck"]


def test_the_node_agent_samples_every_gpu_at_its_interval() -> None:
    readings = iter([[(0, 3.0), (1, 97.0)], [(0, 4.0), (1, 99.0)], [(0, 2.0), (1, 98.0)]])
    ticks = iter([SCRAPE_AT, SCRAPE_AT + 1, SCRAPE_AT + 2])
    slept: list[float] = []
    samples = sample_nvml("n1", 3.0, 1.0, lambda: next(readings), lambda: next(ticks), slept.append)
    assert slept == [1.0, 1.0]
    (report,) = aggregate(samples, 300.0)
    assert [(g.index, g.mean_percent, g.max_percent, g.samples) for g in report.gpus] == [
        (0, 3.0, 4.0, 3),
        (1, 98.0, 99.0, 3),
    ]


def test_replaying_the_telemetry_gives_the_same_flags() -> None:
    state = cluster(policy())
    first = decide(state, ApplyTelemetry(series()))
    again = decide(cluster(policy()), ApplyTelemetry(tuple(reversed(series()))))
    assert first == again


def test_samples_recorded_on_a_real_h100_tell_a_load_from_idle() -> None:
    """`scripts/gpu-check` on an NVIDIA H100 80GB HBM3 (a VM, driver 580.159.04,
    nvidia-ml-py 13.610.43): `telemetry sample --interval 0.5` while a bf16 matmul loop
    ran from 07:33:43.02 to 07:33:55.04 UTC; nvidia-smi read the same percentages."""
    samples = parse_nvml_record((DATA / "nvml_h100_vm.jsonl").read_text())
    load_start = datetime(2026, 11, 27, 7, 33, 43, 20000, UTC).timestamp()
    load_end = datetime(2026, 11, 27, 7, 33, 55, 40000, UTC).timestamp()
    before = [s.percent for s in samples if s.at < load_start]
    during = [s.percent for s in samples if load_start + 1 < s.at < load_end]
    after = [s.percent for s in samples if s.at > load_end + 1]
    assert len(before) >= 10 and len(during) >= 20 and len(after) >= 10
    assert max(before) == 0.0 and max(after) == 0.0 and min(during) >= 95.0
    reports = aggregate(samples, 6.0)
    means = [r.gpus[0].mean_percent for r in reports]
    assert means[0] == 0.0 and max(means) >= 95.0 and means[-1] == 0.0
