"""The placement MILP, built from typed inputs: one model for admission, flavors, gangs,
topology, quotas, preemption, moves, fairness and fragmentation.

Scale comes from aggregation: nodes that are interchangeable (same attributes, same
free GPUs after the jobs that cannot move, same topology domains) form one class,
and the model counts replicas per class, not per node. Capacity rows per class are
necessary conditions of node-level packing (GPU counts, shares, CPU, memory, and
"at most floor(free/s) items of size >= s per node"), so the model is a relaxation
of the real problem and its bound bounds every plan; `milp.py` packs the chosen
counts onto nodes and GPUs. Large instances also aggregate jobs without topology
onto coarse classes that ignore domains, and prune the domains a gang may choose.
With one node per class (`per_node`) the rows are exact for whole GPUs and for shares
that divide a GPU (the q-slot rows), so a solution of that model packs as counted.

Rows and columns are named `rule__job__where` so a binding row can be read back.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from engine.model import (
    GPU_MILLI,
    NODE_LEVEL,
    Isolation,
    Job,
    Node,
    Placement,
    ReplicaPlacement,
    Resources,
    TopologyMode,
)
from engine.placement.constraints import (
    NodeFree,
    eligible_flavors,
    node_rejection,
    replica_shape_error,
)
from engine.placement.linear import INF, LinearModel
from engine.placement.objective import (
    capacity_vector,
    compact_unit,
    compactness_penalty,
    fairness_penalty_per_share,
    instance_fair_targets,
    instance_tree,
    lost_gpu_seconds,
    move_penalty,
    preemption_penalty,
    topology_spread_penalty,
    weights,
)
from engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from engine.placement.preemption import Rights, over_limits
from engine.placement.topology import Tree, span_of, topology_violation

HALF = GPU_MILLI // 2
Terms = list[tuple[int, float]]


Profile = tuple[tuple[int, ...], int, int, bool]  # free per GPU (sorted), CPU, memory, busy


def _free_of(node: Node, profile: Profile) -> NodeFree:
    gpus, cpu, memory, busy = profile
    return NodeFree(node, list(gpus), cpu, memory, 1 if busy else 0)


_PROFILE_ROOMS: dict[tuple[object, ...], int] = {}


def _profile_room(profile: Profile, job: Job) -> int:
    """Replicas of `job` a node left like `profile` takes (a pure function, memoised)."""
    key = (profile, job.resources, job.isolation, job.replicas)
    room = _PROFILE_ROOMS.get(key)
    if room is None:
        if len(_PROFILE_ROOMS) > 200_000:
            _PROFILE_ROOMS.clear()
        probe = Node("probe", None, 0, 0, 0)
        room = _free_of(probe, profile).room_for(job.resources, job, job.replicas)
        _PROFILE_ROOMS[key] = room
    return room


@dataclass(slots=True)
class NodeClass:
    """Nodes that count together: what is left on them after the jobs that stay put.

    Fine classes lie inside one domain of every level a gang asks for; on small
    instances their nodes are identical. Coarse classes only share attributes
    (flavor, isolation, region, size) and serve jobs without topology.
    """

    id: int
    name: str
    flavor: str | None
    isolation: Isolation
    node_gpus: int
    domains: dict[str, str]
    coarse: int = -1
    nodes: list[Node] = field(default_factory=list)
    profiles: dict[Profile, int] = field(default_factory=dict)
    _rooms: dict[tuple[object, ...], tuple[int, int]] = field(default_factory=dict)

    def add(self, node: Node, profile: Profile) -> None:
        self.nodes.append(node)
        self.profiles[profile] = self.profiles.get(profile, 0) + 1

    @property
    def count(self) -> int:
        return len(self.nodes)

    def total(self, part: str) -> float:
        out = 0.0
        for (gpus, cpu, memory, _), n in self.profiles.items():
            if part == "whole":
                out += n * sum(1 for g in gpus if g == GPU_MILLI)
            elif part == "over_half":
                out += n * sum(1 for g in gpus if g > HALF)
            elif part == "milli":
                out += n * sum(gpus)
            elif part == "cpu":
                out += n * cpu
            elif part == "memory":
                out += n * memory
        return out

    def node_max(self, part: str) -> int:
        """The most one node of the class has left of `part`."""
        best = 0
        for gpus, cpu, memory, _ in self.profiles:
            have = {
                "whole": sum(1 for g in gpus if g == GPU_MILLI) * GPU_MILLI,
                "milli": sum(gpus),
                "cpu": cpu,
                "memory": memory,
            }[part]
            best = max(best, have)
        return best

    def slots(self, size: int) -> int:
        """Items of `size` whole GPUs the class can hold: per node floor(free / size)."""
        return sum(
            n * (sum(1 for g in p[0] if g == GPU_MILLI) // size) for p, n in self.profiles.items()
        )

    def share_slots(self, q: int) -> int:
        """Shares of q milli the class can hold: per GPU floor(free / q)."""
        return sum(n * sum(g // q for g in p[0]) for p, n in self.profiles.items())

    def fixed_use(self) -> tuple[float, int]:
        """GPUs held by jobs that stay put, and how many nodes they touch."""
        used = 0.0
        touched = 0
        for (gpus, _, _, _), n in self.profiles.items():
            u = self.node_gpus - sum(gpus) / GPU_MILLI
            used += n * u
            touched += n if u > 1e-9 else 0
        return used, touched

    def _room(self, job: Job) -> tuple[int, int]:
        key = (job.resources, job.isolation, job.replicas)
        found = self._rooms.get(key)
        if found is None:
            rooms = [(_profile_room(p, job), n) for p, n in self.profiles.items()]
            found = (max((r for r, _ in rooms), default=0), sum(r * n for r, n in rooms))
            self._rooms[key] = found
        return found

    def room(self, job: Job) -> int:
        """Replicas of `job` the roomiest node of the class takes."""
        return self._room(job)[0]

    def capacity(self, job: Job) -> int:
        """Replicas of `job` the whole class takes (each node on its own)."""
        return self._room(job)[1]


@dataclass(slots=True)
class JobVars:
    """The columns of one job; -1 where the job has no such choice."""

    job: Job
    place: int = -1  # 1 if the job is placed anew (for a running job: moved)
    keep: int = -1  # 1 if a running job stays exactly where it is
    replicas: int = -1  # elastic jobs: replicas placed anew
    spread: int = -1  # preferred topology given up
    per_class: dict[int, int] = field(default_factory=dict)  # class id -> replicas (fine)
    per_coarse: dict[int, int] = field(default_factory=dict)  # coarse class id -> replicas
    flavor: dict[str | None, int] = field(default_factory=dict)
    domain: dict[tuple[str | None, str], int] = field(default_factory=dict)  # (flavor, domain)
    single: dict[int, int] = field(
        default_factory=dict
    )  # class (coarse: -1-id) -> gang on one node
    single_replicas: dict[int, int] = field(default_factory=dict)  # elastic: replicas there
    escapes: list[int] = field(default_factory=list)  # pruned domains in aggregate (LP only)
    holds: dict[int, int] = field(default_factory=dict)  # dedicated: nodes held per class
    level: str | None = None
    single_size: int = 0


@dataclass(slots=True)
class RunningJob:
    """A job that runs now, and whether it may stay put."""

    job: Job
    placement: Placement
    keepable: bool
    fixed: bool  # stays put, not a decision


@dataclass(slots=True)
class PlacementModel:
    lp: LinearModel
    classes: list[NodeClass]
    coarse: list[NodeClass]
    jobs: dict[str, JobVars]
    running: dict[str, RunningJob]
    node_class: dict[str, int]
    small: bool
    pruned: list[str]  # jobs whose domains were pruned
    escapes: list[int] = field(default_factory=list)  # pruned domains, in aggregate (bound only)
    # Columns whose warm-start value follows from the others: (col, terms, constant, kind, parameter).
    aux: list[tuple[int, Terms, float, str, float]] = field(default_factory=list)
    # Level 1 of the objective: each nominal column's queue, flavor and priority.
    nominal: dict[int, tuple[str, str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """How the model is shaped: `small` models each node that runs a movable job on its
    own and gives every job per-class columns (with `per_node`, every node: then the
    capacity rows are exact for whole GPUs and shares that divide a GPU, and a solution
    packs as it is counted); `keep_all` fixes every running job the warm start keeps
    (incremental solves); a gang may choose among `domain_candidates` domains, and the
    others come back as one aggregate column per coarse class, open only in the LP
    relaxation that bounds the solve."""

    small: bool
    keep_all: bool = False
    domain_candidates: int = 64
    movable: frozenset[str] = frozenset()  # with keep_all: running jobs that may still stop
    moves: bool = True  # running jobs may move (else only stay or stop)
    per_node: bool = False  # with small: every node is its own class (the rows are exact)
    unkeepable: frozenset[str] | None = None  # running jobs known not to stay (None: ask)
    compactness: bool = False  # with small: each domain a gang uses costs (second criterion)


# -- what runs now ----------------------------------------------------------------------------


def keep_problem(
    instance: PlacementInstance,
    job: Job,
    placement: Placement,
    nodes: Mapping[str, Node] | None = None,
) -> str | None:
    """Why a running placement cannot stay as it is, whatever else runs; None if it can."""
    if nodes is None:
        nodes = {n.name: n for n in instance.nodes}
    queue = instance.queue(job.queue)
    if placement.flavor not in eligible_flavors(job, queue):
        return f"flavor {placement.flavor} is no longer allowed for the job"
    if not job.smallest_gang <= len(placement.replicas) <= job.replicas:
        return "the job's replica count changed"
    for replica in placement.replicas:
        node = nodes.get(replica.node)
        if node is None:
            return f"node {replica.node} was removed"
        why = node_rejection(job, node, placement.flavor)
        if why is not None:
            return why
        if replica_shape_error(job, replica) is not None:
            return "the job's resources changed"
        if any(not 0 <= g < node.gpus for g in replica.gpus):
            return "the job's GPUs are gone"
    broken = topology_violation(instance_tree(instance), job, [r.node for r in placement.replicas])
    if broken is not None:
        return f"the job's topology changed: it {broken}"
    return None


def running_jobs(
    instance: PlacementInstance, warm: PlacementPlan, options: BuildOptions
) -> dict[str, RunningJob]:
    jobs = {j.key: j for j in instance.jobs}
    nodes = {n.name: n for n in instance.nodes}
    warm_outcomes = {o.job: o for o in warm.outcomes}
    out: dict[str, RunningJob] = {}
    for key, placement in sorted(instance.current.items()):  # columns in a fixed order
        job = jobs.get(key)
        if job is None:
            continue
        outcome = warm_outcomes.get(key)
        kept_by_warm = outcome is not None and outcome.status is OutcomeStatus.KEPT
        decided = job.preemptible and (not options.keep_all or key in options.movable)
        fixed = kept_by_warm and not decided
        if options.unkeepable is not None:
            keepable = key not in options.unkeepable
        else:
            keepable = fixed or keep_problem(instance, job, placement, nodes) is None
        out[key] = RunningJob(job, placement, keepable, fixed)
    return out


# -- node classes -----------------------------------------------------------------------------


def topology_levels(jobs: Iterable[Job], tree: Tree | None = None) -> list[str]:
    """The levels node classes resolve: those gangs ask for, and on small instances every
    level of the tree (the compactness columns count domains at each)."""
    named = {j.topology.level for j in jobs if j.topology and j.topology.level}
    named |= {j.topology.slice_level for j in jobs if j.topology and j.topology.slice_level}
    if tree is not None:
        named.update(tree.levels)
    return sorted(named - {NODE_LEVEL})


def node_classes(
    instance: PlacementInstance,
    running: Mapping[str, RunningJob],
    levels: list[str],
    small: bool,
    per_node: bool = False,
) -> tuple[list[NodeClass], list[NodeClass], dict[str, int], dict[str, NodeFree]]:
    """Fine classes (inside one domain of every level a gang asks for) and coarse ones."""
    free = {n.name: NodeFree.of(n) for n in instance.nodes if n.schedulable}
    movable_on: set[str] = set()
    for rj in running.values():
        for replica in rj.placement.replicas:
            if replica.node not in free:
                continue
            if rj.fixed:
                free[replica.node].take(replica, rj.job.resources, rj.job)
            else:
                movable_on.add(replica.node)
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    for n in instance.nodes:
        if n.schedulable:
            for level in levels:
                sizes[(level, n.domain(level))] += 1
    classes: list[NodeClass] = []
    coarse: list[NodeClass] = []
    fine_ids: dict[tuple[object, ...], int] = {}
    coarse_ids: dict[tuple[object, ...], int] = {}
    node_class: dict[str, int] = {}
    for n in sorted((n for n in instance.nodes if n.name in free), key=lambda n: n.name):
        f = free[n.name]
        if f.dedicated_holder is not None:
            continue  # a fixed isolated job holds the node alone
        profile: Profile = (tuple(sorted(f.gpu_free)), f.cpu_free, f.memory_free, f.jobs > 0)
        attrs = (n.flavor, n.isolation, n.region, n.gpus, n.cpu_milli, n.memory_mib)
        domains = tuple(
            (level, n.domain(level)) for level in levels if sizes[(level, n.domain(level))] > 1
        )
        if small:
            key: tuple[object, ...] = (
                attrs,
                profile,
                domains,
                n.name if per_node or n.name in movable_on else "",
            )
        else:
            key = (attrs, domains)
        kid = coarse_ids.get(attrs)
        if kid is None:
            kid = coarse_ids[attrs] = len(coarse)
            coarse.append(NodeClass(kid, f"k{kid}:{n.name}", n.flavor, n.isolation, n.gpus, {}))
        coarse[kid].add(n, profile)
        cid = fine_ids.get(key)
        if cid is None:
            cid = fine_ids[key] = len(classes)
            classes.append(
                NodeClass(
                    cid, f"c{cid}:{n.name}", n.flavor, n.isolation, n.gpus, dict(domains), kid
                )
            )
        classes[cid].add(n, profile)
        node_class[n.name] = cid
    return classes, coarse, node_class, free


# -- the usage a replica puts on a class's rows -------------------------------------------------


@dataclass(slots=True)
class ClassRows:
    """Linear expressions for the capacity rows of one class."""

    whole: Terms = field(default_factory=list)
    over_half: Terms = field(default_factory=list)
    milli: Terms = field(default_factory=list)
    cpu: Terms = field(default_factory=list)
    memory: Terms = field(default_factory=list)
    items: dict[int, Terms] = field(default_factory=lambda: defaultdict(list))  # size -> count
    slot_use: dict[int, Terms] = field(default_factory=lambda: defaultdict(list))  # by kept jobs
    holds: Terms = field(default_factory=list)
    gpu_used: Terms = field(default_factory=list)  # in GPUs, for fragmentation
    fractional: bool = False
    # Whether a job may be placed anew on the class: rows over kept jobs alone hold anyway
    # (what runs now fits together), so a class without new placements gets no rows.
    fresh: bool = False
    # (column, GPU items, milli each) of whole GPUs and new shares, for the rows that count
    # slots of each share size q; kept shares count through the slots they block, per GPU.
    share_items: list[tuple[int, float, int]] = field(default_factory=list)
    share_blocked: dict[int, Terms] = field(default_factory=lambda: defaultdict(list))


def share_sizes(rows: ClassRows) -> list[int]:
    """The share sizes q whose slots get a row of their own: new shares that divide a GPU,
    at most half of it. With such sizes (250, 500 milli ...) and whole GPUs, the rows make
    packing one node exact: an item of size a uses floor(a / q) of the node's
    sum over GPUs of floor(free / q) slots."""
    return sorted(
        {q for _, _, q in rows.share_items if q <= HALF and GPU_MILLI % q == 0}, reverse=True
    )


def add_replicas(
    rows: ClassRows, r: Resources, col: int, count: float = 1.0, items: bool = True
) -> None:
    """`count` replicas of shape `r`, times column `col`, on the rows of one class
    (`items` False: a kept job, whose whole-GPU slots and shares count per node)."""
    if r.gpu_milli:
        if r.fractional:
            rows.fractional = True
            if r.gpu_milli > HALF:
                rows.over_half.append((col, count))
            if items:
                rows.share_items.append((col, count, r.gpu_milli))
        else:
            rows.whole.append((col, count * r.whole_gpus))
            rows.over_half.append((col, count * r.whole_gpus))
            rows.share_items.append((col, count * r.whole_gpus, GPU_MILLI))
            if items and r.whole_gpus > 1:
                rows.items[r.whole_gpus].append((col, count))
        rows.milli.append((col, count * r.gpu_milli / GPU_MILLI))
        rows.gpu_used.append((col, count * r.gpu_milli / GPU_MILLI))
    if r.cpu_milli:
        rows.cpu.append((col, count * r.cpu_milli / 1000))
    if r.memory_mib:
        rows.memory.append((col, count * r.memory_mib / 1024))


def emit_class_rows(
    lp: LinearModel,
    cls: NodeClass,
    rows: ClassRows,
    frag_weight: float,
    aux: list[tuple[int, Terms, float, str, float]],
) -> None:
    """Capacity rows of one class: each a necessary condition of packing its nodes."""
    tag = cls.name
    lp.row(f"gpus__{tag}", rows.whole, upper=cls.total("whole"))
    if rows.fractional:
        lp.row(f"gpu_shares__{tag}", rows.over_half, upper=cls.total("over_half"))
        lp.row(f"gpu_milli__{tag}", rows.milli, upper=cls.total("milli") / GPU_MILLI)
    for q in share_sizes(rows):
        terms = [(c, v * (a // q)) for c, v, a in rows.share_items if a >= q]
        lp.row(f"gpu_slots__{tag}__{q}", terms + rows.share_blocked[q], upper=cls.share_slots(q))
    lp.row(f"cpu__{tag}", rows.cpu, upper=cls.total("cpu") / 1000)
    lp.row(f"memory__{tag}", rows.memory, upper=cls.total("memory") / 1024)
    # An item of a GPUs uses floor(a / s) of a node's floor(free / s) slots of s GPUs.
    for size in sorted(rows.items):
        if size > cls.node_gpus:
            continue
        terms = [(c, v * (a // size)) for a in rows.items if a >= size for c, v in rows.items[a]]
        lp.row(f"gpu_items__{tag}__{size}", terms + rows.slot_use[size], upper=cls.slots(size))
    if rows.holds:
        lp.row(f"dedicated__{tag}", rows.holds, upper=cls.count)
    if frag_weight and cls.node_gpus and rows.gpu_used:
        g = cls.node_gpus
        fixed_used, touched_fixed = cls.fixed_use()
        # Touched nodes T >= used / GPUs per node; the stranded share is T - used / GPUs per node.
        t = lp.var(f"touched__{tag}", touched_fixed, cls.count, cost=-frag_weight)
        lp.row(
            f"touched__{tag}",
            [(t, float(g)), *((c, -v) for c, v in rows.gpu_used)],
            lower=fixed_used,
        )
        for c, v in rows.gpu_used:
            lp.add_cost(c, frag_weight * v / g)
        lp.offset += frag_weight * fixed_used / g
        aux.append((t, rows.gpu_used, fixed_used, "touched", float(g)))


def _current_free(instance: PlacementInstance) -> dict[str, int]:
    """Free milli-GPU on each node with everything that runs now still running."""
    free = {n.name: n.gpus * GPU_MILLI for n in instance.nodes}
    for p in instance.current.values():
        for r in p.replicas:
            if r.node in free:
                free[r.node] -= r.gpu_milli * len(r.gpus)
    return free


@dataclass(slots=True)
class Entry:
    """One replica column and the class it counts on."""

    col: int
    cls: NodeClass
    coarse: bool  # cls is a coarse class
    single: bool = False  # the whole gang sits on one node of the class
    mult: float = 1.0  # replicas per unit of the column


class Builder:
    """Builds the model column by column; the warm start is mapped onto it afterwards."""

    def __init__(
        self, instance: PlacementInstance, warm: PlacementPlan, options: BuildOptions
    ) -> None:
        self.instance = instance
        self.policy = instance.policy
        self.options = options
        self.lp = LinearModel()
        self.running = running_jobs(instance, warm, options)
        self.tree = instance_tree(instance)
        self.levels = topology_levels(
            instance.jobs, self.tree if options.small and options.compactness else None
        )
        self._class_domains: dict[tuple[int, bool, int], tuple[str, ...] | None] = {}
        self.classes, self.coarse, self.node_class, self.residual = node_classes(
            instance, self.running, self.levels, options.small, options.per_node
        )
        self.queues = {q.name: q for q in instance.queues}
        self.fine_rows: dict[int, ClassRows] = defaultdict(ClassRows)
        self.coarse_rows: dict[int, ClassRows] = defaultdict(ClassRows)
        self.quota_terms: dict[tuple[str, str], Terms] = defaultdict(list)
        self.quota_const: dict[tuple[str, str], float] = defaultdict(float)
        self.usage_terms: dict[tuple[str, str], Terms] = defaultdict(list)
        self.usage_const: dict[tuple[str, str], float] = defaultdict(float)
        self.by_flavor: dict[str | None, list[NodeClass]] = defaultdict(list)
        for cls in self.classes:
            self.by_flavor[cls.flavor].append(cls)
        self.warm = {o.job: o for o in warm.outcomes}
        self.current_free = _current_free(instance)
        self.model = PlacementModel(
            self.lp, self.classes, self.coarse, {}, self.running, self.node_class, options.small, []
        )
        self.aux = self.model.aux
        self.kept_on_node: dict[str, Terms] = defaultdict(list)  # kept whole GPUs per node
        self.kept_jobs_on_node: dict[str, set[int]] = defaultdict(set)  # keep columns per node
        self.kept_share_milli: dict[tuple[str, int], Terms] = defaultdict(list)  # per GPU
        self.share_slot_cols: dict[tuple[str, int, int], int] = {}
        self.kept_gpus: dict[str, tuple[Terms, dict[int, set[object]]]] = {}
        self.kept_union: dict[str, dict[tuple[int, ...], int]] = {}  # GPUs a set of keeps takes
        self.kept_shares: dict[tuple[str, int], Terms] = defaultdict(list)
        self.share_cols: dict[tuple[str, int], int] = {}
        self.rights = Rights(instance)
        self.own_claims: dict[tuple[str, str], list[Terms]] = defaultdict(list)
        self.weights = weights(instance)
        # Usage per queue, flavor and priority (GPUs): what fills nominal quota, in order.
        self.rank_terms: dict[tuple[str, str, int], Terms] = defaultdict(list)
        self.rank_const: dict[tuple[str, str, int], float] = defaultdict(float)
        self._domain_free: dict[tuple[object, ...], int] = {}
        self._candidates: dict[
            tuple[object, ...], dict[str | None, list[tuple[NodeClass, int]]]
        ] = {}
        self.slot_cols: dict[tuple[str, int], int] = {}

    # -- bookkeeping ----------------------------------------------------------------------
    def charge(self, job: Job, flavor: str | None, col: int | None, replicas: float) -> None:
        """Quota (GPUs per queue and flavor) and fair-share usage of replicas of `job`."""
        r = job.resources
        if flavor is not None and r.gpu_milli:
            key = (job.queue, flavor)
            ranked = (job.queue, flavor, job.priority)
            if col is None:
                self.quota_const[key] += replicas * r.gpu_milli / GPU_MILLI
                self.rank_const[ranked] += replicas * r.gpu_milli / GPU_MILLI
            else:
                self.quota_terms[key].append((col, replicas * r.gpu_milli / GPU_MILLI))
                self.rank_terms[ranked].append((col, replicas * r.gpu_milli / GPU_MILLI))
        for res, amount in (("gpu", r.gpu_milli), ("cpu", r.cpu_milli), ("memory", r.memory_mib)):
            if amount:
                if col is None:
                    self.usage_const[(job.queue, res)] += replicas * amount
                else:
                    self.usage_terms[(job.queue, res)].append((col, replicas * amount))

    def rows_of(self, entry: Entry) -> list[ClassRows]:
        if entry.coarse:
            return [self.coarse_rows[entry.cls.id]]
        if self.options.small:
            return [self.fine_rows[entry.cls.id]]
        return [self.fine_rows[entry.cls.id], self.coarse_rows[entry.cls.coarse]]

    # -- running jobs -----------------------------------------------------------------------
    def add_running(self) -> None:
        for key, rj in self.running.items():
            job = rj.job
            count = len(rj.placement.replicas)
            exempt = not job.preemptible
            spread_cost = (
                compactness_penalty(
                    job, span_of(self.tree, (r.node for r in rj.placement.replicas)), self.policy
                )
                if self.options.compactness
                else 0.0
            )
            if rj.fixed:
                self.charge(job, None if exempt else rj.placement.flavor, None, count)
                self.lp.offset += self.weights.value(job, count) - spread_cost
                continue
            jv = JobVars(job)
            self.model.jobs[key] = jv
            lost = lost_gpu_seconds(job, rj.placement, self.instance.now)
            stop_cost = preemption_penalty(job, lost, self.policy)
            self.lp.offset -= stop_cost
            if rj.keepable:
                jv.keep = self.lp.var(
                    f"keep__{key}",
                    0,
                    1,
                    cost=self.weights.value(job, count) + stop_cost - spread_cost,
                )
                on_class: dict[int, list[str]] = defaultdict(list)
                for replica in rj.placement.replicas:
                    cid = self.node_class.get(replica.node)
                    if cid is not None:
                        on_class[cid].append(replica.node)
                for cid, nodes in on_class.items():
                    cls = self.classes[cid]
                    targets = [self.fine_rows[cid], self.coarse_rows[cls.coarse]]
                    for rows in targets:
                        add_replicas(rows, job.resources, jv.keep, len(nodes), items=False)
                        if job.isolation is Isolation.DEDICATED:
                            rows.holds.append((jv.keep, float(len(set(nodes)))))
                whole_on: dict[str, int] = defaultdict(int)
                for replica in rj.placement.replicas:
                    if job.resources.fractional and replica.node in self.residual:
                        for g in replica.gpus:
                            self.kept_share_milli[(replica.node, g)].append(
                                (jv.keep, float(replica.gpu_milli))
                            )
                            self.kept_jobs_on_node[replica.node].add(jv.keep)
                    blocked = self._blocked_gpus(replica)
                    if not blocked:
                        continue
                    if job.resources.fractional:
                        # A kept share takes a GPU that whole-GPU replicas could have had.
                        for g in replica.gpus:
                            self.kept_shares[(replica.node, g)].append((jv.keep, 1.0))
                            self.kept_jobs_on_node[replica.node].add(jv.keep)
                    else:
                        whole_on[replica.node] += round(blocked)
                for node_name, gpus in whole_on.items():
                    self.kept_on_node[node_name].append((jv.keep, float(gpus)))
                    self.kept_jobs_on_node[node_name].add(jv.keep)
                self.charge(job, None if exempt else rj.placement.flavor, jv.keep, count)
            outcome = self.warm.get(key)
            moved_by_warm = outcome is not None and outcome.status is OutcomeStatus.MOVED
            if (job.preemptible and self.options.moves) or not rj.keepable or moved_by_warm:
                self.add_placement(jv, stop_cost - move_penalty(job, self.policy))
            parts = [(c, 1.0) for c in (jv.keep, jv.place) if c >= 0]
            self._own_claim(job, rj.placement.flavor, parts)
            if parts:
                if len(parts) > 1:
                    self.lp.row(f"run_once__{key}", parts, upper=1)
                # Nobody may claim its place: it runs on (when the warm start shows it can).
                runs_in_warm = outcome is not None and outcome.running
                if runs_in_warm and not self.rights.anyone_may(job):
                    self.lp.row(f"protected__{key}", parts, lower=1, upper=1)

    def _own_claim(self, job: Job, flavor: str | None, parts: Terms) -> None:
        """A running job only its own queue may claim (its queue does not borrow, so no
        reclaim reaches it): it stops only for a job of its queue, and then the queue must
        not borrow (never preempt to borrow) -- rows in `add_never_borrow`."""
        if not parts or not job.preemptible or flavor is None:
            return
        ledger = self.rights.ledger
        queue = self.queues.get(job.queue)
        if queue is None or queue.cohort is None or queue.quota(flavor) is None:
            return
        if ledger.borrowing(job.queue, flavor) or over_limits(ledger, job.queue, flavor):
            return
        self.own_claims[(job.queue, flavor)].append(parts)

    def add_never_borrow(self) -> None:
        """If one of the jobs only its own queue may claim stops, the queue does not borrow:
        usage - nominal <= M * borrows, and borrows <= keep + place of each such job."""
        for (queue_name, flavor), claims in sorted(self.own_claims.items()):
            queue = self.queues[queue_name]
            fq = queue.quota(flavor)
            assert fq is not None
            terms = self.quota_terms.get((queue_name, flavor), [])
            const = self.quota_const.get((queue_name, flavor), 0.0)
            nominal = fq.nominal / GPU_MILLI
            most = const + sum(v for _, v in terms if v > 0) - nominal
            if most <= 0 or not terms:
                continue
            tag = f"{queue_name}__{flavor}"
            b = self.lp.var(f"borrows__{tag}", 0, 1)
            self.lp.row(f"borrows__{tag}", [*terms, (b, -most)], upper=nominal - const)
            for i, parts in enumerate(claims):
                self.lp.row(
                    f"never_preempt_to_borrow__{tag}__{i}",
                    [(b, 1.0)] + [(c, -v) for c, v in parts],
                    upper=0,
                )
            self.aux.append((b, terms, const, "over", nominal))

    # -- placing a job anew -----------------------------------------------------------------
    def candidates(self, job: Job) -> dict[str | None, list[tuple[NodeClass, int]]]:
        """Per eligible flavor, the classes with room for a replica, and how many they take."""
        shape = (
            eligible_flavors(job, self.queues.get(job.queue)),
            job.isolation,
            job.residency,
            job.resources,
            job.replicas,
        )
        known = self._candidates.get(shape)
        if known is None:
            known = self._candidates[shape] = self._find_candidates(job)
        return known

    def _find_candidates(self, job: Job) -> dict[str | None, list[tuple[NodeClass, int]]]:
        out: dict[str | None, list[tuple[NodeClass, int]]] = {}
        for flavor in eligible_flavors(job, self.queues.get(job.queue)):
            pool = (
                self.by_flavor.get(flavor, [])
                if flavor is not None
                else [c for group in self.by_flavor.values() for c in group]
            )
            found = []
            for cls in pool:
                if node_rejection(job, cls.nodes[0], flavor) is None:
                    cap = cls.capacity(job)
                    if cap > 0:
                        found.append((cls, cap))
            if found:
                out[flavor] = found
        return out

    def add_placement(self, jv: JobVars, extra_value: float) -> None:
        lp = self.lp
        job = jv.job
        key = job.key
        r = job.resources
        candidates = self.candidates(job)
        total = sum(cap for opts in candidates.values() for _, cap in opts)
        if total < job.smallest_gang:
            return
        topo = job.topology
        level = topo.level if topo is not None else None
        preferred = topo is not None and topo.mode is TopologyMode.PREFERRED
        jv.level = level
        value = self.weights.value(job, 1)
        jv.place = lp.var(f"place__{key}", 0, 1, cost=extra_value)
        if job.smallest_gang < job.replicas:
            jv.replicas = lp.var(f"replicas__{key}", 0, job.replicas, cost=value)
            lp.row(
                f"gang_min__{key}", [(jv.replicas, 1.0), (jv.place, -job.smallest_gang)], lower=0
            )
            lp.row(f"gang_max__{key}", [(jv.replicas, 1.0), (jv.place, -job.replicas)], upper=0)
            placed: Terms = [(jv.replicas, 1.0)]
        else:
            lp.add_cost(jv.place, value * job.replicas)
            placed = [(jv.place, float(job.replicas))]
        if preferred:
            jv.spread = lp.var(
                f"spread__{key}", 0, 1, cost=-topology_spread_penalty(job, self.policy)
            )
        use_coarse = not self.options.small and (level is None or preferred)
        choices: Terms = [(jv.spread, 1.0)] if preferred else []
        all_entries: list[Entry] = []
        for flavor, opts in candidates.items():
            entries: list[Entry] = []
            if level is None:
                entries += self._loose(jv, opts, use_coarse)
            else:
                entries += self._topology(jv, flavor, opts, level, preferred, choices)
                if preferred:
                    # Spread: any class (on small instances, those no domain column covers).
                    rest = [(c, cap) for c, cap in opts if c.id not in jv.per_class]
                    loose = self._loose(jv, opts if use_coarse else rest, use_coarse)
                    for e in loose:
                        lp.row(
                            f"spread__{key}__{e.cls.name}",
                            [(e.col, 1.0), (jv.spread, -float(job.replicas))],
                            upper=0,
                        )
                    entries += loose
            if not entries:
                continue
            if len(candidates) > 1:
                phi = lp.var(f"flavor__{key}__{flavor}", 0, 1)
                lp.row(
                    f"flavor__{key}__{flavor}",
                    [*((e.col, e.mult) for e in entries), (phi, -float(job.replicas))],
                    upper=0,
                )
            else:
                phi = jv.place
            jv.flavor[flavor] = phi
            for e in entries:
                for rows in self.rows_of(e):
                    rows.fresh = True
                    add_replicas(rows, r, e.col, e.mult, items=not e.single)
                if job.isolation is Isolation.DEDICATED:
                    self._dedicated(jv, e)
                self.charge(job, flavor, e.col, e.mult)
            all_entries += entries
        if not all_entries:
            lp.col_upper[jv.place] = 0
            return
        if len(jv.flavor) > 1:
            lp.row(
                f"one_flavor__{key}",
                [*((c, 1.0) for c in jv.flavor.values()), (jv.place, -1.0)],
                lower=0,
                upper=0,
            )
        lp.row(
            f"gang__{key}",
            [*((e.col, e.mult) for e in all_entries), *((c, -v) for c, v in placed)],
            lower=0,
            upper=0,
        )
        self._compactness(jv, all_entries)
        if level is not None:
            if choices:
                lp.row(f"one_domain__{key}", [*choices, (jv.place, -1.0)], lower=0, upper=0)
            else:
                lp.col_upper[jv.place] = 0

    def _class_domain(self, e: Entry, rank: int) -> tuple[str, ...] | None:
        """The domain at `rank` that every node of the entry's class lies in; None if none."""
        key = (e.cls.id, e.coarse, rank)
        if key not in self._class_domains:
            found = {self.tree.domain(n.name, rank) for n in e.cls.nodes}
            self._class_domains[key] = next(iter(found)) if len(found) == 1 else None
        return self._class_domains[key]

    def _compactness(self, jv: JobVars, entries: list[Entry]) -> None:
        """Compactness models (small, for the second criterion): one column per level and
        domain a gang may use, each costing what one more domain of that level costs
        (objective.compactness_penalty), at the levels where every column of the gang lies
        inside one domain (per node: all of them, so the cost is exact)."""
        job = jv.job
        unit = compact_unit(job, self.policy)
        if not self.options.compactness or not self.options.small or not unit or not entries:
            return
        for rank in range(len(self.tree.levels)):
            groups: dict[tuple[str, ...], Terms] = defaultdict(list)
            for e in entries:
                d = (
                    ("single", str(e.col))
                    if rank == 0 and e.single
                    else self._class_domain(e, rank)
                )
                if d is None:
                    break
                groups[d].append((e.col, e.mult))
            else:
                if len(groups) < 2:
                    continue
                weight = unit * (1 << rank)
                self.lp.add_cost(jv.place, weight)
                for d, terms in groups.items():
                    tag = "/".join(reversed(d))
                    u = self.lp.var(f"uses__{job.key}__{self.tree.levels[rank]}__{tag}", 0, 1)
                    self.lp.add_cost(u, -weight)
                    size = float(job.replicas)
                    self.lp.row(
                        f"uses__{job.key}__{self.tree.levels[rank]}__{tag}",
                        [*terms, (u, -size)],
                        upper=0,
                    )
                    self.aux.append((u, terms, 0.0, "touched", size))

    def _loose(self, jv: JobVars, opts: list[tuple[NodeClass, int]], coarse: bool) -> list[Entry]:
        """Replica columns with no topology: per fine class, or per coarse class on large instances."""
        job = jv.job
        if coarse:
            caps: dict[int, int] = defaultdict(int)
            for cls, cap in opts:
                caps[cls.coarse] += cap
            out = []
            for kid, cap in caps.items():
                x = self.lp.var(
                    f"replicas__{job.key}__{self.coarse[kid].name}", 0, min(job.replicas, cap)
                )
                jv.per_coarse[kid] = x
                out.append(Entry(x, self.coarse[kid], True))
            return out
        out = []
        for cls, cap in opts:
            x = self.lp.var(f"replicas__{job.key}__{cls.name}", 0, min(job.replicas, cap))
            jv.per_class[cls.id] = x
            out.append(Entry(x, cls, False))
        return out

    def _topology(
        self,
        jv: JobVars,
        flavor: str | None,
        opts: list[tuple[NodeClass, int]],
        level: str,
        preferred: bool,
        choices: Terms,
    ) -> list[Entry]:
        """Replica columns inside one domain of `level`: multi-node domains, or one node."""
        lp = self.lp
        job = jv.job
        key = job.key
        elastic = job.smallest_gang < job.replicas
        out: list[Entry] = []
        by_domain: dict[str, list[tuple[NodeClass, int]]] = defaultdict(list)
        singles: list[tuple[NodeClass, int]] = []
        for cls, cap in opts:
            if level != NODE_LEVEL and level in cls.domains:
                by_domain[cls.domains[level]].append((cls, cap))
            else:
                singles.append((cls, cap))
        kept = self._rank_domains(job, level, by_domain)
        if len(kept) < len(by_domain):
            self.model.pruned.append(key)
            out += self._escapes(
                jv, [d for d in by_domain if d not in set(kept)], by_domain, choices
            )
        # On small instances a preferred gang that spreads may use any of these classes.
        spread = [(jv.spread, -1.0)] if preferred and self.options.small else []
        for domain in kept:
            fitting = by_domain[domain]
            if sum(cap for _, cap in fitting) < job.smallest_gang:
                continue
            y = jv.domain.get((flavor, domain))
            if y is None:
                y = lp.var(f"domain__{key}__{domain}@{flavor}", 0, 1)
                jv.domain[(flavor, domain)] = y
                choices.append((y, 1.0))
            if len(fitting) == 1 and not elastic and not spread:
                # One class in the domain: choosing the domain places the whole gang there.
                cls, _ = fitting[0]
                jv.per_class[cls.id] = y
                out.append(Entry(y, cls, False, mult=float(job.replicas)))
                continue
            for cls, cap in fitting:
                cap = min(job.replicas, cap)
                x = lp.var(f"replicas__{key}__{cls.name}", 0, cap)
                jv.per_class[cls.id] = x
                lp.row(
                    f"topology__{key}__{cls.name}",
                    [(x, 1.0), (y, -float(cap)), *((c, v * cap) for c, v in spread)],
                    upper=0,
                )
                out.append(Entry(x, cls, False))
        # Domains of one node: the whole gang on one node (per coarse class on large instances).
        r = job.resources
        pooled: dict[int, tuple[NodeClass, int, bool]] = {}
        for cls, _ in singles:
            room = cls.room(job)
            if room < job.smallest_gang:
                continue
            target, is_coarse = (
                (cls, False) if self.options.small else (self.coarse[cls.coarse], True)
            )
            best = pooled.get(target.id)
            pooled[target.id] = (target, max(room, best[1] if best else 0), is_coarse)
        for target, room, is_coarse in pooled.values():
            size = min(room, job.replicas)
            u = lp.var(f"node__{key}__{target.name}", 0, 1)
            slot = -1 - target.id if is_coarse else target.id
            jv.single[slot] = u
            choices.append((u, 1.0))
            if elastic:
                x = lp.var(f"replicas__{key}__{target.name}", 0, size)
                lp.row(
                    f"topology__{key}__{target.name}",
                    [(x, 1.0), (u, -float(size)), *((c, v * job.replicas) for c, v in spread)],
                    upper=0,
                )
                jv.single_replicas[slot] = x
                entry = Entry(x, target, is_coarse, single=True)
            else:
                entry = Entry(u, target, is_coarse, single=True, mult=float(job.replicas))
            out.append(entry)
            if r.gpu_milli and not r.fractional and job.smallest_gang * r.whole_gpus > 1:
                gang = job.smallest_gang * r.whole_gpus
                for rows in self.rows_of(entry):
                    rows.items[gang].append((u, 1.0))
        return out

    def _escapes(
        self,
        jv: JobVars,
        dropped: list[str],
        by_domain: Mapping[str, list[tuple[NodeClass, int]]],
        choices: Terms,
    ) -> list[Entry]:
        """The pruned domains, each coarse class's as one column counted on coarse rows only:
        a relaxation of placing the gang in any of them, so the LP bound stays a bound."""
        job = jv.job
        caps: dict[int, int] = defaultdict(int)
        for d in dropped:
            best = sum(cap for _, cap in by_domain[d])
            if best >= job.smallest_gang:
                for cls, cap in by_domain[d]:
                    caps[cls.coarse] += cap
        out = []
        for kid, cap in caps.items():
            target = self.coarse[kid]
            e = self.lp.var(f"escape__{job.key}__{target.name}", 0, 1)
            self.model.escapes.append(e)
            jv.escapes.append(e)
            choices.append((e, 1.0))
            if job.smallest_gang < job.replicas:
                x = self.lp.var(
                    f"replicas__{job.key}__escape__{target.name}", 0, min(job.replicas, cap)
                )
                self.lp.row(
                    f"escape__{job.key}__{target.name}",
                    [(x, 1.0), (e, -float(job.replicas))],
                    upper=0,
                )
                self.model.escapes.append(x)
                jv.escapes.append(x)
                out.append(Entry(x, target, True))
            else:
                out.append(Entry(e, target, True, mult=float(job.replicas)))
        return out

    def _rank_domains(
        self, job: Job, level: str, by_domain: Mapping[str, list[tuple[NodeClass, int]]]
    ) -> list[str]:
        """All domains on small instances; else where the warm start put the gang, then
        the fullest domains that hold it without moving anyone, then the emptiest others."""
        if self.options.small or len(by_domain) <= self.options.domain_candidates:
            return sorted(by_domain)
        need = job.smallest_gang * job.resources.gpu_milli
        outcome = self.warm.get(job.key)
        warm_domains = {
            self.classes[self.node_class[r.node]].domains.get(level)
            for r in (outcome.replicas if outcome is not None else ())
            if r.node in self.node_class
        }
        free: dict[str, int] = {}
        for d, opts in by_domain.items():
            key = (level, d, tuple(c.id for c, _ in opts))
            if key not in self._domain_free:
                self._domain_free[key] = sum(
                    self.current_free.get(n.name, 0) for c, _ in opts for n in c.nodes
                )
            free[d] = self._domain_free[key]
        ranked = sorted(
            by_domain,
            key=lambda d: (
                d not in warm_domains,
                free[d] < need,
                free[d] if free[d] >= need else -free[d],
                d,
            ),
        )
        return ranked[: self.options.domain_candidates]

    def _dedicated(self, jv: JobVars, e: Entry) -> None:
        """An isolated job holds whole nodes: h nodes of the class, and fits in them."""
        lp = self.lp
        cls = e.cls
        job = jv.job
        r = job.resources
        h = lp.var(f"holds__{job.key}__{cls.name}", 0, cls.count)
        jv.holds[-1 - cls.id if e.coarse else cls.id] = h
        for rows in self.rows_of(e):
            rows.holds.append((h, 1.0))
        for name, need, part in (
            ("gpus", r.gpu_milli, "milli" if r.fractional else "whole"),
            ("cpu", r.cpu_milli, "cpu"),
            ("memory", r.memory_mib, "memory"),
        ):
            if need:
                lp.row(
                    f"dedicated_{name}__{job.key}__{cls.name}",
                    [(e.col, float(need) * e.mult), (h, -float(cls.node_max(part)))],
                    upper=0,
                )

    # -- quota, fairness ------------------------------------------------------------------
    def add_quota(self) -> None:
        lp = self.lp
        keys = sorted(set(self.quota_terms) | set(self.quota_const))
        pools: dict[tuple[str, str], Terms] = defaultdict(list)
        pool_const: dict[tuple[str, str], float] = defaultdict(float)
        for queue_name, flavor in keys:
            terms = self.quota_terms.get((queue_name, flavor), [])
            const = self.quota_const.get((queue_name, flavor), 0.0)
            queue = self.queues.get(queue_name)
            fq = queue.quota(flavor) if queue else None
            if queue is None or fq is None:
                continue
            tag = f"{queue_name}__{flavor}"
            nominal = fq.nominal / GPU_MILLI
            if queue.cohort is None:
                lp.row(f"quota__{tag}", terms, upper=nominal - const)
            else:
                if fq.ceiling is not None:
                    lp.row(f"quota__{tag}", terms, upper=fq.ceiling / GPU_MILLI - const)
                guaranteed = fq.guaranteed / GPU_MILLI
                pkey = (queue.cohort, flavor)
                if guaranteed <= 0:
                    pools[pkey] += terms
                    pool_const[pkey] += const
                else:
                    # What the queue draws from the pool: max(0, usage - what it keeps).
                    e = lp.var(f"borrowed__{tag}", 0, INF, integer=False)
                    lp.row(
                        f"borrowed__{tag}",
                        [(e, 1.0), *((c, -v) for c, v in terms)],
                        lower=const - guaranteed,
                    )
                    self.aux.append((e, terms, const, "excess", guaranteed))
                    pools[pkey].append((e, 1.0))
            self.add_nominal(queue_name, flavor, nominal, tag)
        for (cohort, flavor), terms in pools.items():
            pool = sum(
                (fq.nominal - fq.guaranteed) / GPU_MILLI
                for q in self.queues.values()
                if q.cohort == cohort
                for fq in q.quotas
                if fq.flavor == flavor
            )
            lp.row(f"cohort__{cohort}__{flavor}", terms, upper=pool - pool_const[(cohort, flavor)])

    def add_nominal(self, queue_name: str, flavor: str, nominal: float, tag: str) -> None:
        """Level 1 of the objective: the queue's nominal quota filled from its highest
        priority down, as one capped column per priority (the usage at or above it)."""
        priorities = {p for (q, f, p) in self.rank_terms if q == queue_name and f == flavor}
        priorities |= {p for (q, f, p) in self.rank_const if q == queue_name and f == flavor}
        terms: Terms = []
        const = 0.0
        for priority, rate in self.weights.nominal_steps(priorities):
            terms = terms + self.rank_terms.get((queue_name, flavor, priority), [])
            const += self.rank_const.get((queue_name, flavor, priority), 0.0)
            if not terms:
                self.lp.offset += rate * min(const, nominal)
                continue
            name = f"nominal__{tag}__{priority}"
            b = self.lp.var(name, 0, nominal, cost=rate, integer=False)
            self.lp.row(name, [(b, 1.0), *((c, -v) for c, v in terms)], upper=const)
            self.aux.append((b, terms, const, "min", nominal))
            self.model.nominal[b] = (queue_name, flavor, priority)

    def add_fairness(self) -> None:
        capacity = capacity_vector(self.instance.nodes)
        rate = fairness_penalty_per_share(self.instance)
        targets = instance_fair_targets(self.instance)
        for target in targets.values():
            cap = capacity[target.resource]
            terms = [
                (c, v / cap) for c, v in self.usage_terms.get((target.queue, target.resource), [])
            ]
            const = self.usage_const.get((target.queue, target.resource), 0.0) / cap
            short = self.lp.var(f"fairness__{target.queue}", 0, INF, cost=-rate, integer=False)
            self.lp.row(
                f"fairness__{target.queue}",
                [(short, 1.0), *terms],
                lower=target.share - const,
            )
            self.aux.append((short, terms, const, "short", target.share))

    def _blocked_gpus(self, replica: ReplicaPlacement) -> float:
        """GPUs of a kept replica that would otherwise be whole and free (shares: their part)."""
        free = self.residual.get(replica.node)
        if free is None:
            return 0.0
        whole = [
            g for g in replica.gpus if 0 <= g < len(free.gpu_free) and free.gpu_free[g] == GPU_MILLI
        ]
        return len(whole) * replica.gpu_milli / GPU_MILLI

    def _share_col(self, node: str, g: int) -> int:
        """1 when some kept share sits on GPU g of `node` (a GPU that is otherwise whole)."""
        col = self.share_cols.get((node, g))
        if col is None:
            keeps = self.kept_shares[(node, g)]
            if len({c for c, _ in keeps}) == 1:
                # One job's shares: the GPU is taken exactly when that job stays.
                self.share_cols[(node, g)] = keeps[0][0]
                return keeps[0][0]
            col = self.lp.var(f"shared_gpu__{node}__{g}", 0, 1)
            for c, _ in keeps:
                self.lp.row(f"shared_gpu__{node}__{g}", [(col, 1.0), (c, -1.0)], lower=0)
            self.aux.append((col, keeps, 0.0, "max", 0.0))
            self.share_cols[(node, g)] = col
        return col

    def _kept_gpu_terms(self, node: str) -> tuple[Terms, dict[int, set[object]]]:
        """Whole GPUs that kept movable jobs take on `node`: their whole GPUs, and each
        otherwise whole GPU that a kept share sits on; and, per keep column, those GPUs."""
        found = self.kept_gpus.get(node)
        if found is None:
            terms = list(self.kept_on_node.get(node, ()))
            own: dict[int, set[object]] = defaultdict(set)
            for c, v in terms:
                own[c].update((c, i) for i in range(round(v)))
            free = self.residual.get(node)
            for g in range(len(free.gpu_free) if free is not None else 0):
                keeps = self.kept_shares.get((node, g))
                if keeps:
                    terms.append((self._share_col(node, g), 1.0))
                    for c, _ in keeps:
                        own[c].add(g)
            found = self.kept_gpus[node] = (terms, own)
        return found

    def _exact_blocking(
        self, name: str, col: int, keeps: list[int], blocked: Callable[[list[int]], int]
    ) -> None:
        """col >= blocked(S) whenever every keep of S stays, for the sets S of kept jobs on one
        node (all of them up to four jobs; else each job, each pair and all): with the keeps
        integral, col is then exactly what they block, so fixing jobs keeps the rows feasible."""
        n = len(keeps)
        if n <= 4:
            masks = list(range(1, 1 << n))
        else:
            masks = [1 << i for i in range(n)]
            masks += [1 << i | 1 << j for i in range(n) for j in range(i + 1, n)]
            masks.append((1 << n) - 1)
        value: dict[int, int] = {}

        def of(mask: int) -> int:
            if mask not in value:
                value[mask] = blocked([k for i, k in enumerate(keeps) if mask >> i & 1])
            return value[mask]

        for mask in masks:
            b = of(mask)
            bits = [1 << i for i in range(n) if mask >> i & 1]
            if b <= 0 or (len(bits) > 1 and any(of(mask ^ bit) >= b for bit in bits)):
                continue  # a smaller set's row is as strong
            self.lp.row(
                f"{name}_by",
                [(col, 1.0), *((k, -float(b)) for i, k in enumerate(keeps) if mask >> i & 1)],
                lower=-float(b) * (len(bits) - 1),
            )

    def kept_share_gpus(self, cls: NodeClass, rows: ClassRows) -> None:
        """Whole GPUs a kept share occupies count against the class's whole GPUs."""
        if not rows.whole:
            return
        for node in cls.nodes:
            for g in range(node.gpus):
                if self.kept_shares.get((node.name, g)):
                    rows.whole.append((self._share_col(node.name, g), 1.0))

    def kept_slots(self, cls: NodeClass, rows: ClassRows) -> None:
        """Slots of s GPUs that kept movable jobs block on a node with W whole free GPUs:
        floor(W / s) - floor((W - k) / s) = ceil((k - W mod s) / s) for k kept GPUs; and
        at least what each kept job blocks on its own (the rows that keep the LP tight)."""
        sizes = [s for s in rows.items if s <= cls.node_gpus]
        for node in cls.nodes:
            if not self.kept_jobs_on_node.get(node.name) or not self._kept_gpu_terms(node.name)[0]:
                continue
            whole = self.residual[node.name].whole_free_gpus
            own = self._kept_gpu_terms(node.name)[1]
            for size in sizes:
                if len(own) == 1:
                    # One kept job: it blocks exactly its own slots, when it stays.
                    ((keep, gpus),) = own.items()
                    blocked = whole // size - max(0, whole - len(gpus)) // size
                    if blocked:
                        rows.slot_use[size].append((keep, float(blocked)))
                    continue
                col = self.slot_cols.get((node.name, size))
                if col is None:
                    col = self._blocked_col(node.name, whole, size)
                rows.slot_use[size].append((col, 1.0))

    def kept_share_slots(self, cls: NodeClass, rows: ClassRows) -> None:
        """Slots of q milli that kept shares block on GPU g with f milli free:
        floor(f / q) - floor((f - kept) / q); at least what each kept share blocks alone."""
        sizes = share_sizes(rows)
        if not sizes:
            return
        for node in cls.nodes:
            if not self.kept_jobs_on_node.get(node.name):
                continue
            free = self.residual[node.name].gpu_free
            for g, f in enumerate(free):
                keeps = self.kept_share_milli.get((node.name, g))
                if not keeps:
                    continue
                for q in sizes:
                    col = self.share_slot_cols.get((node.name, g, q))
                    if col is None:
                        col = self.lp.var(f"blocked_slots__{node.name}__{g}__{q}", 0, f // q)
                        spare = float(f % q)
                        self.lp.row(
                            f"blocked_slots__{node.name}__{g}__{q}",
                            [(col, float(q)), *((c, -v) for c, v in keeps)],
                            lower=-spare,
                        )
                        own: dict[int, float] = defaultdict(float)
                        for c, v in keeps:
                            own[c] += v

                        def lost(
                            subset: list[int],
                            f: int = f,
                            q: int = q,
                            own: dict[int, float] = own,
                        ) -> int:
                            taken = round(sum(own[k] for k in subset))
                            return f // q - max(0, f - taken) // q

                        self._exact_blocking(
                            f"blocked_slots__{node.name}__{g}__{q}", col, sorted(own), lost
                        )
                        self.aux.append((col, keeps, -spare, "touched", float(q)))
                        self.share_slot_cols[(node.name, g, q)] = col
                    rows.share_blocked[q].append((col, 1.0))

    def _blocked_col(self, node: str, whole: int, size: int) -> int:
        kept, own = self._kept_gpu_terms(node)
        col = self.lp.var(f"blocked__{node}__{size}", 0, whole // size)
        spare = float(whole % size)
        self.lp.row(
            f"blocked__{node}__{size}",
            [(col, float(size)), *((c, -v) for c, v in kept)],
            lower=-spare,
        )

        memo = self.kept_union.setdefault(node, {})

        def lost(subset: list[int]) -> int:
            key = tuple(subset)
            taken = memo.get(key)
            if taken is None:
                taken = memo[key] = len(set().union(*(own[k] for k in subset)))
            return whole // size - max(0, whole - taken) // size

        self._exact_blocking(f"blocked__{node}__{size}", col, sorted(own), lost)
        self.aux.append((col, kept, -spare, "touched", float(size)))
        self.slot_cols[(node, size)] = col
        return col

    def build(self) -> PlacementModel:
        self.add_running()
        for job in self.instance.jobs:
            if job.key in self.running:
                continue
            jv = JobVars(job)
            self.add_placement(jv, 0.0)
            if jv.place >= 0:
                self.model.jobs[job.key] = jv
        fine = [(self.classes[cid], rows) for cid, rows in self.fine_rows.items() if rows.fresh]
        coarse = [(self.coarse[kid], rows) for kid, rows in self.coarse_rows.items() if rows.fresh]
        if self.options.small:
            coarse = []
        for cls, rows in fine + coarse:
            self.kept_slots(cls, rows)
            self.kept_share_gpus(cls, rows)
            self.kept_share_slots(cls, rows)
        frag = self.policy.fragmentation_weight
        for cls, rows in fine:
            emit_class_rows(self.lp, cls, rows, frag if self.options.small else 0.0, self.aux)
        for cls, rows in coarse:
            emit_class_rows(self.lp, cls, rows, frag, self.aux)
        self.add_quota()
        self.add_never_borrow()
        if self.policy.fairness_weight:
            self.add_fairness()
        return self.model


def build(
    instance: PlacementInstance, warm: PlacementPlan, options: BuildOptions
) -> PlacementModel:
    return Builder(instance, warm, options).build()


def warm_values(
    model: PlacementModel, instance: PlacementInstance, plan: PlacementPlan
) -> list[float] | None:
    """The plan as column values of the model; None if the model cannot express it."""
    lp = model.lp
    x = [0.0] * lp.num_cols
    nodes = {n.name: n for n in instance.nodes}
    outcomes = {o.job: o for o in plan.outcomes}
    for key, jv in model.jobs.items():
        o = outcomes.get(key)
        if o is None or not o.running:
            continue
        if o.status is OutcomeStatus.KEPT:
            if jv.keep < 0:
                return None
            x[jv.keep] = 1.0
            continue
        if jv.place < 0 or o.flavor not in jv.flavor:
            return None
        x[jv.place] = 1.0
        x[jv.flavor[o.flavor]] = 1.0
        if jv.replicas >= 0:
            x[jv.replicas] = float(len(o.replicas))
        per_class: dict[int, int] = defaultdict(int)
        hosts: dict[int, set[str]] = defaultdict(set)
        for r in o.replicas:
            cid = model.node_class.get(r.node)
            if cid is None:
                return None
            per_class[cid] += 1
            hosts[cid].add(r.node)
        option = "loose"
        if jv.level is not None:
            domains = {nodes[r.node].domain(jv.level) for r in o.replicas}
            one_node = len({r.node for r in o.replicas}) == 1
            first = next(iter(per_class))
            slot = first if model.small else -1 - model.classes[first].coarse
            domain = next(iter(domains)) if len(domains) == 1 else None
            if domain is not None and (o.flavor, domain) in jv.domain:
                x[jv.domain[(o.flavor, domain)]] = 1.0
                option = "domain"
            elif one_node and slot in jv.single:
                x[jv.single[slot]] = 1.0
                if slot in jv.single_replicas:
                    x[jv.single_replicas[slot]] = float(len(o.replicas))
                option = "single"
            elif jv.spread >= 0:
                x[jv.spread] = 1.0
            else:
                return None
        if option == "loose":
            for cid, count in per_class.items():
                kid = model.classes[cid].coarse
                if kid in jv.per_coarse:
                    x[jv.per_coarse[kid]] += count
                elif cid in jv.per_class:
                    x[jv.per_class[cid]] += count
                else:
                    return None
        elif option == "domain":
            chosen = set(jv.domain.values())
            for cid, count in per_class.items():
                col = jv.per_class.get(cid)
                if col is None:
                    return None
                if col not in chosen:
                    x[col] += count
        for cid, held in hosts.items():
            kid = model.classes[cid].coarse
            if cid in jv.holds:
                x[jv.holds[cid]] += len(held)
            elif -1 - kid in jv.holds:
                x[jv.holds[-1 - kid]] += len(held)
    for col, terms, const, kind, param in model.aux:
        used = const + sum(x[c] * v for c, v in terms)
        if kind == "excess":
            x[col] = max(0.0, used - param)
        elif kind == "min":
            x[col] = max(0.0, min(param, used))
        elif kind == "short":
            x[col] = max(0.0, param - used)
        elif kind == "touched":
            x[col] = max(lp.col_lower[col], float(math.ceil(used / param - 1e-9)))
        elif kind == "max":
            x[col] = max((x[c] for c, _ in terms), default=0.0)
        elif kind == "over":
            x[col] = 1.0 if used > param + 1e-9 else 0.0
    return x


def job_columns(jv: JobVars) -> list[int]:
    """Every column that belongs to one job."""
    cols = [jv.place, jv.keep, jv.replicas, jv.spread]
    for group in (jv.per_class, jv.per_coarse, jv.domain, jv.single, jv.single_replicas, jv.holds):
        cols.extend(group.values())
    cols.extend(c for c in jv.flavor.values())
    return [c for c in cols if c >= 0]
