"""The placement MILP's formulation, built from typed inputs: one formulation for admission,
flavors, gangs, topology, quotas, preemption, moves, fairness and fragmentation.

It counts replicas per node class (`classes.py`), with what the running jobs that may stay
block counted exactly (`kept.py`); `realise.py` packs the chosen counts onto nodes and GPUs. Large instances also aggregate jobs without topology onto coarse classes
that ignore domains, and prune the domains a gang may choose. With one node per class
(`per_node`) a solution packs as counted.

Rows and columns are named `rule__job__where` so a binding row can be read back. Columns
whose value follows from others (`Formulation.aux`) take it from `aux_value`, the one rule
the warm start and the neighbourhood searches share.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gitsched.engine.model import NODE_LEVEL, Isolation, Job, TopologyMode
from gitsched.engine.placement.classes import (
    ClassRows,
    NodeClass,
    Terms,
    add_replicas,
    emit_class_rows,
    hold_nodes,
    node_classes,
    topology_levels,
)
from gitsched.engine.placement.constraints import eligible_flavors, node_rejection, quota_charge
from gitsched.engine.placement.kept import KeptBlocking
from gitsched.engine.placement.linear import INF, LinearModel
from gitsched.engine.placement.objective import (
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
    wait_order_bonus,
    weights,
)
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.preemption import Rights, over_limits
from gitsched.engine.placement.running import RunningJob, running_jobs
from gitsched.engine.placement.spread import Cell, cells, has_spread, spread_levels
from gitsched.engine.placement.topology import span_of
from gitsched.engine.units import gpus_from_milli, milli_from_gpus


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
class Formulation:
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
    move_cap: bool = False  # a `move_cap` row limits the moves (Policy maxMovesPerSolve)


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


def aux_value(
    kind: str,
    terms: Terms,
    const: float,
    param: float,
    values: Sequence[float],
    floor: float,
) -> float:
    """The value an auxiliary column takes, given the values of its terms' columns (`floor`:
    its lower bound)."""
    used = const + sum(values[c] * v for c, v in terms)
    if kind == "excess":
        return max(0.0, used - param)
    if kind == "min":
        return max(0.0, min(param, used))
    if kind == "short":
        return max(0.0, param - used)
    if kind == "touched":
        return max(floor, float(math.ceil(used / param - 1e-9)))
    if kind == "over":
        return 1.0 if used > param + 1e-9 else 0.0
    assert kind == "max", kind
    return max((values[c] for c, _ in terms), default=0.0)


def _current_free(instance: PlacementInstance) -> dict[str, int]:
    """Free milli-GPU on each node with everything that runs now still running."""
    free = {n.name: milli_from_gpus(n.gpus) for n in instance.nodes}
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
    """Builds the formulation column by column; the warm start is mapped onto it afterwards."""

    def __init__(
        self, instance: PlacementInstance, warm: PlacementPlan, options: BuildOptions
    ) -> None:
        self.instance = instance
        self.policy = instance.policy
        self.options = options
        self.lp = LinearModel()
        self.running = running_jobs(
            instance, warm, options.keep_all, options.movable, options.unkeepable
        )
        self.tree = instance_tree(instance)
        self.levels = topology_levels(
            instance.jobs, self.tree if options.small and options.compactness else None
        )
        self._class_domains: dict[tuple[int, bool, int], tuple[str, ...] | None] = {}
        self.spread = spread_levels(instance.jobs)
        self.classes, self.coarse, self.node_class, self.residual = node_classes(
            instance, self.running, self.levels, options.small, options.per_node, self.spread
        )
        self.queues = {q.name: q for q in instance.queues}
        self.fine_rows: dict[int, ClassRows] = defaultdict(ClassRows)
        self.coarse_rows: dict[int, ClassRows] = defaultdict(ClassRows)
        self.quota_terms: dict[tuple[str, str], Terms] = defaultdict(list)
        self.quota_const: dict[tuple[str, str], float] = defaultdict(float)
        self.node_of = {n.name: n for n in self.instance.nodes}
        # What non-preemptible jobs hold per queue and flavor, and whether one is placed anew.
        self.fixed_terms: dict[tuple[str, str], Terms] = defaultdict(list)
        self.fixed_const: dict[tuple[str, str], float] = defaultdict(float)
        self.usage_terms: dict[tuple[str, str], Terms] = defaultdict(list)
        self.usage_const: dict[tuple[str, str], float] = defaultdict(float)
        self.by_flavor: dict[str | None, list[NodeClass]] = defaultdict(list)
        for cls in self.classes:
            self.by_flavor[cls.flavor].append(cls)
        self.warm = {o.job: o for o in warm.outcomes}
        self.current_free = _current_free(instance)
        self.formulation = Formulation(
            self.lp, self.classes, self.coarse, {}, self.running, self.node_class, options.small, []
        )
        self.aux = self.formulation.aux
        self.kept = KeptBlocking(self.lp, self.aux, self.residual)
        self.rights = Rights(instance)
        self.own_claims: dict[tuple[str, str], list[Terms]] = defaultdict(list)
        self.weights = weights(instance)
        # Usage per queue, flavor and priority (GPUs): what fills nominal quota, in order.
        self.rank_terms: dict[tuple[str, str, int], Terms] = defaultdict(list)
        self.rank_const: dict[tuple[str, str, int], float] = defaultdict(float)
        self._domain_free: dict[tuple[object, ...], int] = {}
        # The moves of running jobs that may stay: at most maxMovesPerSolve of them.
        self.voluntary_moves: Terms = []
        self._candidates: dict[
            tuple[object, ...], dict[str | None, list[tuple[NodeClass, int]]]
        ] = {}

    # -- bookkeeping ----------------------------------------------------------------------
    def charge(
        self,
        job: Job,
        flavor: str | None,
        col: int | None,
        replicas: float,
        quota_gpus: float | None = None,
        quota: bool = True,
    ) -> None:
        """Quota (GPUs per queue and flavor) and fair-share usage of replicas of `job`;
        `quota_gpus`: what the replicas cost the quota, when not their GPUs (a dedicated
        job is charged the nodes it holds: constraints.quota_charge). Level 1 of the
        objective counts the GPUs the replicas use (objective.py); without `quota` only
        that is counted here."""
        r = job.resources
        if flavor is not None and r.gpu_milli:
            used = gpus_from_milli(replicas * r.gpu_milli)
            ranked = (job.queue, flavor, job.priority)
            if col is None:
                self.rank_const[ranked] += used
            else:
                self.rank_terms[ranked].append((col, used))
            if quota:
                self.charge_quota(job, flavor, col, used if quota_gpus is None else quota_gpus)
        for res, amount in (("gpu", r.gpu_milli), ("cpu", r.cpu_milli), ("memory", r.memory_mib)):
            if amount:
                if col is None:
                    self.usage_const[(job.queue, res)] += replicas * amount
                else:
                    self.usage_terms[(job.queue, res)].append((col, replicas * amount))

    def charge_quota(self, job: Job, flavor: str, col: int | None, gpus: float) -> None:
        """`gpus` of the job's queue's quota of `flavor` (per unit of `col`, or fixed)."""
        if not gpus:
            return
        if not job.preemptible:
            if col is None:
                self.fixed_const[(job.queue, flavor)] += gpus
            else:
                self.fixed_terms[(job.queue, flavor)].append((col, gpus))
        key = (job.queue, flavor)
        if col is None:
            self.quota_const[key] += gpus
        else:
            self.quota_terms[key].append((col, gpus))

    def hold_fixed(self, job: Job, flavor: str, col: int | None, gpus: float) -> None:
        """What a kept non-preemptible job (not charged to quota) holds (`no_borrow` rows)."""
        if col is None:
            self.fixed_const[(job.queue, flavor)] += gpus
        else:
            self.fixed_terms[(job.queue, flavor)].append((col, gpus))

    def add_no_borrow(self) -> None:
        """A non-preemptible job does not borrow: a queue's non-preemptible jobs together
        hold at most its nominal quota of a flavor (preemption.non_preemptible_fits), so
        whatever it borrows can be reclaimed."""
        for key in sorted(self.fixed_terms):
            name, flavor = key
            queue = self.queues.get(name)
            fq = queue.quota(flavor) if queue is not None else None
            nominal = gpus_from_milli(fq.nominal) if fq is not None else 0.0
            self.lp.row(
                f"no_borrow__{name}__{flavor}",
                self.fixed_terms[key],
                upper=nominal - self.fixed_const[key],
            )

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
            held = gpus_from_milli(quota_charge(job, rj.placement.replicas, self.node_of))
            if rj.fixed:
                if exempt and rj.placement.flavor is not None and job.resources.gpu_milli:
                    self.hold_fixed(job, rj.placement.flavor, None, held)
                self.charge(job, None if exempt else rj.placement.flavor, None, count, held)
                self.lp.offset += self.weights.value(job, count) - spread_cost
                continue
            jv = JobVars(job)
            self.formulation.jobs[key] = jv
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
                        dedicated = job.isolation is Isolation.DEDICATED
                        add_replicas(rows, job.resources, jv.keep, len(nodes), False, dedicated)
                        if dedicated:
                            hold_nodes(rows, job.resources, jv.keep, float(len(set(nodes))))
                whole_on: dict[str, int] = defaultdict(int)
                for replica in rj.placement.replicas:
                    if job.resources.fractional and replica.node in self.residual:
                        for g in replica.gpus:
                            self.kept.share_milli[(replica.node, g)].append(
                                (jv.keep, float(replica.gpu_milli))
                            )
                            self.kept.jobs_on_node[replica.node].add(jv.keep)
                    blocked = self.kept.blocked_gpus(replica)
                    if not blocked:
                        continue
                    if job.resources.fractional:
                        # A kept share takes a GPU that whole-GPU replicas could have had.
                        for g in replica.gpus:
                            self.kept.shares[(replica.node, g)].append((jv.keep, 1.0))
                            self.kept.jobs_on_node[replica.node].add(jv.keep)
                    else:
                        whole_on[replica.node] += round(blocked)
                for node_name, gpus in whole_on.items():
                    self.kept.on_node[node_name].append((jv.keep, float(gpus)))
                    self.kept.jobs_on_node[node_name].add(jv.keep)
                self.charge(job, None if exempt else rj.placement.flavor, jv.keep, count, held)
                if exempt and rj.placement.flavor is not None and job.resources.gpu_milli:
                    self.hold_fixed(job, rj.placement.flavor, jv.keep, held)
            outcome = self.warm.get(key)
            moved_by_warm = outcome is not None and outcome.status is OutcomeStatus.MOVED
            may_move = self.options.moves and self.policy.max_moves_per_solve != 0
            if (job.preemptible and may_move) or not rj.keepable or moved_by_warm:
                self.add_placement(jv, stop_cost - move_penalty(job, lost, self.policy))
                if rj.keepable and jv.place >= 0:
                    self.voluntary_moves.append((jv.place, 1.0))
            parts = [(c, 1.0) for c in (jv.keep, jv.place) if c >= 0]
            self._own_claim(job, rj.placement.flavor, parts)
            if parts:
                if len(parts) > 1:
                    self.lp.row(f"run_once__{key}", parts, upper=1)
                # Nobody may claim its place: it runs on (when the warm start shows it can).
                runs_in_warm = outcome is not None and outcome.running
                if runs_in_warm and not self.rights.anyone_may(job):
                    self.lp.row(f"protected__{key}", parts, lower=1, upper=1)

    def add_move_cap(self) -> None:
        """The Policy's maxMovesPerSolve: of the running jobs that may stay where they are,
        at most that many move (moves.py has the rule that every move needs a reason; a
        job whose place is gone is not counted)."""
        cap = self.policy.max_moves_per_solve
        if cap is not None and len(self.voluntary_moves) > cap:
            self.lp.row("move_cap", self.voluntary_moves, upper=float(cap))
            self.formulation.move_cap = True

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
            nominal = gpus_from_milli(fq.nominal)
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
        # A replica's worth, and (a waiting job) its place in wait order (objective.py).
        value = self.weights.value(job, 1) + wait_order_bonus(self.instance, job, 1)
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
        # (a service's spread counts replicas per domain: never on coarse classes)
        use_coarse = not self.options.small and (level is None or preferred) and not has_spread(job)
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
                    add_replicas(
                        rows, r, e.col, e.mult, not e.single, job.isolation is Isolation.DEDICATED
                    )
                if job.isolation is Isolation.DEDICATED and flavor is not None:
                    # Charged the nodes it holds, not its replicas' GPUs (quota_charge).
                    holds = self._dedicated(jv, e)
                    self.charge(job, flavor, e.col, e.mult, quota=False)
                    self.charge_quota(job, flavor, holds, float(e.cls.node_gpus))
                else:
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
            self.formulation.pruned.append(key)
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
            self.formulation.escapes.append(e)
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
                self.formulation.escapes.append(x)
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

    def _dedicated(self, jv: JobVars, e: Entry) -> int:
        """An isolated job holds whole nodes: h nodes of the class, and fits in them (the
        column h)."""
        lp = self.lp
        cls = e.cls
        job = jv.job
        r = job.resources
        h = lp.var(f"holds__{job.key}__{cls.name}", 0, cls.count)
        jv.holds[-1 - cls.id if e.coarse else cls.id] = h
        for rows in self.rows_of(e):
            hold_nodes(rows, r, h, 1.0)
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
        return h

    # -- quota, fairness ------------------------------------------------------------------
    def add_spread(self) -> None:
        """At most maxPerDomain replicas of a service in each domain of a spread's level
        (engine/placement/spread.py): replicas that stay put count as constants, kept ones
        by their keep column, ones placed anew by their class columns."""
        terms: dict[Cell, Terms] = defaultdict(list)
        const: dict[Cell, float] = defaultdict(float)
        rules: dict[Cell, int] = {}
        for rj in self.running.values():
            job = rj.job
            if not has_spread(job):
                continue
            jv = self.formulation.jobs.get(job.key)
            for replica in rj.placement.replicas:
                node = self.node_of.get(replica.node)
                if node is None:
                    continue
                for cell, rule in cells(job, node):
                    rules[cell] = rule.max_per_domain
                    if rj.fixed:
                        const[cell] += 1.0
                    elif jv is not None and jv.keep >= 0:
                        terms[cell].append((jv.keep, 1.0))
        for jv in self.formulation.jobs.values():
            job = jv.job
            if not has_spread(job):
                continue
            for cid, col in jv.per_class.items():
                for cell, rule in cells(job, self.classes[cid].nodes[0]):
                    rules[cell] = rule.max_per_domain
                    terms[cell].append((col, 1.0))
        for cell in sorted(terms):
            service, level, domain = cell
            self.lp.row(
                f"spread__{service}__{level}__{domain}",
                terms[cell],
                upper=max(0.0, rules[cell] - const[cell]),
            )

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
            nominal = gpus_from_milli(fq.nominal)
            if queue.cohort is None:
                lp.row(f"quota__{tag}", terms, upper=nominal - const)
            else:
                if fq.ceiling is not None:
                    lp.row(f"quota__{tag}", terms, upper=gpus_from_milli(fq.ceiling) - const)
                guaranteed = gpus_from_milli(fq.guaranteed)
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
                gpus_from_milli(fq.nominal - fq.guaranteed)
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
            self.formulation.nominal[b] = (queue_name, flavor, priority)

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

    def build(self) -> Formulation:
        self.add_running()
        for job in self.instance.jobs:
            if job.key in self.running:
                continue
            jv = JobVars(job)
            self.add_placement(jv, 0.0)
            if jv.place >= 0:
                self.formulation.jobs[job.key] = jv
        fine = [(self.classes[cid], rows) for cid, rows in self.fine_rows.items() if rows.fresh]
        coarse = [(self.coarse[kid], rows) for kid, rows in self.coarse_rows.items() if rows.fresh]
        if self.options.small:
            coarse = []
        for cls, rows in fine + coarse:
            self.kept.slot_rows(cls, rows)
            self.kept.share_gpu_rows(cls, rows)
            self.kept.share_slot_rows(cls, rows)
        frag = self.policy.fragmentation_weight
        for cls, rows in fine:
            emit_class_rows(self.lp, cls, rows, frag if self.options.small else 0.0, self.aux)
        for cls, rows in coarse:
            emit_class_rows(self.lp, cls, rows, frag, self.aux)
        if self.spread:
            self.add_spread()
        self.add_quota()
        self.add_never_borrow()
        self.add_no_borrow()
        self.add_move_cap()
        if self.policy.fairness_weight:
            self.add_fairness()
        return self.formulation


def build(instance: PlacementInstance, warm: PlacementPlan, options: BuildOptions) -> Formulation:
    return Builder(instance, warm, options).build()


def job_columns(jv: JobVars) -> list[int]:
    """Every column that belongs to one job."""
    cols = [jv.place, jv.keep, jv.replicas, jv.spread]
    for group in (jv.per_class, jv.per_coarse, jv.domain, jv.single, jv.single_replicas, jv.holds):
        cols.extend(group.values())
    cols.extend(c for c in jv.flavor.values())
    return [c for c in cols if c >= 0]
