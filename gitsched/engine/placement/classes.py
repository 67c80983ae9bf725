"""Node classes: the aggregation that lets the formulation scale. Nodes that are
interchangeable (same attributes, same free GPUs after the jobs that cannot move, same
topology domains) form one class, and the formulation counts replicas per class, not per
node. A class's capacity rows are necessary conditions of node-level packing (GPU counts,
shares, CPU, memory, and "at most floor(free/s) items of size >= s per node"), so the
formulation is a relaxation of the real problem and its bound bounds every plan. With one
node per class the rows are exact for whole GPUs and for shares that divide a GPU (the
q-slot rows).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gitsched.engine.model import NODE_LEVEL, Isolation, Job, Node, Resources
from gitsched.engine.placement.constraints import NodeFree
from gitsched.engine.placement.linear import LinearModel
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.engine.placement.running import RunningJob
from gitsched.engine.placement.topology import Tree
from gitsched.engine.units import GPU_MILLI, cores_from_milli, gib_from_mib, gpus_from_milli

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
            u = self.node_gpus - gpus_from_milli(sum(gpus))
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
    spread: frozenset[str] = frozenset(),
) -> tuple[list[NodeClass], list[NodeClass], dict[str, int], dict[str, NodeFree]]:
    """Fine classes (inside one domain of every level a gang asks for, and of every level a
    service spreads over: one node each for 'node') and coarse ones."""
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
        # A spread's row counts replicas per domain: a class never straddles two.
        apart = tuple((level, n.domain(level)) for level in sorted(spread))
        if small:
            key: tuple[object, ...] = (
                attrs,
                profile,
                domains,
                n.name if per_node or n.name in movable_on else "",
                apart,
            )
        else:
            key = (attrs, domains, apart)
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
    # Dedicated jobs with GPUs: the nodes they hold and the GPUs they use there. A held node
    # is touched whatever share of it the job uses (no other job may use the rest).
    held_nodes: Terms = field(default_factory=list)
    held_used: Terms = field(default_factory=list)
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
    rows: ClassRows,
    r: Resources,
    col: int,
    count: float = 1.0,
    items: bool = True,
    dedicated: bool = False,
) -> None:
    """`count` replicas of shape `r`, times column `col`, on the rows of one class
    (`items` False: a kept job, whose whole-GPU slots and shares count per node;
    `dedicated`: a job that holds its nodes whole, `hold_nodes` counts them)."""
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
        rows.milli.append((col, gpus_from_milli(count * r.gpu_milli)))
        rows.gpu_used.append((col, gpus_from_milli(count * r.gpu_milli)))
        if dedicated:
            rows.held_used.append((col, gpus_from_milli(count * r.gpu_milli)))
    if r.cpu_milli:
        rows.cpu.append((col, cores_from_milli(count * r.cpu_milli)))
    if r.memory_mib:
        rows.memory.append((col, gib_from_mib(count * r.memory_mib)))


def hold_nodes(rows: ClassRows, r: Resources, col: int, nodes: float) -> None:
    """A dedicated job holds `nodes` nodes of the class, times column `col`."""
    rows.holds.append((col, nodes))
    if r.gpu_milli:
        rows.held_nodes.append((col, nodes))


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
        lp.row(f"gpu_milli__{tag}", rows.milli, upper=gpus_from_milli(cls.total("milli")))
    for q in share_sizes(rows):
        terms = [(c, v * (a // q)) for c, v, a in rows.share_items if a >= q]
        lp.row(f"gpu_slots__{tag}__{q}", terms + rows.share_blocked[q], upper=cls.share_slots(q))
    lp.row(f"cpu__{tag}", rows.cpu, upper=cores_from_milli(cls.total("cpu")))
    lp.row(f"memory__{tag}", rows.memory, upper=gib_from_mib(cls.total("memory")))
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
        # Touched nodes T >= used / GPUs per node, a node a dedicated job holds counting whole
        # (T >= held nodes + the others' use / GPUs per node); the stranded share is
        # T - used / GPUs per node, as objective.node_fragmentation measures a plan.
        touched = [
            *rows.gpu_used,
            *((c, -v) for c, v in rows.held_used),
            *((c, v * g) for c, v in rows.held_nodes),
        ]
        t = lp.var(f"touched__{tag}", touched_fixed, cls.count, cost=-frag_weight)
        lp.row(
            f"touched__{tag}",
            [(t, float(g)), *((c, -v) for c, v in touched)],
            lower=fixed_used,
        )
        for c, v in rows.gpu_used:
            lp.add_cost(c, frag_weight * v / g)
        lp.offset += frag_weight * fixed_used / g
        aux.append((t, touched, fixed_used, "touched", float(g)))
