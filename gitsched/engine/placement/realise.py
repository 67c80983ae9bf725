"""From counts to nodes and GPUs: a solution of the formulation packed onto the nodes of
each class it counts on, in a few orders (the best plan kept), with greedy repair for
whatever does not pack, and running jobs left where they are wherever that is lawful and
costs nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from gitsched.engine.model import Job, Node, Placement, ReplicaPlacement
from gitsched.engine.placement.constraints import node_rejection, quota_charge
from gitsched.engine.placement.explain import attribution, explain_outcomes
from gitsched.engine.placement.formulation import Formulation, JobVars
from gitsched.engine.placement.greedy import Fit, Packing, claim_shape, priority_order
from gitsched.engine.placement.moves import voluntary_moves_left
from gitsched.engine.placement.objective import lost_gpu_seconds, plan_objective
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus, PlacementInstance
from gitsched.engine.placement.running import keep_problem
from gitsched.engine.placement.topology import compact_allocation, gang_topology
from gitsched.engine.units import GPU_MILLI

EPS = 1e-6


def _chosen(values: tuple[float, ...], col: int) -> bool:
    return col >= 0 and values[col] > 0.5


def _domain_first(jv: JobVars, replicas: int) -> tuple[object, ...]:
    r = jv.job.resources
    return (jv.level is None, -r.gpu_milli, -r.cpu_milli, -replicas, -jv.job.priority, jv.job.key)


def _largest_replica_first(jv: JobVars, replicas: int) -> tuple[object, ...]:
    r = jv.job.resources
    return (-r.gpu_milli, jv.level is None, -r.cpu_milli, -replicas, -jv.job.priority, jv.job.key)


def _largest_job_first(jv: JobVars, replicas: int) -> tuple[object, ...]:
    r = jv.job.resources
    return (jv.level is None, -r.gpu_milli * replicas, -jv.job.priority, jv.job.key)


# Orders in which the model's choices are packed onto nodes; the best plan is kept. Gangs
# bound to a domain first, or first-fit decreasing by replica size (it keeps the larger
# power-of-two slots the capacity rows count), or the largest jobs first.
PACKING_ORDERS = (_domain_first, _largest_replica_first, _largest_job_first)
# Repacks a round of `_stay_where_possible` tries, each keeping one more stopped job.
STAY_TRIES = 32


def best_realisation(
    instance: PlacementInstance,
    formulation: Formulation,
    values: tuple[float, ...],
    orders: int = len(PACKING_ORDERS),
    template: Packing | None = None,
    reclaimed: frozenset[str] = frozenset(),
) -> tuple[tuple[JobOutcome, ...], float]:
    """The best of packing the solution in each of the first `orders` PACKING_ORDERS, and its
    score. Every order is tried, however long it takes: no clock picks the packing.
    `reclaimed`: running jobs the rules stop (milp.fix_reclaims), never kept back."""
    best: Packed | None = None
    best_score = 0.0
    best_order = 0
    for order in range(orders):
        packed = pack_solution(instance, formulation, values, order, template=template)
        template = packed.packing
        score = plan_objective(instance, packed.outcomes(instance, explain=False))
        if best is None or score > best_score + EPS:
            best, best_score, best_order = packed, score, order
    assert best is not None
    best, best_score = _stay_where_possible(
        instance, formulation, values, best, best_score, best_order, reclaimed=reclaimed
    )
    return best.outcomes(instance), best_score


def _stay_where_possible(
    instance: PlacementInstance,
    formulation: Formulation,
    values: tuple[float, ...],
    best: Packed,
    best_score: float,
    order: int,
    follow: bool = False,
    reclaimed: frozenset[str] = frozenset(),
) -> tuple[Packed, float]:
    """A running job the model could only keep or stop (it has no column to move it: an
    incremental solve) and that the packing did not keep stays where it is when no rule
    allows its stop, or when the plan then scores at least as well. The model ties stops
    to the rules per queue, not per preemptor, and counts room by class in aggregate: it
    may stop a job that no admitted job may preempt, or whose room the new jobs did not
    need. Per round: every such job whose place is still free stays (the plan only
    gains); those no rule lets stop stay together (one repack: a plan that stops them is
    not lawful); then each other one, highest priority first, if the plan scores as well
    (at most STAY_TRIES repacks a round: a count, not a clock, bounds it). A job that stays can change which stops are lawful: a few rounds."""
    candidates = [
        job
        for job in priority_order(instance.jobs)
        if (jv := formulation.jobs.get(job.key)) is not None
        and jv.keep >= 0
        and jv.place < 0
        and job.key in instance.current
        and job.key not in reclaimed
    ]
    # Any running job the plan stops, moveable or not: a stop no rule allows is undone.
    running = [job for job in priority_order(instance.jobs) if job.key in instance.current]
    stay: set[str] = set()

    def repack(keys: set[str]) -> tuple[Packed, float]:
        packed = pack_solution(
            instance,
            formulation,
            values,
            order,
            follow,
            template=best.packing,
            stay=frozenset(keys),
        )
        return packed, plan_objective(instance, packed.outcomes(instance, explain=False))

    for _ in range(3):
        changed = False
        stopped = [j for j in candidates if best.status.get(j.key) is None]
        if not stopped and all(best.status.get(j.key) is not None for j in running):
            break
        for job in stopped:
            placement = instance.current[job.key]
            amount = quota_charge(job, placement.replicas, best.packing.nodes)
            if can_take(best.packing, job, placement.replicas) and (
                best.packing.ledger.rejection(job.queue, placement.flavor, amount) is None
            ):
                best.packing.commit(job, Fit(placement.flavor, placement.replicas))
                if not job.preemptible:
                    best.packing.ledger.remove(job.queue, placement.flavor, amount)
                best.status[job.key] = OutcomeStatus.KEPT
                stay.add(job.key)
                changed = True
        if changed:
            best_score = plan_objective(instance, best.outcomes(instance, explain=False))
        lawful = attribution(instance, best.outcomes(instance, explain=False)).by
        unlawful = {j.key for j in running if best.status.get(j.key) is None} - set(lawful)
        if unlawful:
            packed, score = repack(stay | unlawful)
            kept = {k for k in unlawful if packed.status.get(k) is OutcomeStatus.KEPT}
            if kept:
                stay |= kept
                best, best_score = packed, score
                changed = True
        tries = 0
        for job in candidates:
            if best.status.get(job.key) is not None or job.key in unlawful:
                continue
            if tries >= STAY_TRIES:
                return best, best_score
            tries += 1
            packed, score = repack(stay | {job.key})
            if packed.status.get(job.key) is OutcomeStatus.KEPT and score >= best_score - _noise(
                best_score
            ):
                stay.add(job.key)
                best, best_score = packed, score
                changed = True
        if not changed:
            break
    return best, best_score


def _noise(score: float) -> float:
    """What summing a plan's terms in another order may change its score by."""
    return EPS + 1e-12 * abs(score)


def realise(
    instance: PlacementInstance,
    formulation: Formulation,
    values: tuple[float, ...],
    order: int = 0,
    follow: bool = False,
) -> tuple[JobOutcome, ...]:
    """Pack the solution onto nodes and GPUs; jobs that do not pack go through greedy repair.
    `follow`: a per-node solution, whose replicas go exactly to the nodes it names (a job
    it moves back onto its own nodes stays put afterwards, where its GPUs are still free)."""
    packed = pack_solution(instance, formulation, values, order, follow)
    score = plan_objective(instance, packed.outcomes(instance, explain=False))
    packed, _ = _stay_where_possible(instance, formulation, values, packed, score, order, follow)
    return packed.outcomes(instance)


class SharedPacking(Packing):
    """A packing whose caches of eligible nodes and domains (pure functions of the instance)
    are shared with every other packing of the same instance, and filled per kind of node."""

    def __init__(self, instance: PlacementInstance, template: Packing | None = None) -> None:
        super().__init__(instance)
        if isinstance(template, SharedPacking) and template.instance is instance:
            self._eligible = template._eligible
            self._eligible_names = template._eligible_names
            self._domains = template._domains
            self._kinds: tuple[list[tuple[object, ...]], dict[tuple[object, ...], Node]] = (
                template._kinds
            )
        else:
            kind_of: list[tuple[object, ...]] = [
                (n.flavor, n.isolation, n.region, n.state, n.gpus, n.cpu_milli, n.memory_mib)
                for n in instance.nodes
            ]
            first: dict[tuple[object, ...], Node] = {}
            for kind, n in zip(kind_of, instance.nodes, strict=True):
                first.setdefault(kind, n)
            self._kinds = (kind_of, first)

    def eligible_nodes(self, job: Job, flavor: str | None) -> list[Node]:
        key = (flavor, job.isolation, job.residency, job.resources)
        nodes = self._eligible.get(key)
        if nodes is None:
            kind_of, first = self._kinds
            ok = {kind for kind, n in first.items() if node_rejection(job, n, flavor) is None}
            nodes = [n for kind, n in zip(kind_of, self.instance.nodes, strict=True) if kind in ok]
            self._eligible[key] = nodes
            self._eligible_names[key] = {n.name for n in nodes}
        return nodes


def new_packing(instance: PlacementInstance, template: Packing | None = None) -> Packing:
    """An empty packing of `instance` that shares its caches with `template`'s."""
    return SharedPacking(instance, template)


@dataclass(slots=True)
class Packed:
    """A solution packed onto nodes: what runs where, and which jobs repair placed."""

    packing: Packing
    status: dict[str, OutcomeStatus]
    notes: dict[str, str]

    def outcomes(self, instance: PlacementInstance, explain: bool = True) -> tuple[JobOutcome, ...]:
        """Every job's outcome; `explain` False leaves out the reasons (enough to score)."""
        if explain:
            return explain_outcomes(instance, self.packing, self.status, self.notes)
        out = []
        for job in instance.jobs:
            key = job.key
            now = self.status.get(key)
            was = instance.current.get(key)
            if now is not None:
                fit = self.packing.running[key]
                out.append(JobOutcome(key, now, fit.flavor, fit.replicas))
            elif was is None:
                out.append(JobOutcome(key, OutcomeStatus.PENDING))
            else:
                lost = lost_gpu_seconds(job, was, instance.now)
                out.append(JobOutcome(key, OutcomeStatus.PREEMPTED, lost_gpu_seconds=lost))
        return tuple(out)


def pack_solution(
    instance: PlacementInstance,
    formulation: Formulation,
    values: tuple[float, ...],
    order: int = 0,
    follow: bool = False,
    template: Packing | None = None,
    stay: frozenset[str] = frozenset(),
) -> Packed:
    """`realise` without the reasons: the packing and each running job's status. The
    running jobs in `stay` are kept where they are first, whatever the solution says."""
    packing = new_packing(instance, template)
    jobs = {j.key: j for j in instance.jobs}
    status: dict[str, OutcomeStatus] = {}
    notes: dict[str, str] = {}

    def commit(job: Job, fit: Fit, kept: bool) -> None:
        packing.commit(job, fit)
        if kept and not job.preemptible:
            # A non-preemptible job that stays is not charged to quota (check.py agrees).
            packing.ledger.remove(
                job.queue, fit.flavor, quota_charge(job, fit.replicas, packing.nodes)
            )

    def try_keep(job: Job, placement: Placement) -> bool:
        fit = Fit(placement.flavor, placement.replicas)
        if not can_take(packing, job, placement.replicas):
            return False
        if job.preemptible:
            amount = quota_charge(job, placement.replicas, packing.nodes)
            if packing.ledger.rejection(job.queue, placement.flavor, amount) is not None:
                return False
        commit(job, fit, kept=True)
        return True

    # 1. What stays where it is: first the jobs that are not decided (the warm start kept
    # them all together, so they fit together), then those the solution keeps.
    for key, rj in formulation.running.items():
        if rj.fixed:
            commit(rj.job, Fit(rj.placement.flavor, rj.placement.replicas), kept=True)
            status[key] = OutcomeStatus.KEPT
    for key, rj in formulation.running.items():
        jv = formulation.jobs.get(key)
        if (
            key not in status
            and jv is not None
            and (_chosen(values, jv.keep) or key in stay)
            and try_keep(rj.job, rj.placement)
        ):
            status[key] = OutcomeStatus.KEPT

    # 2. What is placed anew, biggest and most constrained first.
    chosen = [
        jv
        for key, jv in formulation.jobs.items()
        if key not in status and _chosen(values, jv.place)
    ]
    chosen.sort(key=lambda jv: PACKING_ORDERS[order](jv, _replicas(jv, values)))
    for jv in chosen:
        job = jv.job
        placement = instance.current.get(job.key)
        if follow:
            fit = _follow_job(packing, formulation, jv, values)
            if fit is not None and _quota_ok(packing, job, fit):
                commit(job, fit, kept=False)
                status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED
            continue
        if (
            placement is not None
            and len(placement.replicas) == _replicas(jv, values)
            and _in_chosen_domain(instance, jv, values, placement)
            and _on_chosen_classes(formulation, jv, values, placement)
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT  # asked to move, but its place is still free
            continue
        fit = _realise_job(packing, formulation, jv, values)
        if fit is not None and _quota_ok(packing, job, fit):
            commit(job, fit, kept=False)
            status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED

    if follow:
        # A job the solution moved onto the nodes it runs on stays where it is, if it can.
        for key, st in list(status.items()):
            placement = instance.current.get(key)
            if st is not OutcomeStatus.MOVED or placement is None:
                continue
            fit = packing.running[key]
            if sorted(r.node for r in fit.replicas) != sorted(r.node for r in placement.replicas):
                continue
            job = jobs[key]
            packing.release(job)
            if keep_problem(instance, job, placement) is None and try_keep(job, placement):
                status[key] = OutcomeStatus.KEPT
            else:
                commit(job, fit, kept=False)

    # 3. Repair: whatever the model admitted but did not pack, and anything that still fits;
    # a running job the model could only keep or stop (an incremental solve gives it no
    # column to move) stays where it is or stops, as the model allowed, never moves; nor
    # does one past the Policy's maxMovesPerSolve (moves.py).
    made = sum(
        1
        for key, st in status.items()
        if st is OutcomeStatus.MOVED
        and keep_problem(instance, jobs[key], instance.current[key]) is None
    )
    # A waiting job that finds no room leaves the packing as it was: the next of its shape
    # finds none either while nothing is committed (a backlog of hundreds, a few looks).
    misses: dict[tuple[object, ...], int] = {}
    for job in priority_order(j for j in instance.jobs if j.key not in status):
        placement = instance.current.get(job.key)
        shape = claim_shape(job) if placement is None else None
        if shape is not None and misses.get(shape) == packing.version:
            continue
        if (
            placement is not None
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT
            continue
        jv = formulation.jobs.get(job.key)
        if placement is not None and job.preemptible and jv is not None and jv.place < 0:
            continue
        voluntary = placement is not None and keep_problem(instance, job, placement) is None
        if voluntary and not voluntary_moves_left(instance, made):
            continue
        result = packing.find(job)
        if isinstance(result, Fit):
            made += int(voluntary)
            commit(job, result, kept=False)
            status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED
            notes[job.key] = "placed by repair after the solve"
        elif shape is not None:
            misses[shape] = packing.version

    return Packed(packing, status, notes)


def _in_chosen_domain(
    instance: PlacementInstance, jv: JobVars, values: tuple[float, ...], placement: Placement
) -> bool:
    """Whether a running job's current nodes lie in the domain the model chose for it."""
    domain = next((d for (_, d), c in jv.domain.items() if _chosen(values, c)), None)
    if domain is None or jv.level is None:
        return True
    nodes = {n.name: n for n in instance.nodes}
    return all(
        r.node in nodes and nodes[r.node].domain(jv.level) == domain for r in placement.replicas
    )


def _on_chosen_classes(
    formulation: Formulation, jv: JobVars, values: tuple[float, ...], placement: Placement
) -> bool:
    """Whether a running job's replicas lie on the node classes the model counted them on
    (then keeping it where it is uses what the model gave it; elsewhere it takes room the
    model gave to others)."""
    fine: dict[int, int] = defaultdict(int)
    coarse: dict[int, int] = defaultdict(int)
    for r in placement.replicas:
        cid = formulation.node_class.get(r.node)
        if cid is None:
            return False
        fine[cid] += 1
        coarse[formulation.classes[cid].coarse] += 1
    singles = [slot for slot, c in jv.single.items() if _chosen(values, c)]
    if singles:
        nodes = {r.node for r in placement.replicas}
        slot = singles[0]
        if len(nodes) != 1:
            return False
        cid = formulation.node_class[next(iter(nodes))]
        return slot == cid if slot >= 0 else -1 - slot == formulation.classes[cid].coarse
    whole_domain = set(jv.domain.values())
    want_fine = {
        cid: (jv.job.replicas if c in whole_domain else round(values[c]))
        for cid, c in jv.per_class.items()
        if values[c] > 0.5
    }
    want_coarse = {kid: round(values[c]) for kid, c in jv.per_coarse.items() if values[c] > 0.5}
    if want_coarse:
        return dict(coarse) == want_coarse and not want_fine
    if want_fine:
        return dict(fine) == want_fine
    return True  # a spread preferred gang: anywhere


def _replicas(jv: JobVars, values: tuple[float, ...]) -> int:
    if jv.replicas >= 0:
        return round(values[jv.replicas])
    return jv.job.replicas


def can_take(packing: Packing, job: Job, replicas: tuple[ReplicaPlacement, ...]) -> bool:
    if len({r.node for r in replicas}) == len(replicas):
        # One replica per node: each node on its own.
        for replica in replicas:
            free = packing.free.get(replica.node)
            if free is None or not free.can_take(replica, job.resources, job):
                return False
        return True
    taken: list[ReplicaPlacement] = []
    ok = True
    for replica in replicas:
        free = packing.free.get(replica.node)
        if free is None or not free.can_take(replica, job.resources, job):
            ok = False
            break
        free.take(replica, job.resources, job)
        taken.append(replica)
    for replica in taken:
        packing.free[replica.node].give(replica, job.resources, job)
    return ok


def _chosen_flavor(jv: JobVars, values: tuple[float, ...]) -> tuple[str | None] | None:
    """The flavor the solution gives the job, as a 1-tuple (its flavor may be None: any);
    None when the job must have one and the solution chose none."""
    flavor = next((f for f, c in jv.flavor.items() if _chosen(values, c)), None)
    if flavor is None and jv.flavor and None not in jv.flavor:
        return None
    return (flavor,)


def _follow_job(
    packing: Packing, formulation: Formulation, jv: JobVars, values: tuple[float, ...]
) -> Fit | None:
    """The replicas of a per-node solution, on exactly the nodes it names."""
    job = jv.job
    picked = _chosen_flavor(jv, values)
    if picked is None:
        return None
    (flavor,) = picked
    whole_domain = set(jv.domain.values())
    counts: list[tuple[Node, int]] = []
    for cid, c in jv.per_class.items():
        if values[c] > 0.5:
            n = jv.job.replicas if c in whole_domain else round(values[c])
            counts.extend((node, n) for node in formulation.classes[cid].nodes[:1])
    for slot, c in jv.single.items():
        if _chosen(values, c) and slot >= 0:
            size = job.replicas
            if slot in jv.single_replicas:
                size = round(values[jv.single_replicas[slot]])
            counts.append((formulation.classes[slot].nodes[0], size))
    if sum(n for _, n in counts) != _replicas(jv, values) or any(
        len(formulation.classes[formulation.node_class[node.name]].nodes) != 1 for node, _ in counts
    ):
        return None
    rooms = packing.rooms(job, flavor, packing.eligible_nodes(job, flavor))
    gang = gang_topology(job)
    if gang.slice_size > 1:
        # Slices: the same nodes, in an order that keeps each slice in one domain.
        allocation = compact_allocation(
            packing.tree,
            {node.name: n for node, n in counts},
            sum(n for _, n in counts),
            packing.fullness,
            gang.limit,
            gang.slice_size,
            gang.slice_level,
        )
        if allocation is None:
            return None
        counts = [(packing.nodes[name], n) for name, n in allocation]
    replicas: list[ReplicaPlacement] = []
    for node, n in counts:
        fit = packing.pack(job, flavor, [node], n, rooms)
        if fit is None:
            return None
        replicas.extend(fit.replicas)
    return Fit(flavor, tuple(replicas))


def _quota_ok(packing: Packing, job: Job, fit: Fit) -> bool:
    amount = quota_charge(job, fit.replicas, packing.nodes)
    return packing.ledger.rejection(job.queue, fit.flavor, amount) is None


def _realise_job(
    packing: Packing, formulation: Formulation, jv: JobVars, values: tuple[float, ...]
) -> Fit | None:
    """Nodes and GPUs for a job the model places: in its domain, on its classes."""
    job = jv.job
    picked = _chosen_flavor(jv, values)
    if picked is None:
        return None
    (flavor,) = picked
    count = _replicas(jv, values)
    if count <= 0:
        return None
    eligible = packing.eligible_nodes(job, flavor)
    rooms = packing.rooms(job, flavor, eligible)
    level = jv.level
    allowed: list[Node] = eligible
    gang = gang_topology(job)
    if level is not None:
        domain = next((d for (_, d), c in jv.domain.items() if _chosen(values, c)), None)
        single = next((slot for slot, c in jv.single.items() if _chosen(values, c)), None)
        if domain is not None:
            allowed = packing.domains(job, flavor, level).get(domain, [])
            if gang.slice_size > 1:
                return _realise_slices(
                    packing, formulation, jv, values, flavor, allowed, count, rooms
                )
        elif single is not None:
            if single in jv.single_replicas:
                count = round(values[jv.single_replicas[single]])
            cls = formulation.classes[single] if single >= 0 else formulation.coarse[-1 - single]
            hosts = [n for n in cls.nodes if rooms.get(n.name, 0) >= count]
            if not hosts:
                hosts = [n for n in eligible if rooms.get(n.name, 0) >= count]
            if not hosts:
                return None
            best = min(
                hosts,
                key=lambda n: (
                    packing.free[n.name].free_gpu_milli,
                    packing.free[n.name].cpu_free,
                    n.name,
                ),
            )
            return packing.pack(job, flavor, [best], count, rooms)
        elif _chosen(values, jv.spread):
            if gang.slice_size > 1:
                return _realise_slices(
                    packing, formulation, jv, values, flavor, allowed, count, rooms
                )
            # A preferred domain given up: still try one domain first, as greedy does.
            for nodes in sorted(
                packing.domains(job, flavor, level).values(),
                key=lambda ns: sum(packing.free[n.name].free_gpu_milli for n in ns),
            ):
                fit = packing.pack(job, flavor, nodes, count, rooms)
                if fit is not None:
                    return fit
        else:
            return None
    # Replicas per class, as the model counted them; else best fit over the allowed nodes.
    whole_domain = set(jv.domain.values())
    per_class = [
        (cid, count if c in whole_domain else round(values[c]))
        for cid, c in jv.per_class.items()
        if values[c] > 0.5
    ]
    per_coarse = [(kid, round(values[c])) for kid, c in jv.per_coarse.items() if values[c] > 0.5]
    groups = [(formulation.classes[cid].nodes, n) for cid, n in per_class]
    if per_coarse:
        groups = [(formulation.coarse[kid].nodes, n) for kid, n in per_coarse] + groups
    if groups:
        inside = {n.name for n in allowed}
        replicas: list[ReplicaPlacement] = []
        for group, n in sorted(groups, key=lambda t: -t[1]):
            nodes = [m for m in group if m.name in inside]
            fit = _pack_group(packing, job, flavor, nodes, n, rooms)
            if fit is None:
                replicas = []
                break
            replicas.extend(fit.replicas)
        if len(replicas) == count:
            return Fit(flavor, tuple(replicas))
    return _pack_group(packing, job, flavor, allowed, count, rooms)


def _pack_group(
    packing: Packing,
    job: Job,
    flavor: str | None,
    nodes: list[Node],
    count: int,
    rooms: dict[str, int],
) -> Fit | None:
    """`count` replicas on `nodes` (the class the model counted them on): as tightly as the
    tree allows (topology.compact_allocation) for a gang, else best fit."""
    if gang_topology(job).compact and count > 1:
        names = {m.name for m in nodes}
        allocation = compact_allocation(
            packing.tree, {n: k for n, k in rooms.items() if n in names}, count, packing.fullness
        )
        if allocation is not None:
            return packing.pack_allocation(job, flavor, allocation)
    return _pack_sparing(packing, job, flavor, nodes, count, rooms)


def _realise_slices(
    packing: Packing,
    formulation: Formulation,
    jv: JobVars,
    values: tuple[float, ...],
    flavor: str | None,
    allowed: list[Node],
    count: int,
    rooms: dict[str, int],
) -> Fit | None:
    """A sliced gang as a whole (each slice in one domain of its slice level), as tightly
    as the tree allows, on the classes the model gave it if they hold it so, else
    anywhere in its domain."""
    job = jv.job
    gang = gang_topology(job)
    inside = {n.name for n in allowed}
    chosen: set[str] = set()
    for cid, c in jv.per_class.items():
        if values[c] > 0.5:
            chosen.update(n.name for n in formulation.classes[cid].nodes)
    for kid, c in jv.per_coarse.items():
        if values[c] > 0.5:
            chosen.update(n.name for n in formulation.coarse[kid].nodes)
    for names in (chosen & inside, inside):
        if not names:
            continue
        allocation = compact_allocation(
            packing.tree,
            {n: k for n, k in rooms.items() if n in names},
            count,
            packing.fullness,
            gang.limit,
            gang.slice_size,
            gang.slice_level,
        )
        if allocation is not None:
            return packing.pack_allocation(job, flavor, allocation)
    return None


def _pack_sparing(
    packing: Packing,
    job: Job,
    flavor: str | None,
    nodes: list[Node],
    count: int,
    rooms: dict[str, int],
) -> Fit | None:
    """Best fit, but a share goes first where a GPU is already shared, so that the whole
    GPUs the model counted for whole-GPU replicas stay whole."""
    r = job.resources
    if r.fractional:
        shared = [
            n
            for n in nodes
            if n.name in rooms
            and any(r.gpu_milli <= g < GPU_MILLI for g in packing.free[n.name].gpu_free)
        ]
        if shared:
            fit = packing.pack(job, flavor, shared, count, rooms)
            if fit is not None:
                return fit
    return packing.pack(job, flavor, nodes, count, rooms)
