"""Suspend and resume (engine/suspend.py): spec.suspend on a job, a workspace suspended by
its own idle rule (engine/idle.py) and resumed by a commit, in both solvers."""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine import events as ev
from gitsched.engine.codec import from_data, to_data
from gitsched.engine.core import ApplyCommit, ApplyTelemetry, decide, placement_instance
from gitsched.engine.idle import suspend_rule
from gitsched.engine.model import (
    WORKSPACE,
    CommitInfo,
    IdlePolicy,
    Job,
    Policy,
    ReplicaPlacement,
)
from gitsched.engine.placement.objective import lost_gpu_seconds
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.suspension import BY_COMMIT, BY_IDLE, SUSPENDED
from gitsched.reconciler.step import solve_step
from tests.support.factories import desired, job, node

SOLVERS = ("greedy", "highs")
ANA = ("Ana", "ana@example.com")


def commit(n: int, who: tuple[str, str] = ANA) -> CommitInfo:
    return CommitInfo(f"{n:040x}", who[0], who[1], f"2026-11-20T1{n}:00:00+00:00", f"c{n}")


def apply(state: ClusterState, n: int, jobs: list[Job], solver: str) -> ClusterState:
    """Commit `n` declaring `jobs` on one 8-GPU node, and the solve that follows it."""
    want = desired(jobs, nodes=[node("n1")], policy=Policy(solver=solver))
    c = commit(n)
    events = decide(state, ApplyCommit(c, want))
    state = fold(events, state)
    return solve_step(state, c.sha, f"2026-11-20T1{n}:00:00.000000Z").state


def events_of(state: ClusterState, n: int, jobs: list[Job], solver: str) -> tuple[ev.Event, ...]:
    want = desired(jobs, nodes=[node("n1")], policy=Policy(solver=solver))
    return decide(state, ApplyCommit(commit(n), want))


@pytest.mark.parametrize("solver", SOLVERS)
def test_suspending_a_running_job_stops_it_like_a_preemption_and_keeps_its_place(
    solver: str,
) -> None:
    a = dataclasses.replace(job("a", gpu=8), checkpoint_interval_minutes=30)
    state = apply(ClusterState(), 1, [a], solver)
    assert "q/a" in state.placements
    placement = state.placements["q/a"]
    submission = state.jobs["q/a"].submission

    paused = dataclasses.replace(a, suspend=True)
    events = events_of(state, 2, [paused], solver)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["JobChanged", "JobSuspended", "JobPreempted", "CommitApplied"]
    suspended, stopped = events[1], events[2]
    assert isinstance(suspended, ev.JobSuspended) and isinstance(stopped, ev.JobPreempted)
    assert suspended.by == "Ana <ana@example.com>" and suspended.at == "2026-11-20T12:00:00.000000Z"
    assert stopped.rule == "suspend" and stopped.preempted_by is None
    # Lost work as any preemption's: an hour run, a checkpoint every 30 minutes.
    assert stopped.lost_gpu_seconds == lost_gpu_seconds(a, placement, suspended.at) == 8 * 1800

    state = apply(state, 2, [paused], solver)
    assert "q/a" not in state.placements
    assert state.pending["q/a"].constraint == SUSPENDED
    assert "suspended (spec.suspend: true) by Ana" in state.pending["q/a"].reason
    assert state.suspended["q/a"].cause == BY_COMMIT
    assert "q/a" not in {j.key for j in placement_instance(state, "2026-11-20T12:00:00Z").jobs}
    assert state.jobs["q/a"].submission == submission

    state = apply(state, 3, [a], solver)
    assert "q/a" in state.placements and "q/a" not in state.suspended
    assert state.jobs["q/a"].submission == submission


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_resumed_job_goes_before_jobs_submitted_after_it(solver: str) -> None:
    a, b, c = job("a", gpu=8), job("b", gpu=8), job("c", gpu=8)
    state = apply(ClusterState(), 1, [a], solver)
    state = apply(state, 2, [a, b], solver)  # b waits behind a
    state = apply(state, 3, [dataclasses.replace(a, suspend=True), b], solver)
    assert list(state.placements) == ["q/b"]  # a's GPUs went to b
    state = apply(state, 4, [dataclasses.replace(a, suspend=True), b, c], solver)
    state = apply(state, 5, [a, b, c], solver)  # a resumed while b runs: a and c wait
    assert list(state.placements) == ["q/b"] and {"q/a", "q/c"} <= set(state.pending)
    state = fold([ev.JobFinished("q/b", "2026-11-20T16:00:00+00:00")], state)
    state = solve_step(state, "done", "2026-11-20T16:00:00.000000Z").state
    # a was submitted before c: resumed, it is still ahead of c.
    assert list(state.placements) == ["q/a"]


def test_a_job_submitted_suspended_is_never_placed_and_says_why() -> None:
    state = apply(ClusterState(), 1, [dataclasses.replace(job("a", gpu=1), suspend=True)], "greedy")
    assert not state.placements
    assert state.pending["q/a"].constraint == SUSPENDED


def workspace(minutes: int | None = 30, resume: str = "") -> Job:
    return dataclasses.replace(
        job("ws", gpu=1), kind=WORKSPACE, idle_suspend_after_minutes=minutes, resume=resume
    )


def report(start: str, end: str, percent: float, gpus: int = 8) -> ev.GpuUtilizationReported:
    return ev.GpuUtilizationReported(
        node="n1",
        source="dcgm",
        start=start,
        end=end,
        gpus=tuple(ev.GpuUtilization(i, percent, percent, 5) for i in range(gpus)),
    )


def idle_for(minutes: int, percent: float = 1.0) -> tuple[ev.GpuUtilizationReported, ...]:
    """Reports every five minutes from the workspace's start (11:00) for `minutes`."""
    out = []
    for m in range(0, minutes, 5):
        out.append(
            report(
                f"2026-11-20T11:{m:02d}:00+00:00", f"2026-11-20T11:{m + 5:02d}:00+00:00", percent
            )
        )
    return tuple(out)


def placed_workspace(policy_idle: IdlePolicy | None = None, ws: Job | None = None) -> ClusterState:
    ws = ws or workspace()
    want = desired([ws], nodes=[node("n1")])
    if policy_idle is not None:
        want = dataclasses.replace(want, policy=Policy(idle=policy_idle))
    state = fold(decide(ClusterState(), ApplyCommit(commit(1), want)), ClusterState())
    return fold(
        [
            ev.PlacementDecided(
                "q/ws",
                "h100",
                (ReplicaPlacement("n1", (0,), 1000),),
                "admitted",
                "",
                "s1",
                "2026-11-20T11:00:00.000000Z",
            )
        ],
        state,
    )


@pytest.mark.parametrize("policy_idle", [None, IdlePolicy(enabled=True, window_minutes=600)])
def test_a_workspace_idle_for_its_window_is_suspended_at_the_telemetry_time(
    policy_idle: IdlePolicy | None,
) -> None:
    state = placed_workspace(policy_idle)
    assert not [e for e in decide(state, ApplyTelemetry(idle_for(25))) if not _report(e)]

    events = decide(state, ApplyTelemetry(idle_for(30)))
    flags = [e for e in events if not _report(e)]
    assert [type(e).__name__ for e in flags] == ["WorkspaceSuspended", "JobPreempted"]
    suspended, stopped = flags
    assert isinstance(suspended, ev.WorkspaceSuspended) and isinstance(stopped, ev.JobPreempted)
    assert (suspended.since, suspended.until) == (
        "2026-11-20T11:00:00+00:00",
        "2026-11-20T11:30:00+00:00",
    )
    assert suspended.utilization_percent == 1.0 and suspended.after_minutes == 30
    assert stopped.rule == "suspend" and stopped.at == suspended.until

    after = fold(events, state)
    assert "q/ws" not in after.placements and after.suspended["q/ws"].cause == BY_IDLE
    assert "idle" in after.pending["q/ws"].reason and "spec.resume" in after.pending["q/ws"].reason
    # Reported again, nothing more: it no longer runs.
    assert not [e for e in decide(after, ApplyTelemetry(idle_for(35))) if not _report(e)]


def test_a_busy_workspace_or_one_without_an_idle_rule_keeps_running() -> None:
    busy = placed_workspace()
    assert not [e for e in decide(busy, ApplyTelemetry(idle_for(60, 40.0))) if not _report(e)]
    no_rule = placed_workspace(ws=workspace(minutes=None))
    assert not [e for e in decide(no_rule, ApplyTelemetry(idle_for(60))) if not _report(e)]
    assert suspend_rule(workspace(minutes=None), IdlePolicy()) is None


def test_an_idle_suspended_workspace_resumes_only_when_its_resume_field_changes() -> None:
    state = placed_workspace()
    state = fold(decide(state, ApplyTelemetry(idle_for(30))), state)
    ws = workspace()

    def commit_of(n: int, jobs: list[Job]) -> tuple[ev.Event, ...]:
        return decide(state, ApplyCommit(commit(n, ("Li", "li@example.com")), desired(jobs)))

    # The same file (suspend: false all along) and an unrelated edit leave it suspended.
    assert not [e for e in commit_of(2, [ws]) if isinstance(e, ev.JobResumed)]
    bigger = dataclasses.replace(ws, resources=dataclasses.replace(ws.resources, cpu_milli=2000))
    assert not [e for e in commit_of(2, [bigger]) if isinstance(e, ev.JobResumed)]

    events = commit_of(3, [dataclasses.replace(ws, resume="monday")])
    (resumed,) = [e for e in events if isinstance(e, ev.JobResumed)]
    assert (resumed.how, resumed.by, resumed.at) == (
        "resume",
        "Li <li@example.com>",
        "2026-11-20T13:00:00.000000Z",
    )
    after = fold(events, state)
    assert "q/ws" not in after.suspended and "q/ws" not in after.pending
    assert "q/ws" in {j.key for j in placement_instance(after, resumed.at).jobs}


def _report(e: ev.Event) -> bool:
    return isinstance(e, ev.GpuUtilizationReported)


@pytest.mark.parametrize("solver", SOLVERS)
def test_editing_a_suspended_job_leaves_it_suspended_and_the_others_placed(solver: str) -> None:
    """A commit that only edits a suspended job is solved incrementally (reconciler.step):
    the job is not the solver's to place, and nothing else moves."""
    a = dataclasses.replace(job("a", gpu=4), suspend=True)
    others = [job(name, gpu=1) for name in "bcde"]  # a fifth of the jobs: incremental
    state = apply(ClusterState(), 1, [a, *others], solver)
    running = ["q/b", "q/c", "q/d", "q/e"]
    assert sorted(state.placements) == running
    wider = dataclasses.replace(a, resources=dataclasses.replace(a.resources, gpu_milli=2000))
    want = desired([wider, *others], nodes=[node("n1")], policy=Policy(solver=solver))
    c = commit(2)
    events = decide(state, ApplyCommit(c, want))
    assert [type(e).__name__ for e in events] == ["JobChanged", "CommitApplied"]
    state = fold(events, state)
    now = "2026-11-20T12:00:00.000000Z"
    step = solve_step(state, c.sha, now, changed=frozenset({"q/a"}))
    assert sorted(step.state.placements) == running and "q/a" in step.state.suspended
    assert step.state.pending["q/a"].constraint == SUSPENDED


def test_a_job_logged_before_suspend_existed_reads_as_a_job_that_runs() -> None:
    """JobSubmitted v1 payloads written before kind/suspend/idle/resume: the defaults."""
    old = to_data(ev.JobSubmitted(job("a")))
    for name in ("kind", "suspend", "idle_suspend_after_minutes", "resume"):
        del old["job"][name]
    read = from_data(ev.JobSubmitted, old).job
    assert (read.kind, read.suspend, read.idle_suspend_after_minutes, read.resume) == (
        "Job",
        False,
        None,
        "",
    )
    assert not read.is_workspace
