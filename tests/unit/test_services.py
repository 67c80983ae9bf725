"""Inference services (engine/services.py): loading and its findings, the replica jobs a
service becomes, ServiceScaled, quota standing, rolling updates, plan = reconcile."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.cluster.controller import StepReport
from gitsched.engine import events as ev
from gitsched.engine.model import CommitInfo, Resources
from gitsched.engine.services import (
    InferenceService,
    Replica,
    RollingUpdate,
    ServiceStatus,
    apply_step,
    next_step,
    rollout_bounds,
    surplus,
)
from gitsched.engine.state import ClusterState, fold
from gitsched.metrics import Metrics
from gitsched.reconciler.approval import CommitApproval
from gitsched.reconciler.specs import LoadedSpecs, SourceFile, parse_files
from gitsched.reconciler.step import Step, commit_step, solve_step
from tests.support.cluster_repo import MINIMAL_CLUSTER, H, job_yaml, queue_yaml

SERVICE = "teams/ml/services/chat.yaml"


def service_yaml(
    *,
    low: int = 2,
    high: int = 4,
    gpu: float = 2,
    spread: str = "",
    extra: str = "",
    image: str = "vllm:1",
) -> str:
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: chat
spec:
  replicas: {{min: {low}, max: {high}}}
  resources: {{gpu: {gpu:g}, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
  priorityClass: high
{spread}{extra}  template:
    spec:
      containers:
        - name: main
          image: {image}
"""
    )


def load(files: dict[str, str]) -> LoadedSpecs:
    return parse_files(
        [SourceFile(path, content.encode()) for path, content in sorted(files.items())]
    )


def commit(n: int) -> CommitInfo:
    return CommitInfo(
        sha=f"{n:040x}",
        author="Ana",
        author_email="ana@ml.example",
        committed_at=f"2026-01-01T{n:02d}:00:00+00:00",
        subject=f"commit {n}",
    )


def step(state: ClusterState, n: int, files: dict[str, str], solver: str = "greedy") -> Step:
    loaded = load(files)
    assert loaded.desired is not None, loaded.errors
    return commit_step(state, commit(n), loaded, CommitApproval(), solver)


def replicas(state: ClusterState) -> dict[str, bool]:
    """Replica job key -> placed."""
    return {k: k in state.placements for k, j in sorted(state.jobs.items()) if j.service}


def test_a_service_becomes_min_replica_jobs_placed_non_preemptible_first() -> None:
    done = step(ClusterState(), 1, {**MINIMAL_CLUSTER, SERVICE: service_yaml()})
    assert replicas(done.state) == {"ml/chat.0": True, "ml/chat.1": True}
    assert [e.type for e in done.events if e.type.startswith("Service")] == [
        "ServiceSubmitted",
        "ServiceReplicasChanged",
    ]
    jobs = [done.state.jobs[k] for k in ("ml/chat.0", "ml/chat.1")]
    assert not any(j.preemptible for j in jobs)


def scaled(to: int, at: str = "2026-01-01T05:00:00Z") -> ev.ServiceScaled:
    return ev.ServiceScaled(
        service="ml/chat",
        from_replicas=2,
        to_replicas=to,
        metric_value=12.0,
        target=5.0,
        bound_by="hpa",
        at=at,
    )


def test_the_replica_count_follows_the_latest_service_scaled_clamped_to_min_and_max() -> None:
    state = step(ClusterState(), 1, {**MINIMAL_CLUSTER, SERVICE: service_yaml()}).state
    state = fold((scaled(3),), state)
    assert state.needs_placement
    after = solve_step(state, "scale", "2026-01-01T05:00:00.000000Z", "greedy")
    changed = [e for e in after.events if isinstance(e, ev.ServiceReplicasChanged)]
    assert [(c.added, c.desired, c.at) for c in changed] == [
        ((changed[0].added[0],), 3, "2026-01-01T05:00:00.000000Z")
    ]
    assert replicas(after.state) == {"ml/chat.0": True, "ml/chat.1": True, "ml/chat.2": True}
    # the replica above min may borrow and is the first to give capacity back
    assert surplus(after.state.jobs["ml/chat.2"])
    assert not surplus(after.state.jobs["ml/chat.1"])
    # above max: clamped to 4; below min: clamped to 2, the newest replicas go
    up = solve_step(fold((scaled(9),), after.state), "s2", "2026-01-01T06:00:00.000000Z", "greedy")
    assert len(replicas(up.state)) == 4
    down = solve_step(fold((scaled(0),), up.state), "s3", "2026-01-01T07:00:00.000000Z", "greedy")
    assert replicas(down.state) == {"ml/chat.0": True, "ml/chat.1": True}


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (service_yaml(low=5, high=3), "$.spec.replicas.min", "min (5) is more than max (3)"),
        (service_yaml(low=-1), "$.spec.replicas.min", ""),
        (service_yaml(extra="  colour: blue\n"), "$.spec.colour", "unknown field 'colour'"),
        (
            service_yaml(low=3, spread="  spread: [{topology: rack, maxPerDomain: 2}]\n"),
            "$.spec.spread[0].maxPerDomain",
            "allows at most 2",
        ),
        (
            service_yaml(spread="  spread: [{topology: zone, maxPerDomain: 1}]\n"),
            "$.spec.spread[0].topology",
            "topology level 'zone'",
        ),
        (
            service_yaml(extra="  autoscaling: {metric: {query: 7}, target: 1}\n"),
            "$.spec.autoscaling.metric.query",
            "",
        ),
        (
            service_yaml(extra="  autoscaling: {metric: {query: q}, target: 0}\n"),
            "$.spec.autoscaling.target",
            "",
        ),
        (
            service_yaml(
                extra="  autoscaling: {metric: {query: q}, target: 2, scaleUp: {selectPolicy: Most}}\n"
            ),
            "$.spec.autoscaling.scaleUp.selectPolicy",
            "",
        ),
        (
            service_yaml(extra="  rollingUpdate: {maxSurge: 0, maxUnavailable: 0%}\n"),
            "$.spec.rollingUpdate.maxSurge",
            "both 0",
        ),
    ],
)
def test_bad_service_input_is_a_finding_with_file_line_and_field(
    text: str, path: str, words: str
) -> None:
    loaded = load({**MINIMAL_CLUSTER, SERVICE: text})
    assert loaded.desired is None
    found = [e for e in loaded.errors if e.file == SERVICE]
    assert found, loaded.errors
    assert any(e.path == path and e.line and words in e.message for e in found), found
    state = step(ClusterState(), 1, MINIMAL_CLUSTER).state
    bad = commit_step(state, commit(2), loaded, CommitApproval(), "greedy")
    assert [e.type for e in bad.events] == ["CommitRejected"]
    assert bad.state.services == state.services and bad.state.jobs == state.jobs


def started(state: ClusterState, *keys: str) -> ClusterState:
    return fold(
        [ev.JobStarted(job=k, placement_at=state.placements[k].started_at) for k in keys], state
    )


def running(state: ClusterState) -> list[str]:
    return sorted(k for k, j in state.jobs.items() if j.service and k in state.started)


def test_a_template_change_rolls_replicas_a_few_at_a_time_never_below_min() -> None:
    rolling = "  rollingUpdate: {maxSurge: 1, maxUnavailable: 0}\n"
    files = {**MINIMAL_CLUSTER, SERVICE: service_yaml(extra=rolling)}
    state = step(ClusterState(), 1, files).state
    state = started(state, "ml/chat.0", "ml/chat.1")
    changed = step(state, 2, {**files, SERVICE: service_yaml(extra=rolling, image="vllm:2")})
    kinds = [e.type for e in changed.events if e.type.startswith("Service")]
    assert kinds == ["ServiceChanged", "ServiceReplicasChanged"]
    state = changed.state
    # one new replica surges; both old ones keep serving
    assert replicas(state) == {"ml/chat.0": True, "ml/chat.1": True, "ml/chat.2": True}
    assert state.jobs["ml/chat.2"].template != state.jobs["ml/chat.0"].template
    seen_running: list[int] = []
    at = 3
    while any(
        r.revision != state.services["ml/chat"].revision for r in state.services["ml/chat"].replicas
    ):
        new = [k for k in replicas(state) if k not in state.started and k in state.placements]
        assert new, "the update stalled"
        state = started(state, *new)
        assert state.needs_placement  # a new replica running makes the next step due
        nxt = solve_step(state, f"started/{at}", f"2026-01-01T{at:02d}:00:00.000000Z", "greedy")
        steps = [e for e in nxt.events if isinstance(e, ev.ServiceReplicasChanged)]
        assert steps and all(s.at == f"2026-01-01T{at:02d}:00:00.000000Z" for s in steps)
        state = nxt.state
        seen_running.append(len(running(state)))
        at += 1
    assert min(seen_running) >= 2
    assert sorted(replicas(state)) == ["ml/chat.2", "ml/chat.3"]
    assert all(state.jobs[k].template == state.jobs["ml/chat.2"].template for k in replicas(state))


def test_a_suspended_service_has_no_replicas_and_resumes_to_min() -> None:
    files = {**MINIMAL_CLUSTER, SERVICE: service_yaml()}
    state = step(ClusterState(), 1, files).state
    off = step(state, 2, {**files, SERVICE: service_yaml(extra="  suspend: true\n")}).state
    assert replicas(off) == {} and not off.placements
    on = step(off, 3, files).state
    assert replicas(on) == {"ml/chat.2": True, "ml/chat.3": True}


def test_withdrawing_the_file_withdraws_the_replicas() -> None:
    state = step(ClusterState(), 1, {**MINIMAL_CLUSTER, SERVICE: service_yaml()}).state
    gone = step(state, 2, MINIMAL_CLUSTER)
    assert "ServiceWithdrawn" in [e.type for e in gone.events]
    assert replicas(gone.state) == {} and "ml/chat" not in gone.state.services


def test_metrics_export_service_replicas_by_state_and_drop_a_withdrawn_service() -> None:
    def sample(metrics: Metrics, word: str) -> float | None:
        labels = {"service": "ml/chat", "state": word}
        return metrics.registry.get_sample_value("gitsched_service_replicas", labels)

    metrics = Metrics()
    state = step(ClusterState(), 1, {**MINIMAL_CLUSTER, SERVICE: service_yaml()}).state
    state = started(state, "ml/chat.0")
    state = solve_step(
        fold((scaled(3),), state), "s", "2026-01-01T05:00:00.000000Z", "greedy"
    ).state
    metrics.record(StepReport(state=state), datetime(2030, 1, 1, tzinfo=UTC))
    got = {
        w: sample(metrics, w) for w in ("desired", "current", "running", "pending", "min", "max")
    }
    assert got == {"desired": 3, "current": 3, "running": 1, "pending": 0, "min": 2, "max": 4}
    gone = step(state, 6, MINIMAL_CLUSTER).state
    metrics.record(StepReport(state=gone), datetime(2030, 1, 1, tzinfo=UTC))
    assert sample(metrics, "desired") is None


COHORT = {
    **MINIMAL_CLUSTER,
    "teams/ml/queue.yaml": queue_yaml("ml", 8, extra="  cohort: lab\n"),
    "teams/cv/queue.yaml": queue_yaml("cv", 24, extra="  cohort: lab\n"),
}


@pytest.mark.parametrize("solver", ["greedy", "highs", "cbc"])
def test_min_replicas_stay_in_quota_and_surplus_ones_borrow_and_go_back_first(
    solver: str,
) -> None:
    files = {**COHORT, SERVICE: service_yaml(low=1, high=3, gpu=8)}
    state = step(ClusterState(), 1, files, solver).state
    state = solve_step(fold((scaled(3),), state), "s", "2026-01-01T05:00:00.000000Z", solver).state
    # ml's nominal is 8: the min replica is in quota, the two above it borrow cv's GPUs
    assert replicas(state) == {"ml/chat.0": True, "ml/chat.1": True, "ml/chat.2": True}
    assert not state.jobs["ml/chat.0"].preemptible
    # cv takes its nominal back: the surplus replicas give way, the min replica stays
    cv = {f"teams/cv/jobs/t{i}.yaml": job_yaml(f"t{i}", gpu=8) for i in range(3)}
    back = step(state, 6, {**files, **cv}, solver)
    stopped = sorted(e.job for e in back.events if isinstance(e, ev.JobPreempted))
    assert stopped == ["ml/chat.1", "ml/chat.2"]
    assert all(e.rule == "reclaim" for e in back.events if isinstance(e, ev.JobPreempted))
    assert replicas(back.state)["ml/chat.0"]
    assert all(k in back.state.placements for k in ("cv/t0", "cv/t1", "cv/t2"))
    waiting = back.state.pending["ml/chat.1"].reason
    assert waiting  # a replica that cannot be placed says why, like a job


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_a_min_replica_does_not_borrow(solver: str) -> None:
    files = {**COHORT, SERVICE: service_yaml(low=2, high=2, gpu=8)}
    state = step(ClusterState(), 1, files, solver).state
    assert replicas(state) == {"ml/chat.0": True, "ml/chat.1": False}
    reason = state.pending["ml/chat.1"].reason
    assert "not preemptible and does not borrow" in reason, reason


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    low=st.integers(0, 4),
    extra=st.integers(0, 4),
    surge=st.one_of(st.integers(0, 3), st.sampled_from(["0%", "25%", "50%", "100%"])),
    unavailable=st.one_of(st.integers(0, 3), st.sampled_from(["0%", "25%", "50%"])),
    order=st.randoms(use_true_random=False),
)
def test_a_rolling_update_never_runs_fewer_than_its_floor_nor_more_than_the_surge(
    low: int, extra: int, surge: int | str, unavailable: int | str, order: Any
) -> None:
    desired = max(1, low + extra)
    service = InferenceService(
        name="chat",
        team="ml",
        queue="ml",
        min_replicas=min(low, desired),
        max_replicas=desired,
        resources=Resources(gpu_milli=1000),
        priority_class="high",
        priority=900,
        rolling_update=RollingUpdate(surge, unavailable),
    )
    old = tuple(Replica(i, 1) for i in range(desired))
    status = ServiceStatus(service, revision=2, scaled=desired, replicas=old, next_index=desired)
    running = frozenset(range(desired))
    most, floor = rollout_bounds(service, desired)
    for _ in range(10 * desired + 10):
        step = next_step(status, running, running)
        if step is None:
            # it waits only for new replicas to run
            waiting = [r for r in status.replicas if r.index not in running]
            if not waiting:
                break
            running |= {order.choice(waiting).index}
            continue
        status = apply_step(status, step.added, step.removed)
        running -= set(step.removed)
        assert len(running) >= floor  # never below the floor (and never below min)
        assert len(status.replicas) <= desired + most
    assert {r.revision for r in status.replicas} == {2}
    assert len(status.replicas) == desired


def test_serve_scales_the_services_with_an_autoscaling_block_at_the_folds_count() -> None:
    from gitsched.cluster.autoscaler import services_of

    block = "  autoscaling:\n    metric: {query: 'sum(vllm:num_requests_waiting)'}\n    target: 5\n"
    files = {**MINIMAL_CLUSTER, SERVICE: service_yaml(extra=block)}
    state = step(ClusterState(), 1, files).state
    state = fold((scaled(3),), state)
    (only,) = services_of(state)
    assert (only.name, only.current, only.min_replicas, only.max_replicas) == ("ml/chat", 3, 2, 4)
    assert only.spec.target == 5
    # suspended, or without a block: nothing to scale
    state = step(
        state, 2, {**MINIMAL_CLUSTER, SERVICE: service_yaml(extra="  suspend: true\n" + block)}
    ).state
    assert services_of(state) == []
    state = step(state, 3, {**MINIMAL_CLUSTER, SERVICE: service_yaml()}).state
    assert services_of(state) == []
