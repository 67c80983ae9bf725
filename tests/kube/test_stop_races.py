"""A running job that ends while a pass decides is recorded finished, never stopped and run
again: a decision that stops running jobs is appended only after what the cluster said
about them meanwhile (issue 30 item 7, the gang-burst run that ran a gang twice)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gitsched.cluster.api import Obj
from gitsched.cluster.controller import Controller
from gitsched.engine import events as ev
from gitsched.reconciler.loop import ReconcileReport
from tests.support.kube import KubeWorld, run_until, wait_for

pytestmark = pytest.mark.kube


def _phases(world: KubeWorld, job: str, pods: Mapping[Any, Obj]) -> list[str]:
    label = f"{world.team}.{job}"
    return [
        p.get("status", {}).get("phase", "")
        for p in pods.values()
        if (p["metadata"].get("labels") or {}).get("gitsched.io/job") == label
    ]


def _watch_sees(world: KubeWorld, controller: Controller, job: str) -> None:
    wait_for(
        f"{job}'s pods Succeeded in the daemon's watch",
        lambda: (p := _phases(world, job, controller.pods.snapshot())) and set(p) == {"Succeeded"},
    )


def _end_before_deciding(
    world: KubeWorld, controller: Controller, job: str, decision: str = "run_once"
) -> None:
    """The race, made to happen every time: the pass has observed the cluster (the job
    still running) and is about to decide (`decision`: the reconciler's run_once for a
    commit, solve_now after a cluster event) when the job's pods Succeed and the watch
    sees it."""
    reconciler = controller.reconciler
    assert reconciler is not None
    decide: Callable[..., ReconcileReport] = getattr(reconciler, decision)
    fired = False

    def late_end(*args: Any) -> ReconcileReport:
        nonlocal fired
        if not fired:
            fired = True
            world.end_pods(job, "succeeded")
            _watch_sees(world, controller, job)
        return decide(*args)

    setattr(reconciler, decision, late_end)


def test_a_job_that_ends_while_a_commit_is_decided_is_finished_not_preempted(
    world: KubeWorld,
) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("batch", replicas=2, priority="low")
    controller = world.controller()
    run_until(controller, "batch started", lambda r: world.job_key("batch") in r.state.started)
    # A higher priority gang that needs batch's nodes: with batch running, it preempts it.
    world.submit("urgent", replicas=2, priority="high")
    _end_before_deciding(world, controller, "batch")
    report = controller.step()
    assert not any(isinstance(e, ev.JobFinished) for e in report.observed)  # the race: missed
    run_until(controller, "urgent started", lambda r: world.job_key("urgent") in r.state.started)

    events = world.events()
    assert [e.job for e in events if isinstance(e, ev.JobPreempted)] == []
    finished = [e.job for e in events if isinstance(e, ev.JobFinished)]
    assert finished == [world.job_key("batch")]
    # Its finish is in the log before the decision that placed urgent on its nodes.
    at = {
        (type(e).__name__, e.job): i
        for i, e in reversed(list(enumerate(events)))
        if isinstance(e, ev.JobFinished | ev.PlacementDecided)
    }
    assert (
        at[("JobFinished", world.job_key("batch"))]
        < at[("PlacementDecided", world.job_key("urgent"))]
    )
    state = controller.step().state
    assert state.ended[world.job_key("batch")] == "finished"
    assert world.job_key("batch") not in state.pending
    # Its pods stay, Succeeded, as a finished job's do: none deleted, none made again.
    assert _phases(world, "batch", world.pods()) == ["Succeeded", "Succeeded"]


def test_a_job_that_ends_while_a_finish_is_placed_after_is_finished_not_preempted(
    world: KubeWorld,
) -> None:
    """The gang burst's race: one job's end observed, another's not yet, when the solve
    after the first would stop the second to place a waiting gang."""
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("batch", replicas=1, priority="low")
    world.submit("other", replicas=1, priority="high")
    controller = world.controller()
    run_until(
        controller,
        "batch and other started",
        lambda r: {world.job_key("batch"), world.job_key("other")} <= set(r.state.started),
    )
    # urgent needs both nodes; other (as high as urgent) cannot be preempted: urgent waits.
    world.submit("urgent", replicas=2, priority="high")
    run_until(controller, "urgent waiting", lambda r: world.job_key("urgent") in r.state.pending)
    # other ends and the watch sees it; while the pass after it decides, batch ends too.
    world.end_pods("other", "succeeded")
    _watch_sees(world, controller, "other")
    _end_before_deciding(world, controller, "batch", "solve_now")
    report = controller.step()
    assert [e.job for e in report.observed if isinstance(e, ev.JobFinished)] == [
        world.job_key("other")
    ]  # batch's end missed by the observation, as in the race
    run_until(controller, "urgent started", lambda r: world.job_key("urgent") in r.state.started)

    events = world.events()
    assert [e.job for e in events if isinstance(e, ev.JobPreempted)] == []
    assert sorted(e.job for e in events if isinstance(e, ev.JobFinished)) == [
        world.job_key("batch"),
        world.job_key("other"),
    ]
    state = controller.step().state
    assert state.ended[world.job_key("batch")] == "finished"
    assert _phases(world, "batch", world.pods()) == ["Succeeded"]
