"""The openb trace (BENCHMARKS.md §1) as a cluster repo would live it: pods arrive, are
placed by gitsched's own placer, and stay.

Nothing here places a pod. Each arrival (online) or commit of arrivals (batch) is a
JobSubmitted folded into the cluster state (engine.state: the same fold that learns the
workload's job shapes), the state becomes a placement instance as the reconciler builds
it (engine.core.placement_instance), the product's solver decides
(engine.placement.solvers: greedy Packing, or the MILP's incremental solve by the
reconciler's rule), and the plan goes back through decide/fold as PlacementDecided
events. Re-optimise is one full solve of the final state with moves allowed. What is left
here is the simulation: drawing arrivals, the events, and measuring the allocation.

Online keeps one greedy Packing between arrivals instead of rebuilding it per pod: with
every running pod kept and nothing preemptible (the trace has no priorities), greedy's
solve of a commit of one pod is exactly its `find` for that pod on the packing of the
running ones (a unit test checks the two agree); the packing is rebuilt from the folded
state whenever the learned shapes are republished.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from immutables import Map

from gitsched.engine import events as ev
from gitsched.engine.core import ApplyPlan, decide, placement_instance
from gitsched.engine.model import (
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    Job,
    Node,
    Policy,
    PriorityClass,
    Queue,
    Resources,
)
from gitsched.engine.placement.greedy import Fit, Packing
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.units import GPU_MILLI
from gitsched.reconciler.step import place

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


def trace_policy(solver: str, time_limit_s: float = 10.0) -> Policy:
    """The trace's Policy: the solver asked for; no preemption (the trace has no
    priorities: a pod that runs stays)."""
    return Policy(solver=solver, time_limit_s=time_limit_s, preemption_enabled=False)


# -- the cluster repo, as events ------------------------------------------------------------


class TraceLog:
    """The cluster's folded state as the trace's events build it, and the reconciler's
    step on it: instance, solve, decide, fold. `learn` off hides the learned job shapes
    from the solver (greedy's plain best fit: the baseline)."""

    def __init__(self, nodes: Sequence[Node], policy: Policy, learn: bool = True) -> None:
        self.nodes = list(nodes)
        self.learn = learn
        setup: list[ev.Event] = [
            ev.ClusterConfigured(cluster=trace_cluster_spec(nodes)),
            ev.PolicyChanged(policy=policy),
            *(ev.NodeRegistered(node=n) for n in nodes),
            ev.QueueConfigured(queue=trace_queue(nodes)),
        ]
        self.state: ClusterState = fold(setup)
        self.solves = 0

    def submit(self, jobs: Sequence[Job]) -> list[str]:
        """The jobs' files committed: a JobSubmitted each (what decide makes of a new file)."""
        self.state = fold((ev.JobSubmitted(job=j) for j in jobs), self.state)
        return [j.key for j in jobs]

    def set_policy(self, policy: Policy) -> None:
        self.state = fold([ev.PolicyChanged(policy=policy)], self.state)

    def instance(self) -> PlacementInstance:
        instance = placement_instance(self.state, NOW)
        return instance if self.learn else dataclasses.replace(instance, shapes=())

    def step(self, changed: Collection[str] | None) -> PlacementPlan:
        """The reconciler's solve after a commit that changed `changed` (its own step,
        reconciler.step.place: incremental when something runs and the commit is a small
        part of the jobs, else a full solve; None: a full solve), applied through decide
        and fold."""
        state = self.state
        if not self.learn:
            state = dataclasses.replace(state, shapes=Map())
        plan = place(state, NOW, None if changed is None else frozenset(changed))
        self.apply(plan)
        return plan

    def apply(self, plan: PlacementPlan) -> None:
        self.solves += 1
        solve_id = f"trace/{self.solves}"
        self.state = fold(decide(self.state, ApplyPlan(plan, solve_id, NOW)), self.state)

    def packing(self) -> Packing:
        """Greedy's packing of the state with every running job kept (greedy's first step)."""
        instance = self.instance()
        packing = Packing(instance)
        jobs = {j.key: j for j in instance.jobs}
        for key, placement in instance.current.items():
            packing.commit(jobs[key], Fit(placement.flavor, placement.replicas))
        return packing

    # -- measurement --------------------------------------------------------------------
    @property
    def capacity_milli(self) -> int:
        return sum(n.gpus for n in self.nodes) * GPU_MILLI

    @property
    def allocated_milli(self) -> int:
        return sum(
            r.gpu_milli * len(r.gpus) for p in self.state.placements.values() for r in p.replicas
        )

    def free_split(self) -> tuple[int, int]:
        """The free milli-GPU on GPUs that hold a share (remainders only a smaller share can
        use), and on GPUs that hold nothing."""
        used: dict[tuple[str, int], int] = {}
        for p in self.state.placements.values():
            for r in p.replicas:
                for g in r.gpus:
                    used[(r.node, g)] = used.get((r.node, g), 0) + r.gpu_milli
        partial = whole = 0
        for n in self.nodes:
            for g in range(n.gpus):
                u = used.get((n.name, g), 0)
                if u == 0:
                    whole += GPU_MILLI
                else:
                    partial += GPU_MILLI - u
        return partial, whole


# -- runs ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class TraceRun:
    """The outcome of one arrival sequence."""

    arrivals: list[TracePod]
    log: TraceLog
    curve: list[float]  # allocation ratio at every 1% of arrived demand
    moves: int = 0
    seconds: float = 0.0
    # The work the moves lost since their jobs' last checkpoints (engine/placement/moves.py).
    lost_gpu_seconds: float = 0.0

    @property
    def allocation(self) -> float:
        return self.log.allocated_milli / self.log.capacity_milli

    @property
    def solves(self) -> int:
        return self.log.solves

    @property
    def placed(self) -> list[int]:
        """The arrivals running at the end, by index."""
        running = self.log.state.placements
        return [k for k, pod in enumerate(self.arrivals) if pod.job(k).key in running]


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
    nodes: Sequence[Node], arrivals: Sequence[TracePod], demand: float, learn: bool = True
) -> TraceRun:
    """Each pod a commit of its own, placed by greedy on arrival and never moved; `learn`
    off: plain best fit (greedy without the learned shapes, the Kueue-style baseline)."""
    started = time.perf_counter()
    log = TraceLog(nodes, trace_policy("greedy"), learn)
    marks = set(_curve_points(arrivals, log.capacity_milli, demand))
    run = TraceRun(list(arrivals), log, [])
    packing: Packing | None = None
    published = None
    # No pod leaves, so free capacity only shrinks: a shape that found no room never will
    # (greedy would try the waiting pod again at every solve, and miss again).
    hopeless: set[ShapeKey] = set()
    for k, pod in enumerate(arrivals):
        job = pod.job(k)
        log.submit([job])
        if packing is None or (learn and log.state.shapes is not published):
            packing, published = log.packing(), log.state.shapes
        found = None if pod.shape in hopeless else packing.find(job)
        if isinstance(found, Fit):
            packing.commit(job, found)
            outcome = JobOutcome(
                job.key, OutcomeStatus.PLACED, found.flavor, found.replicas, reason="admitted"
            )
            log.apply(PlacementPlan((outcome,), SolveStats("greedy", "heuristic", 0.0)))
        else:
            hopeless.add(pod.shape)
        if k in marks:
            run.curve.append(log.allocated_milli / log.capacity_milli)
    run.seconds = time.perf_counter() - started
    return run


def run_batch(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    demand: float,
    solver: str,
    commit: int = 100,
    time_limit_s: float = 10.0,
) -> TraceRun:
    """Commits of `commit` pods, each solved as the reconciler solves a commit (the MILP's
    incremental solve once pods run: earlier pods stay, waiting ones wait on)."""
    started = time.perf_counter()
    log = TraceLog(nodes, trace_policy(solver, time_limit_s))
    marks = set(_curve_points(arrivals, log.capacity_milli, demand))
    run = TraceRun(list(arrivals), log, [])
    for start in range(0, len(arrivals), commit):
        batch = range(start, min(start + commit, len(arrivals)))
        changed = log.submit([arrivals[k].job(k) for k in batch])
        log.step(changed)
        for k in batch:
            if k in marks:
                run.curve.append(log.allocated_milli / log.capacity_milli)
    run.seconds = time.perf_counter() - started
    return run


def reoptimise(run: TraceRun, solver: str, budget_s: float) -> TraceRun:
    """A full solve of the final state, as the reconciler runs one (moves allowed at their
    cost), with `budget_s` as the Policy's time limit."""
    started = time.perf_counter()
    log = run.log
    log.set_policy(trace_policy(solver, budget_s))
    plan = log.step(None)
    moved = plan.counts()[OutcomeStatus.MOVED]
    lost = sum(o.lost_gpu_seconds for o in plan.outcomes if o.status is OutcomeStatus.MOVED)
    return dataclasses.replace(
        run,
        moves=run.moves + moved,
        lost_gpu_seconds=run.lost_gpu_seconds + lost,
        seconds=run.seconds + time.perf_counter() - started,
    )


# -- what the plan looks like to the checker ---------------------------------------------------


def as_plan(run: TraceRun) -> tuple[PlacementInstance, PlacementPlan]:
    """The final state as a PlacementInstance and PlacementPlan, for check.py."""
    instance = run.log.instance()
    placements = run.log.state.placements
    outcomes = []
    for job in instance.jobs:
        p = placements.get(job.key)
        if p is not None:
            outcomes.append(JobOutcome(job.key, OutcomeStatus.PLACED, p.flavor, p.replicas))
        else:
            outcomes.append(
                JobOutcome(job.key, OutcomeStatus.PENDING, reason="no room", constraint="capacity")
            )
    instance = dataclasses.replace(instance, current={})
    return instance, PlacementPlan(tuple(outcomes), SolveStats("trace", "heuristic", 0.0))
