"""A gang's place in the network tree: its span, the tightest span free capacity allows, and
a compact choice of nodes (climb to the narrowest domain that holds the gang, then use as
few child domains as possible at every level down to the node). One definition, used by
greedy, the MILP, `check`, the plan's explanations and `bench synth`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gitsched.engine.model import NODE_LEVEL, ClusterSpec, Job, Node, TopologyMode
from gitsched.engine.placement.constraints import NodeFree, node_rejection
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus, PlacementInstance

CLUSTER_LEVEL = "cluster"  # the span of a gang that no single domain holds
# A gang's compactness cost: per extra domain used at level rank i (node = 0), 2**i units;
# a unit is this share of one replica's value (explicit topology), or the smaller default
# share for a multi-node gang with no topology field at all.
COMPACT_SHARE = 0.01
DEFAULT_COMPACT_SHARE = 0.002

Fullness = Callable[[str], tuple[int, int]]  # node -> (free milli-GPU, free milli-CPU)


class Tree:
    """The cluster's levels, narrowest first with 'node' at rank 0, and each node's domain
    at each level as a path to the top (equal labels under different parents differ)."""

    def __init__(self, levels: Sequence[str], nodes: Iterable[Node]) -> None:
        self.levels: tuple[str, ...] = (NODE_LEVEL, *(lv for lv in levels if lv != NODE_LEVEL))
        self.rank: dict[str, int] = {lv: i for i, lv in enumerate(self.levels)}
        self.rank[CLUSTER_LEVEL] = len(self.levels)
        self.keys: dict[str, tuple[tuple[str, ...], ...]] = {}
        for n in nodes:
            labels = [n.domain(lv) for lv in self.levels]
            self.keys[n.name] = tuple(tuple(labels[i:]) for i in range(len(labels)))
        # Levels whose every domain holds one node (an unlabelled level, say): a gang fits in
        # one of their domains exactly when it fits on one node.
        self.one_node_each: tuple[bool, ...] = tuple(
            len({k[i] for k in self.keys.values()}) == len(self.keys)
            for i in range(len(self.levels))
        )

    @classmethod
    def of(cls, cluster: ClusterSpec | None, nodes: Sequence[Node]) -> Tree:
        """The tree of a cluster; without a ClusterSpec, the labelled levels, widest last
        (a level with more distinct domains is narrower)."""
        if cluster is not None:
            return cls(cluster.topology_levels, nodes)
        seen: dict[str, set[str]] = {}
        for n in nodes:
            for lv, d in n.topology.items():
                seen.setdefault(lv, set()).add(d)
        return cls(sorted(seen, key=lambda lv: (-len(seen[lv]), lv)), nodes)

    def level_rank(self, level: str) -> int:
        """Rank of a level (unknown levels: just below the cluster, so they never pass as tight)."""
        return self.rank.get(level, len(self.levels) - 1)

    def domain(self, name: str, rank: int) -> tuple[str, ...]:
        return self.keys[name][rank]


@dataclass(frozen=True, slots=True)
class Span:
    """Where a gang sits: the narrowest level at which one domain holds every replica
    ('cluster' if none), and the domains it uses at each level, node first."""

    level: str
    used: tuple[int, ...]

    def text(self, tree: Tree) -> str:
        parts = [
            f"{n} {_plural(lv, n)}" for lv, n in zip(tree.levels, self.used, strict=False) if n
        ]
        return " in ".join(parts)


def span_of(tree: Tree, nodes: Iterable[str]) -> Span:
    names = [n for n in nodes if n in tree.keys]
    used = tuple(len({tree.keys[n][i] for n in names}) for i in range(len(tree.levels)))
    level = next(
        (lv for lv, k in zip(tree.levels, used, strict=True) if k == 1),
        CLUSTER_LEVEL,
    )
    return Span(level, used)


def extra_levels(tree: Tree, span: Span, tightest: str) -> int:
    """How many levels wider than the tightest available span a gang sits."""
    return max(0, tree.rank[span.level] - tree.rank[tightest])


# -- what a job asks for --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GangTopology:
    """A job's topology as placement reads it. `limit`: the widest level a required gang may
    span; `named`: the level the job names; `compact`: keep the gang tight (soft) at all."""

    limit: str | None
    named: str | None
    preferred: bool
    compact: bool
    share: float  # weight of the compactness cost (a share of one replica's value)
    slice_size: int = 1
    slice_level: str = NODE_LEVEL


def gang_topology(job: Job) -> GangTopology:
    topo = job.topology
    if topo is None:
        return GangTopology(None, None, False, True, DEFAULT_COMPACT_SHARE)
    if topo.mode is TopologyMode.UNCONSTRAINED:
        return GangTopology(None, None, False, False, 0.0)
    sliced = topo.slice_size is not None and topo.slice_level is not None
    return GangTopology(
        topo.level if topo.mode is TopologyMode.REQUIRED else None,
        topo.level,
        topo.mode is TopologyMode.PREFERRED,
        True,
        COMPACT_SHARE,
        topo.slice_size if sliced and topo.slice_size else 1,
        topo.slice_level if sliced and topo.slice_level else NODE_LEVEL,
    )


def topology_violation(tree: Tree, job: Job, nodes: Sequence[str]) -> str | None:
    """Why replicas on `nodes` (in replica order) break the job's hard topology; None if not."""
    gang = gang_topology(job)
    if gang.limit is not None and gang.limit in tree.rank:
        rank = tree.rank[gang.limit]
        used = len({tree.keys[n][rank] for n in nodes if n in tree.keys})
        if used > 1:
            return f"spans {used} {gang.limit} domains, needs one"
    if gang.slice_size > 1 and gang.slice_level in tree.rank:
        rank = tree.rank[gang.slice_level]
        s = gang.slice_size
        for start in range(0, len(nodes), s):
            group = {tree.keys[n][rank] for n in nodes[start : start + s] if n in tree.keys}
            if len(group) > 1:
                return (
                    f"replicas {start}-{start + s - 1} span more than one {gang.slice_level}"
                    " domain, each slice needs one"
                )
    return None


# -- compact allocation ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Below:
    """What a domain needs to make its children when _fill first reaches it (no slices)."""

    tree: Tree
    caps: Mapping[str, int]
    fullness: Fullness


@dataclass(slots=True, eq=False)
class _Domain:
    key: tuple[str, ...]
    rank: int
    children: dict[tuple[str, ...], _Domain] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    room: int = 0
    cap: int = 0
    free: tuple[int, int] = (0, 0)
    # Set: the children are made on first use (_children), so a gang placed in a wide
    # domain pays for the subtrees it goes into, not for every node's.
    below: _Below | None = None


# A child domain as _fill chooses among them: (replicas it holds, free, key, the domain, or
# the name of its one node when each child of the level is one node).
_Child = tuple[int, tuple[int, int], tuple[str, ...], "_Domain | str"]


def _children(d: _Domain) -> list[_Child]:
    below = d.below
    if below is None or d.children or d.rank == 0:
        return [(c.cap, c.free, c.key, c) for c in d.children.values()]
    rank = d.rank - 1
    keys, caps, fullness = below.tree.keys, below.caps, below.fullness
    if below.tree.one_node_each[rank]:
        # Each child is one node: no domain objects, and its subtree is just that node.
        return [(caps[n], fullness(n), keys[n][rank], n) for n in d.nodes]
    sums: dict[tuple[str, ...], list[int]] = {}
    names: dict[tuple[str, ...], list[str]] = {}
    for name in d.nodes:
        key = keys[name][rank]
        total = sums.get(key)
        if total is None:
            total = sums[key] = [0, 0, 0]
            names[key] = []
        a, b = fullness(name)
        total[0] += caps[name]
        total[1] += a
        total[2] += b
        names[key].append(name)
    for key, (room, a, b) in sums.items():
        d.children[key] = _Domain(key, rank, {}, names[key], room, room, (a, b), below)
    return [(c.cap, c.free, c.key, c) for c in d.children.values()]


def _build(
    tree: Tree,
    rooms: Mapping[str, int],
    count: int,
    slice_size: int,
    slice_rank: int,
    fullness: Fullness,
) -> list[list[_Domain]]:
    """The domains that hold room for the job, per rank (the last: the whole cluster), with their capacity in replicas
    (at and above the slice level: whole slices only)."""
    top = len(tree.levels)
    root = _Domain((), top)
    by_rank: list[list[_Domain]] = [[] for _ in range(top + 1)]
    by_rank[top].append(root)
    for name in sorted(rooms):
        k = min(rooms[name], count)
        if k <= 0 or name not in tree.keys:
            continue
        keys = tree.keys[name]
        f = fullness(name)
        d = root
        d.room += k
        d.nodes.append(name)
        d.free = (d.free[0] + f[0], d.free[1] + f[1])
        for rank in range(top - 1, -1, -1):
            child = d.children.get(keys[rank])
            if child is None:
                child = d.children[keys[rank]] = _Domain(keys[rank], rank)
                by_rank[rank].append(child)
            child.room += k
            child.nodes.append(name)
            child.free = (child.free[0] + f[0], child.free[1] + f[1])
            d = child
    for rank in range(top + 1):
        for d in by_rank[rank]:
            if rank < slice_rank:
                d.cap = d.room
            elif rank == slice_rank:
                d.cap = d.room // slice_size * slice_size
            else:
                d.cap = sum(c.cap for c in d.children.values())
    return by_rank


def _best_fit(domains: Iterable[_Domain]) -> _Domain:
    return min(domains, key=lambda d: (d.free, d.key))


def _best_fit_child(children: Iterable[_Child]) -> _Child:
    return min(children, key=lambda c: (c[1], c[2]))


def _largest_first(c: _Child) -> tuple[int, tuple[int, int], tuple[str, ...]]:
    return -c[0], c[1], c[2]


def _fill(d: _Domain, count: int, out: list[tuple[str, int]]) -> None:
    if d.rank == 0:
        out.append((d.nodes[0], count))
        return
    children = _children(d)
    holding = [c for c in children if c[0] >= count]
    if holding:
        _fill_child(_best_fit_child(holding), count, out)
        return
    # As few children as possible: the largest first; the last one the best fit for the rest.
    # Children holding a replica each: the first `count` of that order are all it can take.
    ranked = heapq.nsmallest(count, children, key=_largest_first)
    if sum(c[0] for c in ranked) < count:
        ranked = sorted(children, key=_largest_first)
    taken: list[_Child] = []
    total = 0
    for c in ranked:
        if total >= count:
            break
        taken.append(c)
        total += c[0]
    rest = count - sum(c[0] for c in taken[:-1])
    last = _best_fit_child(c for c in children if c not in taken[:-1] and c[0] >= rest)
    for c in [*taken[:-1], last]:
        k = min(c[0], count)
        _fill_child(c, k, out)
        count -= k


def _fill_child(child: _Child, count: int, out: list[tuple[str, int]]) -> None:
    ref = child[3]
    if isinstance(ref, str):
        out.append((ref, count))  # a one-node domain: every level below it is that node
    else:
        _fill(ref, count, out)


def tightest_level(
    tree: Tree,
    rooms: Mapping[str, int],
    count: int,
    slice_size: int = 1,
    slice_level: str = NODE_LEVEL,
    fullness: Fullness | None = None,
) -> str | None:
    """The narrowest level at which one domain's free room holds the gang ('cluster' if only
    the whole cluster does; None if not even that)."""
    chosen = _narrowest(tree, rooms, count, slice_size, slice_level, fullness)
    if chosen is None:
        return None
    return tree.levels[chosen.rank] if chosen.rank < len(tree.levels) else CLUSTER_LEVEL


def _narrowest(
    tree: Tree,
    rooms: Mapping[str, int],
    count: int,
    slice_size: int,
    slice_level: str,
    fullness: Fullness | None,
) -> _Domain | None:
    """The best-fit domain of the narrowest level that holds the gang, with its subtree."""
    fill = fullness or (lambda _: (0, 0))
    if slice_size > 1:
        by_rank = _build(tree, rooms, count, slice_size, tree.rank.get(slice_level, 0), fill)
        for domains in by_rank:
            fitting = [d for d in domains if d.cap >= count]
            if fitting:
                return _best_fit(fitting)
        return None
    # Without slices a domain holds what its nodes hold: sum per level, narrowest first,
    # and make the subtree only under the domain chosen, as far as _fill goes into it.
    caps = {n: k if k < count else count for n, k in rooms.items() if k > 0 and n in tree.keys}
    if sum(caps.values()) < count:
        return None
    top = len(tree.levels)
    for rank in range(top):
        if tree.one_node_each[rank]:
            if rank:
                continue  # its domains hold what their one node holds: no more than at rank 0
            holding = {tree.keys[n][0] for n, k in caps.items() if k >= count}
        else:
            held: dict[tuple[str, ...], int] = {}
            for n, k in caps.items():
                key = tree.keys[n][rank]
                held[key] = held.get(key, 0) + k
            holding = {key for key, v in held.items() if v >= count}
        if not holding:
            continue
        members = [n for n in caps if tree.keys[n][rank] in holding]
        if len(holding) > 1:
            free: dict[tuple[str, ...], tuple[int, int]] = {}
            for n in members:
                key = tree.keys[n][rank]
                f, g = free.get(key, (0, 0))
                a, b = fill(n)
                free[key] = (f + a, g + b)
            best = min(holding, key=lambda d: (free[d], d))
            members = [n for n in members if tree.keys[n][rank] == best]
        return _subtree(tree, {n: caps[n] for n in members}, rank, fill)
    return _subtree(tree, caps, top, fill)


def _subtree(tree: Tree, caps: Mapping[str, int], rank: int, fill: Fullness) -> _Domain:
    """The domain of `rank` that holds every node of `caps`, its children made on first use.
    Its own `free` stays (0, 0): it is chosen already, and only siblings are compared by it."""
    nodes = sorted(caps)
    key = tree.keys[nodes[0]][rank] if rank < len(tree.levels) else ()
    room = sum(caps.values())
    return _Domain(key, rank, {}, nodes, room, room, (0, 0), _Below(tree, caps, fill))


def compact_allocation(
    tree: Tree,
    rooms: Mapping[str, int],
    count: int,
    fullness: Fullness,
    limit: str | None = None,
    slice_size: int = 1,
    slice_level: str = NODE_LEVEL,
) -> list[tuple[str, int]] | None:
    """Replicas per node, in replica order: inside the narrowest domain that holds the gang
    (best fit among those), then as few child domains as possible at every level below.
    None if no domain at or below `limit` holds it (no limit: not even the cluster)."""
    chosen = _narrowest(tree, rooms, count, slice_size, slice_level, fullness)
    if chosen is None:
        return None
    if limit is not None and chosen.rank > tree.level_rank(limit):
        return None
    out: list[tuple[str, int]] = []
    _fill(chosen, count, out)
    return out


def largest_domain_room(tree: Tree, rooms: Mapping[str, int], count: int, level: str) -> int:
    """Replicas the roomiest domain of `level` holds (for the message of a gang that waits)."""
    rank = tree.level_rank(level)
    held: dict[tuple[str, ...], int] = {}
    for name, k in rooms.items():
        if name in tree.keys:
            key = tree.keys[name][rank]
            held[key] = held.get(key, 0) + min(k, count)
    return min(count, max(held.values(), default=0))


def largest_slice_room(
    tree: Tree,
    rooms: Mapping[str, int],
    count: int,
    slice_size: int,
    slice_level: str,
    level: str | None,
) -> int:
    """Whole slices the roomiest domain of `level` (None: the cluster) holds."""
    by_rank = _build(
        tree, rooms, count, slice_size, tree.rank.get(slice_level, 0), lambda _: (0, 0)
    )
    rank = tree.level_rank(level) if level is not None else len(tree.levels)
    return max((d.cap for d in by_rank[rank]), default=0) // slice_size


# -- explaining where a gang went -----------------------------------------------------------


def _plural(level: str, n: int) -> str:
    return level if n == 1 else f"{level}s"


def placement_note(tree: Tree, job: Job, span: Span, tightest: str | None) -> str:
    """What a preferred gang's place says about its level: '' when it sits inside one domain
    of the level it names; else which wider domain took it, and why."""
    gang = gang_topology(job)
    named = gang.named
    if not gang.preferred or named is None or named not in tree.rank:
        return ""
    if tree.rank[span.level] <= tree.rank[named]:
        return ""
    could = (
        tightest is not None
        and tightest != CLUSTER_LEVEL
        and tree.rank[tightest] <= tree.rank[named]
    )
    top = tree.levels[-1]
    if span.level != CLUSTER_LEVEL:
        where = f"placed within one {span.level}"
    else:
        where = f"spread over {span.used[-1]} {_plural(top, span.used[-1])}"
    if could:
        return f"preferred {named}: a {named} had room, yet {where}"
    if span.level != CLUSTER_LEVEL:
        return f"preferred {named}: no {named} could hold it; {where}"
    return f"preferred {named}: no domain could hold it, {where}"


# -- spans of a plan ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GangSpan:
    """A gang a plan places anew: its span, and the tightest span free at decision time
    (every other job of the plan where the plan puts it)."""

    job: str
    span: Span
    tightest: str | None
    extra: int  # levels wider than the tightest
    named: bool  # the job names a level (required or preferred)


def gang_spans(
    instance: PlacementInstance,
    outcomes: Sequence[JobOutcome],
    tree: Tree | None = None,
    only: Callable[[Job, JobOutcome, Span], bool] | None = None,
) -> list[GangSpan]:
    """Span against tightest span for every gang of more than one replica the plan places or
    moves (with `only`: those it accepts, before the costly part)."""
    tree = tree or Tree.of(instance.cluster, instance.nodes)
    jobs = {j.key: j for j in instance.jobs}
    todo: list[tuple[Job, JobOutcome, Span]] = []
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None or o.status not in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
            continue
        if len(o.replicas) < 2:
            continue
        span = span_of(tree, (r.node for r in o.replicas))
        if only is None or only(job, o, span):
            todo.append((job, o, span))
    if not todo:
        return []
    free = {n.name: NodeFree.of(n) for n in instance.nodes}
    for o in outcomes:
        job = jobs.get(o.job)
        if job is not None and o.running:
            for r in o.replicas:
                if r.node in free:
                    free[r.node].take(r, job.resources, job)
    eligible: dict[tuple[object, ...], list[str]] = {}
    out: list[GangSpan] = []
    for job, o, span in todo:
        count = len(o.replicas)
        for r in o.replicas:
            free[r.node].give(r, job.resources, job)
        kind = (o.flavor, job.isolation, job.residency, job.resources)
        names = eligible.get(kind)
        if names is None:
            names = eligible[kind] = [
                n.name for n in instance.nodes if node_rejection(job, n, o.flavor) is None
            ]
        rooms = {name: free[name].room_for(job.resources, job, count) for name in names}
        gang = gang_topology(job)
        tightest = tightest_level(tree, rooms, count, gang.slice_size, gang.slice_level)
        for r in o.replicas:
            free[r.node].take(r, job.resources, job)
        extra = extra_levels(tree, span, tightest) if tightest is not None else 0
        out.append(GangSpan(job.key, span, tightest, extra, gang.named is not None))
    return out


def explain_spans(
    instance: PlacementInstance, outcomes: tuple[JobOutcome, ...]
) -> tuple[JobOutcome, ...]:
    """The outcomes, each preferred gang placed wider than its level told where it went and
    why (the decision event, `plan` and audit carry the reason)."""
    tree: Tree | None = None
    jobs = {j.key: j for j in instance.jobs}

    def wider(job: Job, o: JobOutcome, span: Span) -> bool:
        named = job.topology.level if job.topology is not None else None
        return (
            job.topology is not None
            and job.topology.mode is TopologyMode.PREFERRED
            and named is not None
            and tree is not None
            and tree.rank[span.level] > tree.level_rank(named)
        )

    if not any(
        (j := jobs.get(o.job)) is not None
        and j.topology is not None
        and j.topology.mode is TopologyMode.PREFERRED
        and o.running
        and len(o.replicas) > 1
        for o in outcomes
    ):
        return outcomes
    tree = Tree.of(instance.cluster, instance.nodes)
    notes = {
        g.job: placement_note(tree, jobs[g.job], g.span, g.tightest)
        for g in gang_spans(instance, outcomes, tree, wider)
    }
    return tuple(
        JobOutcome(
            o.job,
            o.status,
            o.flavor,
            o.replicas,
            f"{o.reason}; {notes[o.job]}" if o.reason else notes[o.job],
            o.constraint,
            o.preempted_by,
            o.lost_gpu_seconds,
        )
        if notes.get(o.job)
        else o
        for o in outcomes
    )
