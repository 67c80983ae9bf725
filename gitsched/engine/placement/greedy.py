"""The greedy baseline: priority order, best fit, gangs all-or-nothing.

This is what Kueue- and Volcano-style schedulers do, and the plan every other
solver is measured against (and warm-started from). Running jobs stay where
they are unless their node went away, their spec changed, a quota cut leaves
no room, or a higher-priority job preempts them.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gitsched.engine.model import (
    NODE_LEVEL,
    Isolation,
    Job,
    Node,
    Placement,
    Queue,
    ReplicaPlacement,
)
from gitsched.engine.placement.constraints import (
    NodeFree,
    QuotaLedger,
    eligible_flavors,
    node_rejection,
    quota_charge,
    replica_shape_error,
    replicas_text,
)
from gitsched.engine.placement.fragmentation import NodeScorer
from gitsched.engine.placement.moves import settle_moves, voluntary_moves_left
from gitsched.engine.placement.objective import (
    broken_soft_constraints,
    instance_tree,
    jobs_by_key,
    lost_gpu_seconds,
    plan_objective,
)
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.placement.preemption import (
    Party,
    Rule,
    admission_order,
    below_nominal,
    borrowing_reclaimable,
    judge,
    min_runtime_protection,
    non_preemptible_fits,
    party,
    reason_text,
    reclaim_note,
    victim_order,
)
from gitsched.engine.placement.spread import SpreadCount, has_spread
from gitsched.engine.placement.topology import (
    compact_allocation,
    gang_topology,
    largest_domain_room,
    largest_slice_room,
    placement_note,
    span_of,
    topology_violation,
)
from gitsched.engine.units import GPU_MILLI, gpus_text


@dataclass(frozen=True, slots=True)
class Fit:
    flavor: str | None
    replicas: tuple[ReplicaPlacement, ...]
    note: str = ""  # where a preferred gang went, and why, as it was at the decision


@dataclass(frozen=True, slots=True)
class Miss:
    reason: str
    constraint: str


def _noted(reason: str, fit: Fit) -> str:
    return f"{reason}; {fit.note}" if fit.note else reason


# What is left on a node: whole free GPUs, CPU, memory, whether a job runs there, its
# dedicated holder, free milli-GPU, milli-GPU free per GPU.
Left = tuple[int, int, int, bool, str | None, int, tuple[int, ...]]


def _left(free: NodeFree) -> Left:
    """What is left on a node, as far as any job's room there depends on it."""
    return (
        free.whole_free_gpus,
        free.cpu_free,
        free.memory_free,
        free.jobs > 0,
        free.dedicated_holder,
        free.free_gpu_milli,
        tuple(free.gpu_free),
    )


def priority_key(job: Job) -> tuple[int, int, str, str]:
    """The order in which the cluster is filled: priority, then submission (the order of
    the commits that submitted the jobs, then their time), then key."""
    return (-job.priority, job.submission, job.submitted_at, job.key)


def claim_shape(job: Job) -> tuple[object, ...] | None:
    """What finding a place and victims reads of a waiting job: jobs of one shape get the
    same answer from the same packing. None for jobs a rule tells apart by name (not
    preemptible, not shared)."""
    if not job.preemptible or job.isolation is not Isolation.SHARED:
        return None
    return (job.queue, job.priority, job.kind, job.service, *job.placement_fields())


def priority_order(jobs: Iterable[Job]) -> list[Job]:
    return sorted(jobs, key=priority_key)


class Packing:
    """The mutable working state of one plan: free capacity and quota usage."""

    def __init__(self, instance: PlacementInstance) -> None:
        self.instance = instance
        self.nodes = {n.name: n for n in instance.nodes}
        self.free = {n.name: NodeFree.of(n) for n in instance.nodes}
        self.ledger = QuotaLedger(instance.queues)
        # What non-preemptible jobs hold per queue and flavor (they stay within nominal).
        self.fixed: dict[tuple[str, str], int] = defaultdict(int)
        self.queues: dict[str, Queue] = {q.name: q for q in instance.queues}
        self.running: dict[str, Fit] = {}
        self.running_in: dict[str, set[str]] = defaultdict(set)  # queue -> running job keys
        # Bumped by every commit and release: an answer asked of the packing holds while it
        # is unchanged (`GreedyPlacer.solve`'s memo of a backlog's misses).
        self.version = 0
        self._eligible: dict[tuple[object, ...], list[Node]] = {}
        self._eligible_names: dict[tuple[object, ...], set[str]] = {}
        # Nodes with some GPU left: when the cluster is full, the only ones worth a look.
        self.open: set[str] = {n.name for n in instance.nodes if n.gpus > 0}
        # Nodes grouped by what is left on them (`_left`): a job's room is asked once per
        # group, not once per node, so a pass over thousands of alike nodes costs a few
        # calls. Groups are dicts used as ordered sets (deterministic order); nodes that
        # commit/release touched are regrouped before the next look (`_stale`).
        self._alike: dict[Left, dict[str, None]] = {}
        self._left_of: dict[str, Left] = {}
        self._stale: dict[str, None] = dict.fromkeys(self.free)
        self._domains: dict[tuple[object, ...], dict[str, list[Node]]] = {}
        self.tree = instance_tree(instance)  # read only: one per node list, as the MILP's
        self._parties: dict[str, Party] = {}
        self._holders: dict[str, dict[str, list[Job]]] = {}  # see `holders`
        self.flavor_free: dict[str | None, int] = defaultdict(int)  # free milli-GPU per flavor
        # Node choice over the job shapes the cluster has seen (None: plain best fit).
        self.scorer = NodeScorer.of(instance)
        # Replicas of each service per domain (engine/placement/spread.py).
        self.spread = SpreadCount()
        self.spread_block: str | None = None  # why the last `rooms` left nodes out by spread
        for n in instance.nodes:
            if n.schedulable:
                self.flavor_free[n.flavor] += n.gpus * GPU_MILLI

    def party(self, job: Job) -> Party:
        """The job as the preemption rules see it (cached: it depends on static fields)."""
        found = self._parties.get(job.key)
        if found is None:
            found = self._parties[job.key] = party(job, self.queues)
        return found

    def eligible_nodes(self, job: Job, flavor: str | None) -> list[Node]:
        """Nodes that could ever host a replica (cached: it depends only on static fields)."""
        key = (flavor, job.isolation, job.residency, job.resources)
        nodes = self._eligible.get(key)
        if nodes is None:
            # node_rejection reads only a node's static attributes: ask once per kind of node.
            verdict: dict[tuple[object, ...], bool] = {}
            nodes = []
            for n in self.instance.nodes:
                kind = (n.flavor, n.isolation, n.region, n.state, n.gpus, n.cpu_milli, n.memory_mib)
                ok = verdict.get(kind)
                if ok is None:
                    ok = verdict[kind] = node_rejection(job, n, flavor) is None
                if ok:
                    nodes.append(n)
            self._eligible[key] = nodes
            self._eligible_names[key] = {n.name for n in nodes}
        return nodes

    def rooms(self, job: Job, flavor: str | None, candidates: list[Node]) -> dict[str, int]:
        """Replicas of `job` each eligible node can take now; nodes that take none are left out."""
        r = job.resources
        names = self._eligible_names[(flavor, job.isolation, job.residency, job.resources)]
        every = len(names) == len(self.free)
        self._regroup()
        rooms: dict[str, int] = {}
        # Many nodes are left alike (empty, or full but for the same few GPUs): ask once per group.
        for left, group in self._alike.items():
            if r.gpu_milli > 0 and left[5] <= 0:
                continue  # no GPU left: no room for a GPU job
            members = group if every else [name for name in group if name in names]
            if not members:
                continue
            k = self.free[next(iter(members))].room_for(r, job, job.replicas)
            if k:
                rooms.update(dict.fromkeys(members, k))
        self.spread_block = None
        if has_spread(job) and rooms:
            open_rooms = {}
            for name, k in rooms.items():
                why = self.spread.blocks(job, self.nodes[name])
                if why is None:
                    open_rooms[name] = k
                elif self.spread_block is None:
                    self.spread_block = why
            if open_rooms:
                self.spread_block = None
            rooms = open_rooms
        return rooms

    def _regroup(self) -> None:
        """Move the nodes touched since the last look to the group of what is left on them."""
        for name in self._stale:
            was = self._left_of.get(name)
            if was is not None:
                group = self._alike[was]
                del group[name]
                if not group:
                    del self._alike[was]
            left = self._left_of[name] = _left(self.free[name])
            self._alike.setdefault(left, {})[name] = None
        self._stale.clear()

    def domains(self, job: Job, flavor: str | None, level: str) -> dict[str, list[Node]]:
        key = (flavor, job.isolation, job.residency, job.resources, level)
        groups = self._domains.get(key)
        if groups is None:
            groups = defaultdict(list)
            for node in self.eligible_nodes(job, flavor):
                groups[node.domain(level)].append(node)
            self._domains[key] = groups
        return groups

    # -- bookkeeping -----------------------------------------------------------------
    def commit(self, job: Job, fit: Fit) -> None:
        self.version += 1
        for replica in fit.replicas:
            free = self.free[replica.node]
            free.take(replica, job.resources, job)
            self._stale[replica.node] = None
            self.flavor_free[free.node.flavor] -= replica.gpu_milli * len(replica.gpus)
            if free.free_gpu_milli <= 0:
                self.open.discard(replica.node)
        if has_spread(job):
            for replica in fit.replicas:
                self.spread.add(job, self.nodes[replica.node])
        charge = quota_charge(job, fit.replicas, self.nodes)
        self.ledger.add(job.queue, fit.flavor, charge)
        if not job.preemptible and fit.flavor is not None:
            self.fixed[(job.queue, fit.flavor)] += charge
        self.running[job.key] = fit
        self.running_in[job.queue].add(job.key)
        self._holders.pop(job.queue, None)

    def release(self, job: Job) -> Fit:
        self.version += 1
        fit = self.running.pop(job.key)
        self.running_in[job.queue].discard(job.key)
        self._holders.pop(job.queue, None)
        for replica in fit.replicas:
            free = self.free[replica.node]
            free.give(replica, job.resources, job)
            self._stale[replica.node] = None
            self.flavor_free[free.node.flavor] += replica.gpu_milli * len(replica.gpus)
            if free.free_gpu_milli > 0:
                self.open.add(replica.node)
        if has_spread(job):
            for replica in fit.replicas:
                self.spread.add(job, self.nodes[replica.node], -1)
        charge = quota_charge(job, fit.replicas, self.nodes)
        self.ledger.remove(job.queue, fit.flavor, charge)
        if not job.preemptible and fit.flavor is not None:
            self.fixed[(job.queue, fit.flavor)] -= charge
        return fit

    # -- keeping a running job where it is ---------------------------------------------
    def keep_problem(self, job: Job, placement: Placement) -> Miss | None:
        """Why the running placement cannot stay as it is, or None if it can."""
        queue = self.queues.get(job.queue)
        if placement.flavor not in eligible_flavors(job, queue):
            return Miss(f"flavor {placement.flavor} is no longer allowed for the job", "spec")
        if not job.smallest_gang <= len(placement.replicas) <= job.replicas:
            return Miss("the job's replica count changed", "spec")
        for replica in placement.replicas:
            node = self.nodes.get(replica.node)
            if node is None:
                return Miss(f"node {replica.node} was removed", "node")
            why = node_rejection(job, node, placement.flavor)
            if why is not None:
                return Miss(why, "node")
            shape = replica_shape_error(job, replica)
            if shape is not None:
                return Miss("the job's resources changed", "spec")
        broken = topology_violation(self.tree, job, [r.node for r in placement.replicas])
        if broken is not None:
            return Miss(f"the job's topology changed: it {broken}", "spec")
        if has_spread(job):
            for replica in placement.replicas:
                why = self.spread.blocks(job, self.nodes[replica.node])
                if why is not None:
                    return Miss(why, f"spread__{job.service}")
        # Check capacity on a copy: a replica must not half-commit.
        taken: list[ReplicaPlacement] = []
        for replica in placement.replicas:
            free = self.free[replica.node]
            if not free.can_take(replica, job.resources, job):
                for done in taken:
                    self.free[done.node].give(done, job.resources, job)
                return Miss(f"GPUs on {replica.node} are taken", "capacity")
            free.take(replica, job.resources, job)
            taken.append(replica)
        for done in taken:
            self.free[done.node].give(done, job.resources, job)
        amount = quota_charge(job, placement.replicas, self.nodes)
        quota = self.ledger.rejection(job.queue, placement.flavor, amount)
        if quota is not None and job.preemptible:
            return Miss(quota[0], quota[1])
        return None

    # -- finding room for a job ----------------------------------------------------------
    def find(self, job: Job) -> Fit | Miss:
        queue = self.queues.get(job.queue)
        flavors = eligible_flavors(job, queue)
        if queue is None:
            return Miss(f"queue {job.queue} does not exist", "queue")
        if not flavors:
            wanted = ", ".join(job.gpu_flavors) or "any flavor"
            return Miss(
                f"queue {job.queue} has no quota for {wanted}", f"quota__{job.queue}__flavor"
            )
        misses: list[Miss] = []
        if self.scorer is not None and job.replicas == 1 and len(flavors) > 1:
            # Knowing the workload, the node that leaves the most usable is chosen across
            # every flavor the job may take (the queue's order breaks ties), as FGD does.
            best: tuple[float, int, Fit] | None = None
            for i, flavor in enumerate(flavors):
                result = self._find_on_flavor(job, flavor)
                if isinstance(result, Miss):
                    misses.append(result)
                    continue
                growth = self.fit_growth(job, result)
                if best is None or (growth, i) < best[:2]:
                    best = (growth, i, result)
            if best is not None:
                return best[2]
        else:
            for flavor in flavors:
                result = self._find_on_flavor(job, flavor)
                if isinstance(result, Fit):
                    return result
                misses.append(result)
        if len(misses) == 1:
            return misses[0]
        return Miss(
            "; ".join(f"{f}: {m.reason}" for f, m in zip(flavors, misses, strict=True)),
            misses[0].constraint,
        )

    def find_within_nominal(self, job: Job, flavor: str | None) -> Fit | Miss:
        """A place on `flavor` that keeps the job's queue within its nominal quota."""
        return self._find_on_flavor(job, flavor, within_nominal=True)

    def _find_on_flavor(
        self, job: Job, flavor: str | None, within_nominal: bool = False
    ) -> Fit | Miss:
        candidates = self.eligible_nodes(job, flavor)
        what = f"{gpus_text(job.resources.gpu_milli)} × {flavor}" if flavor else "CPU only"
        if not candidates:
            return Miss(
                f"no Ready node can host a replica ({what}"
                + (f", {job.isolation} isolation" if job.isolation.value != "shared" else "")
                + (f", regions {', '.join(job.residency)}" if job.residency else "")
                + ")",
                "eligibility",
            )
        # What each node can take does not change while this job is being fitted.
        rooms = self.rooms(job, flavor, candidates)
        if not rooms and self.spread_block is not None:
            return Miss(
                f"needs 1 replica of {what} on a node its spread allows; every node with"
                f" room is full for it: {self.spread_block}",
                f"spread__{job.service}",
            )
        first_miss: Miss | None = None
        step = gang_topology(job).slice_size
        for count in range(job.replicas, job.smallest_gang - 1, -1):
            if count % step:
                continue
            result = self._pack_gang(job, flavor, candidates, count, rooms)
            amount = (
                quota_charge(job, result.replicas, self.nodes)
                if isinstance(result, Fit)
                else count * job.resources.gpu_milli
            )
            quota = self.quota_rejection(job, flavor, amount, within_nominal)
            if quota is None and isinstance(result, Fit):
                return result
            if first_miss is None:
                first_miss = self._explain(quota, result)
        assert first_miss is not None
        return first_miss

    def quota_rejection(
        self, job: Job, flavor: str | None, amount: int, within_nominal: bool
    ) -> tuple[str, str] | None:
        """Why `amount` more milli-GPU of `flavor` is not the job's to take: a limit, borrowing
        where the job may not borrow, or a non-preemptible job's nominal quota."""
        quota = self.ledger.rejection(job.queue, flavor, amount)
        if (
            quota is None
            and within_nominal
            and flavor is not None
            and not self.ledger.below_nominal(job.queue, flavor, amount)
        ):
            quota = (f"queue {job.queue} would borrow", f"quota__{job.queue}__{flavor}")
        if quota is None and not job.preemptible and flavor is not None:
            quota = self.non_preemptible_rejection(job, flavor, amount)
        return quota

    def holders(self, queue: str, flavor: str) -> list[Job]:
        """The queue's running jobs on `flavor`, one per (priority, preemptible): all the
        reclaim rule tells apart (a pending job's reason asks it; kept until the queue's
        running jobs change, as a large queue is asked once per waiting job)."""
        per_flavor = self._holders.setdefault(queue, {})
        found = per_flavor.get(flavor)
        if found is None:
            jobs = jobs_by_key(self.instance)
            seen: dict[tuple[int, bool], Job] = {}
            for k in sorted(self.running_in[queue]):
                job = jobs[k]
                if self.running[k].flavor == flavor:
                    seen.setdefault((job.priority, job.preemptible), job)
            found = per_flavor[flavor] = [seen[p] for p in sorted(seen)]
        return found

    def non_preemptible_rejection(
        self, job: Job, flavor: str, amount: int
    ) -> tuple[str, str] | None:
        """Why a non-preemptible job may not take `amount` of `flavor`: it would borrow."""
        queue = self.queues.get(job.queue)
        fq = queue.quota(flavor) if queue is not None else None
        nominal = fq.nominal if fq is not None else 0
        held = self.fixed[(job.queue, flavor)]
        if non_preemptible_fits(nominal, held, amount):
            return None
        return (
            f"job {job.key} is not preemptible and does not borrow: queue {job.queue}'s "
            f"non-preemptible jobs would hold {gpus_text(held + amount)} of its nominal "
            f"{gpus_text(nominal)} {flavor} GPUs",
            f"no_borrow__{job.queue}__{flavor}",
        )

    @staticmethod
    def _explain(quota: tuple[str, str] | None, packed: Fit | Miss) -> Miss:
        """Every constraint that blocks the job, quota first: a person fixes them all at once."""
        if quota is None:
            assert isinstance(packed, Miss)
            return packed
        if isinstance(packed, Fit):
            return Miss(*quota)
        return Miss(f"{quota[0]}; and even within quota: {packed.reason}", quota[1])

    def _pack_gang(
        self,
        job: Job,
        flavor: str | None,
        candidates: list[Node],
        count: int,
        rooms: dict[str, int],
    ) -> Fit | Miss:
        gang = gang_topology(job)
        if not gang.compact or (count == 1 and gang.slice_size == 1):
            return self.pack(job, flavor, candidates, count, rooms) or self._capacity_miss(
                job, flavor, candidates, count, rooms
            )
        allocation = compact_allocation(
            self.tree,
            rooms,
            count,
            self.fullness,
            gang.limit,
            gang.slice_size,
            gang.slice_level,
        )
        if allocation is not None:
            fit = self.pack_allocation(job, flavor, allocation)
            if not gang.preferred:
                return fit
            # The allocation sits in the narrowest domain that had room: the tightest span.
            span = span_of(self.tree, (name for name, _ in allocation))
            return Fit(flavor, fit.replicas, placement_note(self.tree, job, span, span.level))
        if gang.slice_size > 1:
            slices = count // gang.slice_size
            where = f" within one {gang.limit} domain" if gang.limit else ""
            held = largest_slice_room(
                self.tree, rooms, count, gang.slice_size, gang.slice_level, gang.limit
            )
            return Miss(
                f"needs {slices} slices of {gang.slice_size} replicas of "
                f"{gpus_text(job.resources.gpu_milli)} × {flavor or 'CPU'} GPU, each slice in"
                f" one {gang.slice_level} domain{where}; the largest free "
                f"{gang.limit or 'cluster'}{' domain' if gang.limit else ''} holds {held} of"
                f" the {slices} slices",
                f"topology__{job.key}__{gang.slice_level}",
            )
        if gang.limit is None:
            return self._capacity_miss(job, flavor, candidates, count, rooms)
        best = largest_domain_room(self.tree, rooms, count, gang.limit)
        level = "node" if gang.limit == NODE_LEVEL else f"{gang.limit} domain"
        need = count * job.resources.gpu_milli
        return Miss(
            f"needs {gpus_text(need)} × {flavor or 'CPU'} GPU ({count} × {gpus_text(job.resources.gpu_milli)}) "
            f"in one {level}; the largest free {level} holds {best} of the {replicas_text(count)}",
            f"topology__{job.key}__{gang.limit}",
        )

    def fullness(self, name: str) -> tuple[int, int]:
        """How much a node has left: best fit prefers the domain with the least."""
        free = self.free[name]
        return free.free_gpu_milli, free.cpu_free

    def pack_allocation(
        self, job: Job, flavor: str | None, allocation: Sequence[tuple[str, int]]
    ) -> Fit:
        """Replicas on the nodes of a compact allocation, in its order (slices stay together)."""
        r = job.resources
        placed: list[ReplicaPlacement] = []
        for name, k in allocation:
            scratch = self.free[name].copy()
            for _ in range(k):
                replica = scratch.choose(r)
                scratch.take(replica, r, job)
                placed.append(replica)
        return Fit(flavor, tuple(placed))

    def pack(
        self,
        job: Job,
        flavor: str | None,
        nodes: Sequence[Node],
        count: int,
        rooms: dict[str, int],
    ) -> Fit | None:
        """Best fit, replica by replica; None if the gang does not fit.

        The node a replica goes to only gets fuller, so it stays the best fit until
        it is full: filling nodes in best-fit order, each as far as it goes, places
        the replicas exactly as choosing them one at a time would.
        """
        r = job.resources
        if len(rooms) >= len(nodes):
            names = [n.name for n in nodes if rooms.get(n.name, 0) > 0]
        elif nodes is self._eligible.get((flavor, job.isolation, job.residency, r)):
            names = [name for name, k in rooms.items() if k > 0]  # rooms() looked at these only
        else:
            within = {n.name for n in nodes}
            names = [name for name, k in rooms.items() if k > 0 and name in within]
        total = sum(rooms[name] for name in names)
        if total < count:
            return None
        free = self.free
        if self.scorer is not None and count == 1:
            room = [
                (
                    (free[n].free_gpu_milli - r.gpu_milli, free[n].cpu_free - r.cpu_milli, n),
                    free[n],
                    1,
                )
                for n in names
            ]
            return self._pack_one(job, flavor, room)
        # Each node takes at least one replica: the `count` best fits are all a gang can use.
        best = heapq.nsmallest(
            count, names, key=lambda name: (free[name].free_gpu_milli, free[name].cpu_free, name)
        )
        placed: list[ReplicaPlacement] = []
        for name in best:
            scratch = free[name].copy()
            for _ in range(min(rooms[name], count - len(placed))):
                replica = scratch.choose(r)
                scratch.take(replica, r, job)
                placed.append(replica)
            if len(placed) == count:
                break
        return Fit(flavor, tuple(placed))

    def _pack_one(
        self, job: Job, flavor: str | None, room: list[tuple[tuple[int, int, str], NodeFree, int]]
    ) -> Fit:
        """One replica where the workload's fragmentation plus stranded GPU grows least
        (engine.placement.fragmentation), then best fit; a share on the GPU that grows it
        least. Nodes left alike are scored once."""
        assert self.scorer is not None
        r = job.resources
        best: tuple[tuple[float, int, int, str], NodeFree, int] | None = None
        seen: dict[tuple[object, ...], tuple[float, int]] = {}
        for fit_key, free, _ in room:
            state = (free.node.flavor, tuple(free.gpu_free), free.cpu_free, free.memory_free)
            scored = seen.get(state)
            if scored is None:
                scored = seen[state] = self.scorer.growth(
                    free, r.gpu_milli, r.cpu_milli, r.memory_mib
                )
            key = (scored[0], fit_key[0], fit_key[1], fit_key[2])
            if best is None or key < best[0]:
                best = (key, free, scored[1])
        assert best is not None
        _, free, gpu = best
        if gpu < 0:
            return Fit(flavor, (free.choose(r),))
        return Fit(flavor, (ReplicaPlacement(free.node.name, (gpu,), r.gpu_milli),))

    def fit_growth(self, job: Job, fit: Fit) -> float:
        """How much a one-replica fit grows the workload's fragmentation plus stranded GPU."""
        assert self.scorer is not None
        r = job.resources
        (replica,) = fit.replicas
        growth, _ = self.scorer.growth(
            self.free[replica.node], r.gpu_milli, r.cpu_milli, r.memory_mib
        )
        return growth

    def _capacity_miss(
        self,
        job: Job,
        flavor: str | None,
        candidates: list[Node],
        count: int,
        rooms: dict[str, int],
    ) -> Miss:
        fitting = len(rooms)
        return Miss(
            f"needs {replicas_text(count)} of {gpus_text(job.resources.gpu_milli)} × {flavor or 'CPU'} "
            f"GPU; {fitting} eligible node(s) have room for one now",
            "capacity",
        )


class GreedyPlacer:
    name = "greedy"

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        started = time.perf_counter()
        instance = borrowing_reclaimable(instance)
        packing = Packing(instance)
        policy = instance.policy
        jobs = {j.key: j for j in instance.jobs}
        outcomes: dict[str, JobOutcome] = {}
        displaced: dict[str, Miss] = {}

        # 1. Running jobs keep their place, highest priority first (a quota cut evicts the lowest).
        running = [jobs[k] for k in instance.current if k in jobs]
        running.sort(key=lambda j: (j.preemptible, -j.priority, j.submitted_at, j.key))
        for job in running:
            placement = instance.current[job.key]
            problem = packing.keep_problem(job, placement)
            if problem is None:
                packing.commit(job, Fit(placement.flavor, placement.replicas))
                outcomes[job.key] = JobOutcome(
                    job.key, OutcomeStatus.KEPT, placement.flavor, placement.replicas
                )
            else:
                displaced[job.key] = problem

        # 2. Everything else in admission order, preempting where the rules allow.
        waiting = [j for j in instance.jobs if j.key not in packing.running]
        retry: list[Job] = []
        # A backlog is mostly alike (a queue's stream of 1-GPU jobs): a job that finds no
        # place and no victims leaves the packing as it was, so the next job of its shape
        # would find the same; its answer is remembered while the packing is unchanged.
        waits: dict[tuple[object, ...], tuple[int, JobOutcome]] = {}
        for job in admission_order(waiting, packing.ledger, packing.queues):
            shape = None if job.key in instance.current else claim_shape(job)
            seen = waits.get(shape) if shape is not None else None
            if seen is not None and seen[0] == packing.version:
                outcomes[job.key] = dataclasses.replace(seen[1], job=job.key)
                continue
            result = packing.find(job)
            preempted_here: list[Job] = []
            if isinstance(result, Miss) and policy.preemption_enabled:
                chosen = self._victims(packing, job, jobs)
                if chosen is not None:
                    result, victims = chosen
                    for victim, rule, flavor in victims:
                        was = instance.current.get(victim.key)
                        lost = lost_gpu_seconds(victim, was, instance.now) if was else 0.0
                        # A job admitted earlier in this same solve never ran: it waits again.
                        outcomes[victim.key] = JobOutcome(
                            victim.key,
                            OutcomeStatus.PREEMPTED if was else OutcomeStatus.PENDING,
                            reason=reason_text(rule, job, victim, flavor),
                            constraint="preemption",
                            preempted_by=job.key,
                            lost_gpu_seconds=lost,
                            rule=rule if was else "",
                        )
                        preempted_here.append(victim)
            if isinstance(result, Fit):
                packing.commit(job, result)
                was_running = job.key in instance.current
                outcomes[job.key] = JobOutcome(
                    job.key,
                    OutcomeStatus.MOVED if was_running else OutcomeStatus.PLACED,
                    result.flavor,
                    result.replicas,
                    reason=_noted(
                        displaced[job.key].reason
                        if was_running and job.key in displaced
                        else "admitted",
                        result,
                    ),
                )
            else:
                outcome = self._not_running(instance, job, result, displaced)
                if outcome.status is OutcomeStatus.PENDING:
                    note = reclaim_note(policy, job, packing.ledger, packing.holders)
                    if note:
                        outcome = dataclasses.replace(outcome, reason=f"{outcome.reason}; {note}")
                    if (
                        shape is not None
                        and not preempted_here
                        and job.key not in outcome.reason
                        and job.key not in outcome.constraint
                    ):
                        waits[shape] = (packing.version, outcome)
                outcomes[job.key] = outcome
            retry.extend(preempted_here)

        # 3. A preempted job may still fit elsewhere: then it moves instead of stopping, as
        # many as the Policy's maxMovesPerSolve allows (moves.py).
        made = 0
        for victim in priority_order(retry):
            ran = victim.key in instance.current
            if ran and not voluntary_moves_left(instance, made):
                continue
            result = packing.find(victim)
            if isinstance(result, Fit):
                made += int(ran)
                packing.commit(victim, result)
                outcomes[victim.key] = JobOutcome(
                    victim.key,
                    OutcomeStatus.MOVED if victim.key in instance.current else OutcomeStatus.PLACED,
                    result.flavor,
                    result.replicas,
                    reason=_noted(
                        f"moved to make room for {outcomes[victim.key].preempted_by}", result
                    ),
                )

        ordered = settle_moves(
            instance, tuple(outcomes[j.key] for j in priority_order(instance.jobs))
        )
        objective = plan_objective(instance, ordered)
        return PlacementPlan(
            outcomes=ordered,
            stats=SolveStats(
                solver=self.name,
                status="heuristic",
                objective=objective,
                seconds=time.perf_counter() - started,
                plan_source="greedy",
            ),
            broken_soft=broken_soft_constraints(instance, ordered),
        )

    @staticmethod
    def _not_running(
        instance: PlacementInstance, job: Job, miss: Miss, displaced: dict[str, Miss]
    ) -> JobOutcome:
        if job.key in instance.current:
            cause = displaced.get(job.key, miss)
            lost = lost_gpu_seconds(job, instance.current[job.key], instance.now)
            return JobOutcome(
                job.key,
                OutcomeStatus.PREEMPTED,
                reason=f"{cause.reason}; no other place: {miss.reason}",
                constraint=cause.constraint,
                lost_gpu_seconds=lost,
                rule=Rule.PLACE_GONE,
            )
        return JobOutcome(
            job.key, OutcomeStatus.PENDING, reason=miss.reason, constraint=miss.constraint
        )

    @staticmethod
    def _victims(
        packing: Packing, job: Job, jobs: dict[str, Job]
    ) -> tuple[Fit, list[tuple[Job, Rule, str | None]]] | None:
        """The place and the victims that let `job` in under the rules (Kueue's minimal
        preemptions): per flavor, candidates in `victim_order`, each taken while the rule
        still allows it, until the job fits within its queue's nominal quota; then every
        victim but the last is given back if the job still fits. None if nothing works."""
        queue = packing.queues.get(job.queue)
        if queue is None:
            return None
        flavors = eligible_flavors(job, queue)
        version = packing.version
        # Reclaim comes first on every flavor the job may use, then its own queue's
        # lower-priority jobs (victim_order across flavors: borrowers first).
        for reclaim_only in (True, False):
            for flavor in flavors:
                found = GreedyPlacer._victims_on(packing, job, jobs, flavor, reclaim_only)
                if found is not None:
                    return found
        # Every victim tried was given back: the packing is as it was (`Packing.version`).
        packing.version = version
        return None

    @staticmethod
    def _victims_on(
        packing: Packing, job: Job, jobs: dict[str, Job], flavor: str | None, reclaim_only: bool
    ) -> tuple[Fit, list[tuple[Job, Rule, str | None]]] | None:
        """Victims on one flavor (None: a CPU-only job, which preempts in its own queue);
        with `reclaim_only`, of other queues only."""
        instance = packing.instance
        policy = instance.policy
        ledger = packing.ledger
        queue = packing.queues[job.queue]
        neighbours = [
            q.name
            for q in packing.queues.values()
            if q.name == job.queue or (queue.cohort is not None and q.cohort == queue.cohort)
        ]
        claimant = party(job, packing.queues)
        # Whether the job's queue is below nominal, per flavor: looked up once per pass
        # (it changes as victims of the own queue go).
        facts: dict[str | None, bool] = {}

        def rule_for(victim: Job, held: str | None) -> Rule | str:
            if held not in facts:
                facts[held] = below_nominal(ledger, job.queue, held)
            below = facts[held]
            borrows = held is not None and ledger.borrowing(victim.queue, held)
            return judge(
                policy,
                claimant,
                packing.party(victim),
                victim_queue_borrows=borrows,
                preemptor_queue_below_nominal=below,
            )

        candidates: list[tuple[tuple[bool, int, bool, float, float, str], Job]] = []
        for key in sorted(k for name in neighbours for k in packing.running_in[name]):
            fit = packing.running[key]
            other = jobs[key]
            if other.queue != job.queue and (flavor is None or fit.flavor != flavor):
                continue  # reclaim frees quota and GPUs of the flavor the job needs
            if reclaim_only and other.queue == job.queue:
                continue
            if not isinstance(rule_for(other, fit.flavor), Rule):
                continue
            was = instance.current.get(key)
            if was is not None and min_runtime_protection(
                other,
                was.started_at,
                instance.now,
                packing.queues,
                instance.cluster,
                preemptor_preemptible=job.preemptible,
            ):
                continue  # younger than its minimum run time
            lost = lost_gpu_seconds(other, was, instance.now) if was else 0.0
            order = victim_order(job, other, lost, was.started_at if was else "")
            candidates.append((order, other))
        if not candidates:
            return None
        candidates.sort(key=lambda c: c[0])
        need = job.smallest_gang * job.resources.gpu_milli
        reachable = packing.flavor_free[flavor] + sum(
            len(packing.running[v.key].replicas) * v.resources.gpu_milli
            for _, v in candidates
            if packing.running[v.key].flavor == flavor
        )
        if reachable < need:
            return None  # not enough GPUs of the flavor even with every candidate gone

        def fits() -> Fit | None:
            if need and packing.flavor_free[flavor] < need:
                return None
            found = packing.find_within_nominal(job, flavor)
            return found if isinstance(found, Fit) else None

        removed: list[tuple[Job, Fit, Rule]] = []
        placed: Fit | None = None
        for _, victim in candidates:
            fit = packing.running[victim.key]
            # Judged again: a queue that no longer borrows is not reclaimed from any more.
            facts.clear()
            rule = rule_for(victim, fit.flavor)
            if not isinstance(rule, Rule):
                continue
            removed.append((victim, packing.release(victim), rule))
            placed = fits()
            if placed is not None:
                break
        if placed is None:
            for victim, fit, _ in reversed(removed):
                packing.commit(victim, fit)
            return None
        # Give back every victim the job can do without, the last taken kept.
        needed = [removed[-1]]
        for victim, fit, rule in reversed(removed[:-1]):
            packing.commit(victim, fit)
            again = fits()
            if again is not None:
                placed = again
            else:
                packing.release(victim)
                needed.append((victim, fit, rule))
        placed = fits()
        assert placed is not None, "victims were chosen so that the job fits"
        return placed, [(v, rule, flavor) for v, _, rule in needed]
