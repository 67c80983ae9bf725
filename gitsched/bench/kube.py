"""`gitsched bench kube`: from one git commit to every pod bound, on a real API server with kwok nodes.

Makes NODES fake 8-GPU nodes (kwok), commits jobs for about `--fill` of their
GPUs (half the pods in gangs of `--gang`, the rest single-pod jobs) to a fresh
cluster repo, and runs the daemon's own pass (cluster.Controller: reconcile,
solve, actuate, observe) until every pod is bound. Reports commit-to-all-bound,
pods bound per second, per-gang actuation latency (placement in the log to the
gang's last Binding) and the process's peak memory. kube-scheduler is not run
alongside (not built here): no ratio is claimed.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from cluster.api import KubeApi
from cluster.controller import Controller
from cluster.inventory import InventoryConfig
from cluster.pods import SELECTOR
from eventlog.sqlite import SQLiteEventLog
from gitsched.options import format_option, user_errors
from gitsched.render import table
from reconciler.git import GitRepo
from reconciler.loop import Reconciler

RUN_LABEL = "gitsched.io/bench-run"
GPUS_PER_NODE = 8


@dataclass
class KubeResult:
    nodes: int
    jobs: int
    gangs: int
    pods: int
    commit_to_all_bound_s: float
    pods_bound_per_s: float
    actuation_p50_s: float
    actuation_p99_s: float
    peak_rss_mib: float
    passes: int


def _doc(kind: str, name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"apiVersion": "gitsched.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec},
        sort_keys=False,
    )


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            *args,
        ],
        check=True,
        capture_output=True,
    )


def _repo(root: Path, team: str, nodes: int, pods: int, gang: int) -> tuple[int, int]:
    """The cluster repo, committed: (jobs, gangs)."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    (root / "cluster.yaml").write_text(
        _doc(
            "Cluster",
            "bench",
            {
                "topologyLevels": ["rack"],
                "gpuFlavors": [{"name": "h100-80g", "model": "H100", "memoryGiB": 80}],
                "priorityClasses": [{"name": "normal", "value": 500}],
                "defaultPriorityClass": "normal",
            },
        )
    )
    (root / "policies").mkdir()
    (root / "policies" / "default.yaml").write_text(
        _doc("Policy", "default", {"solver": {"name": "greedy"}})
    )
    teams = root / "teams" / team
    (teams / "jobs").mkdir(parents=True)
    quota = nodes * GPUS_PER_NODE
    (teams / "queue.yaml").write_text(
        _doc("Queue", team, {"quotas": [{"flavor": "h100-80g", "nominal": quota}]})
    )
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "bench: the cluster (nodes from Kubernetes)")
    gangs = (pods // 2) // gang
    singles = pods - gangs * gang
    template = {"spec": {"containers": [{"name": "main", "image": "registry.example/bench:1"}]}}
    for i in range(gangs):
        spec = {"replicas": gang, "resources": {"gpu": GPUS_PER_NODE}, "template": template}
        (teams / "jobs" / f"gang-{i}.yaml").write_text(_doc("Job", f"gang-{i}", spec))
    for i in range(singles):
        spec = {"replicas": 1, "resources": {"gpu": GPUS_PER_NODE}, "template": template}
        (teams / "jobs" / f"single-{i}.yaml").write_text(_doc("Job", f"single-{i}", spec))
    return gangs + singles, gangs


def _node_body(name: str, run: str) -> dict[str, Any]:
    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "nvidia.com/gpu": str(GPUS_PER_NODE),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {RUN_LABEL: run, "type": "kwok", "nvidia.com/gpu.product": "H100"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(api: KubeApi, nodes: int, fill: float, gang: int, timeout_s: float) -> KubeResult:
    run = uuid.uuid4().hex[:8]
    team = f"bench-{run}"
    names = [f"bench-{run}-{i:05d}" for i in range(nodes)]
    pods = max(1, round(nodes * fill))
    api.ensure_namespace(team)
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: api.core.create_node(_node_body(n, run), _preload_content=False), names
            )
        )
    try:
        with tempfile.TemporaryDirectory(prefix="gitsched-bench-kube-") as tmp:
            root = Path(tmp) / "repo"
            jobs, gangs = _repo(root, team, nodes, pods, gang)
            with SQLiteEventLog(Path(tmp) / "log.db") as event_log:
                controller = Controller(
                    api,
                    event_log,
                    Reconciler(GitRepo(root), event_log),
                    inventory=InventoryConfig(node_selector=f"{RUN_LABEL}={run}"),
                    grace_period_s=0,
                )
                controller.start(timeout_s=120)
                try:
                    deadline = time.monotonic() + timeout_s
                    # The inventory first: every node registered and Ready in the log.
                    while True:
                        state = controller.step().state
                        if sum(1 for n in state.nodes.values() if n.schedulable) >= nodes:
                            break
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"only {len(state.nodes)} of {nodes} nodes Ready")
                        time.sleep(0.2)
                    _git(root, "add", "-A")
                    _git(root, "commit", "-q", "-m", f"bench: {jobs} jobs, {pods} pods")
                    committed = time.monotonic()
                    bound, passes = 0, 0
                    latencies: list[float] = []
                    last_bind = committed
                    while bound < pods:
                        report = controller.step()
                        passes += 1
                        bound += report.actuation.bound
                        for at in report.actuation.bound_at.values():
                            latencies.append(at - report.decided_at)
                            last_bind = max(last_bind, at)
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"only {bound} of {pods} pods bound")
                finally:
                    controller.stop()
        elapsed = last_bind - committed
        return KubeResult(
            nodes=nodes,
            jobs=jobs,
            gangs=gangs,
            pods=pods,
            commit_to_all_bound_s=round(elapsed, 3),
            pods_bound_per_s=round(pods / elapsed, 1) if elapsed else 0.0,
            actuation_p50_s=round(statistics.median(latencies), 3) if latencies else 0.0,
            actuation_p99_s=round(_percentile(latencies, 0.99), 3),
            peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            passes=passes,
        )
    finally:
        _clean(api, team, names)


def _clean(api: KubeApi, team: str, names: list[str]) -> None:
    listed = api.list("pods", SELECTOR)
    mine = [p for p in listed.items if p["metadata"]["namespace"] == team]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda p: api.delete_pod(team, p["metadata"]["name"], p["metadata"]["uid"], 0), mine
            )
        )
        list(pool.map(lambda n: api.core.delete_node(n, _preload_content=False), names))


@click.command()
@click.option(
    "--kubeconfig",
    envvar="GITSCHED_KUBECONFIG",
    show_envvar=True,
    required=True,
    help="A cluster running kwok (scripts/kube up prints one).",
)
@click.option(
    "--nodes",
    "sizes",
    type=int,
    multiple=True,
    default=(1000,),
    show_default=True,
    help="Fake 8-GPU nodes; repeat for several runs.",
)
@click.option("--fill", default=0.9, show_default=True, help="Pods per node (one 8-GPU pod each).")
@click.option("--gang", default=4, show_default=True, help="Replicas per gang (half the pods).")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True)
@format_option("text", "json")
def command(
    kubeconfig: str, sizes: tuple[int, ...], fill: float, gang: int, timeout_s: float, fmt: str
) -> None:
    """Commit to every pod bound on kwok nodes: latency, pods/s, memory."""
    with user_errors():
        api = KubeApi.connect(kubeconfig)
        results = [measure(api, n, fill, gang, timeout_s) for n in sizes]
    if fmt == "json":
        click.echo(json.dumps([asdict(r) for r in results], indent=2))
        return
    headers = [
        "NODES",
        "JOBS",
        "GANGS",
        "PODS",
        "COMMIT->ALL BOUND s",
        "PODS/s",
        "P50 s",
        "P99 s",
        "PEAK RSS MiB",
    ]
    rows = [
        [
            str(r.nodes),
            str(r.jobs),
            str(r.gangs),
            str(r.pods),
            f"{r.commit_to_all_bound_s:.2f}",
            f"{r.pods_bound_per_s:.0f}",
            f"{r.actuation_p50_s:.3f}",
            f"{r.actuation_p99_s:.3f}",
            f"{r.peak_rss_mib:.0f}",
        ]
        for r in results
    ]
    click.echo(table(headers, rows))
