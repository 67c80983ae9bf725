"""An inference service and training jobs on one cluster, over an hour of real requests
(`gitsched bench serving`, docs/autoscaling.md "The serving benchmark").

Nothing here places a replica or decides a count. The service is an InferenceService
whose replicas the reconciler's own step (`gitsched.reconciler.step.solve_step`) adds,
removes and places beside a Philly window of training jobs, as in the trace replay
(simulation/replay.py); its count is decided by the autoscaler the caller passes, asked
for the service's requests in flight every 15 s: the bench passes `serve`'s own
(`gitsched.cluster.autoscaler.Autoscaler`: its windows, engine/autoscaling.py's rule),
which this package may not import (the layers in pyproject.toml). What this
module adds is the model of a replica (how long a request takes on it, from its prompt
and output tokens), the requests' queues, the clock, and the figures.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from gitsched.engine import events as ev
from gitsched.engine.autoscaling import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    AutoscalingSpec,
    autoscaling_block,
    parse_autoscaling,
    rejudge,
)
from gitsched.engine.fairshare import moment
from gitsched.engine.model import FlavorQuota, GpuFlavor, Job, Node, Policy, Queue, Resources
from gitsched.engine.services import InferenceService, is_replica_key
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.units import GPU_MILLI
from gitsched.reconciler.step import solve_step
from gitsched.simulation.replay import (
    CHECKPOINT_MINUTES,
    COHORT,
    CPU_MILLI_PER_GPU,
    MEMORY_MIB_PER_GPU,
    TraceError,
    TraceJob,
    cluster_spec,
    csv_rows,
    iso,
    job_of,
    percentile,
    size_cluster,
    time_limits,
)

# -- the model of one replica -------------------------------------------------------------

FLAVOR = "a100"  # the benchmark's one GPU flavor: A100 80 GB, 8 to a node (a DGX A100)
SERVICE_TEAM = "serving"
SERVICE_NAME = "chat"
SERVICE_KEY = f"{SERVICE_TEAM}/{SERVICE_NAME}"
QUERY = 'sum(vllm:num_requests_running{service="chat"} + vllm:num_requests_waiting{service="chat"})'
SCRAPE_S = 15  # Prometheus' scrape and HPA's sync period alike


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """What one replica (one GPU) serves. ASSUMPTIONS, not measurements (docs/autoscaling.md):
    a 13B model in 16-bit on one A100 80 GB under vLLM. Prefill is compute-bound: 2 x 13e9
    FLOP a token against the A100's 312 TFLOPS at about 40% gives ~5,000 prompt tokens/s.
    Decode is memory-bound: 26 GB of weights read per step at 2 TB/s, with batching
    overheads, ~30 tokens/s per sequence at 8 sequences, the range vLLM's published
    figures give for 13B models on one A100. At most `max_concurrency` sequences at once
    (vLLM's max_num_seqs, set low to keep per-token latency); more wait in the replica's
    queue, first come first served. A replica placed serves `startup_s` later (image
    cached on the node, weights read from local disk, CUDA graphs captured)."""

    prefill_tokens_per_s: float = 5_000.0
    decode_tokens_per_s: float = 30.0  # per sequence
    max_concurrency: int = 8
    startup_s: float = 120.0

    def prefill_s(self, request: Request) -> float:
        return request.prompt_tokens / self.prefill_tokens_per_s

    def service_s(self, request: Request) -> float:
        """A request's time in a slot: its prompt's prefill, then its output's decode."""
        return self.prefill_s(request) + request.output_tokens / self.decode_tokens_per_s


@dataclass(frozen=True, slots=True)
class Request:
    index: int
    arrival_s: float  # seconds since the epoch, UTC
    prompt_tokens: int
    output_tokens: int


def read_azure(path: Path, minutes: float | None = None) -> list[Request]:
    """The requests of an Azure LLM inference trace (TIMESTAMP, ContextTokens,
    GeneratedTokens; UTC), in arrival order; with `minutes`, those of the first minutes
    from the first arrival. A malformed row stops the read with its file and line."""
    out: list[Request] = []
    first: float | None = None
    for line, row in csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        text = row["TIMESTAMP"].strip()
        try:
            # Seven digits of fraction: Python reads six.
            head, _, frac = text.partition(".")
            at = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
            at += float(f"0.{frac}") if frac else 0.0
        except ValueError as e:
            raise TraceError(f"{path}:{line}: TIMESTAMP: not a time: {text!r}") from e
        tokens = []
        for column in ("ContextTokens", "GeneratedTokens"):
            value = row[column].strip()
            if not value.isdigit():
                raise TraceError(f"{path}:{line}: {column}: not a whole number >= 0: {value!r}")
            tokens.append(int(value))
        first = at if first is None else min(first, at)
        out.append(Request(len(out), at, tokens[0], tokens[1]))
    if not out:
        raise TraceError(f"{path}: no requests")
    out.sort(key=lambda r: (r.arrival_s, r.index))
    if minutes is not None:
        assert first is not None
        out = [r for r in out if r.arrival_s < first + minutes * 60]
    return [replace(r, index=i) for i, r in enumerate(out)]


def minute_need(requests: Sequence[Request], model: ReplicaModel, target: float) -> list[int]:
    """The replicas each minute of the trace needs for its requests in flight to average
    `target` per replica (Little's law: in flight = the minute's slot-seconds / 60), at
    least one; minutes from the first arrival's minute."""
    if not requests:
        return []
    start = math.floor(requests[0].arrival_s / 60) * 60
    work: dict[int, float] = {}
    for r in requests:
        m = int((r.arrival_s - start) // 60)
        work[m] = work.get(m, 0.0) + model.service_s(r)
    return [max(1, math.ceil(work.get(m, 0.0) / 60 / target)) for m in range(max(work) + 1)]


# -- the requests' queues -----------------------------------------------------------------


@dataclass(slots=True)
class _Replica:
    index: int
    life: int = 0  # a replica placed again (moved) is a new life: old completions are not its
    ready: bool = False
    running: int = 0
    waiting: deque[int] = field(default_factory=deque)

    @property
    def in_flight(self) -> int:
        return self.running + len(self.waiting)


@dataclass(slots=True)
class RequestQueues:
    """A service's requests as a discrete-event simulation: a router sends each arrival to
    the ready replica with the fewest requests in flight (least-request load balancing;
    ties: the lowest ordinal); each replica runs `max_concurrency` at once, first come first
    served; with no replica ready, requests wait at the router. A replica removed takes no
    more requests: its waiting ones go back to the router's queue in arrival order, its
    running ones finish (a graceful drain). Latency = queueing + service time."""

    requests: Sequence[Request]
    model: ReplicaModel
    replicas: dict[int, _Replica] = field(default_factory=dict)
    held: deque[int] = field(default_factory=deque)  # at the router: no replica ready
    done: list[tuple[int, int]] = field(default_factory=list)  # (request, replica) running
    next_arrival: int = 0
    first_token_s: list[float] = field(default_factory=list)  # per request, once started
    latency_s: list[float] = field(default_factory=list)
    _completions: list[tuple[float, int, int, int]] = field(default_factory=list)
    _lives: int = 0

    def __post_init__(self) -> None:
        self.first_token_s = [math.nan] * len(self.requests)
        self.latency_s = [math.nan] * len(self.requests)

    # -- time ---------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Every arrival and completion up to and including `now`, in time order
        (a completion first at equal times: its slot is free for the arrival)."""
        while True:
            arrival = (
                self.requests[self.next_arrival].arrival_s
                if self.next_arrival < len(self.requests)
                else math.inf
            )
            completion = self._completions[0][0] if self._completions else math.inf
            t = min(arrival, completion)
            if t > now or math.isinf(t):
                return
            if completion <= arrival:
                _, _, replica, life = heapq.heappop(self._completions)
                self._finish(replica, life, t)
            else:
                self._route(self.next_arrival, t)
                self.next_arrival += 1

    def _route(self, request: int, now: float) -> None:
        ready = [r for r in self.replicas.values() if r.ready]
        if not ready:
            self.held.append(request)
            return
        target = min(ready, key=lambda r: (r.in_flight, r.index))
        target.waiting.append(request)
        self._start(target, now)

    def _start(self, replica: _Replica, now: float) -> None:
        while replica.waiting and replica.running < self.model.max_concurrency:
            i = replica.waiting.popleft()
            r = self.requests[i]
            replica.running += 1
            self.first_token_s[i] = now - r.arrival_s + self.model.prefill_s(r)
            end = now + self.model.service_s(r)
            self.latency_s[i] = end - r.arrival_s
            heapq.heappush(self._completions, (end, i, replica.index, replica.life))

    def _finish(self, index: int, life: int, now: float) -> None:
        replica = self.replicas.get(index)
        if replica is None or replica.life != life:
            return  # drained after its removal
        replica.running -= 1
        self._start(replica, now)

    # -- replicas -----------------------------------------------------------------------
    def placed(self, index: int) -> None:
        if index not in self.replicas:
            self._lives += 1
            self.replicas[index] = _Replica(index, self._lives)

    def ready(self, index: int, now: float) -> None:
        replica = self.replicas.get(index)
        if replica is None or replica.ready:
            return
        replica.ready = True
        while self.held:
            self._route(self.held.popleft(), now)

    def removed(self, index: int, now: float) -> None:
        replica = self.replicas.pop(index, None)
        if replica is None:
            return
        back = sorted([*self.held, *replica.waiting])
        self.held = deque()
        for i in back:
            self._route(i, now)

    # -- what Prometheus scrapes ----------------------------------------------------------
    def in_flight(self) -> int:
        """vllm:num_requests_running + vllm:num_requests_waiting summed over the pods,
        plus what waits at the router."""
        return sum(r.in_flight for r in self.replicas.values()) + len(self.held)


# The autoscaler of a run: given the time, the metric's value then (Prometheus' answer)
# and the folded state, the events it appends (ServiceMetricObserved windows and
# ServiceScaled decisions). The bench passes `serve`'s own (gitsched.cluster.autoscaler,
# which this package may not import: bench/serving.py wires it).
Autoscale = Callable[[float, float, ClusterState], Sequence[ev.Event]]


# -- configurations -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """One way to run the service: a fixed count (`autoscaling` None) or a rule, and the
    Policy that places its replicas."""

    name: str
    min_replicas: int
    max_replicas: int
    autoscaling: AutoscalingSpec | None
    policy: Policy
    note: str = ""


@dataclass(frozen=True, slots=True)
class ServingSetup:
    """What every configuration of one run shares."""

    requests: tuple[Request, ...]
    training: tuple[TraceJob, ...]  # shifted onto the requests' day
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    model: ReplicaModel
    start_s: float  # the simulation's start (training's warm-up)
    hour_start_s: float  # the measured span: the requests' first minute ...
    hour_end_s: float  # ... to the end of their last minute
    offered_load: float
    limits: dict[int, int]
    seed: int
    preroll: int = 0  # the first requests are the pre-roll's: served, never measured


def with_preroll(requests: Sequence[Request], minutes: float) -> tuple[list[Request], int]:
    """The trace's first `minutes` of requests copied to just before it, then the trace:
    the service was running before the trace's hour began, so every configuration starts
    the hour in the state the product's own decisions leave it in, not cold at its minimum.
    Returns the requests and how many of them are the pre-roll's."""
    if minutes <= 0 or not requests:
        return list(requests), 0
    start = math.floor(requests[0].arrival_s / 60) * 60
    shift = minutes * 60
    copied = [
        replace(r, arrival_s=r.arrival_s - shift) for r in requests if r.arrival_s < start + shift
    ]
    merged = [*copied, *requests]
    return [replace(r, index=i) for i, r in enumerate(merged)], len(copied)


def setup(
    requests: Sequence[Request],
    training: Sequence[TraceJob],
    model: ReplicaModel,
    service_max_gpus: int,
    warmup_s: float,
    load: float,
    seed: int = 1,
    preroll: int = 0,
) -> ServingSetup:
    """The cluster: the training jobs' (simulation.replay.size_cluster at `load`, their
    queues' nominal quotas adding up to it), plus the service's nodes, whose GPUs are the
    service queue's nominal quota (`service_max_gpus`: its `max`). Training may borrow
    what the service does not use; the service reclaims it (engine/placement/preemption.py)."""
    if len(requests) <= preroll:
        raise TraceError("no requests")
    hour_start = math.floor(requests[preroll].arrival_s / 60) * 60
    first = math.floor(requests[0].arrival_s / 60) * 60
    hour_end = math.floor(requests[-1].arrival_s / 60) * 60 + 60
    sized = size_cluster(training, load) if training else None
    train_nodes = len(sized.nodes) if sized else 0
    extra = math.ceil(service_max_gpus / 8)
    nodes = tuple(
        Node(
            name=f"n{i:04d}",
            flavor=FLAVOR,
            gpus=8,
            cpu_milli=8 * CPU_MILLI_PER_GPU,
            memory_mib=8 * MEMORY_MIB_PER_GPU,
            topology={"rack": f"r{i // 16:03d}"},
        )
        for i in range(train_nodes + extra)
    )
    queues = [
        replace(q, quotas=tuple(FlavorQuota(FLAVOR, fq.nominal) for fq in q.quotas))
        for q in (sized.queues if sized else ())
    ]
    service_quota = len(nodes) * 8 * GPU_MILLI - sum(q.quotas[0].nominal for q in queues)
    queues.append(
        Queue(
            name=SERVICE_TEAM,
            team=SERVICE_TEAM,
            cohort=COHORT,
            quotas=(FlavorQuota(FLAVOR, service_quota),),
        )
    )
    return ServingSetup(
        requests=tuple(requests),
        training=tuple(training),
        nodes=nodes,
        queues=tuple(queues),
        model=model,
        start_s=min(
            first, hour_start - warmup_s, min((j.submit_s for j in training), default=first)
        ),
        hour_start_s=hour_start,
        hour_end_s=hour_end,
        offered_load=sized.offered_load if sized else 0.0,
        limits=time_limits(training, seed),
        seed=seed,
        preroll=preroll,
    )


def service_of(config: ServingConfig, submitted_at: str) -> InferenceService:
    return InferenceService(
        name=SERVICE_NAME,
        team=SERVICE_TEAM,
        queue=SERVICE_TEAM,
        min_replicas=config.min_replicas,
        max_replicas=config.max_replicas,
        resources=Resources(GPU_MILLI, CPU_MILLI_PER_GPU, MEMORY_MIB_PER_GPU),
        priority_class="p0",
        priority=0,
        gpu_flavors=(FLAVOR,),
        autoscaling=None if config.autoscaling is None else autoscaling_block(config.autoscaling),
        file=f"teams/{SERVICE_TEAM}/services/{SERVICE_NAME}.yaml",
        submitted_at=submitted_at,
        submission=1,
    )


def hpa_spec(target: float) -> AutoscalingSpec:
    """HPA v2's defaults written out (scaleUp: no stabilisation, 100% or 4 pods per 15 s,
    Max; scaleDown: 300 s, 100% per 15 s): the same as the product's defaults."""
    return AutoscalingSpec(QUERY, target, scale_up=DEFAULT_SCALE_UP, scale_down=DEFAULT_SCALE_DOWN)


def gitsched_spec(target: float) -> AutoscalingSpec:
    """The block a user writes with only the metric and the target: the product's defaults."""
    return parse_autoscaling({"metric": {"query": QUERY}, "target": target})


# -- one run --------------------------------------------------------------------------------


@dataclass(slots=True)
class _TrainRun:
    job: TraceJob
    key: str
    first_start: float | None = None
    started: float | None = None
    done_s: float = 0.0
    generation: int = 0


@dataclass(slots=True)
class ServingResult:
    config: ServingConfig
    setup: ServingSetup
    queues: RequestQueues
    replica_gpu_s: float = 0.0  # the service's GPUs held within the hour
    training_gpu_s: float = 0.0  # training's GPUs held within the hour
    training_lost_gpu_s: float = 0.0  # work lost to preemptions within the hour
    training_waits_s: list[float] = field(default_factory=list)
    training_jobs_started: int = 0
    scaled: list[ev.ServiceScaled] = field(default_factory=list)
    windows: list[ev.ServiceMetricObserved] = field(default_factory=list)
    replica_steps: int = 0
    preemptions_training: int = 0
    preemptions_service: int = 0
    replicas_over_time: list[tuple[float, int]] = field(default_factory=list)
    # how long each replica added waited for its GPU (added -> placed), seconds
    replica_waits_s: list[float] = field(default_factory=list)
    replica_pending_s: float = 0.0  # replica-seconds wanted but not placed, within the hour
    decisions: int = 0
    decision_cpu_s: float = 0.0
    wall_s: float = 0.0


# At one time: finishes free GPUs first, then replicas become ready, jobs arrive, the
# autoscaler polls; the first solve (the service's replicas) is the run's first event.
_FINISH, _READY, _ARRIVE, _POLL, _START = 0, 1, 2, 3, 4


def run(
    s: ServingSetup, config: ServingConfig, autoscale: Autoscale | None = None
) -> ServingResult:
    """The hour under `config`: training from `s.start_s`, requests from their first
    arrival, `autoscale` (the product's autoscaler, for a config with a rule) asked every
    SCRAPE_S from then to the hour's end; every placement is the reconciler's step at the
    time of the event it follows."""
    if config.autoscaling is not None and autoscale is None:
        raise ValueError(f"{config.name}: a configuration with a rule needs an autoscaler")
    started_wall = time.perf_counter()
    queues = RequestQueues(s.requests, s.model)
    result = ServingResult(config, s, queues)
    state: ClusterState = fold(
        [
            ev.ClusterConfigured(
                cluster=replace(
                    cluster_spec((0,)), gpu_flavors=(GpuFlavor(FLAVOR, "A100-SXM4-80GB", 80),)
                )
            ),
            ev.PolicyChanged(policy=config.policy),
            *(ev.NodeRegistered(node=n) for n in s.nodes),
            *(ev.QueueConfigured(queue=q) for q in s.queues),
            ev.ServiceSubmitted(service=service_of(config, iso(s.start_s))),
        ]
    )
    runs = {j.index: _TrainRun(j, f"{j.team}/j{j.index:06d}") for j in s.training}
    by_key = {r.key: r for r in runs.values()}
    heap: list[tuple[float, int, int, int]] = [
        (j.submit_s, _ARRIVE, j.index, 0) for j in s.training
    ]
    if config.autoscaling is not None:
        t = math.floor(s.requests[0].arrival_s / 60) * 60 + SCRAPE_S
        while t <= s.hour_end_s:
            heap.append((t, _POLL, 0, 0))
            t += SCRAPE_S
    heap.append((s.start_s, _START, 0, 0))  # the first solve places the service's replicas
    heapq.heapify(heap)
    placed_at: dict[int, float] = {}  # replica ordinal -> placed (holds a GPU) since
    added_at: dict[int, float] = {}  # replica ordinal -> added by a step, not yet placed
    ready_gen: dict[int, int] = {}
    lo, hi = s.hour_start_s, s.hour_end_s

    def held(since: float, until: float) -> float:
        return max(0.0, min(until, hi) - max(since, lo))

    def replica_gone(index: int, now: float) -> None:
        since = placed_at.pop(index, None)
        if since is not None:
            result.replica_gpu_s += held(since, now)
        ready_gen[index] = ready_gen.get(index, 0) + 1
        queues.removed(index, now)

    def stop_training(r: _TrainRun, now: float) -> None:
        assert r.started is not None
        ran = now - r.started
        kept = (ran // (CHECKPOINT_MINUTES * 60)) * CHECKPOINT_MINUTES * 60
        result.training_gpu_s += held(r.started, now) * r.job.gpus
        if lo <= now < hi:
            result.training_lost_gpu_s += (ran - kept) * r.job.gpus
        r.done_s += kept
        r.started = None
        r.generation += 1

    while heap:
        now = heap[0][0]
        if now > hi:
            break  # past the hour: nothing more is measured
        queues.advance(now)
        arrived: list[TraceJob] = []
        finished: list[ev.Event] = []
        scaled: list[ev.Event] = []
        solve = False
        while heap and heap[0][0] == now:
            _, kind, index, generation = heapq.heappop(heap)
            if kind == _ARRIVE:
                arrived.append(runs[index].job)
            elif kind == _FINISH:
                r = runs[index]
                if generation == r.generation and r.started is not None:
                    result.training_gpu_s += held(r.started, now) * r.job.gpus
                    r.started = None
                    r.generation += 1
                    finished.append(ev.JobFinished(job=r.key, at=iso(now)))
            elif kind == _READY:
                if ready_gen.get(index) == generation:
                    queues.ready(index, now)
            elif kind == _START:
                solve = True
            elif kind == _POLL and autoscale is not None:
                for e in autoscale(now, float(queues.in_flight()), state):
                    if isinstance(e, ev.ServiceScaled):
                        result.scaled.append(e)
                        scaled.append(e)
                    elif isinstance(e, ev.ServiceMetricObserved):
                        result.windows.append(e)
                        scaled.append(e)
        state = fold(
            (
                *finished,
                *(ev.JobSubmitted(job=training_job(j, s.limits)) for j in arrived),
                *scaled,
            ),
            state,
        )
        if not (solve or state.needs_placement):
            continue
        result.decisions += 1
        changed = (
            frozenset(runs[j.index].key for j in arrived)
            if arrived and not finished and not scaled and not solve
            else None
        )
        cpu = time.process_time()
        step = solve_step(state, f"serving/{result.decisions}", iso(now), changed=changed)
        result.decision_cpu_s += time.process_time() - cpu
        starts: list[ev.Event] = []
        for event in step.events:
            if isinstance(event, ev.ServiceReplicasChanged):
                result.replica_steps += 1
                for gone in event.removed:
                    since = added_at.pop(gone, None)
                    if since is not None:
                        result.replica_pending_s += held(since, now)
                    replica_gone(gone, now)
                for replica in event.added:
                    added_at[replica.index] = now
            elif isinstance(event, ev.PlacementDecided):
                if is_replica_key(event.job):
                    index = int(event.job.rpartition(".")[2])
                    if index in placed_at:
                        replica_gone(index, now)  # moved: it starts again
                    since = added_at.pop(index, None)
                    if since is not None:
                        result.replica_pending_s += held(since, now)
                        if lo <= now < hi:
                            result.replica_waits_s.append(now - since)
                    placed_at[index] = now
                    queues.placed(index)
                    gen = ready_gen.get(index, 0) + 1
                    ready_gen[index] = gen
                    heapq.heappush(heap, (now + s.model.startup_s, _READY, index, gen))
                else:
                    r = by_key[event.job]
                    if r.started is not None:
                        stop_training(r, now)
                    r.started = now
                    r.generation += 1
                    if r.first_start is None:
                        r.first_start = now
                    heapq.heappush(
                        heap,
                        (now + r.job.duration_s - r.done_s, _FINISH, r.job.index, r.generation),
                    )
                starts.append(ev.JobStarted(job=event.job, placement_at=event.at))
            elif isinstance(event, ev.JobPreempted):
                if is_replica_key(event.job):
                    result.preemptions_service += 1
                    index = int(event.job.rpartition(".")[2])
                    replica_gone(index, now)
                    added_at[index] = now  # it waits for a GPU again
                else:
                    if lo <= now < hi:
                        result.preemptions_training += 1
                    stop_training(by_key[event.job], now)
        state = fold(starts, step.state)
        count = len(placed_at)
        if not result.replicas_over_time or result.replicas_over_time[-1][1] != count:
            result.replicas_over_time.append((now, count))
    queues.advance(math.inf)  # the hour's requests finish on the replicas left
    for index in list(placed_at):
        result.replica_gpu_s += held(placed_at.pop(index), hi)
    for since in added_at.values():
        result.replica_pending_s += held(since, hi)
    for r in runs.values():
        if r.started is not None:
            result.training_gpu_s += held(r.started, hi) * r.job.gpus
        if lo <= r.job.submit_s < hi:
            result.training_waits_s.append(
                (r.first_start if r.first_start is not None else hi) - r.job.submit_s
            )
        if r.first_start is not None and lo <= r.first_start < hi:
            result.training_jobs_started += 1
    result.wall_s = time.perf_counter() - started_wall
    return result


def training_job(j: TraceJob, limits: dict[int, int]) -> Job:
    """A Philly job as the replay makes it (simulation.replay.job_of), on the one flavor."""
    return replace(job_of(j, 0, limits.get(j.index)), gpu_flavors=(FLAVOR,))


# -- the configurations compared ------------------------------------------------------------


def configurations(
    requests: Sequence[Request],
    model: ReplicaModel,
    builtin: Policy,
    min_replicas: int = 2,
    target_share: float = 0.75,
) -> list[ServingConfig]:
    """The benchmark's configurations, each of the product: static at the peak minute's
    need; HPA's rule and defaults with replicas placed as Kubernetes' scheduler beside a
    batch queue would (no preemption of training: a scale-up waits for GPUs to free);
    gitsched's autoscaler with its default behaviour, replicas placed by the built-in
    Policy (reclaim of the quota training borrowed); and the reference, the service held
    at its minimum. The target is `target_share` of a replica's concurrency, the peak's
    need is at that target, and `max` is twice the peak."""
    target = target_share * model.max_concurrency
    peak = max(minute_need(requests, model, target))
    top = max(2 * peak, min_replicas)
    no_preemption = replace(builtin, preemption_enabled=False)
    return [
        ServingConfig(
            "static-peak", peak, peak, None, builtin, f"{peak} replicas, the peak minute's need"
        ),
        ServingConfig(
            "hpa",
            min_replicas,
            top,
            hpa_spec(target),
            no_preemption,
            "HPA's rule and defaults; scale-ups wait for free GPUs (no preemption)",
        ),
        ServingConfig(
            "gitsched",
            min_replicas,
            top,
            gitsched_spec(target),
            builtin,
            "gitsched's autoscaler, default behaviour; the built-in Policy places (reclaim)",
        ),
        ServingConfig(
            "service-at-min",
            min_replicas,
            min_replicas,
            None,
            builtin,
            "reference: the service held at its minimum",
        ),
    ]


def _gpus(s: ServingSetup) -> int:
    return sum(n.gpus for n in s.nodes)


def figures(result: ServingResult, slo_ttft_s: float) -> dict[str, object]:
    """One configuration's figures, units in the keys. A minute misses the SLO when the p99
    time to first token of the requests arriving in it is above `slo_ttft_s`; a request
    never served counts as infinitely late."""
    s = result.setup
    q = result.queues
    ttft = [math.inf if math.isnan(v) else v for v in q.first_token_s]
    e2e = [math.inf if math.isnan(v) else v for v in q.latency_s]
    by_minute: dict[int, list[float]] = {}
    ttft, e2e = ttft[s.preroll :], e2e[s.preroll :]
    for r, t in zip(s.requests[s.preroll :], ttft, strict=True):
        by_minute.setdefault(int((r.arrival_s - s.hour_start_s) // 60), []).append(t)
    missed = sum(1 for v in by_minute.values() if percentile(v, 99) > slo_ttft_s)
    hour_h = (s.hour_end_s - s.hour_start_s) / 3600
    counts = [c for _, c in result.replicas_over_time]
    rejudged = sum(
        1
        for e in result.scaled
        if result.config.autoscaling is not None
        and rejudge(
            e,
            result.config.min_replicas,
            result.config.max_replicas,
            result.config.autoscaling,
            result.windows,
            result.scaled,
        )
        == e
    )
    waits = result.training_waits_s
    return {
        "configuration": result.config.name,
        "note": result.config.note,
        "min_replicas": result.config.min_replicas,
        "max_replicas": result.config.max_replicas,
        "requests": len(s.requests) - s.preroll,
        "requests_unserved": sum(1 for v in e2e if math.isinf(v)),
        "p50_latency_s": round(percentile(e2e, 50), 3),
        "p99_latency_s": round(percentile(e2e, 99), 3),
        "p50_ttft_s": round(percentile(ttft, 50), 3),
        "p99_ttft_s": round(percentile(ttft, 99), 3),
        "slo_p99_ttft_s": slo_ttft_s,
        "minutes": len(by_minute),
        "minutes_over_slo": missed,
        "share_minutes_over_slo": round(missed / max(1, len(by_minute)), 4),
        "service_gpu_hours": round(result.replica_gpu_s / 3600, 3),
        "service_mean_replicas": round(result.replica_gpu_s / 3600 / hour_h, 3),
        "service_max_replicas_placed": max(counts, default=0),
        "training_gpu_hours": round(result.training_gpu_s / 3600, 3),
        "training_gpu_hours_lost": round(result.training_lost_gpu_s / 3600, 3),
        "training_gpu_hours_done": round(
            (result.training_gpu_s - result.training_lost_gpu_s) / 3600, 3
        ),
        "training_jobs_submitted": len(waits),
        "training_jobs_started": result.training_jobs_started,
        "training_mean_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "replica_placement_wait_mean_s": round(
            sum(result.replica_waits_s) / len(result.replica_waits_s), 1
        )
        if result.replica_waits_s
        else 0.0,
        "replica_placement_wait_max_s": round(max(result.replica_waits_s, default=0.0), 1),
        "replica_hours_pending": round(result.replica_pending_s / 3600, 3),
        "training_share_of_cluster_gpu_hours": round(
            result.training_gpu_s / ((s.hour_end_s - s.hour_start_s) * _gpus(s)), 4
        ),
        "scaling_actions": sum(
            1 for e in result.scaled if s.hour_start_s <= (moment(e.at) or 0.0) < s.hour_end_s
        ),
        "scaling_actions_with_preroll": len(result.scaled),
        "scaling_actions_rejudged_equal": rejudged,
        "replica_steps": result.replica_steps,
        "preemptions_training": result.preemptions_training,
        "preemptions_service": result.preemptions_service,
        "decisions": result.decisions,
        "decision_cpu_s": round(result.decision_cpu_s, 2),
        "run_wall_s": round(result.wall_s, 2),
    }


# -- the training window ---------------------------------------------------------------------


def training_window(
    jobs: Sequence[TraceJob],
    hour_start_s: float,
    hour_end_s: float,
    warmup_s: float,
    day: str | None = None,
) -> tuple[str, list[TraceJob]]:
    """The training jobs of the Philly day that runs beside the requests: `day`
    (YYYY-MM-DD), or by rule the day of the requests' weekday whose same hours (UTC, the
    warm-up's and the requests') hold the most submissions (ties: the earliest). Jobs submitted from `warmup_s` before the
    hour to its end, shifted by whole days onto the requests' day, renumbered."""

    def midnight(t: float) -> float:
        return math.floor(t / 86400) * 86400

    day0 = midnight(hour_start_s)
    begin, end = hour_start_s - day0, hour_end_s - day0  # seconds into the day
    weekday = datetime.fromtimestamp(hour_start_s, UTC).weekday()
    if day is None:
        counts: dict[float, int] = {}
        for j in jobs:
            d = midnight(j.submit_s)
            if (
                datetime.fromtimestamp(d, UTC).weekday() == weekday
                and begin - warmup_s <= j.submit_s - d < end
            ):
                counts[d] = counts.get(d, 0) + 1
        if not counts:
            raise TraceError("no training job is submitted on that weekday in those hours")
        chosen = min(counts, key=lambda d: (-counts[d], d))
    else:
        try:
            chosen = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
        except ValueError as e:
            raise TraceError(f"--philly-day: not a date YYYY-MM-DD: {day!r}") from e
    shift = day0 - chosen
    picked = [
        replace(j, submit_s=j.submit_s + shift)
        for j in jobs
        if chosen + begin - warmup_s <= j.submit_s < chosen + end
    ]
    picked.sort(key=lambda j: (j.submit_s, j.index))
    label = datetime.fromtimestamp(chosen, UTC).strftime("%Y-%m-%d")
    return label, [replace(j, index=i) for i, j in enumerate(picked)]
