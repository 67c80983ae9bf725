"""A reconciled cluster repo that runs an inference service and an idle workspace, with
what `serve` would have appended for them (replicas started, a scaling decision and the
step after it, GPU telemetry that suspends the workspace): for the report's and the
console's tests."""

from __future__ import annotations

import json
from pathlib import Path

from gitsched.engine import events as ev
from gitsched.eventlog.codec import encode
from gitsched.eventlog.replay import replay
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from tests.support.cluster_repo import ANA, EPOCH, ClusterRepo, H, gitsched, job_yaml
from tests.support.telemetry import dcgm_series

SERVICE_KEY = "ml/chat"
WORKSPACE_KEY = "ml/nb"
SCALED_AT = "2025-11-16T10:05:00.000000Z"


def service_yaml(name: str = "chat", low: int = 1, high: int = 3) -> str:
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: {name}
spec:
  replicas: {{min: {low}, max: {high}}}
  resources: {{gpu: 1, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
"""
    )


def workspace_yaml(name: str = "nb") -> str:
    return (
        H
        + f"""kind: Workspace
metadata:
  name: {name}
spec:
  resources: {{gpu: 1, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
  idle: {{suspendAfterMinutes: 30}}
"""
    )


def append_as_serve(repo: ClusterRepo, events: list[ev.Event], cause: str) -> None:
    """Append cluster events as `serve` does (actor, cause), then the solve they ask for."""
    with SQLiteEventLog(repo.log_path) as log:
        last = log.last_seq()
        log.append(
            [
                encode(e, id=f"{cause}/{i}", actor="cluster:test", cause=cause)
                for i, e in enumerate(events)
            ],
            expected_last_seq=last,
        )
        Reconciler(GitRepo(repo.path), log).solve_now(cause)


def serving_repo(path: Path, *, extra_services: dict[str, str] | None = None) -> ClusterRepo:
    """ml runs service ml/chat (min 1, max 3), workspace ml/nb and a training job; chat.0
    and the job start, the autoscaler scales chat 1 -> 2 (metric 12, target 5), chat.1 is
    added; the notebook's GPU idles 35 minutes and it is suspended."""
    repo = ClusterRepo(path)
    repo.bootstrap()
    repo.write("teams/ml/services/chat.yaml", service_yaml())
    repo.write("teams/ml/workspaces/nb.yaml", workspace_yaml())
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train", gpu=8))
    for rel, text in (extra_services or {}).items():
        repo.write(rel, text)
    repo.commit("ml: a chat service, a notebook and a training job", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    with SQLiteEventLog(repo.log_path) as log:
        state = replay(log).state
    started = [
        ev.JobStarted(job=key, placement_at=state.placements[key].started_at)
        for key in ("ml/chat.0", "ml/train")
    ]
    append_as_serve(repo, [*started], "cluster/started")
    scaled = ev.ServiceScaled(SERVICE_KEY, 1, 2, 12.0, 5.0, "hpa", SCALED_AT)
    append_as_serve(repo, [scaled], "autoscaler/ml/chat/1")
    with SQLiteEventLog(repo.log_path) as log:
        state = replay(log).state
    node = state.placements[WORKSPACE_KEY].replicas[0].node
    gpus = state.placements[WORKSPACE_KEY].replicas[0].gpus
    series = path.parent / "dcgm.prom"
    series.write_text(dcgm_series(node, range(gpus[0], gpus[0] + 1), EPOCH + 3600, 35, 1))
    run = gitsched("telemetry", "ingest", series, "--repo", repo.path, "--format", "json")
    (flag,) = json.loads(run.stdout)["suspended"]
    assert flag["job"] == WORKSPACE_KEY
    return repo
