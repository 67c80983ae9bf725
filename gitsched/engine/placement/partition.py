"""The cut of a decomposed solve (engine/placement/decompose.py): which part each node and
job goes to, and each part's share of every quota.

How the cut keeps the merged plan legal:
- Nodes: whole top-level domains (blocks) go to one part, so every topology requirement
  a part can meet is met in the whole; blocks that a running job spans stay together.
  Each part holds a share of every flavor, dealt in a seeded order balanced by GPUs.
- Jobs: a running job goes with its nodes; waiting jobs, highest priority first, go to
  the part and flavor where their queue's nominal quota is least asked for by work of
  their priority or above, running jobs included (ties: the seeded order), so that each
  part's share of a queue's nominal quota is filled by the work the whole would put in
  it first.
- Quotas: every quota figure of every queue (nominal, borrowing limit, the guaranteed
  part that is never lent, and lending) is split over the parts so that the parts add
  up to the whole, each part first getting what its running jobs already use. Every
  quota rule is a sum over usage that is at most the sum of the parts' limits (the
  cohort rule's max(0, usage - guaranteed) is convex, so the parts' draws add up to at
  least the whole's draw), so parts that each keep their own quotas keep the whole's.
  The merged plan is checked against the whole's quotas all the same (`quota_violations`),
  and a plan that breaks one is never returned.

The partition is a function of the instance: sorted names and a seed drawn from the
instance's size, never hash or set order or the clock.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gitsched.engine.model import FlavorQuota, Isolation, Job, Node, Placement, Queue
from gitsched.engine.placement.constraints import QuotaLedger, node_rejection, quota_charge
from gitsched.engine.placement.objective import (
    CPU_JOB_VALUE_MILLI,
    jobs_by_key,
    nodes_by_name,
    quota_exempt,
)
from gitsched.engine.placement.plan import JobOutcome, PlacementInstance
from gitsched.engine.placement.topology import Tree
from gitsched.engine.units import GPU_MILLI

UNITS_PER_PART = 4  # the cut's level is the widest with this many domains per part


@dataclass(frozen=True, slots=True)
class Partition:
    """Which part each node and job is in; `parts` sub-instances, in part order."""

    node_part: dict[str, int]
    job_part: dict[str, int]
    parts: tuple[PlacementInstance, ...]
    active: tuple[int, ...]  # the parts that take waiting jobs
    jobs: Mapping[str, Job]  # every job by key, in the instance's order


def _seed(instance: PlacementInstance) -> str:
    return f"decompose-{len(instance.nodes)}-{len(instance.jobs)}-{len(instance.queues)}"


def _signature(node: Node) -> tuple[object, ...]:
    """What node_rejection reads of a node: nodes alike in it take the same jobs."""
    return (
        node.flavor,
        node.isolation,
        node.region,
        node.gpus,
        node.cpu_milli,
        node.memory_mib,
        node.state,
    )


@dataclass(frozen=True, slots=True)
class _Unit:
    """A domain of the cut's level, summed up once per node list: what the deal and the
    parts' capacities read of its nodes (a commit of jobs leaves the nodes as they were,
    so the sums are kept for the next solve; see _domains)."""

    nodes: tuple[Node, ...]  # in the instance's order
    first: int  # the index of its first node in the instance
    gpus: int
    gpus_by_flavor: dict[str, int]  # every node ("" for none), as the deal weighs units
    schedulable_milli: int
    # Schedulable shared GPUs by flavor, with the index of the flavor's first such node.
    capacity: dict[str, tuple[int, int]]
    # One node of each kind (the first in the instance's order) and its kind's GPUs.
    kinds: dict[tuple[object, ...], tuple[int, Node, int]]


@dataclass(frozen=True, slots=True)
class _Domains:
    """The node list cut into domains of the widest level with UNITS_PER_PART per part."""

    nodes: tuple[Node, ...]
    count: int
    unit_of: dict[str, str]
    units: dict[str, _Unit]
    index: dict[str, int]
    lost: frozenset[str]  # nodes that are not schedulable


_DOMAINS: dict[int, _Domains] = {}


def _domains(instance: PlacementInstance, count: int) -> _Domains:
    """The cut's domains of the instance's nodes, summed once per node list (kept by the
    list's identity, which holds it alive: engine.core hands the same tuple to every solve
    while the state's nodes are unchanged)."""
    found = _DOMAINS.get(count)
    if found is not None and found.nodes is instance.nodes:
        return found
    # The levels alone (a Tree's paths for 12,500 nodes cost more than the cut).
    levels = Tree.of(instance.cluster, instance.nodes if instance.cluster is None else ()).levels

    def path(node: Node, rank: int) -> str:
        return "/".join(node.domain(lv) for lv in levels[rank:])

    top = 0
    for rank in range(len(levels) - 1, -1, -1):
        if len({path(n, rank) for n in instance.nodes}) >= UNITS_PER_PART * count:
            top = rank
            break
    unit_of = {n.name: path(n, top) for n in instance.nodes}
    grouped: dict[str, list[tuple[int, Node]]] = defaultdict(list)
    for i, n in enumerate(instance.nodes):
        grouped[unit_of[n.name]].append((i, n))
    units: dict[str, _Unit] = {}
    for name in sorted(grouped):
        by_flavor: dict[str, int] = defaultdict(int)
        capacity: dict[str, tuple[int, int]] = {}
        kinds: dict[tuple[object, ...], tuple[int, Node, int]] = {}
        milli = 0
        for i, n in grouped[name]:
            by_flavor[n.flavor or ""] += n.gpus
            if not n.schedulable:
                continue
            milli += n.gpus * GPU_MILLI
            if n.flavor is not None and n.isolation is Isolation.SHARED:
                at, gpus = capacity.get(n.flavor, (i, 0))
                capacity[n.flavor] = (at, gpus + n.gpus)
            sig = _signature(n)
            at, node, gpus = kinds.get(sig, (i, n, 0))
            kinds[sig] = (at, node, gpus + n.gpus)
        members = tuple(n for _, n in grouped[name])
        units[name] = _Unit(
            members,
            grouped[name][0][0],
            sum(n.gpus for n in members),
            dict(by_flavor),
            milli,
            capacity,
            kinds,
        )
    found = _Domains(
        instance.nodes,
        count,
        unit_of,
        units,
        {n.name: i for i, n in enumerate(instance.nodes)},
        frozenset(n.name for n in instance.nodes if not n.schedulable),
    )
    if len(_DOMAINS) > 4:
        _DOMAINS.clear()
    _DOMAINS[count] = found
    return found


def _units(instance: PlacementInstance, count: int) -> tuple[_Domains, dict[str, list[_Unit]]]:
    """Nodes grouped by the widest domain that has at least UNITS_PER_PART domains per
    part (so parts can be evened out), with groups that a running job spans joined: each
    group's domains, the first (by name) naming the group."""
    domains = _domains(instance, count)
    unit_of = domains.unit_of
    parent = {u: u for u in domains.units}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for key in sorted(instance.current):
        replicas = instance.current[key].replicas
        if len(replicas) < 2:
            continue  # one replica, one unit: nothing to join
        spanned = sorted({unit_of[r.node] for r in replicas if r.node in unit_of})
        for other in spanned[1:]:
            a, b = find(spanned[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[str, list[_Unit]] = defaultdict(list)
    for name in sorted(domains.units, key=lambda u: domains.units[u].first):
        groups[find(name)].append(domains.units[name])
    return domains, groups


def _deal_nodes(
    instance: PlacementInstance, count: int, rng: random.Random
) -> tuple[dict[str, int], list[list[Node]], list[list[_Unit]], _Domains]:
    """Units to `count` parts: by main flavor, in a seeded order, each to the part with the
    fewest GPUs of that flavor so far (ties: the fewest GPUs in all, then lowest index).
    Also each part's domains and the cut's domains."""
    domains, units = _units(instance, count)
    by_flavor: dict[str, list[str]] = defaultdict(list)
    size_of: dict[str, int] = {}
    for name in sorted(units):
        gpus: dict[str, int] = defaultdict(int)
        for u in units[name]:
            for flavor, count_of in u.gpus_by_flavor.items():
                gpus[flavor] += count_of
        size_of[name] = sum(u.gpus for u in units[name])
        by_flavor[max(sorted(gpus), key=lambda f: gpus[f])].append(name)
    part_of: dict[str, int] = {}
    total = [0] * count
    for flavor in sorted(by_flavor):
        names = by_flavor[flavor]
        rng.shuffle(names)
        # Largest first (stable on the seeded order), so parts even out.
        names.sort(key=lambda u: -size_of[u])
        load = [0] * count
        for name in names:
            k = min(range(count), key=lambda i: (load[i], total[i], i))
            load[k] += size_of[name]
            total[k] += size_of[name]
            part_of[name] = k
    node_part: dict[str, int] = {}
    members: list[list[Node]] = [[] for _ in range(count)]
    part_units: list[list[_Unit]] = [[] for _ in range(count)]
    for name in sorted(units):
        part_units[part_of[name]].extend(units[name])
    for k in range(count):
        part_units[k].sort(key=lambda u: u.first)
    index = domains.index
    for k in range(count):
        m = members[k]
        for u in part_units[k]:
            m.extend(u.nodes)
            for n in u.nodes:
                node_part[n.name] = k
        m.sort(key=lambda n: index[n.name])
    return node_part, members, part_units, domains


def _usage(job: Job, placement: Placement, nodes: Mapping[str, Node]) -> int:
    return quota_charge(job, placement.replicas, nodes)


def _split(total: int, need: Sequence[int], share: Sequence[float]) -> list[int]:
    """`total` over the parts, adding up exactly: each its `need` first, the rest by `share`
    (largest remainder; ties to the lower index); short of the needs, by need."""
    count = len(need)
    if sum(need) <= total:
        base, rest, weight = list(need), total - sum(need), list(share)
    else:
        base, rest, weight = [0] * count, total, [float(x) for x in need]
    if sum(weight) <= 0:
        weight = [1.0] * count
    scale = sum(weight)
    exact = [rest * w / scale for w in weight]
    parts = [math.floor(x) for x in exact]
    left = rest - sum(parts)
    for i in sorted(range(count), key=lambda i: (parts[i] - exact[i], i))[:left]:
        parts[i] += 1
    return [b + p for b, p in zip(base, parts, strict=True)]


def split_quotas(
    queues: Sequence[Queue],
    running: dict[tuple[str, str], list[int]],
    share: dict[tuple[str, str], list[float]],
    count: int,
) -> list[list[Queue]]:
    """Each queue's quotas over `count` parts: `running[(queue, flavor)]` is what its running
    jobs use in each part (every running job, as the rules' facts count it), `share[(queue,
    flavor)]` how the rest is dealt. Each part's quotas hold what runs there wherever the
    whole's do, the cohorts' pools included (`_cover_cohort_pools`)."""
    dealt: dict[str, dict[str, list[FlavorQuota]]] = {}
    for q in queues:
        dealt[q.name] = {}
        for fq in q.quotas:
            used = running.get((q.name, fq.flavor), [0] * count)
            weight = share.get((q.name, fq.flavor), [1.0] * count)
            nominal = _split(fq.nominal, used, weight)
            over = [max(0, u - n) for u, n in zip(used, nominal, strict=True)]
            borrowing = (
                None if fq.borrowing_limit is None else _split(fq.borrowing_limit, over, weight)
            )
            lending: list[int | None] = [None] * count
            if fq.lending_limit is not None:
                # What the queue keeps for itself goes first where it runs: a part where it
                # runs past its share of that, beside one where its share lies unused,
                # would draw on the cohort's pool there more than the whole instance does.
                held = [min(u, n) for u, n in zip(used, nominal, strict=True)]
                guaranteed = _split(fq.guaranteed, held, [float(n) for n in nominal])
                guaranteed = [min(g, n) for g, n in zip(guaranteed, nominal, strict=True)]
                extra = _split(max(0, fq.lending_limit - fq.nominal), [0] * count, weight)
                lending = [n - g + e for n, g, e in zip(nominal, guaranteed, extra, strict=True)]
            dealt[q.name][fq.flavor] = [
                FlavorQuota(
                    fq.flavor,
                    nominal[k],
                    None if borrowing is None else borrowing[k],
                    lending[k],
                )
                for k in range(count)
            ]
    _cover_cohort_pools(queues, dealt, running, count)
    out: list[list[Queue]] = [[] for _ in range(count)]
    for q in queues:
        for k in range(count):
            quotas = tuple(dealt[q.name][fq.flavor][k] for fq in q.quotas)
            out[k].append(replace(q, quotas=quotas))
    return out


def _cover_cohort_pools(
    queues: Sequence[Queue],
    dealt: dict[str, dict[str, list[FlavorQuota]]],
    running: dict[tuple[str, str], list[int]],
    count: int,
) -> None:
    """Where a cohort's running jobs draw more from a part's pool than its queues' quotas
    there put in (QuotaLedger: the sum of usage over guaranteed against the sum of nominal
    over guaranteed), move lendable nominal quota that a queue does not use from parts with
    room to spare: the whole instance's pool covers what runs, so must each part's, or a
    part reads a cut quota the whole does not, and moves or stops jobs for it. Only unused
    quota moves (a queue keeps at least what it runs there), with its lending limit, so
    what each queue guarantees itself in each part is unchanged."""
    members: dict[str, list[Queue]] = defaultdict(list)
    for q in queues:
        if q.cohort is not None:
            members[q.cohort].append(q)
    for cohort in sorted(members):
        mates = sorted(members[cohort], key=lambda q: q.name)
        for flavor in sorted({fq.flavor for q in mates for fq in q.quotas}):
            have = [q for q in mates if flavor in dealt[q.name]]
            _cover_pool(have, flavor, dealt, running, count)


def _cover_pool(
    have: list[Queue],
    flavor: str,
    dealt: dict[str, dict[str, list[FlavorQuota]]],
    running: dict[tuple[str, str], list[int]],
    count: int,
) -> None:
    """`_cover_cohort_pools` for one cohort's queues `have` and one flavor."""
    used = {q.name: running.get((q.name, flavor), [0] * count) for q in have}

    def spare(k: int) -> int:
        pool = draw = 0
        for q in have:
            fq = dealt[q.name][flavor][k]
            pool += fq.nominal - fq.guaranteed
            draw += max(0, used[q.name][k] - fq.guaranteed)
        return pool - draw

    for short in range(count):
        need = -spare(short)
        for k in range(count):
            if need <= 0:
                break
            if k == short:
                continue
            for q in have:
                room = spare(k)
                if need <= 0 or room <= 0:
                    break
                fq = dealt[q.name][flavor][k]
                lendable = fq.nominal if fq.lending_limit is None else fq.lending_limit
                free = fq.nominal - max(used[q.name][k], fq.guaranteed)
                moved = min(need, room, free, lendable)
                if moved <= 0:
                    continue
                dealt[q.name][flavor][k] = _shifted(fq, -moved)
                dealt[q.name][flavor][short] = _shifted(dealt[q.name][flavor][short], moved)
                need -= moved


def _shifted(fq: FlavorQuota, amount: int) -> FlavorQuota:
    """`fq` with `amount` more nominal quota, all of it lendable (its lending limit moves
    with it, so what the queue guarantees itself stays)."""
    lending = None if fq.lending_limit is None else fq.lending_limit + amount
    return replace(fq, nominal=fq.nominal + amount, lending_limit=lending)


def _fill(
    queues: Sequence[Queue],
    running: dict[tuple[str, str], list[int]],
    capacity: dict[str, list[float]],
    live: Sequence[int],
    count: int,
    rng: random.Random,
) -> dict[tuple[str, str], list[float]]:
    """Where each queue's quota beyond its running jobs goes: per flavor, first to the
    parts where its cohort's running jobs borrow, then the parts' free GPUs are filled
    queue after queue (cohort members next to each other), so a queue's quota lands
    whole in one part or two, not a sliver in each: a sliver too small for its jobs is
    quota no part can use."""
    order = list(live)
    rng.shuffle(order)
    out: dict[tuple[str, str], list[float]] = {}
    for flavor in sorted(capacity):
        room = [0.0] * count
        for k in live:
            used = sum(r[k] for (q, f), r in running.items() if f == flavor)
            room[k] = max(0.0, capacity[flavor][k] * GPU_MILLI - used)
        wants = []
        for q in sorted(queues, key=lambda q: (q.cohort or "~" + q.name, q.name)):
            fq = q.quota(flavor)
            if fq is not None:
                used = sum(running.get((q.name, flavor), [0] * count))
                wants.append((q.name, max(0, fq.nominal - used)))
        total_room, total_want = sum(room), sum(w for _, w in wants)
        if total_room <= 0 or total_want <= 0:
            continue
        room = [r * total_want / total_room for r in room]
        left_of = {name: float(want) for name, want in wants}
        got_of = {name: [0.0] * count for name, _ in wants}
        # First, where a cohort's queues run beyond their own nominal (borrowing), the
        # lenders' quota goes to the same part, or that part's pool is short of what
        # already runs there and its solve must preempt.
        members: dict[str, list[Queue]] = defaultdict(list)
        for q in queues:
            if q.cohort is not None and q.quota(flavor) is not None:
                members[q.cohort].append(q)
        for cohort in sorted(members):
            mates = sorted(members[cohort], key=lambda q: q.name)
            for k in live:
                short = 0.0
                for q in mates:
                    fq = q.quota(flavor)
                    use = running.get((q.name, flavor), [0] * count)
                    total = sum(use)
                    if fq is not None and total > fq.nominal:
                        short += use[k] * (1 - fq.nominal / total)
                for q in mates:
                    if short <= 1e-9:
                        break
                    take = min(short, left_of[q.name])
                    got_of[q.name][k] += take
                    left_of[q.name] -= take
                    room[k] = max(0.0, room[k] - take)
                    short -= take
        at = 0
        for name, _ in wants:
            got = got_of[name]
            left = left_of[name]
            while left > 1e-9 and at < len(order):
                k = order[at]
                take = min(left, room[k])
                got[k] += take
                room[k] -= take
                left -= take
                if room[k] <= 1e-9:
                    at += 1
            if left > 1e-9:
                got[order[-1]] += left
            out[(name, flavor)] = got
    return out


def partition(
    instance: PlacementInstance,
    count: int,
    active_count: int | None = None,
    assign: Collection[str] | None = None,
    changed: Collection[str] = (),
) -> Partition:
    """The instance in `count` parts. Waiting jobs (or only those in `assign`, the rest left
    out) go to the active parts: all, or the `active_count` with the most free GPUs (ties:
    lowest index) and every part where a `changed` running job runs or a running job lost
    its node; quota slack goes to the active parts."""
    rng = random.Random(_seed(instance))
    node_part, members, part_units, domains = _deal_nodes(instance, count, rng)
    current = instance.current
    running_keys = sorted(current)
    if active_count is None:
        live = list(range(count))
    else:
        used = [0] * count
        for p in instance.current.values():
            for r in p.replicas:
                if r.node in node_part:
                    used[node_part[r.node]] += r.gpu_milli * len(r.gpus)
        free = [sum(u.schedulable_milli for u in part_units[k]) - used[k] for k in range(count)]
        homes = set()
        lost = domains.lost
        for key in running_keys:
            nodes = {r.node for r in current[key].replicas}
            if key in changed or not nodes <= node_part.keys() or nodes & lost:
                homes |= {node_part[n] for n in nodes if n in node_part}
        roomiest = sorted(range(count), key=lambda k: (-free[k], k))[:active_count]
        live = sorted(homes | set(roomiest))
    jobs = jobs_by_key(instance)
    job_part: dict[str, int] = {}
    running_use: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * count)
    running_by_priority: dict[int, list[tuple[tuple[str, str], int, int]]] = defaultdict(list)
    for key in running_keys:
        job = jobs.get(key)
        placement = current[key]
        homes = {node_part[r.node] for r in placement.replicas if r.node in node_part}
        if job is None or not homes:
            continue
        k = min(homes)
        job_part[key] = k
        # Every running job counts, as the rules' facts count it (preemption.start_ledger;
        # a kept non-preemptible job is in its queue's no_borrow rows, though exempt from
        # its limits): a part short of nominal quota for what runs there reads as a cut
        # quota, and moves or stops jobs the whole instance leaves alone.
        if placement.flavor is not None:
            held = _usage(job, placement, nodes_by_name(instance))
            running_use[(job.queue, placement.flavor)][k] += held
            running_by_priority[job.priority].append(((job.queue, placement.flavor), k, held))
    # Capacity per part and flavor, and one node of each kind per part for eligibility.
    # (Summed from the parts' domains; flavors in the order their first nodes come.)
    capacity: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    kinds: list[dict[tuple[object, ...], Node]] = [{} for _ in range(count)]
    kind_gpus: list[dict[tuple[object, ...], int]] = [defaultdict(int) for _ in range(count)]
    for k in range(count):
        first: dict[str, int] = {}
        gpus_of: dict[str, int] = defaultdict(int)
        kind_at: dict[tuple[object, ...], int] = {}
        for u in part_units[k]:
            for flavor, (at, flavor_gpus) in u.capacity.items():
                first[flavor] = min(first.get(flavor, at), at)
                gpus_of[flavor] += flavor_gpus
            for sig, (at, kind_node, sig_gpus) in u.kinds.items():
                if sig not in kind_at or at < kind_at[sig]:
                    kind_at[sig] = at
                    kinds[k][sig] = kind_node
                kind_gpus[k][sig] += sig_gpus
        for flavor in sorted(first, key=lambda f: first[f]):
            capacity[flavor][k] += gpus_of[flavor]
    share = _fill(instance.queues, running_use, capacity, live, count, rng)
    split = split_quotas(instance.queues, running_use, share, count)
    nominal: dict[tuple[str, str], list[int]] = {
        (q.name, fq.flavor): [split[k][i].quotas[j].nominal for k in range(count)]
        for i, q in enumerate(instance.queues)
        for j, fq in enumerate(q.quotas)
    }
    # Milli-GPUs each (queue, flavor) is asked per part, running work included.
    demand: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * count)
    eligible_cache: dict[tuple[object, ...], list[tuple[int, float]]] = {}
    waiting = [
        j for j in instance.jobs if j.key not in job_part and (assign is None or j.key in assign)
    ]
    order = list(range(len(waiting)))
    rng.shuffle(order)
    flavors = tuple(capacity)

    def accepted(job: Job) -> tuple[str, ...]:
        return tuple(f for f in (job.gpu_flavors or flavors) if f in capacity)

    # Highest priority first, and within a priority the jobs with the fewest flavors
    # first (stable on the seeded order): a queue's nominal quota of a flavor in a part
    # is filled by its highest-priority work there, running or waiting, so each
    # priority's demand is dealt over the parts and flavors in proportion to the queue's
    # nominal quota, counting the running jobs of that priority or above where they run.
    order.sort(key=lambda i: (-waiting[i].priority, len(accepted(waiting[i]))))
    counted: set[int] = set()
    for i in order:
        job = waiting[i]
        for level in sorted(running_by_priority, reverse=True):
            if level >= job.priority and level not in counted:
                counted.add(level)
                for pair, at, milli in running_by_priority[level]:
                    demand[pair][at] += milli
        shape = (job.resources, job.isolation, job.residency, job.gpu_flavors, job.replicas)
        options = eligible_cache.get(shape)
        if options is None:
            options = []
            for k in live:
                gpus = 0.0
                for sig, node in kinds[k].items():
                    flavors_of = job.gpu_flavors or (node.flavor,)
                    if node.flavor in flavors_of and node_rejection(job, node, node.flavor) is None:
                        gpus += kind_gpus[k][sig]
                if gpus:
                    options.append((k, gpus))
            eligible_cache[shape] = options
        if not options:
            options = [(k, 1.0) for k in live]
        size = job.replicas * (job.resources.gpu_milli or CPU_JOB_VALUE_MILLI)
        # Where the job's queue has nominal quota of a flavor it takes, the part and
        # flavor asked least per quota GPU; else where it fits, the least asked per GPU.
        quota = [
            ((job.queue, f), k, n)
            for k, _ in options
            for f in accepted(job)
            if (n := nominal.get((job.queue, f), [0] * count)[k]) > 0
        ]
        if quota:
            pair, k, _ = min(quota, key=lambda o: ((demand[o[0]][o[1]] + size) / o[2], o[1]))
            demand[pair][k] += size
        else:
            q = demand[(job.queue, "")]
            k = min(options, key=lambda o: ((q[o[0]] + size) / o[1], o[0]))[0]
            q[k] += size
        job_part[job.key] = k
    by_part: list[list[Job]] = [[] for _ in range(count)]
    homes_of: list[dict[str, Placement]] = [{} for _ in range(count)]
    for j in instance.jobs:
        home = job_part.get(j.key)
        if home is not None:
            by_part[home].append(j)
            run = current.get(j.key)
            if run is not None:
                homes_of[home][j.key] = run
    parts = tuple(
        replace(
            instance,
            nodes=tuple(members[k]),
            queues=tuple(split[k]),
            jobs=tuple(by_part[k]),
            current=homes_of[k],
            # The parts' own weights: past WEIGHT_RANGE (every instance this large) they
            # depend on the priority classes alone, so they equal the whole's; a basis
            # would carry the whole instance into every worker.
            basis=None,
        )
        for k in range(count)
    )
    return Partition(node_part, job_part, parts, tuple(live), jobs)


def quota_violations(
    instance: PlacementInstance,
    outcomes: Sequence[JobOutcome],
    jobs: Mapping[str, Job] | None = None,
) -> list[str]:
    """The whole instance's quota rules the merged plan breaks (check.py's ledger); `jobs`:
    the instance's jobs by key, where the caller has them."""
    if jobs is None:
        jobs = jobs_by_key(instance)
    ledger = QuotaLedger(instance.queues)
    nodes = nodes_by_name(instance)
    for o in outcomes:
        job = jobs.get(o.job)
        if job is not None and o.running and not quota_exempt(job, o.status):
            ledger.add(job.queue, o.flavor, quota_charge(job, o.replicas, nodes))
    return list(ledger.violations())
