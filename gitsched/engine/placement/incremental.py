"""The incremental solve's inputs: which waiting jobs it decides again (`waiting_to_retry`),
and its warm start and fallback, greedy on the change alone. Every running job stays where
it is, the changed jobs go where they fit, and nobody is preempted for them (the MILP
decides that).
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from gitsched.engine.model import Job, Node, Placement
from gitsched.engine.placement.constraints import eligible_flavors, quota_charge
from gitsched.engine.placement.greedy import Fit, Packing, priority_key, priority_order
from gitsched.engine.placement.objective import lost_gpu_seconds, plan_objective
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.placement.realise import can_take, new_packing
from gitsched.engine.placement.running import keep_problem
from gitsched.engine.units import GPU_MILLI

# At most this many waiting jobs join an incremental solve (Kueue, too, retries a bounded
# head of the queue per cycle): an incremental solve stays about the size of its commit
# on any backlog, and the next commit retries the next ones.
RETRY_WAITING_MAX = 64


@dataclass(slots=True)
class _FlavorRoom:
    """Free capacity on a flavor's schedulable nodes, in aggregate: the sums, and the most
    one node (whole GPUs, CPU, memory) or one GPU (milli) has free."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    whole_gpus_on_a_node: int = 0
    milli_on_a_gpu: int = 0
    cpu_on_a_node: int = 0
    memory_on_a_node: int = 0

    def add(self, node: _NodeRoom) -> None:
        self.gpu_milli += node.gpu_milli
        self.cpu_milli += node.cpu_milli
        self.memory_mib += node.memory_mib
        self.whole_gpus_on_a_node = max(self.whole_gpus_on_a_node, node.whole_gpus)
        self.milli_on_a_gpu = max(self.milli_on_a_gpu, node.milli_on_a_gpu)
        self.cpu_on_a_node = max(self.cpu_on_a_node, node.cpu_milli)
        self.memory_on_a_node = max(self.memory_on_a_node, node.memory_mib)

    def may_take(self, job: Job) -> bool:
        """Whether the job could fit here as far as the aggregates tell (necessary, not
        sufficient: the solve decides)."""
        r = job.resources
        if (
            r.gpu_milli * job.replicas > self.gpu_milli
            or r.cpu_milli * job.replicas > self.cpu_milli
            or r.memory_mib * job.replicas > self.memory_mib
            or r.cpu_milli > self.cpu_on_a_node
            or r.memory_mib > self.memory_on_a_node
        ):
            return False
        if r.fractional:
            return r.gpu_milli <= self.milli_on_a_gpu
        return r.whole_gpus <= self.whole_gpus_on_a_node

    def take(self, job: Job) -> None:
        r = job.resources
        self.gpu_milli -= r.gpu_milli * job.replicas
        self.cpu_milli -= r.cpu_milli * job.replicas
        self.memory_mib -= r.memory_mib * job.replicas


@dataclass(frozen=True, slots=True)
class _NodeRoom:
    """What one node has free: milli-GPU in all, whole GPUs, the most on one GPU, CPU, memory."""

    gpu_milli: int
    whole_gpus: int
    milli_on_a_gpu: int
    cpu_milli: int
    memory_mib: int

    @classmethod
    def of(cls, gpu_free: list[int], cpu: int, memory: int) -> _NodeRoom:
        whole = sum(1 for g in gpu_free if g >= GPU_MILLI)
        return cls(sum(gpu_free), whole, max(gpu_free, default=0), cpu, memory)

    @classmethod
    def empty(cls, node: Node) -> _NodeRoom:
        """A node nothing runs on (`of` its whole GPUs, without a list per node)."""
        gpus = max(node.gpus, 0)
        top = GPU_MILLI if gpus > 0 else 0
        return cls(GPU_MILLI * gpus, gpus, top, node.cpu_milli, node.memory_mib)


def _free_rooms(
    nodes: Collection[Node], running: Collection[tuple[Job, Placement]]
) -> dict[str | None, _FlavorRoom]:
    """Free capacity per flavor (None: every schedulable node, for CPU-only jobs) after
    the `running` jobs."""
    schedulable = [n for n in nodes if n.schedulable]
    gpus = {n.name: n.gpus for n in schedulable}
    # Only the nodes something runs on get a list of free milli-GPU per GPU.
    gpu_free: dict[str, list[int]] = {}
    cpu_used: dict[str, int] = defaultdict(int)
    memory_used: dict[str, int] = defaultdict(int)
    for job, placement in running:
        r = job.resources
        for replica in placement.replicas:
            name = replica.node
            count = gpus.get(name)
            if count is None:
                continue
            free = gpu_free.get(name)
            if free is None:
                free = gpu_free[name] = [GPU_MILLI] * count
            for g in replica.gpus:
                if 0 <= g < count:
                    free[g] -= replica.gpu_milli
            cpu_used[name] += r.cpu_milli
            memory_used[name] += r.memory_mib
    rooms: dict[str | None, _FlavorRoom] = {None: _FlavorRoom()}
    for n in schedulable:
        free = gpu_free.get(n.name)
        node = (
            _NodeRoom.empty(n)
            if free is None
            else _NodeRoom.of(
                free, n.cpu_milli - cpu_used[n.name], n.memory_mib - memory_used[n.name]
            )
        )
        rooms[None].add(node)
        if n.flavor is not None:
            room = rooms.get(n.flavor)
            if room is None:
                room = rooms[n.flavor] = _FlavorRoom()
            room.add(node)
    return rooms


def waiting_to_retry(
    instance: PlacementInstance, changed: Collection[str], limit: int = RETRY_WAITING_MAX
) -> tuple[str, ...]:
    """The waiting jobs an incremental solve for `changed` decides again, beside them: a
    production scheduler retries waiting work whenever capacity may have changed, and a
    commit that only adds or edits jobs may free room (an edit moves or shrinks a job)
    or find room an earlier solve left. In the order the full solve fills the cluster
    (`priority_order`: priority, then submission, then key), those whose demand the free
    capacity of a flavor they may take holds in aggregate (each taken off as it joins;
    the changed jobs' places count as free: the solve decides them again), at most
    `limit`.

    Cheap on a large backlog: one pass over the jobs (as the incremental solve makes
    anyway) and the running replicas, a heap of the waiting jobs popped only as far as
    the head goes, no packing (4,000 nodes, 30,000 running and 100,000 waiting jobs:
    1.2 s on 2 cores at load 10, most of it reading each job's key)."""
    if limit <= 0:
        return ()
    changed = frozenset(changed)
    current = instance.current
    running: list[tuple[Job, Placement]] = []
    waiting: list[tuple[int, int, str, str, int]] = []
    for i, job in enumerate(instance.jobs):
        key = job.key
        placement = current.get(key)
        if placement is not None:
            if key not in changed:
                running.append((job, placement))
        elif key not in changed:
            waiting.append((*priority_key(job), i))
    if not waiting:
        return ()
    heapq.heapify(waiting)
    rooms = _free_rooms(instance.nodes, running)
    queues = {q.name: q for q in instance.queues}
    # A demand that found no room on its flavors never will in this pass (rooms only
    # shrink): the next job asking the same is skipped unseen.
    hopeless: set[tuple[object, ...]] = set()
    chosen: list[str] = []
    while waiting and len(chosen) < limit:
        *_, key, i = heapq.heappop(waiting)
        job = instance.jobs[i]
        flavors = eligible_flavors(job, queues.get(job.queue))
        demand = (flavors, job.resources, job.replicas)
        if demand in hopeless:
            continue
        for flavor in flavors:
            room = rooms.get(flavor)
            if room is not None and room.may_take(job):
                room.take(job)
                if flavor is not None:
                    rooms[None].take(job)
                chosen.append(key)
                break
        else:
            hopeless.add(demand)
    return tuple(chosen)


def incremental_start(
    sub: PlacementInstance, free: Collection[str]
) -> tuple[PlacementPlan, Packing]:
    """The warm start and fallback of an incremental solve, greedy on the change alone: every
    running job stays where it is (highest priority first, as greedy keeps them), and the
    free jobs go, in priority order, wherever they fit; nobody is preempted for them (the
    MILP decides that)."""
    started = time.perf_counter()
    packing = new_packing(sub)
    outcomes: dict[str, JobOutcome] = {}
    running = [j for j in sub.jobs if j.key in sub.current and j.key not in free]
    running.sort(key=lambda j: (j.preemptible, -j.priority, j.submitted_at, j.key))
    for job in running:
        placement = sub.current[job.key]
        amount = quota_charge(job, placement.replicas, packing.nodes)
        if can_take(packing, job, placement.replicas) and (
            not job.preemptible
            or packing.ledger.rejection(job.queue, placement.flavor, amount) is None
        ):
            packing.commit(job, Fit(placement.flavor, placement.replicas))
            if not job.preemptible:
                # A non-preemptible job that stays is not charged to quota (check.py agrees).
                packing.ledger.remove(job.queue, placement.flavor, amount)
            outcomes[job.key] = JobOutcome(
                job.key, OutcomeStatus.KEPT, placement.flavor, placement.replicas
            )
    for job in priority_order(j for j in sub.jobs if j.key not in outcomes):
        result = packing.find(job)
        was = sub.current.get(job.key)
        why = "" if was is None else keep_problem(sub, job, was) or "its place is taken"
        if isinstance(result, Fit):
            packing.commit(job, result)
            status = OutcomeStatus.MOVED if was is not None else OutcomeStatus.PLACED
            reason = f"moved: {why}" if was is not None else "admitted"
            outcomes[job.key] = JobOutcome(
                job.key, status, result.flavor, result.replicas, reason=reason
            )
        elif was is not None:
            outcomes[job.key] = JobOutcome(
                job.key,
                OutcomeStatus.PREEMPTED,
                reason=f"{why}; no other place: {result.reason}",
                constraint=result.constraint,
                lost_gpu_seconds=lost_gpu_seconds(job, was, sub.now),
            )
        else:
            outcomes[job.key] = JobOutcome(
                job.key, OutcomeStatus.PENDING, reason=result.reason, constraint=result.constraint
            )
    ordered = tuple(outcomes[j.key] for j in priority_order(sub.jobs))
    plan = PlacementPlan(
        outcomes=ordered,
        stats=SolveStats(
            solver="greedy",
            status="heuristic",
            objective=plan_objective(sub, ordered),
            seconds=time.perf_counter() - started,
        ),
    )
    return plan, packing
