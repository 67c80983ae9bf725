"""A time limit on a real API server (docs/time.md): `serve`'s pass appends the stop at the
moment the limit was reached, deletes the job's pods, and places the job that waited."""

from __future__ import annotations

import pytest

from gitsched.engine import events as ev
from gitsched.engine.timelimits import plus_minutes
from tests.support.kube import KubeWorld, job_yaml, run_until

pytestmark = pytest.mark.kube


def _pods_of(world: KubeWorld, job: str) -> list[str]:
    return [
        name
        for name, pod in world.pods().items()
        if pod["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
        and not pod["metadata"].get("deletionTimestamp")
    ]


def _running(world: KubeWorld, job: str) -> bool:
    pods = world.pods()
    return any(
        pod["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
        and pod["status"].get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
        for pod in pods.values()
    )


def test_a_job_that_reaches_its_limit_is_stopped_its_pods_deleted_and_the_next_placed(
    world: KubeWorld,
) -> None:
    world.add_node("n0")
    world.bootstrap(nominal=8)  # room for one 8-GPU job at a time
    # The job is placed when the pass that registers the node decides (that event's time),
    # so its one-minute limit is reached a minute after: the deadline leaves room for it.
    world.repo.write(
        f"teams/{world.team}/jobs/a-short.yaml", job_yaml("a-short") + "  timeLimitMinutes: 1\n"
    )
    world.repo.write(f"teams/{world.team}/jobs/b-next.yaml", job_yaml("b-next"))
    world.repo.commit("Submit a-short (1 min) and b-next")
    controller = world.controller()
    run_until(
        controller,
        "b-next Running and a-short's pods gone",
        lambda r: _running(world, "b-next") and not _pods_of(world, "a-short"),
        timeout_s=240.0,
    )
    events = world.events()
    [stopped] = [e for e in events if isinstance(e, ev.JobTimedOut)]
    [placed] = [
        e
        for e in events
        if isinstance(e, ev.PlacementDecided) and e.job == world.job_key("a-short")
    ]
    assert stopped.job == world.job_key("a-short")
    # When the limit was reached, not when the daemon looked.
    assert stopped.at == plus_minutes(placed.at, 1)
    assert stopped.limit_minutes == 1
    assert world.job_key("a-short") not in controller.step().state.jobs
