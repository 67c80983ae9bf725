"""A workspace on a real API server (docs/workspaces.md): its pod runs; GPU utilisation
ingested as the DCGM exporter reports it shows its GPU idle for its idle.suspendAfterMinutes,
so it is suspended and its pod deleted; a commit that changes its spec.resume makes the
pod again."""

from __future__ import annotations

import pytest

from gitsched.engine import events as ev
from gitsched.engine.fairshare import moment
from tests.support.cluster_repo import ANA, LI, H, gitsched
from tests.support.kube import KubeWorld, run_until
from tests.support.telemetry import dcgm_series

pytestmark = pytest.mark.kube


def workspace_yaml(name: str, resume: str = "") -> str:
    return (
        H
        + f"""kind: Workspace
metadata:
  name: {name}
spec:
  resources: {{gpu: 1, cpu: 2, memoryGiB: 8}}
  idle: {{suspendAfterMinutes: 30}}
  template:
    spec:
      containers:
        - name: notebook
          image: registry.example/jupyter:1
          command: [start-notebook.sh]
"""
        + (f'  resume: "{resume}"\n' if resume else "")
    )


def _live_pods(world: KubeWorld, job: str) -> list[dict[str, object]]:
    return [
        pod
        for pod in world.pods().values()
        if pod["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
        and not pod["metadata"].get("deletionTimestamp")
    ]


def _running(world: KubeWorld, job: str) -> bool:
    return any(p["status"].get("phase") == "Running" for p in _live_pods(world, job))  # type: ignore[attr-defined]


def test_a_workspace_suspended_when_idle_loses_its_pod_and_a_commit_brings_it_back(
    world: KubeWorld,
) -> None:
    world.add_node("n0")
    world.bootstrap(nominal=8)
    path = f"teams/{world.team}/workspaces/nb.yaml"
    world.repo.write(path, workspace_yaml("nb"))
    world.repo.commit("A notebook", author=ANA)
    controller = world.controller()
    report = run_until(
        controller, "the workspace's pod Running", lambda r: _running(world, "nb"), 120.0
    )
    key = world.job_key("nb")
    placement = report.state.placements[key]
    (replica,) = placement.replicas
    (gpu,) = replica.gpus

    # Its GPU at 1% from its start for 35 minutes, as Prometheus kept the exporter's scrapes.
    start = int(moment(placement.started_at) or 0) + 1
    series = world.tmp / "dcgm.prom"
    series.write_text(dcgm_series(replica.node, range(gpu, gpu + 1), start, 35, 1))
    ingest = gitsched(
        "telemetry",
        "ingest",
        series,
        "--log",
        world.log_url,
        "--repo",
        world.repo.path,
        "--format",
        "json",
        expect=0,
    ).json()
    assert [s["job"] for s in ingest["suspended"]] == [key]

    report = run_until(
        controller, "the idle workspace's pod deleted", lambda r: not _live_pods(world, "nb"), 120.0
    )
    assert key not in report.state.placements and key in report.state.suspended
    [suspended] = [e for e in world.events() if isinstance(e, ev.WorkspaceSuspended)]
    assert suspended.job == key and suspended.after_minutes == 30

    world.repo.write(path, workspace_yaml("nb", resume="back"))
    resumed_in = world.repo.commit("Back to the notebook", author=LI)
    run_until(
        controller, "the resumed workspace's pod Running", lambda r: _running(world, "nb"), 120.0
    )
    [resumed] = [e for e in world.events() if isinstance(e, ev.JobResumed)]
    assert resumed.job == key and resumed.commit == resumed_in and resumed.how == "resume"
    assert resumed.by == f"{LI[0]} <{LI[1]}>"
