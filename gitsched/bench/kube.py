"""`gitsched bench kube`: from one git commit to every pod bound, on a real API server with kwok nodes.

Makes NODES fake 8-GPU nodes (kwok), commits jobs for about `--fill` of their
GPUs (half the pods in gangs of `--gang`, the rest single-pod jobs) to a fresh
cluster repo, and runs the daemon's own pass (cluster.Controller: reconcile,
solve, actuate, observe) until every pod is bound. Reports commit-to-all-bound,
pods bound per second, per-gang actuation latency (placement in the log to the
gang's last Binding) and the process's peak memory.

With `--kube-scheduler BINARY` (`scripts/kube build-scheduler` prints one), the
same run then deletes gitsched's pods and has kube-scheduler bind the same
number of the same pods on the same nodes: created directly (no gate,
`schedulerName: default-scheduler`, gangs as loose pods, since it has none),
from the first create to the last pod seen bound; its peak memory is its
process's VmHWM. The ratio is gitsched's pods/s over kube-scheduler's.

`--scenario gang-burst` and `--scenario starvation` run pods that end after
`--run-seconds` instead (gitsched/bench/kube_scenarios.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import signal
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from gitsched.bench import kube_scenarios
from gitsched.bench.kube_scenarios import (
    GPUS_PER_NODE,
    RUN_LABEL,
    bench_git,
    node_body,
    spec_doc,
)
from gitsched.cluster.api import ClusterUnavailable, KubeApi, Obj, WatchExpired, release
from gitsched.cluster.controller import Controller
from gitsched.cluster.inventory import InventoryConfig
from gitsched.cluster.pods import SELECTOR
from gitsched.engine.placement.plan import OutcomeStatus
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.options import fail, format_option, user_errors
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.render import table

# The actuator's own pool size: the kube-scheduler run creates its pods as fast.
CREATE_WORKERS = 24


@dataclass
class KubeResult:
    solver: str  # the solver that placed the jobs (the Policy's default unless --solver)
    nodes: int
    jobs: int
    gangs: int
    pods: int
    commit_to_all_bound_s: float
    # of which: the commit to its placements in the log (reading the job files, the
    # solve, appending), and the solve alone
    commit_to_decided_s: float
    solve_s: float
    pods_bound_per_s: float
    actuation_p50_s: float
    actuation_p99_s: float
    peak_rss_mib: float
    passes: int
    kube_scheduler: SchedulerResult | None = None
    # Running jobs gitsched's solves moved, and the work they lost since their checkpoints.
    moved: int = 0
    lost_gpu_hours: float = 0.0
    # gitsched's pods/s over kube-scheduler's (above 1: gitsched binds faster)
    pods_per_s_ratio: float | None = None


@dataclass
class SchedulerResult:
    """kube-scheduler binding the same pods: created directly, first create to last bound."""

    pods: int
    create_s: float  # creating every pod (our client, CREATE_WORKERS threads)
    first_create_to_all_bound_s: float
    pods_bound_per_s: float
    latency_p50_s: float  # per pod: its create sent to it seen bound
    latency_p99_s: float
    peak_rss_mib: float  # the kube-scheduler process's VmHWM
    ready_s: float  # its start to /readyz ok (not counted above)


def _repo(
    root: Path, team: str, nodes: int, pods: int, gang: int, solver: str | None = None
) -> tuple[int, int]:
    """The cluster repo, committed: (jobs, gangs). No Policy unless `solver` is named:
    the product's defaults are what is measured."""
    root.mkdir(parents=True)
    bench_git(root, "init", "-q", "-b", "main")
    (root / "cluster.yaml").write_text(
        spec_doc(
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
    if solver is not None:
        (root / "policies").mkdir()
        (root / "policies" / "default.yaml").write_text(
            spec_doc("Policy", "default", {"solver": {"name": solver}})
        )
    teams = root / "teams" / team
    (teams / "jobs").mkdir(parents=True)
    quota = nodes * GPUS_PER_NODE
    (teams / "queue.yaml").write_text(
        spec_doc("Queue", team, {"quotas": [{"flavor": "h100-80g", "nominal": quota}]})
    )
    bench_git(root, "add", "-A")
    bench_git(root, "commit", "-q", "-m", "bench: the cluster (nodes from Kubernetes)")
    gangs = (pods // 2) // gang
    singles = pods - gangs * gang
    template = {"spec": {"containers": [{"name": "main", "image": "registry.example/bench:1"}]}}
    for i in range(gangs):
        spec = {"replicas": gang, "resources": {"gpu": GPUS_PER_NODE}, "template": template}
        (teams / "jobs" / f"gang-{i}.yaml").write_text(spec_doc("Job", f"gang-{i}", spec))
    for i in range(singles):
        spec = {"replicas": 1, "resources": {"gpu": GPUS_PER_NODE}, "template": template}
        (teams / "jobs" / f"single-{i}.yaml").write_text(spec_doc("Job", f"single-{i}", spec))
    return gangs + singles, gangs


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    api: KubeApi,
    nodes: int,
    fill: float,
    gang: int,
    timeout_s: float,
    scheduler: SchedulerProcess | None = None,
    solver: str | None = None,
) -> KubeResult:
    run = uuid.uuid4().hex[:8]
    team = f"bench-{run}"
    names = [f"bench-{run}-{i:05d}" for i in range(nodes)]
    pods = max(1, round(nodes * fill))
    api.ensure_namespace(team)
    try:
        # Inside the try: an interrupt while they are made still deletes those made.
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda n: release(
                        api.core.create_node(node_body(n, run), _preload_content=False)
                    ),
                    names,
                )
            )
        result = _gitsched_run(api, team, run, nodes, pods, gang, timeout_s, solver)
        # Nodes free again before kube-scheduler's turn: its pods must fit where gitsched's were.
        _delete_pods(api, team, SELECTOR, timeout_s)
        if scheduler is not None:
            result.kube_scheduler = _scheduler_run(api, scheduler, run, pods, timeout_s)
            if result.kube_scheduler.pods_bound_per_s:
                result.pods_per_s_ratio = round(
                    result.pods_bound_per_s / result.kube_scheduler.pods_bound_per_s, 2
                )
        return result
    finally:
        _delete_pods(api, team, SELECTOR, timeout_s)
        _delete_pods(api, f"{team}-ks", f"{RUN_LABEL}={run}", timeout_s)
        made = [n["metadata"]["name"] for n in api.list("nodes", f"{RUN_LABEL}={run}").items]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: release(api.core.delete_node(n, _preload_content=False)), made))


def _gitsched_run(
    api: KubeApi,
    team: str,
    run: str,
    nodes: int,
    pods: int,
    gang: int,
    timeout_s: float,
    solver: str | None = None,
) -> KubeResult:
    with tempfile.TemporaryDirectory(prefix="gitsched-bench-kube-") as tmp:
        root = Path(tmp) / "repo"
        jobs, gangs = _repo(root, team, nodes, pods, gang, solver)
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
                bench_git(root, "add", "-A")
                bench_git(root, "commit", "-q", "-m", f"bench: {jobs} jobs, {pods} pods")
                committed = time.monotonic()
                bound, passes = 0, 0
                used, solve_s, decided = "", 0.0, 0.0
                moved, lost_s = 0, 0.0
                latencies: list[float] = []
                last_bind = committed
                while bound < pods:
                    report = controller.step()
                    passes += 1
                    if report.reconcile is not None and report.reconcile.plan is not None:
                        used = used or report.reconcile.plan.stats.solver
                        solve_s += report.reconcile.plan.stats.seconds
                        for o in report.reconcile.plan.outcomes:
                            if o.status is OutcomeStatus.MOVED:
                                moved += 1
                                lost_s += o.lost_gpu_seconds
                        decided = decided or report.decided_at - committed
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
        solver=used,
        nodes=nodes,
        jobs=jobs,
        gangs=gangs,
        pods=pods,
        commit_to_all_bound_s=round(elapsed, 3),
        commit_to_decided_s=round(decided, 3),
        solve_s=round(solve_s, 3),
        moved=moved,
        lost_gpu_hours=round(lost_s / 3600, 3),
        pods_bound_per_s=round(pods / elapsed, 1) if elapsed else 0.0,
        actuation_p50_s=round(statistics.median(latencies), 3) if latencies else 0.0,
        actuation_p99_s=round(_percentile(latencies, 0.99), 3),
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        passes=passes,
    )


class SchedulerProcess:
    """kube-scheduler, started for one run against the bench's API server and stopped after it.

    Leader election off (one replica), its own port for /readyz, default
    configuration otherwise: its client's QPS 50 and burst 100 (what a cluster
    runs, and what caps its binds per second) unless `qps` raises them.
    """

    def __init__(self, binary: str, kubeconfig: str, qps: int | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.qps = qps
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Any = None

    def start(self, timeout_s: float = 60.0) -> float:
        """Start it and wait until it is ready: the seconds that took."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Open for the process's life (its output), closed in stop().
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                *(
                    [f"--kube-api-qps={self.qps}", f"--kube-api-burst={2 * self.qps}"]
                    if self.qps
                    else []
                ),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        # Its serving certificate is self-signed, made at start-up.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        while True:
            if self.proc.poll() is not None:
                message = f"kube-scheduler exited with {self.proc.returncode}: {self._tail()}"
                self.stop()
                raise click.ClickException(message)
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=insecure, timeout=2
                ) as resp:
                    if resp.read().strip() == b"ok":
                        return time.monotonic() - started
            except OSError:
                pass
            if time.monotonic() - started > timeout_s:
                self.stop()
                raise click.ClickException(f"kube-scheduler not ready in {timeout_s}s")
            time.sleep(0.1)

    def peak_rss_mib(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def _tail(self) -> str:
        self.log.seek(0)
        return str(self.log.read().decode(errors="replace")[-2000:])


class _BindWatch:
    """When each pod of the run was first seen bound (spec.nodeName set), from a watch."""

    def __init__(self, api: KubeApi, selector: str) -> None:
        self.api = api
        self.selector = selector
        self.bound: dict[str, float] = {}
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._rv = api.list("pods", selector).resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _see(self, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if pod.get("spec", {}).get("nodeName") and name not in self.bound:
            with self.changed:
                self.bound[name] = time.monotonic()
                self.changed.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for kind, pod in self.api.watch("pods", self._rv, self.selector, timeout_s=30):
                    self._rv = pod.get("metadata", {}).get("resourceVersion") or self._rv
                    if kind in ("ADDED", "MODIFIED"):
                        self._see(pod)
                    if self._stop.is_set():
                        return
            except WatchExpired:
                listed = self.api.list("pods", self.selector)
                for pod in listed.items:
                    self._see(pod)
                self._rv = listed.resource_version
            except ClusterUnavailable:
                self._stop.wait(0.5)

    def wait_for(self, names: list[str], deadline: float) -> None:
        with self.changed:
            while not all(n in self.bound for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    done = sum(1 for n in names if n in self.bound)
                    raise TimeoutError(f"kube-scheduler bound only {done} of {len(names)} pods")
                self.changed.wait(min(left, 1.0))

    def stop(self) -> None:
        self._stop.set()


def _plain_pod(namespace: str, name: str, run: str) -> Obj:
    gpus = str(GPUS_PER_NODE)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: run}},
        "spec": {
            "schedulerName": "default-scheduler",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/bench:1",
                    "resources": {
                        "requests": {"nvidia.com/gpu": gpus},
                        "limits": {"nvidia.com/gpu": gpus},
                    },
                }
            ],
        },
    }


def _scheduler_run(
    api: KubeApi, scheduler: SchedulerProcess, run: str, pods: int, timeout_s: float
) -> SchedulerResult:
    namespace = f"bench-{run}-ks"
    api.ensure_namespace(namespace)
    ready_s = scheduler.start()
    try:
        watch = _BindWatch(api, f"{RUN_LABEL}={run}")
        try:
            names = [f"ks-{i:05d}" for i in range(pods)]
            created: dict[str, float] = {}

            def create(name: str) -> None:
                # From the request sent: on a busy machine the watch may see the pod bound
                # before this thread hears its create answered (a latency below zero).
                sent = time.monotonic()
                if api.create_pod(namespace, _plain_pod(namespace, name, run)) is None:
                    raise click.ClickException(f"pod {namespace}/{name} exists already")
                created[name] = sent

            first = time.monotonic()
            with ThreadPoolExecutor(CREATE_WORKERS) as pool:
                list(pool.map(create, names))
            create_s = time.monotonic() - first
            watch.wait_for(names, first + timeout_s)
            bound = dict(watch.bound)
        finally:
            watch.stop()
        peak = scheduler.peak_rss_mib()
    finally:
        scheduler.stop()
    elapsed = max(bound[n] for n in names) - first
    latencies = [bound[n] - created[n] for n in names]
    return SchedulerResult(
        pods=pods,
        create_s=round(create_s, 3),
        first_create_to_all_bound_s=round(elapsed, 3),
        pods_bound_per_s=round(pods / elapsed, 1) if elapsed else 0.0,
        latency_p50_s=round(statistics.median(latencies), 3),
        latency_p99_s=round(_percentile(latencies, 0.99), 3),
        peak_rss_mib=peak,
        ready_s=round(ready_s, 3),
    )


@contextlib.contextmanager
def _timeouts() -> Iterator[None]:
    """A scenario past --timeout (its nodes and pods deleted already): one line, exit 2."""
    try:
        yield
    except TimeoutError as e:
        fail(f"bench kube: {e}")


def _scenario(
    api: KubeApi,
    scenario: str,
    nodes: int,
    run_s: float,
    rounds: int,
    seed: int,
    limit_minutes: int,
    gang_pods: int,
    stream_s: float,
    waves: int,
    reservations: int | None,
    solver: str | None,
    timeout_s: float,
    keep_log: Path | None = None,
) -> dict[str, Any]:
    if limit_minutes * 60 <= run_s:
        raise click.BadParameter(
            f"{limit_minutes} min is not more than the run time of {run_s:g} s: "
            "every job would reach its limit",
            param_hint="--time-limit-minutes",
        )
    if scenario == "gang-burst":
        return asdict(
            kube_scenarios.gang_burst(
                api,
                nodes,
                rounds,
                run_s,
                limit_minutes,
                seed,
                timeout_s,
                reservations,
                solver,
                keep_log,
            )
        )
    if gang_pods > nodes:
        raise click.BadParameter(
            f"a gang of {gang_pods} 8-GPU pods does not fit on {nodes} nodes",
            param_hint="--gang-pods",
        )
    return asdict(
        kube_scenarios.starvation(
            api,
            nodes,
            gang_pods,
            run_s,
            limit_minutes,
            stream_s,
            waves,
            timeout_s,
            reservations,
            solver,
            keep_log,
        )
    )


def _delete_pods(api: KubeApi, namespace: str, selector: str, timeout_s: float) -> None:
    """Delete the namespace's pods at once (grace 0) and wait until the API has none left."""
    deadline = time.monotonic() + timeout_s
    while True:
        mine = [
            p for p in api.list("pods", selector).items if p["metadata"]["namespace"] == namespace
        ]
        if not mine:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(mine)} pods of {namespace} not deleted in {timeout_s}s")
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda p: api.delete_pod(
                        namespace, p["metadata"]["name"], p["metadata"]["uid"], 0
                    ),
                    mine,
                )
            )


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
    help="Fake 8-GPU nodes; repeat for several runs (bind only). "
    "Default: 1000 (bind), 8 (gang-burst, starvation).",
)
@click.option(
    "--scenario",
    type=click.Choice(["bind", *kube_scenarios.SCENARIOS]),
    default="bind",
    show_default=True,
    help="bind: commit to every pod bound (pods never end); gang-burst: a burst of gangs "
    "that packs the cluster, makespan against its lower bound; starvation: a gang behind "
    "a stream of 1-GPU jobs, its wait against its reservation.",
)
@click.option(
    "--run-seconds",
    "run_s",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Scenarios: how long each pod runs (from seen Running to its end).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="gang-burst: rounds of gangs, each a partition of the nodes.",
)
@click.option("--seed", default=1, show_default=True, help="gang-burst: the gang sizes' seed.")
@click.option(
    "--time-limit-minutes",
    "limit_minutes",
    type=click.IntRange(min=1),
    default=None,
    help="Scenarios: every job's timeLimitMinutes; default: 3 x the run time, rounded up.",
)
@click.option(
    "--gang-pods",
    "gang_pods",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="starvation: the gang's 8-GPU pods.",
)
@click.option(
    "--stream-seconds",
    "stream_s",
    type=click.FloatRange(min=0),
    default=None,
    help="starvation: how long 1-GPU jobs keep coming after the gang; default: 3 x run time.",
)
@click.option(
    "--waves",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="starvation: fill commits over one run time; then a stream commit as often.",
)
@click.option(
    "--reservations",
    type=click.IntRange(min=0),
    default=None,
    help="Scenarios: the Policy's backfill.reservations (0: off); default: no Policy, the built-in.",
)
@click.option("--fill", default=0.9, show_default=True, help="Pods per node (one 8-GPU pod each).")
@click.option("--gang", default=4, show_default=True, help="Replicas per gang (half the pods).")
@click.option(
    "--kube-scheduler",
    "kube_scheduler",
    envvar="GITSCHED_BENCH_KUBE_SCHEDULER",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A kube-scheduler binary (scripts/kube build-scheduler prints one): "
    "it binds the same pods after gitsched, for a ratio.",
)
@click.option(
    "--kube-scheduler-qps",
    "kube_scheduler_qps",
    type=click.IntRange(min=1),
    default=None,
    help="kube-scheduler's --kube-api-qps (burst twice that); default: its own (50).",
)
@click.option(
    "--solver",
    default=None,
    help="Pin the Policy's solver (greedy, highs, cbc, cpsat); default: no Policy, the product's default.",
)
@click.option(
    "--keep-log",
    "keep_log",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Scenarios: keep the run's event log in this SQLite file (a new one), to read"
    " with `gitsched audit` or `gitsched log`; default: a temporary file.",
)
@click.option("--timeout", "timeout_s", default=600.0, show_default=True)
@format_option("text", "json")
def command(
    kubeconfig: str,
    sizes: tuple[int, ...],
    scenario: str,
    run_s: float,
    rounds: int,
    seed: int,
    limit_minutes: int | None,
    gang_pods: int,
    stream_s: float | None,
    waves: int,
    reservations: int | None,
    fill: float,
    gang: int,
    kube_scheduler: str | None,
    kube_scheduler_qps: int | None,
    solver: str | None,
    timeout_s: float,
    fmt: str,
    keep_log: Path | None = None,
) -> None:
    """Commit to every pod bound on kwok nodes: latency, pods/s, memory; beside kube-scheduler.

    With --scenario gang-burst or starvation, pods end after --run-seconds: a burst's
    makespan against its lower bound, a gang's wait behind a stream against its reservation.
    """
    if scenario != "bind":
        if keep_log is not None and keep_log.exists():
            raise click.BadParameter(f"{keep_log} exists: name a new file", param_hint="--keep-log")
        if kube_scheduler:
            raise click.BadParameter(
                "kube-scheduler has no gangs and no time limits: only the bind scenario "
                "compares with it",
                param_hint="--kube-scheduler",
            )
        with user_errors(), _timeouts():
            figures = _scenario(
                KubeApi.connect(kubeconfig),
                scenario,
                sizes[0] if sizes else 8,
                run_s,
                rounds,
                seed,
                limit_minutes or math.ceil(3 * run_s / 60),
                gang_pods,
                3 * run_s if stream_s is None else stream_s,
                waves,
                reservations,
                solver,
                timeout_s,
                keep_log,
            )
        if fmt == "json":
            click.echo(json.dumps(figures, indent=2))
        else:
            # The gang's reason names every job its reservation waits for: JSON has it whole.
            figure_rows = [
                [k, str(v) if len(str(v)) <= 100 else str(v)[:99] + "…"] for k, v in figures.items()
            ]
            click.echo(table(["FIGURE", "VALUE"], figure_rows))
        return
    sizes = sizes or (1000,)
    with user_errors():
        api = KubeApi.connect(kubeconfig)
        scheduler = (
            SchedulerProcess(kube_scheduler, kubeconfig, kube_scheduler_qps)
            if kube_scheduler
            else None
        )
        results = [measure(api, n, fill, gang, timeout_s, scheduler, solver) for n in sizes]
    if fmt == "json":
        click.echo(json.dumps([asdict(r) for r in results], indent=2))
        return
    headers = [
        "NODES",
        "PODS",
        "SCHEDULER",
        "TO ALL BOUND s",
        "OF WHICH DECIDING s",
        "PODS/s",
        "P50 s",
        "P99 s",
        "PEAK RSS MiB",
        "RATIO",
    ]
    rows: list[list[str]] = []
    for r in results:
        rows.append(
            [
                str(r.nodes),
                str(r.pods),
                f"gitsched, {r.solver} ({r.jobs} jobs, {r.gangs} gangs)",
                f"{r.commit_to_all_bound_s:.2f}",
                f"{r.commit_to_decided_s:.2f} (solve {r.solve_s:.2f})",
                f"{r.pods_bound_per_s:.0f}",
                f"{r.actuation_p50_s:.3f}",
                f"{r.actuation_p99_s:.3f}",
                f"{r.peak_rss_mib:.0f}",
                f"{r.pods_per_s_ratio:.2f}" if r.pods_per_s_ratio is not None else "-",
            ]
        )
        k = r.kube_scheduler
        if k is not None:
            rows.append(
                [
                    str(r.nodes),
                    str(k.pods),
                    "kube-scheduler",
                    f"{k.first_create_to_all_bound_s:.2f}",
                    "-",
                    f"{k.pods_bound_per_s:.0f}",
                    f"{k.latency_p50_s:.3f}",
                    f"{k.latency_p99_s:.3f}",
                    f"{k.peak_rss_mib:.0f}",
                    "1.00",
                ]
            )
    click.echo(table(headers, rows))
