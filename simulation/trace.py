"""Trace-driven placement (BENCHMARKS.md §1): pods arrive on a GPU cluster and stay.

Three ways to place them, all pure and seeded by the caller:
- online: each pod on arrival, never moved. A single pod with everything else
  fixed is a MILP whose optimum is found by enumerating the nodes: the node whose
  workload fragmentation (objective.workload_fragmentation, FGD's measure) plus
  stranded GPU (objective.stranded_gpu: GPU its node's CPU and memory cannot feed)
  grows least.
- batch: a commit of pods at a time, each online-style, hardest to fit first
  (`commit_order`) or in arrival order, whichever places more; then exact MILPs over
  windows of the nodes the commit touched re-place the commit's pods and let waiting
  pods in. Earlier commits never move.
- re-optimise: after all arrivals, exact MILPs re-solve windows of nodes with every
  pod there free to move at a cost (partitioned solves, the POP idea), until a time
  budget is spent: first nodes whose GPU waits on CPU or memory, with nodes that have
  room to spare, then the nodes with the most free GPU. Each window is solved in GPU
  configurations (which multiset of share sizes each GPU holds), not GPU by GPU.

Nodes in the same state are scored once: states are grouped by node kind, free GPU
per GPU, and CPU and memory bucketed by the demands that occur (exact for the
fragmentation; the stranded GPU is taken from the group's first node that fits).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from engine.model import (
    GPU_MILLI,
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    Job,
    Node,
    Placement,
    Policy,
    PriorityClass,
    Queue,
    ReplicaPlacement,
    Resources,
)
from engine.placement.greedy import Fit, Packing
from engine.placement.linear import LinearModel, SolveLimits, solve
from engine.placement.objective import WorkloadShape, stranded_gpu, workload_fragmentation
from engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)

QUEUE = "trace"
NOW = "2026-11-22T12:00:00+00:00"
ShapeKey = tuple[int, int, int, int, tuple[str, ...]]  # CPU, memory, GPUs, milli, models


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of a trace: per-pod CPU and memory; whole GPUs, or a share of one GPU."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    models: tuple[str, ...] = ()  # allowed GPU models; empty: any

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, int, int, tuple[str, ...]]:
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.models)

    def job(self, index: int) -> Job:
        return Job(
            name=f"{index:06d}-{self.name}",
            queue=QUEUE,
            replicas=1,
            resources=Resources(self.total_gpu_milli, self.cpu_milli, self.memory_mib),
            priority_class="trace",
            priority=0,
            gpu_flavors=self.models,
            preemptible=True,
            submitted_at=f"{index:09d}",
        )


def trace_cluster_spec(nodes: Sequence[Node]) -> ClusterSpec:
    models = sorted({n.flavor for n in nodes if n.flavor})
    return ClusterSpec(
        name="trace",
        topology_levels=(),
        gpu_flavors=tuple(GpuFlavor(m, m, 0) for m in models),
        priority_classes=(PriorityClass("trace", 0),),
        default_priority_class="trace",
    )


def trace_queue(nodes: Sequence[Node]) -> Queue:
    """One queue whose quota is the whole cluster: the trace has no tenants."""
    models = sorted({n.flavor for n in nodes if n.flavor})
    return Queue(
        name=QUEUE,
        team=QUEUE,
        quotas=tuple(FlavorQuota(m, 10**12) for m in models),
    )


def sample_arrivals(
    pods: Sequence[TracePod], capacity_milli: int, demand: float, draw: Callable[[int], int]
) -> list[TracePod]:
    """Pods drawn with replacement (`draw(n)` gives an index below n) until the GPU asked
    for would pass `demand` times the cluster's milli-GPU (the FGD paper's protocol)."""
    out: list[TracePod] = []
    asked = 0
    limit = demand * capacity_milli
    while True:
        pod = pods[draw(len(pods))]
        if asked + pod.total_gpu_milli > limit:
            return out
        asked += pod.total_gpu_milli
        out.append(pod)


# -- the workload, as FGD sees it ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """Pod shapes of the trace with their share of GPU pods, the demand thresholds, and the
    GPU pods' mean milli-GPU per milli-CPU and per MiB of memory."""

    shapes: tuple[WorkloadShape, ...]  # share, CPU step, memory step, GPUs, milli, models
    cpu_steps: tuple[int, ...]
    memory_steps: tuple[int, ...]
    gpu_per_cpu: float = 0.0
    gpu_per_memory: float = 0.0

    @staticmethod
    def of(pods: Iterable[TracePod], models: Iterable[str]) -> Workload:
        pods = list(pods)
        every = frozenset(models)
        counts = Counter(
            (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.models)
            for p in pods
            if p.num_gpu > 0
        )
        total = sum(counts.values()) or 1
        cpu_steps = tuple(sorted({p.cpu_milli for p in pods}))
        memory_steps = tuple(sorted({p.memory_mib for p in pods}))
        shapes = tuple(
            (
                n / total,
                bisect.bisect_left(cpu_steps, cpu),
                bisect.bisect_left(memory_steps, mem),
                k,
                milli,
                frozenset(ms) if ms else every,
            )
            for (cpu, mem, k, milli, ms), n in sorted(counts.items())
        )
        gpu_pods = [p for p in pods if p.num_gpu > 0]
        gpu = sum(p.total_gpu_milli for p in gpu_pods)
        cpu = sum(p.cpu_milli for p in gpu_pods)
        memory = sum(p.memory_mib for p in gpu_pods)
        return Workload(
            shapes,
            cpu_steps,
            memory_steps,
            gpu / max(cpu, 1),
            gpu / max(memory, 1),
        )


# -- the cluster while pods arrive ------------------------------------------------------------


State = tuple[
    int, tuple[int, ...], int, int
]  # node kind, free per GPU (sorted), CPU step, memory step


@dataclass(slots=True)
class TraceCluster:
    """Exact free capacity per node and GPU, and the nodes grouped by state for scoring."""

    nodes: list[Node]
    workload: Workload
    gpu_free: list[list[int]] = field(default_factory=list)
    cpu_free: list[int] = field(default_factory=list)
    memory_free: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    kinds: list[Node] = field(default_factory=list)
    groups: dict[State, list[int]] = field(default_factory=dict)
    state_of: list[State] = field(default_factory=list)
    placed: dict[int, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)
    _frag: dict[State, float] = field(default_factory=dict)

    @staticmethod
    def of(nodes: Sequence[Node], workload: Workload) -> TraceCluster:
        c = TraceCluster(list(nodes), workload)
        kind_ids: dict[tuple[object, ...], int] = {}
        for n in c.nodes:
            key = (n.flavor, n.gpus, n.cpu_milli, n.memory_mib)
            if key not in kind_ids:
                kind_ids[key] = len(c.kinds)
                c.kinds.append(n)
            c.kind.append(kind_ids[key])
            c.gpu_free.append([GPU_MILLI] * n.gpus)
            c.cpu_free.append(n.cpu_milli)
            c.memory_free.append(n.memory_mib)
        c.state_of = [c._state(i) for i in range(len(c.nodes))]
        for i, s in enumerate(c.state_of):
            c.groups.setdefault(s, []).append(i)
        return c

    def _state(self, i: int) -> State:
        return (
            self.kind[i],
            tuple(sorted(self.gpu_free[i])),
            bisect.bisect_right(self.workload.cpu_steps, self.cpu_free[i]),
            bisect.bisect_right(self.workload.memory_steps, self.memory_free[i]),
        )

    def _regroup(self, i: int) -> None:
        old = self.state_of[i]
        members = self.groups[old]
        members.pop(bisect.bisect_left(members, i))
        if not members:
            del self.groups[old]
        new = self._state(i)
        self.state_of[i] = new
        bisect.insort(self.groups.setdefault(new, []), i)

    @property
    def allocated_milli(self) -> int:
        return sum(
            n.gpus * GPU_MILLI - sum(f) for n, f in zip(self.nodes, self.gpu_free, strict=True)
        )

    @property
    def capacity_milli(self) -> int:
        return sum(n.gpus for n in self.nodes) * GPU_MILLI

    def free_split(self) -> tuple[int, int]:
        """The free milli-GPU on GPUs that hold a share (remainders only a smaller
        share can use), and on GPUs that hold nothing."""
        partial = whole = 0
        for free in self.gpu_free:
            for f in free:
                if f == GPU_MILLI:
                    whole += f
                else:
                    partial += f
        return partial, whole

    def fits(self, i: int, pod: TracePod) -> bool:
        node = self.nodes[i]
        if pod.models and node.flavor not in pod.models:
            return False
        if pod.num_gpu and node.gpus == 0:
            return False
        if self.cpu_free[i] < pod.cpu_milli or self.memory_free[i] < pod.memory_mib:
            return False
        return self.gpu_choice(i, pod) is not None

    def fits_kind(self, i: int, pod: TracePod) -> bool:
        """Whether the pod could ever run on node i (its model, CPU, memory and GPU count)."""
        node = self.nodes[i]
        if pod.models and node.flavor not in pod.models:
            return False
        if pod.cpu_milli > node.cpu_milli or pod.memory_mib > node.memory_mib:
            return False
        return pod.num_gpu <= node.gpus

    def gpu_choice(self, i: int, pod: TracePod) -> tuple[int, ...] | None:
        """GPUs for the pod on node i: the lowest whole free GPUs, or the fullest GPU that
        still takes the share (the GPU choice a single-pod solve makes)."""
        free = self.gpu_free[i]
        if pod.num_gpu == 0:
            return ()
        if pod.gpu_milli >= GPU_MILLI:
            whole = [g for g, f in enumerate(free) if f == GPU_MILLI]
            return tuple(whole[: pod.num_gpu]) if len(whole) >= pod.num_gpu else None
        fitting = [(f, g) for g, f in enumerate(free) if f >= pod.gpu_milli]
        return (min(fitting)[1],) if fitting else None

    def place(self, key: int, pod: TracePod, i: int, gpus: tuple[int, ...]) -> None:
        for g in gpus:
            self.gpu_free[i][g] -= pod.gpu_milli
        self.cpu_free[i] -= pod.cpu_milli
        self.memory_free[i] -= pod.memory_mib
        self.placed[key] = (i, gpus, pod.gpu_milli)
        self._regroup(i)

    def remove(self, key: int, pod: TracePod) -> None:
        i, gpus, milli = self.placed.pop(key)
        for g in gpus:
            self.gpu_free[i][g] += milli
        self.cpu_free[i] += pod.cpu_milli
        self.memory_free[i] += pod.memory_mib
        self._regroup(i)

    # -- scoring ------------------------------------------------------------------------
    def fragmentation(self, state: State) -> float:
        found = self._frag.get(state)
        if found is None:
            kind, gpus, cpu_step, mem_step = state
            node = self.kinds[kind]
            found = workload_fragmentation(
                node.flavor, gpus, cpu_step, mem_step, self.workload.shapes
            )
            self._frag[state] = found
        return found

    def stranded_delta(self, i: int, pod: TracePod) -> float:
        """How much the pod on node i grows the GPU that the node's CPU and memory cannot
        feed (objective.stranded_gpu at the workload's ratios)."""
        gpu = sum(self.gpu_free[i])
        if gpu == 0:
            return 0.0
        w = self.workload
        before = stranded_gpu(
            gpu, self.cpu_free[i], self.memory_free[i], w.gpu_per_cpu, w.gpu_per_memory
        )
        after = stranded_gpu(
            gpu - pod.total_gpu_milli,
            self.cpu_free[i] - pod.cpu_milli,
            self.memory_free[i] - pod.memory_mib,
            w.gpu_per_cpu,
            w.gpu_per_memory,
        )
        return after - before

    def choose(self, pod: TracePod, policy: str) -> tuple[int, tuple[int, ...]] | None:
        """Where a pod goes on its own: `balanced` (least growth of workload fragmentation
        plus stranded GPU, then best fit), `fgd` (FGD's rule: least growth of workload
        fragmentation alone, then best fit) or `bestfit` (least GPU left on the node, then
        least CPU). Nodes in one state are scored by their first member the pod fits."""
        best: tuple[float, ...] | None = None
        choice: tuple[int, tuple[int, ...]] | None = None
        cpu_step_need = bisect.bisect_left(self.workload.cpu_steps, pod.cpu_milli)
        mem_step_need = bisect.bisect_left(self.workload.memory_steps, pod.memory_mib)
        for state, members in self.groups.items():
            kind, gpus, cpu_step, mem_step = state
            node = self.kinds[kind]
            if pod.models and node.flavor not in pod.models:
                continue
            if cpu_step <= cpu_step_need or mem_step <= mem_step_need:
                continue
            if pod.num_gpu:
                if pod.gpu_milli >= GPU_MILLI:
                    if gpus.count(GPU_MILLI) < pod.num_gpu:
                        continue
                elif not gpus or gpus[-1] < pod.gpu_milli:
                    continue
            i = members[0]
            if self.cpu_free[i] < pod.cpu_milli or self.memory_free[i] < pod.memory_mib:
                i = next(
                    (
                        m
                        for m in members
                        if self.cpu_free[m] >= pod.cpu_milli
                        and self.memory_free[m] >= pod.memory_mib
                    ),
                    -1,
                )
                if i < 0:
                    continue
            gpu_sets = self._gpu_options(i, pod)
            for chosen in gpu_sets:
                left = sum(gpus) - pod.total_gpu_milli
                if policy == "bestfit":
                    score: tuple[float, ...] = (left, self.cpu_free[i] - pod.cpu_milli, i)
                else:
                    after = self._after(i, pod, chosen)
                    delta = self.fragmentation(after) - self.fragmentation(state)
                    if policy == "balanced":
                        delta += self.stranded_delta(i, pod)
                    score = (round(delta, 9), left, i)
                if best is None or score < best:
                    best, choice = score, (i, chosen)
        return choice

    def _gpu_options(self, i: int, pod: TracePod) -> list[tuple[int, ...]]:
        if pod.num_gpu == 0:
            return [()]
        free = self.gpu_free[i]
        if pod.gpu_milli >= GPU_MILLI:
            choice = self.gpu_choice(i, pod)
            return [choice] if choice is not None else []
        seen: dict[int, int] = {}
        for g, f in enumerate(free):
            if f >= pod.gpu_milli and f not in seen:
                seen[f] = g
        return [(g,) for g in seen.values()]

    def _after(self, i: int, pod: TracePod, gpus: tuple[int, ...]) -> State:
        free = list(self.gpu_free[i])
        for g in gpus:
            free[g] -= pod.gpu_milli
        return (
            self.kind[i],
            tuple(sorted(free)),
            bisect.bisect_right(self.workload.cpu_steps, self.cpu_free[i] - pod.cpu_milli),
            bisect.bisect_right(self.workload.memory_steps, self.memory_free[i] - pod.memory_mib),
        )


# -- runs ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class TraceRun:
    """The outcome of one arrival sequence under one policy."""

    arrivals: list[TracePod]
    cluster: TraceCluster
    curve: list[float]  # allocation ratio at every 1% of arrived demand
    pending: list[int] = field(default_factory=list)
    moves: int = 0
    solves: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def origin(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        return {k: (i, gpus) for k, (i, gpus, _) in self.cluster.placed.items()}

    @property
    def allocation(self) -> float:
        return self.cluster.allocated_milli / self.cluster.capacity_milli


def _curve_points(arrivals: Sequence[TracePod], capacity: int, demand: float) -> list[int]:
    """Arrival index after which each 1% of demand (of the cluster's capacity) has arrived."""
    marks: list[int] = []
    asked = 0
    step = capacity / 100
    for i, pod in enumerate(arrivals):
        asked += pod.total_gpu_milli
        while len(marks) < int(demand * 100) and asked >= (len(marks) + 1) * step:
            marks.append(i)
    return marks


def run_online(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    workload: Workload,
    policy: str,
    demand: float,
) -> TraceRun:
    """Each pod on arrival, never moved: `balanced` (gitsched's single-pod solve), `fgd`
    (FGD's rule, for comparison), `bestfit`."""
    started = time.perf_counter()
    cluster = TraceCluster.of(nodes, workload)
    marks = set(_curve_points(arrivals, cluster.capacity_milli, demand))
    run = TraceRun(list(arrivals), cluster, [])
    for k, pod in enumerate(arrivals):
        choice = cluster.choose(pod, policy)
        if choice is None:
            run.pending.append(k)
        else:
            cluster.place(k, pod, *choice)
        if k in marks:
            run.curve.append(cluster.allocated_milli / cluster.capacity_milli)
    run.seconds = time.perf_counter() - started
    return run


def run_greedy(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    workload: Workload,
    demand: float,
    commit: int = 1,
) -> TraceRun:
    """The greedy baseline (greedy.py's packing: priority order, best fit) with commits of
    `commit` pods; a pod that does not fit waits and is tried again at the next commit."""
    started = time.perf_counter()
    instance = trace_instance(nodes, [])
    packing = Packing(instance)
    cluster = TraceCluster.of(nodes, workload)
    marks = set(_curve_points(arrivals, cluster.capacity_milli, demand))
    run = TraceRun(list(arrivals), cluster, [])
    index = {n.name: i for i, n in enumerate(nodes)}
    waiting: list[int] = []
    # No pod leaves, so free capacity only shrinks: a shape that found no room never will.
    hopeless: set[ShapeKey] = set()
    for start in range(0, len(arrivals), commit):
        batch = list(range(start, min(start + commit, len(arrivals))))
        still: list[int] = []
        for k in (waiting + batch) if commit > 1 else batch:
            if arrivals[k].shape in hopeless:
                still.append(k)
                continue
            job = arrivals[k].job(k)
            found = packing.find(job)
            if isinstance(found, Fit):
                packing.commit(job, found)
                replica = found.replicas[0]
                cluster.place(k, arrivals[k], index[replica.node], replica.gpus)
            else:
                hopeless.add(arrivals[k].shape)
                still.append(k)
        waiting = still
        for k in batch:
            if k in marks:
                run.curve.append(cluster.allocated_milli / cluster.capacity_milli)
    run.pending = waiting
    run.seconds = time.perf_counter() - started
    return run


def trace_instance(
    nodes: Sequence[Node],
    jobs: Sequence[Job],
    current: dict[str, Placement] | None = None,
    policy: Policy | None = None,
) -> PlacementInstance:
    return PlacementInstance(
        cluster=trace_cluster_spec(nodes),
        nodes=tuple(nodes),
        queues=(trace_queue(nodes),),
        jobs=tuple(jobs),
        current=current or {},
        policy=policy or Policy(),
        now=NOW,
    )


def _placement(cluster: TraceCluster, k: int, pod: TracePod) -> Placement:
    i, gpus, milli = cluster.placed[k]
    node = cluster.nodes[i]
    return Placement(
        pod.job(k).key,
        node.flavor if pod.num_gpu else None,
        (ReplicaPlacement(node.name, gpus, milli if gpus else 0),),
        started_at=NOW,
    )


def _worth_trying(
    cluster: TraceCluster,
    window: list[int],
    candidates: list[int],
    arrivals: Sequence[TracePod],
    movable: bool = False,
) -> list[int]:
    """Waiting pods that fit some window node (an empty one, when the pods there may move),
    at most as many of a shape as the window's free capacity could take."""
    free_gpu = sum(sum(cluster.gpu_free[i]) for i in window)
    free_cpu = sum(cluster.cpu_free[i] for i in window)
    free_memory = sum(cluster.memory_free[i] for i in window)
    if free_gpu <= 0 and free_cpu <= 0:
        return []
    by_shape: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for k in candidates:
        by_shape[arrivals[k].shape].append(k)
    kinds = {cluster.kind[i] for i in window}
    out = []
    for keys in by_shape.values():
        pod = arrivals[keys[0]]
        if movable:
            if not any(_fits_empty(cluster.kinds[kind], pod) for kind in kinds):
                continue
        elif not any(cluster.fits(i, pod) for i in window):
            continue
        cap = len(keys)
        # Pods already in the window stay in it, so what comes in fits in what is free.
        spare = 0 if movable else 1
        if pod.total_gpu_milli:
            cap = min(cap, free_gpu // pod.total_gpu_milli + spare)
        if pod.cpu_milli:
            cap = min(cap, free_cpu // pod.cpu_milli + spare)
        if movable and pod.memory_mib:
            cap = min(cap, free_memory // pod.memory_mib)
        out.extend(keys[:cap])
    return sorted(out)


def _fits_empty(node: Node, pod: TracePod) -> bool:
    if pod.models and node.flavor not in pod.models:
        return False
    if pod.cpu_milli > node.cpu_milli or pod.memory_mib > node.memory_mib:
        return False
    return pod.num_gpu <= node.gpus


def run_batch(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    workload: Workload,
    demand: float,
    backend: str,
    commit: int = 100,
    window_nodes: int = 8,
    window_limit_s: float = 0.5,
) -> TraceRun:
    """Commits of `commit` pods. The commit's pods and the waiting ones are placed hardest
    to fit first (`commit_order`), each by the online rule; then exact MILPs over the nodes the commit touched (in windows) re-place the commit's
    pods and let waiting pods in. Earlier commits never move; a pod that does not fit waits
    and is reconsidered at every later commit, as a job in a cluster repo would be."""
    started = time.perf_counter()
    cluster = TraceCluster.of(nodes, workload)
    marks = set(_curve_points(arrivals, cluster.capacity_milli, demand))
    run = TraceRun(list(arrivals), cluster, [])
    waiting: list[int] = []
    for start in range(0, len(arrivals), commit):
        batch = list(range(start, min(start + commit, len(arrivals))))
        hardest = sorted(waiting + batch, key=lambda k: (commit_order(arrivals[k]), k))
        arrived = sorted(waiting + batch)
        before = cluster.allocated_milli
        touched, still = place_in_order(cluster, arrivals, hardest)
        if hardest != arrived:
            # Hardest first is first-fit-decreasing's order; arrival order is what the
            # online rule sees. Neither wins every commit: keep the one that places more.
            gained = cluster.allocated_milli - before
            for k in hardest:
                if k in cluster.placed:
                    cluster.remove(k, arrivals[k])
            other_touched, other_still = place_in_order(cluster, arrivals, arrived)
            if cluster.allocated_milli - before <= gained:
                for k in arrived:
                    if k in cluster.placed:
                        cluster.remove(k, arrivals[k])
                touched, still = place_in_order(cluster, arrivals, hardest)
            else:
                touched, still = other_touched, other_still
        waiting = sorted(still)
        if waiting and touched:
            ordered = sorted(touched, key=lambda i: (cluster.kind[i], i))
            for w in range(0, len(ordered), window_nodes):
                window = ordered[w : w + window_nodes]
                waiting = window_solve(
                    run, waiting, window, backend, window_limit_s, 0.01, True, set(batch)
                )
        for k in batch:
            if k in marks:
                run.curve.append(cluster.allocated_milli / cluster.capacity_milli)
    run.pending = waiting
    run.seconds = time.perf_counter() - started
    return run


def place_in_order(
    cluster: TraceCluster, arrivals: Sequence[TracePod], order: list[int]
) -> tuple[set[int], list[int]]:
    """Each pod by the online rule, in `order`; every pod that fits is placed. Returns the
    nodes touched and the pods that found no room."""
    touched: set[int] = set()
    failed: set[ShapeKey] = set()
    still: list[int] = []
    for k in order:
        pod = arrivals[k]
        # Within a commit free capacity only shrinks: a shape that found no room won't.
        choice = None if pod.shape in failed else cluster.choose(pod, "balanced")
        if choice is None:
            failed.add(pod.shape)
            still.append(k)
        else:
            cluster.place(k, pod, *choice)
            touched.add(choice[0])
    return touched, still


def commit_order(pod: TracePod) -> tuple[int, int, int, int, int]:
    """The order a commit's pods are placed in: the hardest to fit first (most GPUs, then
    the largest share of one, then a GPU model constraint, then CPU and memory), so the
    small ones fill the holes the large ones leave, as first-fit-decreasing does."""
    return (-pod.num_gpu, -pod.gpu_milli, 0 if pod.models else 1, -pod.cpu_milli, -pod.memory_mib)


def reoptimise(
    run: TraceRun,
    backend: str,
    budget_s: float,
    window_nodes: int = 8,
    window_limit_s: float = 0.5,
    move_weight: float = 0.01,
) -> TraceRun:
    """Windows of nodes re-solved exactly (`window_resolve`: every pod on them free to
    move, at a small cost per move, and every waiting pod free to come in), until the time
    budget is spent. No running pod is stopped. First the windows of `starved_windows`,
    again while they gain; then windows pairing the nodes with the most free GPU with full
    nodes of the same kind."""
    started = time.perf_counter()
    cluster = run.cluster
    waiting = sorted(run.pending)

    def sweep(windows: Iterable[list[int]]) -> bool:
        """Re-solve the windows in turn while the budget lasts; whether any placed more."""
        nonlocal waiting
        gained = False
        for window in windows:
            left = budget_s - (time.perf_counter() - started)
            if left <= 0:
                break
            before = cluster.allocated_milli
            waiting = window_resolve(
                run, waiting, window, backend, min(window_limit_s, left), move_weight
            )
            gained |= cluster.allocated_milli > before
        return gained

    # GPU that waits on CPU or memory first, again while that pays.
    while sweep(starved_windows(cluster, [run.arrivals[k] for k in waiting])):
        pass
    rounds = 0
    while time.perf_counter() - started < budget_s:
        windows = _windows(cluster, window_nodes, rounds)
        if not windows:
            break
        improved = sweep(windows)
        rounds += 1
        if not improved and rounds > 1:
            break
    run.pending = waiting
    run.seconds += time.perf_counter() - started
    run.notes.append(f"{rounds} rounds of windows")
    return run


def window_solve(
    run: TraceRun,
    waiting: list[int],
    window: list[int],
    backend: str,
    time_limit_s: float,
    move_weight: float,
    movable: bool,
    only: set[int] | None = None,
) -> list[int]:
    """One exact MILP over a window of nodes, GPU by GPU: which waiting pods come in, and
    (when `movable`) where the pods already there go (`only` these, if given). No pod
    already placed is dropped. Returns the pods still waiting."""
    cluster = run.cluster
    arrivals = run.arrivals
    inside = set(window)
    here = (
        [
            k
            for k, (i, _, _) in cluster.placed.items()
            if i in inside and (only is None or k in only)
        ]
        if movable
        else []
    )
    tried = _worth_trying(cluster, window, waiting, arrivals, movable)
    if not tried:
        return waiting
    untried = sorted(set(waiting) - set(tried))
    origin = {k: (cluster.placed[k][0], cluster.placed[k][1]) for k in here}
    for k in here:
        cluster.remove(k, arrivals[k])
    lp, cols, shapes = _window_model(cluster, window, here, tried, arrivals, origin, move_weight)
    solution = solve(
        lp,
        backend,
        SolveLimits(max(0.1, time_limit_s), 0.0),
        _window_start(lp, cols, here, arrivals, origin),
    )
    run.solves += 1
    placed = _window_apply(run, window, here, tried, shapes, cols, solution.values, origin)
    if movable and not placed:
        for k in here:  # nothing better found: put everything back where it was
            i, gpus = origin[k]
            cluster.place(k, arrivals[k], i, gpus)
        return waiting
    return sorted(untried + [k for k in tried if k not in cluster.placed])


def window_resolve(
    run: TraceRun,
    waiting: list[int],
    window: list[int],
    backend: str,
    time_limit_s: float,
    move_weight: float,
) -> list[int]:
    """One exact MILP over a window of nodes, every pod there free to move and every
    waiting pod free to come in, in configurations: per node, how many of its GPUs hold
    each maximal multiset of share sizes (`gpu_configurations`) instead of which GPU holds
    what. The GPUs of a node are alike once the window is emptied, so this drops their
    symmetry, and its LP relaxation is the configuration LP, which the GPU-by-GPU model's
    is not. Kept only if it places more milli-GPU; returns the pods still waiting."""
    cluster = run.cluster
    arrivals = run.arrivals
    inside = set(window)
    here = sorted(k for k, (i, _, _) in cluster.placed.items() if i in inside)
    tried = _worth_trying(cluster, window, waiting, arrivals, movable=True)
    if not tried:
        return waiting
    origin = {k: (cluster.placed[k][0], cluster.placed[k][1]) for k in here}
    for k in here:
        cluster.remove(k, arrivals[k])
    built = _configuration_model(cluster, window, here, tried, arrivals, origin, move_weight)
    solution = None
    if built is not None:
        lp, counts, layouts, start = built
        solution = solve(lp, backend, SolveLimits(max(0.05, time_limit_s), 0.0), start)
        run.solves += 1
    if solution is not None and solution.values is not None:
        x = {key: round(solution.values[c]) for key, c in counts.items()}
        gained = sum(n * key[0][2] * key[0][3] for key, n in x.items()) - sum(
            arrivals[k].total_gpu_milli for k in here
        )
        if gained > 0:
            gpus = {
                (i, j): round(solution.values[c])
                for (i, j), c in layouts[1].items()
                if round(solution.values[c]) > 0
            }
            if _configuration_apply(run, window, here, tried, x, gpus, layouts[0], origin):
                return sorted(k for k in waiting if k not in cluster.placed)
    for k in here:  # nothing better found: everything back where it was
        i, was = origin[k]
        cluster.place(k, arrivals[k], i, was)
    return waiting


Layouts = tuple[dict[int, list[tuple[int, ...]]], dict[tuple[int, int], int]]


def _configuration_model(
    cluster: TraceCluster,
    window: list[int],
    here: list[int],
    tried: list[int],
    arrivals: Sequence[TracePod],
    origin: dict[int, tuple[int, tuple[int, ...]]],
    move_weight: float,
) -> tuple[LinearModel, dict[tuple[ShapeKey, int], int], Layouts, list[float]] | None:
    """Columns: pods of a shape per node; GPUs of a node per share configuration; a bonus
    per pod that stays on its node. The start is every pod where it was (always feasible).
    None when a node's share sizes allow too many configurations."""
    lp = LinearModel()
    shapes: dict[ShapeKey, TracePod] = {}
    here_count: Counter[ShapeKey] = Counter()
    wait_count: Counter[ShapeKey] = Counter()
    for k in here:
        shapes[arrivals[k].shape] = arrivals[k]
        here_count[arrivals[k].shape] += 1
    for k in tried:
        shapes[arrivals[k].shape] = arrivals[k]
        wait_count[arrivals[k].shape] += 1
    counts: dict[tuple[ShapeKey, int], int] = {}
    configurations: dict[int, list[tuple[int, ...]]] = {}
    gpu_cols: dict[tuple[int, int], int] = {}
    start: dict[int, float] = {}
    was_on: dict[int, list[int]] = defaultdict(list)
    for k in here:
        was_on[origin[k][0]].append(k)
    per_shape: dict[ShapeKey, list[tuple[int, float]]] = defaultdict(list)
    for i in window:
        node = cluster.nodes[i]
        tag = node.name
        fitting = [key for key, pod in shapes.items() if cluster.fits_kind(i, pod)]
        sizes = sorted(
            {shapes[k].gpu_milli for k in fitting if 0 < shapes[k].gpu_milli < GPU_MILLI}
        )
        found = gpu_configurations(sizes, MAX_WINDOW_CONFIGURATIONS) if sizes else []
        if sizes and not found:
            return None
        configurations[i] = found
        whole: list[tuple[int, float]] = []
        cpu: list[tuple[int, float]] = []
        memory: list[tuple[int, float]] = []
        slots: dict[int, list[tuple[int, float]]] = defaultdict(list)
        stayed = Counter(arrivals[k].shape for k in was_on[i])
        for key in fitting:
            pod = shapes[key]
            top = here_count[key] + wait_count[key]
            if pod.cpu_milli:
                top = min(top, node.cpu_milli // pod.cpu_milli)
            if pod.num_gpu:
                top = min(top, node.gpus * (GPU_MILLI // pod.gpu_milli) // pod.num_gpu)
            c = lp.var(f"pods__{key}__{tag}", 0, top)
            lp.add_cost(c, pod.total_gpu_milli / GPU_MILLI if pod.num_gpu else 1e-4)
            counts[(key, i)] = c
            start[c] = float(stayed[key])
            per_shape[key].append((c, 1.0))
            cpu.append((c, float(pod.cpu_milli)))
            memory.append((c, float(pod.memory_mib)))
            if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
                slots[pod.gpu_milli].append((c, 1.0))
            elif pod.num_gpu:
                whole.append((c, float(pod.num_gpu)))
            if stayed[key] and move_weight:
                t = lp.var(f"stays__{key}__{tag}", 0, stayed[key], cost=move_weight)
                lp.row(f"stays__{key}__{tag}", [(t, 1.0), (c, -1.0)], upper=0)
                start[t] = float(stayed[key])
        used: list[tuple[int, float]] = []
        for j, config in enumerate(found):
            y = lp.var(f"gpus__{tag}__{j}", 0, node.gpus)
            gpu_cols[(i, j)] = y
            used.append((y, 1.0))
            for size in set(config):
                slots[size].append((y, -float(config.count(size))))
        lp.row(f"gpus__{tag}", whole + used, upper=node.gpus)
        for size, terms in slots.items():
            lp.row(f"slots__{tag}__{size}", terms, upper=0)
        lp.row(f"cpu__{tag}", cpu, upper=node.cpu_milli)
        lp.row(f"memory__{tag}", memory, upper=node.memory_mib)
        held: dict[int, list[int]] = defaultdict(list)
        for k in was_on[i]:
            pod = arrivals[k]
            if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
                held[origin[k][1][0]].append(pod.gpu_milli)
        for sizes_on_gpu in held.values():
            j = next(
                (
                    j
                    for j, config in enumerate(found)
                    if all(config.count(s) >= sizes_on_gpu.count(s) for s in sizes_on_gpu)
                ),
                -1,
            )
            if j < 0:
                return None
            start[gpu_cols[(i, j)]] = start.get(gpu_cols[(i, j)], 0.0) + 1.0
    for key in shapes:
        lp.row(
            f"arrived__{key}",
            per_shape[key],
            lower=here_count[key],
            upper=here_count[key] + wait_count[key],
        )
    x = [start.get(c, 0.0) for c in range(lp.num_cols)]
    return lp, counts, (configurations, gpu_cols), x


def _configuration_apply(
    run: TraceRun,
    window: list[int],
    here: list[int],
    tried: list[int],
    x: dict[tuple[ShapeKey, int], int],
    gpus: dict[tuple[int, int], int],
    configurations: dict[int, list[tuple[int, ...]]],
    origin: dict[int, tuple[int, tuple[int, ...]]],
) -> bool:
    """Put pods where the solution says: a pod that was here stays on its node, and on its
    GPU, where the solution allows; shares fill the slots of the chosen configurations.
    All or nothing: False leaves the window empty."""
    cluster = run.cluster
    arrivals = run.arrivals
    room = dict(x)
    on: dict[int, list[int]] = defaultdict(list)
    rest: list[int] = []
    for k in here:
        key = (arrivals[k].shape, origin[k][0])
        if room.get(key, 0) > 0:
            room[key] -= 1
            on[origin[k][0]].append(k)
        else:
            rest.append(k)
    for k in rest + tried:
        i = next((i for i in window if room.get((arrivals[k].shape, i), 0) > 0), -1)
        if i < 0:
            if k in origin:
                return False
            continue
        room[(arrivals[k].shape, i)] -= 1
        on[i].append(k)
    done: list[int] = []
    for i in window:
        plan = _gpus_of_node(cluster, i, on[i], gpus, configurations.get(i, []), arrivals, origin)
        if plan is None:
            break
        for k, chosen in plan:
            if not _fits_on(cluster, i, arrivals[k], chosen):
                plan = None
                break
            cluster.place(k, arrivals[k], i, chosen)
            done.append(k)
        if plan is None:
            break
    else:
        for k in here:
            if origin[k] != (cluster.placed[k][0], cluster.placed[k][1]):
                run.moves += 1
        return True
    for k in done:
        cluster.remove(k, arrivals[k])
    return False


def _gpus_of_node(
    cluster: TraceCluster,
    i: int,
    pods: list[int],
    gpus: dict[tuple[int, int], int],
    configurations: list[tuple[int, ...]],
    arrivals: Sequence[TracePod],
    origin: dict[int, tuple[int, tuple[int, ...]]],
) -> list[tuple[int, tuple[int, ...]]] | None:
    """The GPUs of node i for its pods: each chosen configuration on one GPU (a GPU whose
    pods all stay keeps them), shares into its slots, whole-GPU pods on the GPUs left."""
    instances: list[list[int]] = []  # slots still open, per configuration instance
    for j, config in enumerate(configurations):
        instances.extend(list(config) for _ in range(gpus.get((i, j), 0)))
    bound_to: dict[int, int] = {}  # instance -> GPU
    out: list[tuple[int, tuple[int, ...]]] = []
    shares = [k for k in pods if arrivals[k].num_gpu and arrivals[k].gpu_milli < GPU_MILLI]
    whole = [k for k in pods if arrivals[k].gpu_milli >= GPU_MILLI and arrivals[k].num_gpu]
    out.extend((k, ()) for k in pods if not arrivals[k].num_gpu)
    left: list[int] = []
    stayed: dict[int, list[int]] = defaultdict(list)
    for k in shares:
        if k in origin and origin[k][0] == i:
            stayed[origin[k][1][0]].append(k)
        else:
            left.append(k)
    for g, group in sorted(stayed.items()):
        sizes = [arrivals[k].gpu_milli for k in group]
        m = next(
            (
                m
                for m, open_ in enumerate(instances)
                if m not in bound_to and all(open_.count(s) >= sizes.count(s) for s in sizes)
            ),
            -1,
        )
        if m < 0:
            left.extend(group)
            continue
        bound_to[m] = g
        for k in group:
            instances[m].remove(arrivals[k].gpu_milli)
            out.append((k, (g,)))
    pending: list[tuple[int, int]] = []  # (pod, instance) for instances not yet on a GPU
    for k in sorted(left, key=lambda k: -arrivals[k].gpu_milli):
        size = arrivals[k].gpu_milli
        m = next((m for m, open_ in enumerate(instances) if size in open_), -1)
        if m < 0:
            return None
        instances[m].remove(size)
        pending.append((k, m))
    taken = set(bound_to.values())
    for k in whole:  # whole-GPU pods keep their GPUs where no configuration took them
        if k in origin and origin[k][0] == i and not taken & set(origin[k][1]):
            out.append((k, origin[k][1]))
            taken |= set(origin[k][1])
    free = [g for g in range(cluster.nodes[i].gpus) if g not in taken]
    for k, m in pending:
        if m not in bound_to:
            if not free:
                return None
            bound_to[m] = free.pop(0)
        out.append((k, (bound_to[m],)))
    for k in whole:
        if any(p == k for p, _ in out):
            continue
        if len(free) < arrivals[k].num_gpu:
            return None
        out.append((k, tuple(free[: arrivals[k].num_gpu])))
        free = free[arrivals[k].num_gpu :]
    return out


def _window_model(
    cluster: TraceCluster,
    window: list[int],
    here: list[int],
    tried: list[int],
    arrivals: Sequence[TracePod],
    origin: dict[int, tuple[int, tuple[int, ...]]],
    move_weight: float,
) -> tuple[
    LinearModel, dict[tuple[ShapeKey, int, int], int], dict[ShapeKey, tuple[TracePod, int, int]]
]:
    """Columns: pods of a shape per (node, GPU) for shares, per node for whole GPUs and CPU-only
    pods; GPU g of node n given to whole-GPU pods; a bonus for a pod that stays put."""
    lp = LinearModel()
    shapes: dict[ShapeKey, tuple[TracePod, int, int]] = {}
    for group, keys in (("here", here), ("waiting", tried)):
        for k in keys:
            pod = arrivals[k]
            old = shapes.get(pod.shape, (pod, 0, 0))
            shapes[pod.shape] = (pod, old[1] + (group == "here"), old[2] + (group == "waiting"))
    stays: dict[tuple[ShapeKey, int, int], int] = defaultdict(int)
    for k in here:
        i, gpus = origin[k]
        stays[
            (arrivals[k].shape, i, gpus[0] if arrivals[k].gpu_milli < GPU_MILLI and gpus else -1)
        ] += 1
    cols: dict[tuple[ShapeKey, int, int], int] = {}
    count_terms: dict[ShapeKey, list[tuple[int, float]]] = defaultdict(list)
    for i in window:
        node = cluster.nodes[i]
        tag = node.name
        free = cluster.gpu_free[i]
        whole_cols = []
        cpu_terms: list[tuple[int, float]] = []
        mem_terms: list[tuple[int, float]] = []
        share_terms: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for key, (pod, _, _) in shapes.items():
            if not cluster.fits_kind(i, pod):
                continue
            if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
                for g, f in enumerate(free):
                    if f >= pod.gpu_milli:
                        c = lp.var(f"share__{key[3]}x{key[0]}__{tag}_{g}", 0, f // pod.gpu_milli)
                        cols[(key, i, g)] = c
                        share_terms[g].append((c, float(pod.gpu_milli)))
                        count_terms[key].append((c, 1.0))
                        cpu_terms.append((c, float(pod.cpu_milli)))
                        mem_terms.append((c, float(pod.memory_mib)))
                        lp.add_cost(c, pod.total_gpu_milli / GPU_MILLI)
            else:
                c = lp.var(f"pods__{key[2]}x{key[0]}__{tag}", 0, max(1, len(free)))
                cols[(key, i, -1)] = c
                count_terms[key].append((c, 1.0))
                cpu_terms.append((c, float(pod.cpu_milli)))
                mem_terms.append((c, float(pod.memory_mib)))
                lp.add_cost(c, pod.total_gpu_milli / GPU_MILLI if pod.num_gpu else 1e-4)
                if pod.num_gpu:
                    whole_cols.append((c, float(pod.num_gpu)))
        if whole_cols:
            given = []
            for g, f in enumerate(free):
                if f == GPU_MILLI:
                    u = lp.var(f"whole__{tag}_{g}", 0, 1)
                    given.append((u, -1.0))
                    share_terms[g].append((u, float(GPU_MILLI)))
            lp.row(f"whole__{tag}", whole_cols + given, lower=0, upper=0)
        for g, terms in share_terms.items():
            lp.row(f"gpu__{tag}_{g}", terms, upper=free[g])
        lp.row(f"cpu__{tag}", cpu_terms, upper=cluster.cpu_free[i])
        lp.row(f"memory__{tag}", mem_terms, upper=cluster.memory_free[i])
    for key, (_pod, here_count, wait_count) in shapes.items():
        lp.row(f"pods__{key}", count_terms[key], lower=here_count, upper=here_count + wait_count)
    for (key, i, g), n in stays.items():
        kept = cols.get((key, i, g))
        if kept is not None and move_weight:
            t = lp.var(f"stays__{key}__{i}_{g}", 0, n, cost=move_weight)
            lp.row(f"stays__{key}__{i}_{g}", [(t, 1.0), (kept, -1.0)], upper=0)
    return lp, cols, shapes


def _window_start(
    lp: LinearModel,
    cols: dict[tuple[ShapeKey, int, int], int],
    here: list[int],
    arrivals: Sequence[TracePod],
    origin: dict[int, tuple[int, tuple[int, ...]]],
) -> list[float] | None:
    """Everything where it was and nothing new: the warm start (always feasible)."""
    x = [0.0] * lp.num_cols
    index = {name: c for c, name in enumerate(lp.col_names)}
    for k in here:
        pod = arrivals[k]
        i, gpus = origin[k]
        share = pod.num_gpu and pod.gpu_milli < GPU_MILLI
        c = cols.get((pod.shape, i, gpus[0] if share else -1))
        if c is None:
            return None
        x[c] += 1
        if pod.num_gpu and not share:
            for g in gpus:
                u = index.get(f"whole__{lp.col_names[c].split('__')[-1]}_{g}")
                if u is None:
                    return None
                x[u] = 1.0
    for c, name in enumerate(lp.col_names):
        if name.startswith("stays__"):
            (row,) = [r for r, rn in enumerate(lp.row_names) if rn == name]
            other = next(j for j in lp.row_index[row] if j != c)
            x[c] = min(lp.col_upper[c], x[other])
    return x if not lp.violations(x) else None


def allocation_bound(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    backend: str,
    keep: Sequence[TracePod] = (),
) -> float:
    """An upper bound of the GPU allocation ratio: the LP relaxation of placing the pods on
    the cluster with nodes of a kind pooled (capacity, GPU counts, CPU, memory, and
    floor(GPUs / s) items of s GPUs or more per node), tightened by one row per dual
    feasible function (`packing_functions`): what shares can share a GPU. With `keep`
    (pods that must stay placed, as in re-optimise), it bounds every plan that keeps them.
    """
    kinds: dict[tuple[object, ...], list[Node]] = defaultdict(list)
    for n in nodes:
        kinds[(n.flavor, n.gpus, n.cpu_milli, n.memory_mib)].append(n)
    counts = Counter(p.shape for p in pods)
    kept = Counter(p.shape for p in keep)
    example = {p.shape: p for p in pods}
    functions = packing_functions(sorted({p.gpu_milli for p in pods if p.gpu_milli > 0}))
    lp = LinearModel()
    per_shape: dict[ShapeKey, list[tuple[int, float]]] = defaultdict(list)
    for kid, members in enumerate(kinds.values()):
        node, m = members[0], len(members)
        milli, cpu, mem, count = [], [], [], []
        items: dict[int, list[tuple[int, float]]] = defaultdict(list)
        packed: list[list[tuple[int, float]]] = [[] for _ in functions]
        by_size: dict[int, list[tuple[int, float]]] = defaultdict(list)
        whole: list[tuple[int, float]] = []
        for key, pod in example.items():
            if pod.models and node.flavor not in pod.models:
                continue
            if pod.cpu_milli > node.cpu_milli or pod.memory_mib > node.memory_mib:
                continue
            if pod.num_gpu > node.gpus:
                continue
            x = lp.var(
                f"pods__{key}__{kid}", 0, counts[key], cost=pod.total_gpu_milli, integer=False
            )
            per_shape[key].append((x, 1.0))
            milli.append((x, float(pod.total_gpu_milli)))
            cpu.append((x, float(pod.cpu_milli)))
            mem.append((x, float(pod.memory_mib)))
            if pod.num_gpu and (pod.gpu_milli >= GPU_MILLI or pod.gpu_milli > GPU_MILLI // 2):
                count.append((x, float(pod.num_gpu)))
            if pod.gpu_milli >= GPU_MILLI and pod.num_gpu > 1:
                items[pod.num_gpu].append((x, 1.0))
            if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
                by_size[pod.gpu_milli].append((x, 1.0))
            elif pod.num_gpu:
                whole.append((x, float(pod.num_gpu)))
            if pod.num_gpu:
                for f, terms in zip(functions, packed, strict=True):
                    terms.append((x, float(pod.num_gpu * f[min(pod.gpu_milli, GPU_MILLI)])))
        lp.row(f"gpu__{kid}", milli, upper=m * node.gpus * GPU_MILLI)
        lp.row(f"gpus__{kid}", count, upper=m * node.gpus)
        _gpu_configuration_rows(lp, kid, m * node.gpus, by_size, whole)
        lp.row(f"cpu__{kid}", cpu, upper=m * node.cpu_milli)
        lp.row(f"memory__{kid}", mem, upper=m * node.memory_mib)
        for size in items:
            terms = [(c, v * (a // size)) for a in items if a >= size for c, v in items[a]]
            lp.row(f"items__{kid}__{size}", terms, upper=m * (node.gpus // size))
        for j, terms in enumerate(packed):
            lp.row(f"packing__{kid}__{j}", terms, upper=m * node.gpus * GPU_MILLI)
    for key, terms in per_shape.items():
        lp.row(f"arrived__{key}", terms, lower=min(kept[key], counts[key]), upper=counts[key])
    result = solve(lp, backend, SolveLimits(60.0, 0.0, relax=True))
    capacity = sum(n.gpus for n in nodes) * GPU_MILLI
    return min(1.0, (result.objective or capacity) / capacity)


MAX_GPU_CONFIGURATIONS = 20_000
MAX_WINDOW_CONFIGURATIONS = 3_000


def _gpu_configuration_rows(
    lp: LinearModel,
    kid: int,
    gpus: int,
    by_size: dict[int, list[tuple[int, float]]],
    whole: list[tuple[int, float]],
) -> None:
    """The configuration LP (Gilmore and Gomory) of one pool of GPUs: each GPU is given
    whole, or holds one maximal multiset of the share sizes (`gpu_configurations`); the
    shares of a size placed are at most the slots the chosen multisets offer. Any plan
    induces such a choice (extend each GPU's shares to a maximal multiset), so the rows
    are valid; they imply every dual feasible function row and also see which sizes can
    really sit together. Skipped when the sizes allow too many multisets."""
    sizes = sorted(by_size)
    configurations = gpu_configurations(sizes, MAX_GPU_CONFIGURATIONS)
    if not configurations:
        return
    used = [
        lp.var(f"configuration__{kid}__{j}", 0, gpus, integer=False)
        for j in range(len(configurations))
    ]
    lp.row(f"configurations__{kid}", whole + [(y, 1.0) for y in used], upper=gpus)
    for s in sizes:
        slots = [(y, -float(c.count(s))) for y, c in zip(used, configurations, strict=True)]
        lp.row(f"slots__{kid}__{s}", by_size[s] + [t for t in slots if t[1]], upper=0)


def gpu_configurations(sizes: Sequence[int], limit: int) -> list[tuple[int, ...]]:
    """Every maximal multiset of `sizes` that fits one GPU (no size can be added), in
    non-increasing order; empty when there are none or more than `limit`."""
    ordered = sorted(set(sizes), reverse=True)
    if not ordered:
        return []
    smallest = ordered[-1]
    out: list[tuple[int, ...]] = []
    stack: list[tuple[int, int, tuple[int, ...]]] = [(0, GPU_MILLI, ())]
    while stack:
        start, left, chosen = stack.pop()
        if left < smallest:  # the smallest size is among the ones still allowed
            out.append(chosen)
            if len(out) > limit:
                return []
            continue
        stack.extend(
            (j, left - ordered[j], (*chosen, ordered[j]))
            for j in range(start, len(ordered))
            if ordered[j] <= left
        )
    return out


def packing_functions(sizes: Sequence[int]) -> list[dict[int, int]]:
    """Dual feasible functions (Fekete and Schepers, 2001) on the milli-GPU sizes that occur,
    scaled to milli: any items that share one GPU (sizes summing to 1000 or less) have
    values summing to 1000 or less, so a GPU pool of G GPUs holds items of total value
    at most G * 1000. Two families: U_e (an item above 1000 - e takes the GPU, one below
    e is free, the rest count their size) and u_k (floor((k+1) x) / k, or x where
    (k+1) x is whole). Values are rounded down to whole milli, which keeps them valid."""
    sizes = sorted(set(sizes) | {GPU_MILLI})
    cuts = {GPU_MILLI + 1 - s for s in sizes if s > GPU_MILLI // 2} | {
        s for s in sizes if s <= GPU_MILLI // 2
    }
    functions: list[dict[int, int]] = []
    for e in sorted(c for c in cuts if 0 < c <= GPU_MILLI // 2):
        functions.append({s: GPU_MILLI if s > GPU_MILLI - e else 0 if s < e else s for s in sizes})
    for k in range(1, 7):
        functions.append(
            {
                s: s
                if ((k + 1) * s) % GPU_MILLI == 0
                else ((k + 1) * s // GPU_MILLI) * GPU_MILLI // k
                for s in sizes
            }
        )
    return functions


def _window_apply(
    run: TraceRun,
    window: list[int],
    here: list[int],
    tried: list[int],
    shapes: dict[ShapeKey, tuple[TracePod, int, int]],
    cols: dict[tuple[ShapeKey, int, int], int],
    values: tuple[float, ...] | None,
    origin: dict[int, tuple[int, tuple[int, ...]]],
) -> bool:
    """Put pods where the solution says (a pod that was here keeps its old place when the
    solution has one of its shape there). All or nothing: False leaves the window empty."""
    if values is None:
        return False
    cluster = run.cluster
    arrivals = run.arrivals
    slots: dict[ShapeKey, list[tuple[int, int]]] = defaultdict(list)
    for (key, i, g), c in cols.items():
        slots[key].extend([(i, g)] * round(values[c]))
    assigned: list[tuple[int, int, int]] = []
    rest: list[int] = []
    for k in here:
        pod = arrivals[k]
        i, was_on = origin[k]
        slot = (i, was_on[0] if pod.num_gpu and pod.gpu_milli < GPU_MILLI else -1)
        if slot in slots[pod.shape]:
            slots[pod.shape].remove(slot)
            assigned.append((k, *slot))
        else:
            rest.append(k)
    for k in rest + tried:
        free = slots[arrivals[k].shape]
        if free:
            assigned.append((k, *free.pop(0)))
        elif k in origin:
            return False

    def rank(t: tuple[int, int, int]) -> tuple[int, int]:
        # Shares first (their GPU is given), then whole GPUs, then CPU-only pods.
        pod = arrivals[t[0]]
        return (0 if t[2] >= 0 else 1 if pod.num_gpu else 2, t[0])

    done: list[int] = []
    for k, i, g in sorted(assigned, key=rank):
        pod = arrivals[k]
        gpus: tuple[int, ...] | None
        if g >= 0:
            gpus = (g,)
        elif k in origin and origin[k][0] == i and _fits_on(cluster, i, pod, origin[k][1]):
            gpus = origin[k][1]
        else:
            gpus = cluster.gpu_choice(i, pod)
        if gpus is None or not _fits_on(cluster, i, pod, gpus):
            if k in origin:
                for d in done:
                    cluster.remove(d, arrivals[d])
                return False
            continue
        cluster.place(k, pod, i, gpus)
        done.append(k)
    for k in here:
        if origin[k] != (cluster.placed[k][0], cluster.placed[k][1]):
            run.moves += 1
    return True


def _fits_on(cluster: TraceCluster, i: int, pod: TracePod, gpus: tuple[int, ...]) -> bool:
    if cluster.cpu_free[i] < pod.cpu_milli or cluster.memory_free[i] < pod.memory_mib:
        return False
    if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
        return False
    return all(
        0 <= g < len(cluster.gpu_free[i]) and cluster.gpu_free[i][g] >= pod.gpu_milli for g in gpus
    )


def starved_windows(
    cluster: TraceCluster, waiting: Sequence[TracePod], partners: int = 2
) -> list[list[int]]:
    """Windows for GPU that waits on CPU or memory: a node with a GPU hole some waiting
    pod would fit but for the node's CPU or memory, with the nodes of its kind that have
    the most CPU and memory to spare (moves between them can free what the hole needs).
    Most such GPU first; each spare node joins one window."""
    shapes = {p.shape: p for p in waiting if p.num_gpu}.values()
    starved: list[tuple[int, int]] = []
    for i, node in enumerate(cluster.nodes):
        free = cluster.gpu_free[i]
        whole = free.count(GPU_MILLI)
        stuck = 0
        for f in free:
            if not f:
                continue
            could = [
                p
                for p in shapes
                if (not p.models or node.flavor in p.models)
                and (p.gpu_milli <= f if p.gpu_milli < GPU_MILLI else p.num_gpu <= whole)
            ]
            if could and not any(
                p.cpu_milli <= cluster.cpu_free[i] and p.memory_mib <= cluster.memory_free[i]
                for p in could
            ):
                stuck += f
        if stuck:
            starved.append((-stuck, i))
    if not starved:
        return []
    chosen = {i for _, i in starved}
    spare: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(cluster.nodes):
        if i not in chosen and node.gpus:
            spare[cluster.kind[i]].append(i)

    def room(i: int) -> tuple[float, int]:
        node = cluster.nodes[i]
        share = cluster.cpu_free[i] / max(1, node.cpu_milli)
        return (share + cluster.memory_free[i] / max(1, node.memory_mib), -i)

    for members in spare.values():
        members.sort(key=room)  # the most room last, where pop() takes it
    windows = []
    for _, i in sorted(starved):
        pool = spare[cluster.kind[i]]
        windows.append([i, *(pool.pop() for _ in range(min(partners, len(pool))))])
    return windows


def _windows(cluster: TraceCluster, size: int, rounds: int) -> list[list[int]]:
    by_kind: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(cluster.nodes):
        if node.gpus:
            by_kind[cluster.kind[i]].append(i)
    windows: list[list[int]] = []
    for members in by_kind.values():
        open_ = sorted(
            (i for i in members if sum(cluster.gpu_free[i]) > 0),
            key=lambda i: (-sum(cluster.gpu_free[i]), i),
        )
        if not open_:
            continue
        full = [i for i in members if sum(cluster.gpu_free[i]) == 0]
        half = max(1, size // 2)
        for w in range(0, len(open_), half):
            chosen = open_[w : w + half]
            partners = full[(rounds * half + w) % max(1, len(full)) :][: size - len(chosen)]
            windows.append(sorted(set(chosen + partners)))
    return windows


# -- what the plan looks like to the checker ---------------------------------------------------


def as_plan(run: TraceRun) -> tuple[PlacementInstance, PlacementPlan]:
    """The final state as a PlacementInstance and PlacementPlan, for check.py."""
    cluster = run.cluster
    jobs = [pod.job(k) for k, pod in enumerate(run.arrivals)]
    instance = trace_instance(cluster.nodes, jobs)
    outcomes = []
    for k, pod in enumerate(run.arrivals):
        job = jobs[k]
        if k in cluster.placed:
            p = _placement(cluster, k, pod)
            outcomes.append(JobOutcome(job.key, OutcomeStatus.PLACED, p.flavor, p.replicas))
        else:
            outcomes.append(
                JobOutcome(job.key, OutcomeStatus.PENDING, reason="no room", constraint="capacity")
            )
    return instance, PlacementPlan(tuple(outcomes), SolveStats("trace", "heuristic", 0.0))
