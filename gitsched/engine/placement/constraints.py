"""The rules every solver and the checker share: eligibility, quota, GPU packing.

Written once so that the greedy baseline, the MILP and `check` cannot
disagree about what a legal placement is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gitsched.engine.model import (
    Isolation,
    Job,
    Node,
    Queue,
    ReplicaPlacement,
    Resources,
)
from gitsched.engine.units import GPU_MILLI, gpus_text


def replicas_text(count: int) -> str:
    """1 -> '1 replica', 3 -> '3 replicas'."""
    return f"{count} replica" if count == 1 else f"{count} replicas"


def quota_charge(job: Job, replicas: Iterable[ReplicaPlacement], nodes: Mapping[str, Node]) -> int:
    """What a placement costs its queue's quota, in milli-GPU: the GPUs it holds. A job with
    `isolation: dedicated` holds every node it runs on alone, so it is charged each node's
    GPUs, whatever share it asks (0.25 GPU x 2 on one 8-GPU node: 8 GPUs); any other job
    its replicas' GPUs. Greedy, the MILP, check.py and `audit compliance` all charge this."""
    held = replicas if isinstance(replicas, tuple | list) else list(replicas)
    dedicated = job.isolation is Isolation.DEDICATED and job.resources.gpu_milli > 0
    if not dedicated:  # asked for every placement a step looks at: no node list needed
        return held_gpu_milli(False, len(held) * job.resources.gpu_milli, ())
    names = sorted({r.node for r in held})
    return held_gpu_milli(
        dedicated,
        len(held) * job.resources.gpu_milli,
        [nodes[n].gpus for n in names if n in nodes],
    )


def held_gpu_milli(dedicated: bool, replica_milli: int, node_gpus: Iterable[int]) -> int:
    """`quota_charge` on plain figures (audit reads them from the log): a dedicated job is
    charged the GPUs of the nodes it holds (`node_gpus`, one entry per node), any other job
    the milli-GPU its replicas use (`replica_milli`)."""
    return sum(node_gpus) * GPU_MILLI if dedicated else replica_milli


def eligible_flavors(job: Job, queue: Queue | None) -> tuple[str | None, ...]:
    """Flavors the job may run on: its own list, narrowed to what its queue has quota for.

    A job that asks for no GPU runs on any node and is charged to no flavor (None).
    """
    if job.resources.gpu_milli == 0:
        return (None,)
    if queue is None:
        return ()
    queue_flavors = [q.flavor for q in queue.quotas]
    if job.gpu_flavors:
        return tuple(f for f in job.gpu_flavors if f in queue_flavors)
    return tuple(queue_flavors)


def node_rejection(job: Job, node: Node, flavor: str | None) -> str | None:
    """Why `node` can never host a replica of `job` on `flavor`, whatever else runs; None if it can."""
    if not node.schedulable:
        return f"node {node.name} is {node.state}"
    if flavor is not None and node.flavor != flavor:
        return f"node {node.name} has flavor {node.flavor or 'none'}"
    if job.isolation is Isolation.DEDICATED and node.isolation is not Isolation.DEDICATED:
        return f"node {node.name} is shared; the job needs a dedicated node"
    if job.isolation is Isolation.SHARED and node.isolation is Isolation.DEDICATED:
        return f"node {node.name} is dedicated to isolated jobs"
    if job.residency and node.region not in job.residency:
        return f"node {node.name} is in region {node.region or 'none'}"
    r = job.resources
    if r.gpu_milli > node.gpus * GPU_MILLI:
        return f"node {node.name} has {node.gpus} GPUs"
    if r.cpu_milli > node.cpu_milli or r.memory_mib > node.memory_mib:
        return f"node {node.name} is too small for one replica"
    return None


@dataclass(slots=True)
class NodeFree:
    """What is left on one node while a plan is built: milli-GPU per physical GPU, CPU, memory."""

    node: Node
    gpu_free: list[int]
    cpu_free: int
    memory_free: int
    jobs: int = 0
    dedicated_holder: str | None = None
    # Running totals of gpu_free, kept by take/give: the packers read them millions of times.
    free_gpu_milli: int = -1
    whole_free_gpus: int = -1

    def __post_init__(self) -> None:
        if self.free_gpu_milli < 0:
            self.free_gpu_milli = sum(self.gpu_free)
        if self.whole_free_gpus < 0:
            self.whole_free_gpus = sum(1 for g in self.gpu_free if g == GPU_MILLI)

    @staticmethod
    def of(node: Node) -> NodeFree:
        return NodeFree(node, [GPU_MILLI] * node.gpus, node.cpu_milli, node.memory_mib)

    def fits(self, r: Resources, job: Job) -> bool:
        if r.cpu_milli > self.cpu_free or r.memory_mib > self.memory_free:
            return False
        if job.isolation is Isolation.DEDICATED and self.jobs and self.dedicated_holder != job.key:
            return False
        if self.dedicated_holder is not None and self.dedicated_holder != job.key:
            return False
        if r.fractional:
            return any(g >= r.gpu_milli for g in self.gpu_free)
        return self.whole_free_gpus >= r.whole_gpus

    def copy(self) -> NodeFree:
        return NodeFree(
            self.node,
            list(self.gpu_free),
            self.cpu_free,
            self.memory_free,
            self.jobs,
            self.dedicated_holder,
            self.free_gpu_milli,
            self.whole_free_gpus,
        )

    def room_for(self, r: Resources, job: Job, limit: int) -> int:
        """How many replicas of `job` fit here, one after another (at most `limit`)."""
        if self.dedicated_holder is not None and self.dedicated_holder != job.key:
            return 0
        if job.isolation is Isolation.DEDICATED and self.jobs and self.dedicated_holder != job.key:
            return 0
        k = limit
        if r.cpu_milli:
            k = min(k, self.cpu_free // r.cpu_milli)
        if r.memory_mib:
            k = min(k, self.memory_free // r.memory_mib)
        if k <= 0 or r.gpu_milli == 0:
            return max(k, 0)
        if not r.fractional:
            return min(k, self.whole_free_gpus // r.whole_gpus)
        gpus = sorted(g for g in self.gpu_free if g >= r.gpu_milli)
        placed = 0
        while gpus and placed < k:
            # Best fit, as `choose` does: the fullest GPU that still takes the share.
            g = gpus.pop(0) - r.gpu_milli
            placed += 1
            if g >= r.gpu_milli:
                gpus.insert(next((i for i, x in enumerate(gpus) if x >= g), len(gpus)), g)
        return placed

    def choose(self, r: Resources) -> ReplicaPlacement:
        """Pick GPUs for one replica (best fit for shares, lowest whole GPUs otherwise)."""
        if r.gpu_milli == 0:
            return ReplicaPlacement(self.node.name, (), 0)
        if r.fractional:
            best = min(
                (i for i, g in enumerate(self.gpu_free) if g >= r.gpu_milli),
                key=lambda i: (self.gpu_free[i], i),
            )
            return ReplicaPlacement(self.node.name, (best,), r.gpu_milli)
        whole = [i for i, g in enumerate(self.gpu_free) if g == GPU_MILLI][: r.whole_gpus]
        return ReplicaPlacement(self.node.name, tuple(whole), GPU_MILLI)

    def can_take(self, replica: ReplicaPlacement, r: Resources, job: Job) -> bool:
        """Whether these exact GPUs are still free (for keeping a running replica in place)."""
        if r.cpu_milli > self.cpu_free or r.memory_mib > self.memory_free:
            return False
        if job.isolation is Isolation.DEDICATED and self.jobs and self.dedicated_holder != job.key:
            return False
        if self.dedicated_holder is not None and self.dedicated_holder != job.key:
            return False
        return all(
            0 <= i < len(self.gpu_free) and self.gpu_free[i] >= replica.gpu_milli
            for i in replica.gpus
        )

    def take(self, replica: ReplicaPlacement, r: Resources, job: Job) -> None:
        for i in replica.gpus:
            if self.gpu_free[i] == GPU_MILLI and replica.gpu_milli > 0:
                self.whole_free_gpus -= 1
            self.gpu_free[i] -= replica.gpu_milli
            self.free_gpu_milli -= replica.gpu_milli
        self.cpu_free -= r.cpu_milli
        self.memory_free -= r.memory_mib
        self.jobs += 1
        if job.isolation is Isolation.DEDICATED:
            self.dedicated_holder = job.key

    def give(self, replica: ReplicaPlacement, r: Resources, job: Job) -> None:
        for i in replica.gpus:
            self.gpu_free[i] += replica.gpu_milli
            self.free_gpu_milli += replica.gpu_milli
            if self.gpu_free[i] == GPU_MILLI and replica.gpu_milli > 0:
                self.whole_free_gpus += 1
        self.cpu_free += r.cpu_milli
        self.memory_free += r.memory_mib
        self.jobs -= 1
        if self.jobs == 0:
            self.dedicated_holder = None


class QuotaLedger:
    """Usage per queue and flavor against nominal quota, borrowing and lending limits.

    Kueue's model: a queue keeps `nominal - lendingLimit` for itself; the rest of
    every queue's nominal is the cohort's pool. A queue may use up to
    `nominal + borrowingLimit`, and the cohort as a whole may not hand out more
    than its pool: sum over queues of max(0, usage - guaranteed) <= sum(nominal - guaranteed).
    """

    def __init__(self, queues: Iterable[Queue]) -> None:
        self.queues = {q.name: q for q in queues}
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.pool: dict[tuple[str, str], int] = defaultdict(int)
        self.members: dict[str, list[Queue]] = defaultdict(list)
        self.touched: set[str] = set()  # queues whose usage changed (for the admission order)
        for q in self.queues.values():
            if q.cohort is None:
                continue
            self.members[q.cohort].append(q)
            for fq in q.quotas:
                self.pool[(q.cohort, fq.flavor)] += fq.nominal - fq.guaranteed

    def cohort_draw(self, cohort: str, flavor: str, extra: tuple[str, int] | None = None) -> int:
        """What the cohort's queues take from its pool (optionally with `extra` usage added)."""
        total = 0
        for q in self.members[cohort]:
            fq = q.quota(flavor)
            if fq is None:
                continue
            used = self.usage[(q.name, flavor)]
            if extra is not None and extra[0] == q.name:
                used += extra[1]
            total += max(0, used - fq.guaranteed)
        return total

    def rejection(self, queue_name: str, flavor: str | None, amount: int) -> tuple[str, str] | None:
        """(reason, constraint) if `amount` more milli-GPU of `flavor` breaks a limit, else None."""
        if flavor is None or amount == 0:
            return None
        queue = self.queues.get(queue_name)
        constraint = f"quota__{queue_name}__{flavor}"
        if queue is None:
            return (f"queue {queue_name} does not exist", constraint)
        fq = queue.quota(flavor)
        if fq is None:
            return (f"queue {queue_name} has no quota for {flavor}", constraint)
        used = self.usage[(queue_name, flavor)]
        after = used + amount
        if queue.cohort is None:
            if after > fq.nominal:
                return (
                    f"queue {queue_name} would use {gpus_text(after)} of its {gpus_text(fq.nominal)} "
                    f"{flavor} GPUs (no cohort to borrow from)",
                    constraint,
                )
            return None
        ceiling = fq.ceiling
        if ceiling is not None and after > ceiling:
            return (
                f"queue {queue_name} would use {gpus_text(after)} {flavor} GPUs; nominal "
                f"{gpus_text(fq.nominal)} + borrowing limit {gpus_text(fq.borrowing_limit or 0)} "
                f"allows {gpus_text(ceiling)}",
                constraint,
            )
        pool = self.pool[(queue.cohort, flavor)]
        drawn = self.cohort_draw(queue.cohort, flavor, (queue_name, amount))
        if drawn > pool:
            in_use = self.cohort_draw(queue.cohort, flavor)
            return (
                f"cohort {queue.cohort} shares {gpus_text(pool)} {flavor} GPUs and "
                f"{gpus_text(in_use)} are in use; queue {queue_name} needs {gpus_text(amount)} more",
                f"cohort__{queue.cohort}__{flavor}",
            )
        return None

    def add(self, queue: str, flavor: str | None, amount: int) -> None:
        if flavor is not None:
            self.usage[(queue, flavor)] += amount
            self.touched.add(queue)

    def remove(self, queue: str, flavor: str | None, amount: int) -> None:
        if flavor is not None:
            self.usage[(queue, flavor)] -= amount
            self.touched.add(queue)

    def borrowing(self, queue_name: str, flavor: str) -> bool:
        queue = self.queues.get(queue_name)
        fq = queue.quota(flavor) if queue else None
        return fq is not None and self.usage[(queue_name, flavor)] > fq.nominal

    def below_nominal(self, queue_name: str, flavor: str, amount: int) -> bool:
        queue = self.queues.get(queue_name)
        fq = queue.quota(flavor) if queue else None
        return fq is not None and self.usage[(queue_name, flavor)] + amount <= fq.nominal

    def violations(self) -> list[str]:
        out: list[str] = []
        for (queue_name, flavor), used in sorted(self.usage.items()):
            if used == 0:
                continue
            self.usage[(queue_name, flavor)] = 0
            problem = self.rejection(queue_name, flavor, used)
            self.usage[(queue_name, flavor)] = used
            if problem is not None:
                out.append(problem[0])
        return out


def replica_shape_error(job: Job, replica: ReplicaPlacement) -> str | None:
    """Whether a replica's GPUs match what the job asks for per replica."""
    r = job.resources
    if r.gpu_milli == 0:
        ok = replica.gpus == ()
    elif r.fractional:
        ok = len(replica.gpus) == 1 and replica.gpu_milli == r.gpu_milli
    else:
        ok = (
            len(set(replica.gpus)) == len(replica.gpus) == r.whole_gpus
            and replica.gpu_milli == GPU_MILLI
        )
    if ok:
        return None
    return (
        f"replica of {job.key} on {replica.node} holds GPUs {list(replica.gpus)} at "
        f"{replica.gpu_milli} milli each; the job asks for {gpus_text(r.gpu_milli)} per replica"
    )
