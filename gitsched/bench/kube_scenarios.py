"""`gitsched bench kube --scenario gang-burst|starvation`: scheduling over time on a real API server.

The default scenario of `bench kube` binds pods that never end. These two let pods run for
a fixed time and end (kwok's `gitsched-test-pod-succeeded` stage from scripts/kube, which
the bench triggers `--run-seconds` after each pod is seen Running), so the daemon's pass
(cluster.Controller) places, starts, sees finishes and places again, as `serve` does:

- gang-burst: gangs of mixed sizes whose best schedule fills the cluster exactly in a known
  number of rounds, committed in one commit: makespan against the lower bound (pod-seconds
  over GPU capacity), mean GPU occupancy, and, after every pass, that no gang is partly bound.
- starvation: a cluster filled with 1-GPU jobs in staggered waves, a multi-node gang
  committed then, a stream of more 1-GPU jobs after it: the gang's wait and its reservation.
"""

from __future__ import annotations

import logging
import random
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import KubeApi, Obj, WatchExpired, release
from gitsched.cluster.controller import Controller
from gitsched.cluster.inventory import InventoryConfig
from gitsched.cluster.pods import JOB_ANNOTATION, PLACEMENT_LABEL, SELECTOR
from gitsched.engine import events as ev
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode
from gitsched.eventlog.replay import replay
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler

SCENARIOS = ("gang-burst", "starvation")
RUN_LABEL = "gitsched.io/bench-run"
GPUS_PER_NODE = 8
# scripts/kube's kwok stage: a Running pod with this annotation ends Succeeded.
OUTCOME_ANNOTATION = "gitsched.io/test-outcome"
PASS_PAUSE_S = 0.2  # between the daemon's passes (serve waits up to --poll-seconds)

log = logging.getLogger("gitsched.bench")


@dataclass
class GangBurstResult:
    scenario: str
    solver: str  # the Policy's default unless --solver
    nodes: int
    gpus: int
    jobs: int
    pods: int
    rounds: int  # the number of rounds the best schedule needs (each fills the cluster)
    gang_sizes_pods: list[int]
    run_s: float  # how long every pod runs, from seen Running to its end
    time_limit_minutes: int
    makespan_s: float  # the commit to the last pod seen Succeeded
    lower_bound_s: float  # total pod GPU-seconds / cluster GPUs
    makespan_ratio: float
    mean_gpu_occupancy: float  # GPU-seconds bound over GPU capacity x makespan
    passes: int
    # after each pass, gangs with some but not all of their pods bound (0: never)
    partly_bound_gangs: int
    # the longest time between a gang's first and last pod seen bound (one pass's binds)
    max_gang_bind_spread_s: float
    jobs_finished: int
    jobs_timed_out: int
    pods_deleted: int  # preempted or stopped pods (none expected)
    # every JobPreempted in the log: "job: rule (reason)"
    preemptions: list[str] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)  # running jobs placed elsewhere


@dataclass
class StarvationResult:
    scenario: str
    solver: str
    nodes: int
    gpus: int
    gang_pods: int
    run_s: float
    time_limit_minutes: int
    fill_jobs: int
    stream_jobs: int
    # all from the gang's commit
    gang_wait_s: float  # to its placement (PlacementDecided.at)
    gang_all_bound_s: float  # to its last pod seen bound
    first_reservation_start_s: float | None  # the start its first reservation named
    # the gang's start minus that reservation's start (below 0: it started earlier)
    start_minus_reservation_s: float | None
    stream_end_s: float  # the last stream commit
    started_before_stream_end: bool
    gang_reason: str  # its first pending reason
    makespan_s: float
    passes: int
    partly_bound_gangs: int
    jobs_finished: int
    jobs_timed_out: int
    reservations_policy: int | None  # backfill.reservations in the Policy; None: the built-in
    preemptions: list[str] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)  # running jobs placed elsewhere


@dataclass
class _Pod:
    job: str
    gpus: int
    placement: str = ""  # a moved or preempted job's next pods are another placement's
    bound_at: float | None = None
    running_at: float | None = None
    ended_at: float | None = None
    deleted_at: float | None = None  # preempted or stopped at its limit: it ends no other way
    end_asked: bool = False

    @property
    def over(self) -> bool:
        return self.ended_at is not None or self.deleted_at is not None


class _PodClock:
    """Each pod of the run, from a watch: when it was bound, Running and Succeeded; and ends
    every pod `run_s` after it is seen Running (the kwok stage's annotation)."""

    def __init__(self, api: KubeApi, namespace: str, run_s: float) -> None:
        self.api = api
        self.namespace = namespace
        self.run_s = run_s
        self.pods: dict[str, _Pod] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._rv = api.list("pods", SELECTOR).resource_version
        self._threads = [
            threading.Thread(target=self._watch, daemon=True),
            threading.Thread(target=self._ender, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _see(self, pod: Obj, deleted: bool = False) -> None:
        meta = pod["metadata"]
        if meta.get("namespace") != self.namespace:
            return
        now = time.time()
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        gpus = sum(
            int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", 0))
            for c in spec.get("containers") or []
        )
        job = (meta.get("annotations") or {}).get(JOB_ANNOTATION, "")
        placement = (meta.get("labels") or {}).get(PLACEMENT_LABEL, "")
        with self.lock:
            seen = self.pods.setdefault(meta["name"], _Pod(job, gpus, placement))
            if spec.get("nodeName") and seen.bound_at is None:
                seen.bound_at = now
            if phase in ("Running", "Succeeded") and seen.running_at is None:
                seen.running_at = now
            if phase == "Succeeded" and seen.ended_at is None:
                seen.ended_at = now
            if deleted and seen.deleted_at is None:
                seen.deleted_at = now

    def _watch(self) -> None:
        # The clock must never go blind: a pod it stops seeing never ends, and the run
        # waits out its timeout. Whatever ends a watch, it lists again and goes on.
        while not self._stop.is_set():
            try:
                if not self._rv:
                    listed = self.api.list("pods", SELECTOR)
                    for pod in listed.items:
                        self._see(pod)
                    self._rv = listed.resource_version
                for kind, pod in self.api.watch("pods", self._rv, SELECTOR, timeout_s=30):
                    self._rv = pod.get("metadata", {}).get("resourceVersion") or self._rv
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._see(pod, deleted=kind == "DELETED")
                    if self._stop.is_set():
                        return
            except WatchExpired:
                self._rv = ""
            except Exception as e:  # any failure: back off, list, watch again
                log.warning("bench pod clock: %s; listing again", e)
                self._rv = ""
                self._stop.wait(0.5)

    def _ender(self) -> None:
        body = {"metadata": {"annotations": {OUTCOME_ANNOTATION: "succeeded"}}}
        while not self._stop.wait(0.1):
            now = time.time()
            with self.lock:
                due = [
                    name
                    for name, p in self.pods.items()
                    if not p.end_asked
                    and p.running_at is not None
                    and now >= p.running_at + self.run_s
                ]
                for name in due:
                    self.pods[name].end_asked = True
            for name in due:
                try:
                    release(
                        self.api.core.patch_namespaced_pod(
                            name,
                            self.namespace,
                            body,
                            _preload_content=False,
                            _request_timeout=10,
                        )
                    )
                except ApiException as e:
                    if e.status != 404:  # 404: deleted meanwhile, nothing to end
                        self._retry(name, e)
                except Exception as e:  # a timeout, a dropped connection
                    self._retry(name, e)

    def _retry(self, name: str, error: Exception) -> None:
        """Ask again on the next tick: a pod whose end was lost would run to its limit."""
        log.warning("bench pod clock: ending pod %s: %s; retrying", name, error)
        with self.lock:
            self.pods[name].end_asked = False

    def progress(self) -> str:
        """What the pods are doing, for a run that ran out of time."""
        with self.lock:
            pods = list(self.pods.values())
        waiting = sum(1 for p in pods if p.bound_at is None and not p.over)
        running = [p for p in pods if p.running_at is not None and not p.over]
        late = sum(1 for p in running if p.end_asked)
        bound = sum(1 for p in pods if p.bound_at is not None and p.running_at is None)
        return (
            f"pods: {len(pods)} seen, {waiting} unbound, {bound} bound not Running, "
            f"{len(running)} Running ({late} asked to end), "
            f"{sum(1 for p in pods if p.ended_at)} Succeeded, "
            f"{sum(1 for p in pods if p.deleted_at and not p.ended_at)} deleted"
        )

    def snapshot(self) -> dict[str, _Pod]:
        with self.lock:
            return {k: _Pod(**vars(v)) for k, v in self.pods.items()}

    def stop(self) -> None:
        self._stop.set()


def spec_doc(kind: str, name: str, spec: dict[str, Any]) -> str:
    """A cluster-repo document of `kind` (the benches' job and queue files)."""
    return yaml.safe_dump(
        {"apiVersion": "gitsched.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec},
        sort_keys=False,
    )


def bench_git(root: Path, *args: str) -> str:
    """git in the bench's repo as its one author; its output."""
    return subprocess.run(
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
        text=True,
    ).stdout.strip()


def _job(replicas: int, gpus: int, limit_minutes: int) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "resources": {"gpu": gpus},
        "timeLimitMinutes": limit_minutes,
        "template": {
            "spec": {"containers": [{"name": "main", "image": "registry.example/bench:1"}]}
        },
    }


def _repo(root: Path, team: str, gpus: int, reservations: int | None, solver: str | None) -> Path:
    """The cluster repo with its first commit; returns the team's jobs folder. A Policy only
    for what the bench was asked to pin: the product's defaults are what is measured."""
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
    policy: dict[str, Any] = {}
    if solver is not None:
        policy["solver"] = {"name": solver}
    if reservations is not None:
        policy["backfill"] = {"reservations": reservations}
    if policy:
        (root / "policies").mkdir()
        (root / "policies" / "default.yaml").write_text(spec_doc("Policy", "default", policy))
    jobs = root / "teams" / team / "jobs"
    jobs.mkdir(parents=True)
    (root / "teams" / team / "queue.yaml").write_text(
        spec_doc("Queue", team, {"quotas": [{"flavor": "h100-80g", "nominal": gpus}]})
    )
    bench_git(root, "add", "-A")
    bench_git(root, "commit", "-q", "-m", "bench: the cluster (nodes from Kubernetes)")
    return jobs


def _commit(root: Path, message: str) -> tuple[float, str]:
    """Commit everything: (time.time() just after, the committer date)."""
    bench_git(root, "add", "-A")
    bench_git(root, "commit", "-q", "-m", message)
    return time.time(), bench_git(root, "log", "-1", "--format=%cI")


def node_body(name: str, run: str) -> dict[str, Any]:
    """A kwok node of 8 H100 GPUs, labelled with the bench run that made it."""
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


def gang_burst_sizes(nodes: int, rounds: int, seed: int) -> list[int]:
    """Gang sizes (8-GPU pods), each round a partition of the nodes, shuffled: the best
    schedule runs exactly `rounds` rounds, each filling every GPU."""
    rng = random.Random(seed)
    sizes: list[int] = []
    for _ in range(rounds):
        left = nodes
        while left:
            size = rng.randint(1, min(left, max(1, (3 * nodes) // 4)))
            sizes.append(size)
            left -= size
    rng.shuffle(sizes)
    return sizes


@dataclass
class _Run:
    """What one scenario's loop saw."""

    passes: int = 0
    solver: str = ""  # the solver that placed the jobs, as the plan says
    partly_bound: int = 0
    pods_deleted: int = 0
    states: list[Any] = field(default_factory=list)


def _partly_bound(api: KubeApi, namespace: str, replicas: dict[str, int]) -> int:
    """Gangs with some but not all of their pods bound, by a consistent LIST: per placement
    (a job placed again has new pods), leaving out gangs being stopped as a whole."""
    bound: dict[tuple[str, str], int] = {}
    leaving: set[tuple[str, str]] = set()
    for pod in api.list("pods", SELECTOR).items:
        meta = pod["metadata"]
        if meta["namespace"] != namespace:
            continue
        key = (
            (meta.get("annotations") or {}).get(JOB_ANNOTATION, ""),
            (meta.get("labels") or {}).get(PLACEMENT_LABEL, ""),
        )
        if meta.get("deletionTimestamp"):
            leaving.add(key)
        if (pod.get("spec") or {}).get("nodeName"):
            bound[key] = bound.get(key, 0) + 1
    return sum(
        1
        for key, n in bound.items()
        if key not in leaving and replicas.get(key[0], 1) > 1 and n != replicas[key[0]]
    )


def _drive(
    api: KubeApi,
    run: str,
    team: str,
    nodes: int,
    run_s: float,
    timeout_s: float,
    reservations: int | None,
    solver: str | None,
    scenario: Callable[[Controller, Path, Path, _PodClock, Callable[[], Any]], Any],
    keep_log: Path | None = None,
) -> Any:
    """Nodes, repo and daemon for one scenario run; everything made is deleted after, but
    the event log when `keep_log` names a file for it (to read what a run did)."""
    names = [f"bench-{run}-{i:05d}" for i in range(nodes)]
    api.ensure_namespace(team)
    try:
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda n: release(
                        api.core.create_node(node_body(n, run), _preload_content=False)
                    ),
                    names,
                )
            )
        with tempfile.TemporaryDirectory(prefix="gitsched-bench-kube-") as tmp:
            root = Path(tmp) / "repo"
            jobs = _repo(root, team, nodes * GPUS_PER_NODE, reservations, solver)
            with SQLiteEventLog(keep_log or Path(tmp) / "log.db") as event_log:
                controller = Controller(
                    api,
                    event_log,
                    Reconciler(GitRepo(root), event_log),
                    inventory=InventoryConfig(node_selector=f"{RUN_LABEL}={run}"),
                    grace_period_s=0,
                )
                controller.start(timeout_s=120)
                clock = _PodClock(api, team, run_s)
                try:
                    deadline = time.monotonic() + timeout_s
                    while True:
                        state = controller.step().state
                        if sum(1 for n in state.nodes.values() if n.schedulable) >= nodes:
                            break
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"only {len(state.nodes)} of {nodes} nodes Ready")
                        time.sleep(PASS_PAUSE_S)

                    def check_deadline() -> None:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"the {scenario.__name__} run took over {timeout_s}s; "
                                f"{_jobs_progress(event_log, team)}; {clock.progress()}"
                            )

                    result = scenario(controller, root, jobs, clock, check_deadline)
                    logged = [decode(e) for e in event_log.read(0)]
                    result.preemptions = [
                        f"{e.job}: {e.rule} ({e.reason})"
                        for e in logged
                        if isinstance(e, ev.JobPreempted)
                    ]
                    result.moves = [
                        f"{e.job}: {e.rule} ({e.reason})"
                        for e in logged
                        if isinstance(e, ev.PlacementDecided) and e.action == "moved"
                    ]
                    return result
                finally:
                    clock.stop()
                    controller.stop()
    finally:
        _delete_all(api, team, run, timeout_s)


def _delete_all(api: KubeApi, team: str, run: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        mine = [p for p in api.list("pods", SELECTOR).items if p["metadata"]["namespace"] == team]
        if not mine or time.monotonic() > deadline:
            break
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda p: api.delete_pod(team, p["metadata"]["name"], p["metadata"]["uid"], 0),
                    mine,
                )
            )
    made = [n["metadata"]["name"] for n in api.list("nodes", f"{RUN_LABEL}={run}").items]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: release(api.core.delete_node(n, _preload_content=False)), made))


def _seconds(a: str, b: str) -> float:
    """b - a, two log or git times."""
    return (
        datetime.fromisoformat(b.replace("Z", "+00:00"))
        - datetime.fromisoformat(a.replace("Z", "+00:00"))
    ).total_seconds()


def _jobs_progress(event_log: EventLog, team: str) -> str:
    """The run's jobs as the daemon's log has them, for a run that ran out of time."""
    state = replay(event_log).state
    mine = [j for j in state.jobs if j.startswith(f"{team}/")]
    pending = [j for j in mine if j in state.pending]
    running = [j for j in mine if j in state.placements]
    ended = [j for j in state.ended if j.startswith(f"{team}/")]
    said = "; ".join(f"{j}: {state.pending[j].reason}" for j in sorted(pending)[:3])
    return (
        f"jobs: {len(running)} running, {len(pending)} pending"
        + (f" ({said})" if said else "")
        + f", {len(ended)} ended"
    )


def _step(controller: Controller, namespace: str, replicas: dict[str, int], seen: _Run) -> Any:
    """One pass of the daemon; then, its binds all answered, a LIST for partly bound gangs."""
    report = controller.step()
    seen.passes += 1
    if report.reconcile is not None and report.reconcile.plan is not None:
        seen.solver = seen.solver or report.reconcile.plan.stats.solver
    seen.pods_deleted += report.actuation.deleted
    seen.partly_bound += _partly_bound(controller.actuator.api, namespace, replicas)
    return report.state


def _occupancy(pods: dict[str, _Pod], start: float, end: float, gpus: int) -> float:
    busy = sum(
        p.gpus * max(0.0, min(p.ended_at or end, end) - max(p.bound_at, start))
        for p in pods.values()
        if p.bound_at is not None
    )
    return busy / (gpus * (end - start)) if end > start else 0.0


def _bind_spread(pods: dict[str, _Pod], replicas: dict[str, int]) -> float:
    by_job: dict[tuple[str, str], list[float]] = {}
    for p in pods.values():
        if p.bound_at is not None and replicas.get(p.job, 1) > 1:
            by_job.setdefault((p.job, p.placement), []).append(p.bound_at)
    return max((max(t) - min(t) for t in by_job.values()), default=0.0)


def gang_burst(
    api: KubeApi,
    nodes: int,
    rounds: int,
    run_s: float,
    limit_minutes: int,
    seed: int,
    timeout_s: float,
    reservations: int | None = None,
    solver: str | None = None,
    keep_log: Path | None = None,
) -> GangBurstResult:
    run = uuid.uuid4().hex[:8]
    team = f"bench-{run}"
    sizes = gang_burst_sizes(nodes, rounds, seed)
    replicas = {f"{team}/gang-{i:02d}": n for i, n in enumerate(sizes)}
    gpus = nodes * GPUS_PER_NODE

    def scenario(
        controller: Controller, root: Path, jobs: Path, clock: _PodClock, check: Callable[[], None]
    ) -> GangBurstResult:
        for i, n in enumerate(sizes):
            (jobs / f"gang-{i:02d}.yaml").write_text(
                spec_doc("Job", f"gang-{i:02d}", _job(n, GPUS_PER_NODE, limit_minutes))
            )
        committed, _ = _commit(root, f"bench: a burst of {len(sizes)} gangs")
        seen = _Run()
        pods: dict[str, _Pod] = {}
        while True:
            state = _step(controller, team, replicas, seen)
            if all(job in state.ended for job in replicas):
                pods = clock.snapshot()
                if len(pods) >= sum(sizes) and all(p.over for p in pods.values()):
                    break
            check()
            time.sleep(PASS_PAUSE_S)
        end = max(p.ended_at or 0.0 for p in pods.values())
        makespan = end - committed
        lower = sum(sizes) * GPUS_PER_NODE * run_s / gpus
        ended = [state.ended[j] for j in replicas]
        return GangBurstResult(
            scenario="gang-burst",
            solver=seen.solver,
            nodes=nodes,
            gpus=gpus,
            jobs=len(sizes),
            pods=sum(sizes),
            rounds=rounds,
            gang_sizes_pods=sizes,
            run_s=run_s,
            time_limit_minutes=limit_minutes,
            makespan_s=round(makespan, 2),
            lower_bound_s=round(lower, 2),
            makespan_ratio=round(makespan / lower, 3),
            mean_gpu_occupancy=round(_occupancy(pods, committed, end, gpus), 3),
            passes=seen.passes,
            partly_bound_gangs=seen.partly_bound,
            max_gang_bind_spread_s=round(_bind_spread(pods, replicas), 3),
            jobs_finished=ended.count("finished"),
            jobs_timed_out=ended.count("timed_out"),
            pods_deleted=seen.pods_deleted,
        )

    result: GangBurstResult = _drive(
        api, run, team, nodes, run_s, timeout_s, reservations, solver, scenario, keep_log
    )
    return result


def starvation(
    api: KubeApi,
    nodes: int,
    gang_pods: int,
    run_s: float,
    limit_minutes: int,
    stream_s: float,
    waves: int,
    timeout_s: float,
    reservations: int | None = None,
    solver: str | None = None,
    keep_log: Path | None = None,
) -> StarvationResult:
    """Fill the cluster with 1-GPU jobs in `waves` commits spread over one run time (so they
    end at different moments, as in a busy cluster), commit the gang, then keep the offered
    load at the cluster's capacity with a commit of 1-GPU jobs every run time / waves, for
    `stream_s` seconds."""
    run = uuid.uuid4().hex[:8]
    team = f"bench-{run}"
    gpus = nodes * GPUS_PER_NODE
    gang = f"{team}/gang"
    replicas = {gang: gang_pods}
    period = run_s / waves
    batch = max(1, round(gpus / waves))

    def scenario(
        controller: Controller, root: Path, jobs: Path, clock: _PodClock, check: Callable[[], None]
    ) -> StarvationResult:
        seen = _Run()
        names: list[str] = []

        def small(prefix: str, count: int) -> None:
            for _ in range(count):
                name = f"{prefix}-{len(names):04d}"
                names.append(name)
                (jobs / f"{name}.yaml").write_text(spec_doc("Job", name, _job(1, 1, limit_minutes)))

        def wait_until(moment: float) -> Any:
            state = None
            while state is None or time.time() < moment:
                state = _step(controller, team, replicas, seen)
                observe(state)
                check()
                time.sleep(PASS_PAUSE_S)
            return state

        first: dict[str, Any] = {}

        def observe(state: Any) -> None:
            if gang in state.pending and "reason" not in first:
                first["reason"] = state.pending[gang].reason
            for r in state.reservations:
                if r.job == gang and "reservation" not in first:
                    first["reservation"] = r.start
            if gang in state.placements and "placed" not in first:
                first["placed"] = state.placements[gang].started_at

        started = time.time()
        for w in range(waves):
            small("fill", batch if w < waves - 1 else gpus - batch * (waves - 1))
            _commit(root, f"bench: fill wave {w + 1}")
            wait_until(started + (w + 1) * period)
        fill = len(names)
        (jobs / "gang.yaml").write_text(
            spec_doc("Job", "gang", _job(gang_pods, GPUS_PER_NODE, limit_minutes))
        )
        gang_at, gang_date = _commit(root, "bench: the gang")
        stream_end_date = gang_date
        stream_end = gang_at
        k = 1
        while gang_at + k * period <= gang_at + stream_s:
            wait_until(gang_at + k * period)
            small("stream", batch)
            stream_end, stream_end_date = _commit(root, f"bench: stream {k}")
            k += 1
        all_jobs = {f"{team}/{n}" for n in names} | {gang}
        pods: dict[str, _Pod] = {}
        while True:
            state = _step(controller, team, replicas, seen)
            observe(state)
            if all(j in state.ended for j in all_jobs):
                pods = clock.snapshot()
                if all(p.over for p in pods.values()):
                    break
            check()
            time.sleep(PASS_PAUSE_S)
        gang_bound = max(p.bound_at or 0.0 for p in pods.values() if p.job == gang)
        placed = first.get("placed", "")
        reservation = first.get("reservation")
        ended = [state.ended[j] for j in sorted(all_jobs)]
        wait = _seconds(gang_date, placed)
        return StarvationResult(
            scenario="starvation",
            solver=seen.solver,
            nodes=nodes,
            gpus=gpus,
            gang_pods=gang_pods,
            run_s=run_s,
            time_limit_minutes=limit_minutes,
            fill_jobs=fill,
            stream_jobs=len(names) - fill,
            gang_wait_s=round(wait, 2),
            gang_all_bound_s=round(gang_bound - gang_at, 2),
            first_reservation_start_s=(
                round(_seconds(gang_date, reservation), 2) if reservation else None
            ),
            start_minus_reservation_s=(
                round(_seconds(reservation, placed), 2) if reservation else None
            ),
            stream_end_s=round(stream_end - gang_at, 2),
            started_before_stream_end=_seconds(placed, stream_end_date) > 0,
            gang_reason=first.get("reason", ""),
            makespan_s=round(max(p.ended_at or 0.0 for p in pods.values()) - started, 2),
            passes=seen.passes,
            partly_bound_gangs=seen.partly_bound,
            jobs_finished=ended.count("finished"),
            jobs_timed_out=ended.count("timed_out"),
            reservations_policy=reservations,
        )

    result: StarvationResult = _drive(
        api, run, team, nodes, run_s, timeout_s, reservations, solver, scenario, keep_log
    )
    return result
