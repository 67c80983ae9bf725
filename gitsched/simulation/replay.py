"""Scheduling over time (BENCHMARKS.md §5): a job trace replayed through the reconciler's
own decision step, so waits, completion times and utilisation are measured on the code
`reconcile` and `serve` run.

Nothing here places a job. Arrivals become JobSubmitted events at their submission
times; the step (`gitsched.reconciler.step.solve_step`: incremental after a commit of new jobs, a
full solve after a cluster event, as the reconcile loop and `serve` do) decides at that
event's time; a placed job reports JobStarted at once and JobFinished its run time later,
at that event's time; the next decision happens at the next event. Preempted jobs lose
their work since their last checkpoint and wait again. What this module adds is the
clock of the simulation, the trace's readers and the figures.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
import resource
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from gitsched.engine import events as ev
from gitsched.engine.errors import PermanentError
from gitsched.engine.model import (
    BackfillPolicy,
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    Job,
    Node,
    Policy,
    PriorityClass,
    Queue,
    QueueingStrategy,
    ReplicaPlacement,
    Resources,
)
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.units import GPU_MILLI
from gitsched.reconciler.step import solve_step

FLAVOR = "v100"
COHORT = "philly"
GPUS_PER_NODE = 8
NODES_PER_RACK = 16
# Per-GPU CPU and memory on the replay's nodes, and what a job asks per GPU: Philly's
# servers held 8 GPUs with two sockets; the trace records GPUs alone, so CPU and memory
# are sized never to bind.
CPU_MILLI_PER_GPU = 8_000
MEMORY_MIB_PER_GPU = 64 * 1024
# A job whose trace records no checkpoints loses its work since it started when it is
# preempted; the replay's jobs checkpoint every this many minutes (Philly's jobs were
# restarted from their last checkpoint by the framework).
CHECKPOINT_MINUTES = 30
# Users over-estimate their run time: a job's time limit is its run time times a factor
# drawn per job, uniform in this range (Slurm studies report 2-5x; docs/time.md).
OVERESTIMATE = (2.0, 5.0)
# Bounded slowdown's floor on the run time (the common 10 s of the literature).
SLOWDOWN_FLOOR_S = 10.0


class TraceError(PermanentError):
    """A trace file gitsched cannot replay: the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: when it was submitted, how long it ran, what it asked."""

    index: int
    submit_s: float  # seconds since the epoch, UTC
    duration_s: float
    gpu_milli: int  # in all, over every replica
    team: str

    @property
    def gpus(self) -> float:
        return self.gpu_milli / GPU_MILLI


# -- readers ----------------------------------------------------------------------------


def _epoch(text: str, path: Path, line: int, column: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError as e:
        raise TraceError(
            f"{path}:{line}: {column}: not a time YYYY-MM-DD HH:MM:SS: {text!r}"
        ) from e


def _number(row: dict[str, str], column: str, path: Path, line: int) -> float:
    text = row.get(column)
    if text is None or text == "":
        raise TraceError(f"{path}:{line}: {column}: missing")
    try:
        value = float(text)
    except ValueError as e:
        raise TraceError(f"{path}:{line}: {column}: not a number: {text!r}") from e
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: {column}: must be a finite number >= 0, not {text!r}")
    return value


def csv_rows(path: Path, required: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: missing column(s): {', '.join(missing)}")
        try:
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    raise TraceError(f"{path}:{reader.line_num}: wrong number of fields")
                yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as e:
            raise TraceError(f"{path}:{reader.line_num}: {e}") from e


def read_philly(path: Path, start: str | None = None, days: float | None = None) -> list[TraceJob]:
    """The Philly jobs submitted in [start, start + days) (UTC; the whole file by default).
    A malformed row stops the read with its file and line, wherever it is."""
    begin = None if start is None else _parse_start(start)
    jobs: list[TraceJob] = []
    for line, row in csv_rows(path, ("timestamp", "duration", "num_gpus", "cluster")):
        submit = _epoch(row["timestamp"], path, line, "timestamp")
        duration = _number(row, "duration", path, line)
        gpus = _number(row, "num_gpus", path, line)
        if gpus < 1 or gpus != int(gpus):
            raise TraceError(f"{path}:{line}: num_gpus: must be a whole number >= 1: {gpus:g}")
        if begin is not None and submit < begin:
            continue
        if begin is not None and days is not None and submit >= begin + days * 86400:
            continue
        team = row["cluster"].strip()
        if not team:
            raise TraceError(f"{path}:{line}: cluster: empty")
        jobs.append(TraceJob(len(jobs), submit, duration, int(gpus) * GPU_MILLI, team))
    jobs.sort(key=lambda j: (j.submit_s, j.index))
    return [replace(j, index=i) for i, j in enumerate(jobs)]


def read_openb_lifetimes(
    path: Path, start_day: float | None = None, days: float | None = None
) -> list[TraceJob]:
    """An openb pod list's pods with their creation and deletion times (seconds from the
    trace's start) as jobs: the time between them is the run; the team is the pod's QoS
    class (openb records no tenant). Pods without both times are left out; with
    `start_day`, only the pods created in [start_day, start_day + days) days from the
    trace's start."""
    begin = None if start_day is None else start_day * 86400
    end = None if begin is None or days is None else begin + days * 86400
    jobs: list[TraceJob] = []
    required = ("num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time")
    for line, row in csv_rows(path, required):
        if not row["creation_time"] or not row["deletion_time"]:
            continue
        created = _number(row, "creation_time", path, line)
        deleted = _number(row, "deletion_time", path, line)
        gpus = int(_number(row, "num_gpu", path, line))
        milli = int(_number(row, "gpu_milli", path, line))
        if gpus == 0 or milli == 0 or deleted <= created:
            continue
        if (begin is not None and created < begin) or (end is not None and created >= end):
            continue
        jobs.append(
            TraceJob(len(jobs), created, deleted - created, gpus * milli, row["qos"] or "none")
        )
    jobs.sort(key=lambda j: (j.submit_s, j.index))
    return [replace(j, index=i) for i, j in enumerate(jobs)]


def _parse_start(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as e:
        raise TraceError(f"--start: not an ISO date or time: {text!r}") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


# -- the cluster ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayCluster:
    """The cluster a trace is replayed on: 8-GPU nodes in racks of 16, one queue per team
    in one cohort, each team's nominal quota its share of the window's GPU-hours."""

    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    offered_load: float  # the window's GPU-seconds / (the cluster's GPUs x the window)
    window_s: float

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


def size_cluster(jobs: Sequence[TraceJob], load: float = 1.0) -> ReplayCluster:
    """A cluster on which `jobs` offer `load` (1.0: the GPU-seconds the window's jobs ask
    for equal the cluster's GPU-seconds over the window), never smaller than the largest
    job. Each run counts within the window only up to the window's end, so a job of weeks
    does not make a cluster of hundreds of idle GPUs."""
    if not jobs:
        raise TraceError("the trace window holds no jobs")
    begin = jobs[0].submit_s
    window = max(jobs[-1].submit_s - begin, 3600.0)
    asked = sum(j.gpus * min(j.duration_s, begin + window - j.submit_s) for j in jobs)
    gpus = max(asked / (window * load), max(j.gpus for j in jobs))
    count = max(1, math.ceil(gpus / GPUS_PER_NODE))
    nodes = tuple(
        Node(
            name=f"n{i:04d}",
            flavor=FLAVOR,
            gpus=GPUS_PER_NODE,
            cpu_milli=GPUS_PER_NODE * CPU_MILLI_PER_GPU,
            memory_mib=GPUS_PER_NODE * MEMORY_MIB_PER_GPU,
            topology={"rack": f"r{i // NODES_PER_RACK:03d}"},
        )
        for i in range(count)
    )
    total = count * GPUS_PER_NODE
    by_team: dict[str, float] = {}
    for j in jobs:
        by_team[j.team] = by_team.get(j.team, 0.0) + j.gpus * j.duration_s
    teams = sorted(by_team)
    whole = sum(by_team.values()) or 1.0
    # Largest remainder, so the nominal quotas add up to the cluster exactly.
    exact = {t: total * GPU_MILLI * by_team[t] / whole for t in teams}
    nominal = {t: int(exact[t]) for t in teams}
    short = total * GPU_MILLI - sum(nominal.values())
    for t in sorted(teams, key=lambda t: (-(exact[t] - nominal[t]), t))[:short]:
        nominal[t] += 1
    queues = tuple(
        Queue(name=t, team=t, cohort=COHORT, quotas=(FlavorQuota(FLAVOR, nominal[t]),))
        for t in teams
    )
    return ReplayCluster(nodes, queues, asked / (total * window), window)


def cluster_spec(priorities: Iterable[int] = (0,)) -> ClusterSpec:
    classes = tuple(PriorityClass(f"p{v}", v) for v in sorted(set(priorities)))
    return ClusterSpec(
        name="replay",
        topology_levels=("rack",),
        gpu_flavors=(GpuFlavor(FLAVOR, "V100", 16),),
        priority_classes=classes,
        default_priority_class=classes[0].name,
    )


# -- policies -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """A scheduling policy the replay compares: a Policy of the product, and whether the
    jobs are ranked by their true run time (the shortest-job-first oracle)."""

    name: str
    policy: Policy
    oracle_sjf: bool = False
    # every queue's spec.queueingStrategy under this policy
    queueing: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO


def job_of(t: TraceJob, priority: int, limit_minutes: int | None) -> Job:
    """The trace job as the Job its file would become: a gang of 8-GPU replicas when it
    asks more than one node holds, else one replica."""
    gpus = t.gpu_milli
    if gpus > GPUS_PER_NODE * GPU_MILLI and gpus % (GPUS_PER_NODE * GPU_MILLI) == 0:
        replicas, per = gpus // (GPUS_PER_NODE * GPU_MILLI), GPUS_PER_NODE * GPU_MILLI
    elif gpus > GPUS_PER_NODE * GPU_MILLI:
        # Not a multiple of a node: one GPU per replica, still a gang.
        replicas, per = gpus // GPU_MILLI, GPU_MILLI
    else:
        replicas, per = 1, gpus
    whole = max(1, per // GPU_MILLI)
    return Job(
        name=f"j{t.index:06d}",
        queue=t.team,
        replicas=replicas,
        resources=Resources(per, whole * CPU_MILLI_PER_GPU, whole * MEMORY_MIB_PER_GPU),
        priority_class=f"p{priority}",
        priority=priority,
        gpu_flavors=(FLAVOR,),
        checkpoint_interval_minutes=CHECKPOINT_MINUTES,
        submitted_at=iso(t.submit_s),
        time_limit_minutes=limit_minutes,
    )


def sjf_priorities(jobs: Sequence[TraceJob]) -> dict[int, int]:
    """The oracle's priority per job: shorter runs rank higher, in 64 classes by the
    logarithm of the run time (ties go to submission order, as for any priority)."""
    out: dict[int, int] = {}
    for j in jobs:
        bucket = min(63, int(4 * math.log2(max(j.duration_s, 1.0))))
        out[j.index] = 63 - bucket
    return out


def time_limits(jobs: Sequence[TraceJob], seed: int) -> dict[int, int]:
    """Each job's time limit in minutes: its run time times a factor drawn per job from
    OVERESTIMATE (seeded: the same limits for every policy of one replay)."""
    rng = random.Random(f"limits-{seed}")
    return {
        j.index: max(1, math.ceil(j.duration_s * rng.uniform(*OVERESTIMATE) / 60.0)) for j in jobs
    }


# -- the replay ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    """A job's life in the replay."""

    trace: TraceJob
    key: str
    first_start: float | None = None
    started: float | None = None  # the current run's start, while it runs
    done_s: float = 0.0  # work kept (checkpointed) from earlier runs
    finish: float | None = None
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    generation: int = 0
    # Every wait counted, the first and each one after a preemption: the time since it
    # arrived or was stopped, to each start (its total time in the queue).
    queued_s: float = 0.0
    waiting_since: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision of a replay did (kept with `record=True`): the jobs it started
    (key, PlacementDecided.reason), those it stopped (key, preempted by, rule), the free
    GPUs per node after it (milli-GPU; nodes with none free left out), and whose plan."""

    at: float
    source: str
    started: tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]  # key, reason, node milli
    stopped: tuple[tuple[str, str | None, str], ...]
    free_milli: tuple[tuple[str, int], ...]
    pending: tuple[tuple[str, str], ...] = ()  # JobPending of this decision: key, constraint


@dataclass(slots=True)
class ReplayResult:
    policy: str
    limits_known: bool
    jobs: list[_Run]
    cluster: ReplayCluster
    decision_cpu_s: list[float] = field(default_factory=list)
    busy: list[tuple[float, float]] = field(
        default_factory=list
    )  # (time, GPUs allocated from then)
    preemptions: int = 0
    retries: int = 0
    wall_s: float = 0.0
    peak_rss_mib: float = 0.0
    solvers: dict[str, int] = field(default_factory=dict)
    log: list[Decision] = field(default_factory=list)  # with record=True


_FINISH, _ARRIVE = 0, 1


def replay(
    trace: Sequence[TraceJob],
    cluster: ReplayCluster,
    rp: ReplayPolicy,
    limits: dict[int, int] | None = None,
    *,
    record: bool = False,
) -> ReplayResult:
    """Replay `trace` on `cluster` under `rp`: every decision is the reconciler's step at
    the time of the event it follows. `limits` gives each job's time limit in minutes
    (None: no limits known). `record` keeps what each decision did (`ReplayResult.log`)."""
    priorities = sjf_priorities(trace) if rp.oracle_sjf else {j.index: 0 for j in trace}
    setup: list[ev.Event] = [
        ev.ClusterConfigured(cluster=cluster_spec(priorities.values())),
        ev.PolicyChanged(policy=rp.policy),
        *(ev.NodeRegistered(node=n) for n in cluster.nodes),
        *(
            ev.QueueConfigured(queue=replace(q, queueing_strategy=rp.queueing))
            for q in cluster.queues
        ),
    ]
    state: ClusterState = fold(setup)
    runs = {j.index: _Run(j, f"{j.team}/j{j.index:06d}") for j in trace}
    by_key = {r.key: r for r in runs.values()}
    heap: list[tuple[float, int, int, int]] = [(j.submit_s, _ARRIVE, j.index, 0) for j in trace]
    heapq.heapify(heap)
    result = ReplayResult(rp.name, limits is not None, list(runs.values()), cluster)
    allocated = 0.0
    started_wall = time.perf_counter()
    decisions = 0
    while heap:
        now = heap[0][0]
        arrived: list[Job] = []
        finished: list[ev.Event] = []
        while heap and heap[0][0] == now:
            _, kind, index, generation = heapq.heappop(heap)
            run = runs[index]
            if kind == _ARRIVE:
                run.waiting_since = now
                arrived.append(
                    job_of(run.trace, priorities[index], None if limits is None else limits[index])
                )
            elif generation == run.generation and run.started is not None:
                run.finish = now
                run.started = None
                finished.append(ev.JobFinished(job=run.key, at=iso(now)))
        at = iso(now)
        state = fold((*finished, *(ev.JobSubmitted(job=j) for j in arrived)), state)
        if state.needs_placement:
            decisions += 1
            changed = frozenset(j.key for j in arrived) if arrived and not finished else None
            cpu = time.process_time()
            step = solve_step(state, f"replay/{decisions}", at, changed=changed)
            result.decision_cpu_s.append(time.process_time() - cpu)
            if step.plan is not None:
                solver = step.plan.stats.solver
                result.solvers[solver] = result.solvers.get(solver, 0) + 1
            started: list[ev.Event] = []
            began: list[tuple[str, str, tuple[tuple[str, int], ...]]] = []
            pending: list[tuple[str, str]] = []
            stopped: list[tuple[str, str | None, str]] = []
            for event in step.events:
                if isinstance(event, ev.PlacementDecided):
                    run = by_key[event.job]
                    if run.started is not None:  # moved: it starts again from its checkpoint
                        _stop(run, now)
                        run.waiting_since = now
                    if run.waiting_since is not None:
                        run.queued_s += now - run.waiting_since
                        run.waiting_since = None
                    began.append((event.job, event.reason, _node_milli(event.replicas)))
                    run.started = now
                    run.generation += 1
                    if run.first_start is None:
                        run.first_start = now
                    heapq.heappush(
                        heap,
                        (
                            now + run.trace.duration_s - run.done_s,
                            _FINISH,
                            run.trace.index,
                            run.generation,
                        ),
                    )
                    started.append(ev.JobStarted(job=event.job, placement_at=event.at))
                elif isinstance(event, ev.JobPreempted):
                    run = by_key[event.job]
                    _stop(run, now)
                    run.waiting_since = now
                    run.preemptions += 1
                    result.preemptions += 1
                    stopped.append((event.job, event.preempted_by, event.rule))
                elif isinstance(event, ev.JobPending) and record:
                    pending.append((event.job, event.constraint))
            state = fold(started, step.state)
            if record:
                stats = step.plan.stats if step.plan is not None else None
                source = "" if stats is None else stats.plan_source or stats.solver
                result.log.append(
                    Decision(
                        now,
                        source,
                        tuple(began),
                        tuple(stopped),
                        _free_milli(state),
                        tuple(pending),
                    )
                )
        gpus = (
            sum(r.gpu_milli * len(r.gpus) for p in state.placements.values() for r in p.replicas)
            / GPU_MILLI
        )
        if gpus != allocated or not result.busy:
            result.busy.append((now, gpus))
            allocated = gpus
    result.wall_s = time.perf_counter() - started_wall
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _node_milli(replicas: Iterable[ReplicaPlacement]) -> tuple[tuple[str, int], ...]:
    used: dict[str, int] = {}
    for r in replicas:
        used[r.node] = used.get(r.node, 0) + r.gpu_milli * len(r.gpus)
    return tuple(sorted(used.items()))


def _free_milli(state: ClusterState) -> tuple[tuple[str, int], ...]:
    used: dict[str, int] = {}
    for p in state.placements.values():
        for r in p.replicas:
            used[r.node] = used.get(r.node, 0) + r.gpu_milli * len(r.gpus)
    out = []
    for name in sorted(state.nodes):
        free = state.nodes[name].gpus * GPU_MILLI - used.get(name, 0)
        if free > 0:
            out.append((name, free))
    return tuple(out)


def _stop(run: _Run, now: float) -> None:
    """The job stops at `now`: its work since the last checkpoint is lost."""
    assert run.started is not None
    ran = now - run.started
    kept = (ran // (CHECKPOINT_MINUTES * 60)) * CHECKPOINT_MINUTES * 60
    run.lost_gpu_s += (ran - kept) * run.trace.gpus
    run.done_s += kept
    run.started = None
    run.generation += 1


# -- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 for no values): every replay figure's."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one holds everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def figures(result: ReplayResult) -> dict[str, object]:
    """Every figure of BENCHMARKS.md §5 for one policy, units in the keys."""
    runs = result.jobs
    begin = min(r.trace.submit_s for r in runs)
    window_end = begin + result.cluster.window_s
    done = [r for r in runs if r.finish is not None]
    waits = [r.first_start - r.trace.submit_s for r in runs if r.first_start is not None]
    # Every wait of a job, its first and each after a preemption (its time in the queue).
    totals = [r.queued_s for r in runs if r.first_start is not None]
    never = [r for r in runs if r.first_start is None]
    jct = [r.finish - r.trace.submit_s for r in done if r.finish is not None]
    slowdown = [
        max(1.0, (r.finish - r.trace.submit_s) / max(r.trace.duration_s, SLOWDOWN_FLOOR_S))
        for r in done
        if r.finish is not None
    ]
    end = max((r.finish for r in done if r.finish is not None), default=begin)
    big = [
        r.first_start - r.trace.submit_s
        for r in runs
        if r.trace.gpus >= 32 and r.first_start is not None
    ]
    capacity = result.cluster.gpus

    def busy_between(a: float, b: float) -> float:
        total = 0.0
        points = result.busy
        for i, (t, gpus) in enumerate(points):
            nxt = points[i + 1][0] if i + 1 < len(points) else max(b, t)
            lo, hi = max(t, a), min(nxt, b)
            if hi > lo:
                total += gpus * (hi - lo)
        return total

    per_queue: dict[str, dict[str, float]] = {}
    gpu_s_by_queue: dict[str, float] = {}
    for r in runs:
        q = r.trace.team
        gpu_s_by_queue[q] = gpu_s_by_queue.get(q, 0.0) + r.trace.gpus * r.trace.duration_s * (
            r.first_start is not None
        )
    total_used = sum(gpu_s_by_queue.values()) or 1.0
    nominal_total = sum(fq.nominal for q in result.cluster.queues for fq in q.quotas) or 1
    ratios: list[float] = []
    for queue in result.cluster.queues:
        mine = [
            r.first_start - r.trace.submit_s
            for r in runs
            if r.trace.team == queue.name and r.first_start is not None
        ]
        share = gpu_s_by_queue.get(queue.name, 0.0) / total_used
        nominal = sum(fq.nominal for fq in queue.quotas) / nominal_total
        per_queue[queue.name] = {
            "jobs": float(sum(1 for r in runs if r.trace.team == queue.name)),
            "mean_wait_s": _mean(mine),
            "p99_wait_s": percentile(mine, 99),
            "gpu_hours_share": share,
            "nominal_share": nominal,
        }
        if nominal > 0:
            ratios.append(share / nominal)
    return {
        "policy": result.policy,
        "limits_known": result.limits_known,
        "jobs": len(runs),
        "jobs_never_started": len(never),
        "cluster_gpus": capacity,
        "offered_load": round(result.cluster.offered_load, 4),
        "mean_wait_s": _mean(waits),
        "p50_wait_s": percentile(waits, 50),
        "p99_wait_s": percentile(waits, 99),
        "max_wait_s": max(waits, default=0.0),
        "mean_total_wait_s": _mean(totals),
        "p50_total_wait_s": percentile(totals, 50),
        "p99_total_wait_s": percentile(totals, 99),
        "max_total_wait_s": max(totals, default=0.0),
        "mean_jct_s": _mean(jct),
        "mean_bounded_slowdown": _mean(slowdown),
        "makespan_s": end - begin,
        "gpu_utilisation_window": busy_between(begin, window_end)
        / (capacity * result.cluster.window_s),
        "gpu_utilisation_makespan": busy_between(begin, end) / (capacity * max(end - begin, 1.0)),
        "jobs_32_gpus_or_more": len([r for r in runs if r.trace.gpus >= 32]),
        "mean_wait_32_gpus_or_more_s": _mean(big),
        "max_wait_32_gpus_or_more_s": max(big, default=0.0),
        "jain_index_share_over_nominal": jain(ratios),
        "preemptions": result.preemptions,
        "retries": result.retries,
        "gpu_hours_lost": sum(r.lost_gpu_s for r in runs) / 3600,
        "decisions": len(result.decision_cpu_s),
        "p50_decision_cpu_s": percentile(result.decision_cpu_s, 50),
        "p99_decision_cpu_s": percentile(result.decision_cpu_s, 99),
        "max_decision_cpu_s": max(result.decision_cpu_s, default=0.0),
        "replay_wall_s": result.wall_s,
        "peak_rss_mib": result.peak_rss_mib,
        "solvers": dict(sorted(result.solvers.items())),
        "queues": per_queue,
    }


def wait_cdf(result: ReplayResult) -> list[float]:
    """The waits of the jobs that started, sorted: the wait CDF's points."""
    return sorted(
        r.first_start - r.trace.submit_s for r in result.jobs if r.first_start is not None
    )


def policies(builtin: Policy) -> list[ReplayPolicy]:
    """The policies BENCHMARKS.md §5 compares, each a configuration of the product:
    gitsched's built-in Policy (the MILP, fair share, preemption, EASY backfill); Kueue's
    two queueing strategies with no preemption and no reservation, `strict-fifo` (every
    queue StrictFIFO: a head that does not fit blocks its queue) and `best-effort-fifo`
    (Kueue's default BestEffortFIFO: it does not); EASY backfill as Slurm does it (priority
    then submission order, one reservation for the top job, no preemption); and
    shortest-job-first with the true run times known (an oracle: priorities by run time,
    no reservation)."""
    fifo = Policy(
        solver="greedy",
        preemption_enabled=False,
        fairness_weight=0.0,
        backfill=BackfillPolicy(reservations=0),
    )
    easy = replace(fifo, backfill=BackfillPolicy(reservations=1))
    return [
        ReplayPolicy("gitsched", builtin),
        ReplayPolicy("strict-fifo", fifo, queueing=QueueingStrategy.STRICT_FIFO),
        ReplayPolicy("best-effort-fifo", fifo),
        ReplayPolicy("easy-backfill", easy),
        ReplayPolicy("sjf-oracle", fifo, oracle_sjf=True),
    ]
