"""The MILP placer: the greedy plan as warm start and fallback, the model of `model.py`
solved by HiGHS or CBC, its counts packed onto nodes and GPUs, and every job that
does not run told why.

The plan it returns is never worse than the greedy plan on the shared objective
and always passes `check.py`: a solve that cannot beat or equal greedy (time out
with nothing better, a packing that loses too much) returns the greedy plan, with
the solve's bound still recorded.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from engine.model import Job, Node, Placement, ReplicaPlacement
from engine.placement.check import check_plan
from engine.placement.greedy import Fit, GreedyPlacer, Miss, Packing, priority_order
from engine.placement.linear import LinearModel, LinearSolution, SolveLimits, solve
from engine.placement.model import (
    BuildOptions,
    JobVars,
    PlacementModel,
    PreemptionRights,
    build,
    job_columns,
    keep_problem,
    warm_values,
)
from engine.placement.objective import (
    broken_soft_constraints,
    lost_gpu_seconds,
    plan_objective,
)
from engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)

# Instances up to this size get the node-exact model (every node that runs a movable
# job is its own class, every job gets per-class columns, no domain is pruned).
SMALL_NODES = 24
SMALL_JOBS = 80
# Models up to this many columns are solved outright; larger ones relax, then fix.
DIRECT_COLUMNS = 6000
INTEGRAL = 1e-6
EPS = 1e-6
RESERVE_S = 2.0  # kept back from the time limit for packing and explaining the plan


@dataclass(frozen=True, slots=True)
class SolveReport:
    """What the placer did, beyond the plan (for benchmarks and tests)."""

    greedy_objective: float
    model_objective: float | None
    bound: float | None
    fell_back: bool
    warm_started: bool
    small: bool
    pruned: int
    phases: tuple[tuple[str, float], ...] = ()  # seconds per phase
    fixed_jobs: int = 0  # jobs the relax-and-fix step fixed where the LP put them
    free_jobs: int = 0
    problems: tuple[str, ...] = ()  # what check.py found in the MILP's own plan (then: greedy)
    model_bound: float | None = None  # the solve's bound, before the plan's score is folded in
    milp_objective: float | None = None  # the MILP's own plan's score, fallback or not


class MilpPlacer:
    """Placement by MILP. `mode`: "full" re-decides every movable running job;
    "incremental" keeps every running job the greedy plan keeps and decides the rest."""

    def __init__(self, backend: str, mode: str = "full") -> None:
        self.backend = backend
        self.name = backend
        self.mode = mode
        self.last_report: SolveReport | None = None

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        self._start()
        greedy = GreedyPlacer().solve(instance)
        self._mark("greedy")
        schedulable = sum(1 for n in instance.nodes if n.schedulable)
        small = schedulable <= SMALL_NODES and len(instance.jobs) <= SMALL_JOBS
        options = BuildOptions(small=small, keep_all=self.mode == "incremental")
        return self._solve(instance, instance, greedy, options, {})

    def solve_incremental(
        self, instance: PlacementInstance, changed: Collection[str]
    ) -> PlacementPlan:
        """A re-solve after a small change: the `changed` jobs (new or edited) and running jobs
        whose place went away are free; every other running job stays unless a changed job
        may preempt it (then it stays or stops, it never moves); every other waiting job
        waits on, for the reason the last solve gave."""
        self._start()
        jobs = {j.key: j for j in instance.jobs}
        nodes = {n.name: n for n in instance.nodes}
        running = {k: p for k, p in instance.current.items() if k in jobs}
        affected = {k for k, p in running.items() if keep_problem(instance, jobs[k], p, nodes)}
        free = (set(changed) & jobs.keys()) | affected
        sub = replace(
            instance,
            jobs=tuple(j for j in instance.jobs if j.key in running or j.key in free),
            current=running,
        )
        greedy_sub = GreedyPlacer().solve(sub)
        waiting = tuple(
            JobOutcome(
                j.key,
                OutcomeStatus.PENDING,
                reason="waits as at the last solve (an incremental solve changes only what changed)",
                constraint=f"incremental__{j.key}",
            )
            for j in instance.jobs
            if j.key not in running and j.key not in free
        )
        greedy = replace(
            greedy_sub,
            outcomes=greedy_sub.outcomes + waiting,
            stats=replace(
                greedy_sub.stats, objective=plan_objective(instance, greedy_sub.outcomes + waiting)
            ),
        )
        self._mark("greedy")
        rights = PreemptionRights(sub)
        free_jobs = [jobs[k] for k in free]
        movable = frozenset(
            k for k in running if any(rights.may(other, jobs[k]) for other in free_jobs)
        )
        options = BuildOptions(small=False, keep_all=True, movable=movable, moves=False)
        return self._solve(instance, sub, greedy, options, {"waiting": waiting})

    def _start(self) -> None:
        self._started = time.perf_counter()
        self._phases: list[tuple[str, float]] = []
        self._split = self._started
        self._rens = (0, 0)

    def _solve(
        self,
        instance: PlacementInstance,
        sub: PlacementInstance,
        greedy: PlacementPlan,
        options: BuildOptions,
        extra: dict[str, tuple[JobOutcome, ...]],
    ) -> PlacementPlan:
        """Build, warm-start, solve and pack `sub` (the whole instance, or the part an
        incremental solve decides); the plan covers all of `instance`."""
        started = self._started
        policy = instance.policy
        waiting = extra.get("waiting", ())
        waits = {o.job for o in waiting}
        greedy_sub = replace(
            greedy, outcomes=tuple(o for o in greedy.outcomes if o.job not in waits)
        )
        model = build(sub, greedy_sub, options)
        self._mark("build")
        warm = warm_values(model, sub, greedy_sub)
        if warm is not None and model.lp.violations(warm):
            warm = None
        self._mark("warm start")
        lp = model.lp
        upper = list(lp.col_upper)
        for col in model.escapes:
            upper[col] = 0.0
        closed = lp.with_bounds(lp.col_lower, upper) if model.escapes else lp

        def left() -> float:
            return max(0.2, policy.time_limit_s - (time.perf_counter() - started))

        if lp.num_cols <= DIRECT_COLUMNS and not model.escapes:
            # Small enough to solve outright: its MIP bound is the bound.
            solution = solve(closed, self.backend, SolveLimits(left(), policy.gap_tolerance), warm)
            bound = solution.bound
            if warm is not None and (
                solution.objective is None or closed.objective(warm) > solution.objective + EPS
            ):
                # A solver may stop within its gap below the start it was given: keep the start.
                solution = replace(self._warm_only(model, warm, solution.status), bound=bound)
        else:
            solution, bound = self._relax_and_fix(model, closed, warm, left, policy.gap_tolerance)
        self._mark("solve")
        outcomes: tuple[JobOutcome, ...] | None = None
        if solution.values is not None:
            outcomes = best_realisation(sub, model, solution.values) + waiting
        self._mark("realise")
        if bound is not None and waiting:
            # The bound is the sub-problem's; the waiting jobs add what they add to the score.
            plan = outcomes or greedy.outcomes
            bound += plan_objective(instance, plan) - plan_objective(
                sub, tuple(o for o in plan if o.job not in waits)
            )
        return self._finish(
            instance, greedy, model, solution, outcomes, bound, warm is not None, started
        )

    def _relax_and_fix(
        self,
        model: PlacementModel,
        closed: LinearModel,
        warm: list[float] | None,
        left: Callable[[], float],
        gap: float,
    ) -> tuple[LinearSolution, float | None]:
        """LP relaxation (every domain open: the bound); then the MIP over the jobs the LP left
        fractional, every other job fixed where the LP put it (RENS); then, while time and gap
        allow, the MIP over the jobs where the LP and the best plan disagree (RINS)."""
        relaxed = solve(model.lp, self.backend, SolveLimits(left(), 0.0, relax=True))
        self._mark("relaxation")
        bound = relaxed.bound
        if relaxed.values is None:
            return self._warm_only(model, warm, "error"), bound
        lp_values = relaxed.values
        best = self._warm_only(model, warm, "feasible")
        sub = self._fix_and_solve(model, closed, lp_values, None, left, gap)
        if sub.values is not None and (
            best.objective is None
            or (sub.objective is not None and sub.objective > best.objective + EPS)
        ):
            best = sub
        rounds = 0
        while (
            best.values is not None
            and best.objective is not None
            and bound is not None
            and (bound - best.objective) > gap * max(abs(bound), EPS)
            and left() > RESERVE_S
            and rounds < 3
        ):
            rounds += 1
            better = self._fix_and_solve(model, closed, lp_values, best.values, left, gap)
            if better.objective is None or better.objective <= best.objective + EPS:
                break
            best = better
        return best, bound

    def _fix_and_solve(
        self,
        model: PlacementModel,
        closed: LinearModel,
        lp_values: tuple[float, ...],
        incumbent: tuple[float, ...] | None,
        left: Callable[[], float],
        gap: float,
    ) -> LinearSolution:
        """Fix every job whose columns the LP settles (RENS: integral; RINS: equal to the
        incumbent) and solve the MIP over the others, from the incumbent if there is one."""
        lower = list(closed.col_lower)
        upper = list(closed.col_upper)
        fixed_jobs = free_jobs = 0
        for jv in model.jobs.values():
            cols = job_columns(jv)
            if incumbent is None:
                settled = all(abs(lp_values[c] - round(lp_values[c])) <= INTEGRAL for c in cols)
                settled = settled and not any(lp_values[c] > INTEGRAL for c in jv.escapes)
                target = lp_values
            else:
                settled = all(abs(lp_values[c] - incumbent[c]) <= INTEGRAL for c in cols)
                target = incumbent
            if settled:
                fixed_jobs += 1
                for c in cols:
                    lower[c] = upper[c] = float(round(target[c]))
            else:
                free_jobs += 1
        if incumbent is None:
            self._rens = (fixed_jobs, free_jobs)
        limits = SolveLimits(max(0.2, left() - RESERVE_S), gap)
        return solve(closed.with_bounds(lower, upper), self.backend, limits, incumbent)

    def _mark(self, phase: str) -> None:
        now = time.perf_counter()
        self._phases.append((phase, round(now - self._split, 3)))
        self._split = now

    @staticmethod
    def _warm_only(model: PlacementModel, warm: list[float] | None, status: str) -> LinearSolution:
        values = tuple(warm) if warm is not None else None
        return LinearSolution(
            status="feasible" if values is not None else status,
            values=values,
            objective=model.lp.objective(values) if values is not None else None,
            bound=None,
            seconds=0.0,
            solver="warm",
        )

    def _finish(
        self,
        instance: PlacementInstance,
        greedy: PlacementPlan,
        model: PlacementModel,
        solution: LinearSolution,
        outcomes: tuple[JobOutcome, ...] | None,
        bound: float | None,
        warm_started: bool,
        started: float,
    ) -> PlacementPlan:
        greedy_score = greedy.stats.objective
        score = plan_objective(instance, outcomes) if outcomes is not None else None
        problems = (
            tuple(check_plan(instance, PlacementPlan(outcomes, greedy.stats)))
            if outcomes is not None
            else ()
        )
        model_bound = bound
        own_score = score if not problems else None
        fell_back = (
            outcomes is None or score is None or score < greedy_score - EPS or bool(problems)
        )
        if fell_back or outcomes is None or score is None:
            outcomes, score = greedy.outcomes, greedy_score
        if bound is not None:
            bound = max(bound, score)
        gap = None if bound is None else (bound - score) / max(abs(bound), EPS)
        if solution.status == "infeasible":
            status = "infeasible"
        elif fell_back:
            status = "heuristic"  # the greedy plan, kept because nothing better was packed
        elif gap is not None and gap <= instance.policy.gap_tolerance + EPS:
            status = "optimal"  # within the policy's gap of a proven bound
        else:
            status = "feasible"
        self.last_report = SolveReport(
            greedy_objective=greedy_score,
            model_objective=solution.objective,
            bound=bound,
            fell_back=fell_back,
            warm_started=warm_started,
            small=model.small,
            pruned=len(model.pruned),
            phases=tuple(self._phases),
            fixed_jobs=self._rens[0],
            free_jobs=self._rens[1],
            problems=problems,
            model_bound=model_bound,
            milp_objective=own_score,
        )
        return PlacementPlan(
            outcomes=outcomes,
            stats=SolveStats(
                solver=self.name,
                status=status,
                objective=score,
                bound=bound,
                gap=gap,
                seconds=time.perf_counter() - started,
                variables=model.lp.num_cols,
                constraints=model.lp.num_rows,
            ),
            broken_soft=broken_soft_constraints(instance, outcomes),
        )


# -- from counts to nodes and GPUs -------------------------------------------------------------


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


def best_realisation(
    instance: PlacementInstance, model: PlacementModel, values: tuple[float, ...]
) -> tuple[JobOutcome, ...]:
    """The best of packing the solution in each of PACKING_ORDERS."""
    best: tuple[JobOutcome, ...] | None = None
    best_score = 0.0
    for order in range(len(PACKING_ORDERS)):
        outcomes = realise(instance, model, values, order)
        score = plan_objective(instance, outcomes)
        if best is None or score > best_score + EPS:
            best, best_score = outcomes, score
    assert best is not None
    return best


def realise(
    instance: PlacementInstance, model: PlacementModel, values: tuple[float, ...], order: int = 0
) -> tuple[JobOutcome, ...]:
    """Pack the solution onto nodes and GPUs; jobs that do not pack go through greedy repair."""
    packing = Packing(instance)
    jobs = {j.key: j for j in instance.jobs}
    status: dict[str, OutcomeStatus] = {}
    notes: dict[str, str] = {}

    def commit(job: Job, fit: Fit, kept: bool) -> None:
        packing.commit(job, fit)
        if kept and not job.preemptible:
            # A non-preemptible job that stays is not charged to quota (check.py agrees).
            packing.ledger.remove(
                job.queue, fit.flavor, len(fit.replicas) * job.resources.gpu_milli
            )

    def try_keep(job: Job, placement: Placement) -> bool:
        fit = Fit(placement.flavor, placement.replicas)
        if not _can_take(packing, job, placement.replicas):
            return False
        if job.preemptible:
            amount = len(placement.replicas) * job.resources.gpu_milli
            if packing.ledger.rejection(job.queue, placement.flavor, amount) is not None:
                return False
        commit(job, fit, kept=True)
        return True

    # 1. What stays where it is.
    for key, rj in model.running.items():
        jv = model.jobs.get(key)
        stays = rj.fixed or (jv is not None and _chosen(values, jv.keep))
        if stays and try_keep(rj.job, rj.placement):
            status[key] = OutcomeStatus.KEPT

    # 2. What is placed anew, biggest and most constrained first.
    chosen = [
        jv for key, jv in model.jobs.items() if key not in status and _chosen(values, jv.place)
    ]
    chosen.sort(key=lambda jv: PACKING_ORDERS[order](jv, _replicas(jv, values)))
    for jv in chosen:
        job = jv.job
        placement = instance.current.get(job.key)
        if (
            placement is not None
            and len(placement.replicas) == _replicas(jv, values)
            and _in_chosen_domain(instance, jv, values, placement)
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT  # asked to move, but its place is still free
            continue
        fit = _realise_job(packing, model, jv, values)
        if fit is not None and _quota_ok(packing, job, fit):
            commit(job, fit, kept=False)
            status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED

    # 3. Repair: whatever the model admitted but did not pack, and anything that still fits.
    for job in priority_order(j for j in instance.jobs if j.key not in status):
        placement = instance.current.get(job.key)
        if (
            placement is not None
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT
            continue
        result = packing.find(job)
        if isinstance(result, Fit):
            commit(job, result, kept=False)
            status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED
            notes[job.key] = "placed by repair after the solve"

    return _outcomes(instance, packing, jobs, status, notes)


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


def _replicas(jv: JobVars, values: tuple[float, ...]) -> int:
    if jv.replicas >= 0:
        return round(values[jv.replicas])
    return jv.job.replicas


def _can_take(packing: Packing, job: Job, replicas: tuple[ReplicaPlacement, ...]) -> bool:
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


def _quota_ok(packing: Packing, job: Job, fit: Fit) -> bool:
    amount = len(fit.replicas) * job.resources.gpu_milli
    return packing.ledger.rejection(job.queue, fit.flavor, amount) is None


def _realise_job(
    packing: Packing, model: PlacementModel, jv: JobVars, values: tuple[float, ...]
) -> Fit | None:
    """Nodes and GPUs for a job the model places: in its domain, on its classes."""
    job = jv.job
    flavor = next((f for f, c in jv.flavor.items() if _chosen(values, c)), None)
    if flavor is None and jv.flavor and None not in jv.flavor:
        return None
    count = _replicas(jv, values)
    if count <= 0:
        return None
    eligible = packing.eligible_nodes(job, flavor)
    rooms = packing.rooms(job, flavor, eligible)
    level = jv.level
    allowed: list[Node] = eligible
    if level is not None:
        domain = next((d for (_, d), c in jv.domain.items() if _chosen(values, c)), None)
        single = next((slot for slot, c in jv.single.items() if _chosen(values, c)), None)
        if domain is not None:
            allowed = packing.domains(job, flavor, level).get(domain, [])
        elif single is not None:
            if single in jv.single_replicas:
                count = round(values[jv.single_replicas[single]])
            cls = model.classes[single] if single >= 0 else model.coarse[-1 - single]
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
    if per_class and not any(values[c] > 0.5 for c in jv.per_coarse.values()):
        inside = {n.name for n in allowed}
        replicas: list[ReplicaPlacement] = []
        for cid, n in sorted(per_class, key=lambda t: -t[1]):
            nodes = [m for m in model.classes[cid].nodes if m.name in inside]
            fit = packing.pack(job, flavor, nodes, n, rooms)
            if fit is None:
                replicas = []
                break
            replicas.extend(fit.replicas)
        if len(replicas) == count:
            return Fit(flavor, tuple(replicas))
    return packing.pack(job, flavor, allowed, count, rooms)


# -- outcomes and their reasons ------------------------------------------------------------------


def _outcomes(
    instance: PlacementInstance,
    packing: Packing,
    jobs: dict[str, Job],
    status: dict[str, OutcomeStatus],
    notes: dict[str, str],
) -> tuple[JobOutcome, ...]:
    out: dict[str, JobOutcome] = {}
    rights = PreemptionRights(instance)
    placed_on: dict[str, set[str]] = defaultdict(set)  # node -> jobs now placed or moved there
    for key, st in status.items():
        if st in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
            for r in packing.running[key].replicas:
                placed_on[r.node].add(key)
    for job in priority_order(instance.jobs):
        key = job.key
        now = status.get(key)
        was = instance.current.get(key)
        if now is not None:
            fit = packing.running[key]
            reason = notes.get(key, "admitted")
            if now is OutcomeStatus.MOVED and was is not None:
                why = keep_problem(instance, job, was)
                reason = f"moved: {why}" if why else "moved to make room (its move cost is paid)"
            out[key] = JobOutcome(key, now, fit.flavor, fit.replicas, reason=reason)
            continue
        miss = packing.find(job)
        if isinstance(miss, Fit):
            reason = "fits, but placing it lowers the objective (fragmentation or fairness terms)"
            miss = Miss(reason, f"objective__{key}")
        if was is None:
            out[key] = JobOutcome(
                key, OutcomeStatus.PENDING, reason=miss.reason, constraint=miss.constraint
            )
            continue
        lost = lost_gpu_seconds(job, was, instance.now)
        by = _preempted_by(rights, job, was, placed_on, jobs)
        why = keep_problem(instance, job, was)
        if why is not None:
            reason, constraint = f"{why}; no other place: {miss.reason}", miss.constraint
        elif by is not None:
            other = jobs[by]
            reason = (
                f"preempted by {by} (priority {other.priority} > {job.priority})"
                if other.queue == job.queue
                else f"preempted by {by}: queue {other.queue} reclaims its quota"
            )
            constraint = "preemption"
        else:
            reason = f"preempted: its place is worth more to the jobs that run now; {miss.reason}"
            constraint = miss.constraint or "preemption"
        out[key] = JobOutcome(
            key,
            OutcomeStatus.PREEMPTED,
            reason=reason,
            constraint=constraint,
            preempted_by=by,
            lost_gpu_seconds=lost,
        )
    return tuple(out[j.key] for j in priority_order(instance.jobs))


def _preempted_by(
    rights: PreemptionRights,
    victim: Job,
    was: Placement,
    placed_on: dict[str, set[str]],
    jobs: dict[str, Job],
) -> str | None:
    """The job that took the victim's place and had the right to: on its nodes, best first."""
    near = sorted(
        {k for r in was.replicas for k in placed_on.get(r.node, ())},
        key=lambda k: (-jobs[k].priority, k),
    )
    for key in near:
        if rights.may(jobs[key], victim):
            return key
    # Its GPUs may have gone elsewhere while the quota it held went to the preemptor.
    others = sorted(
        {k for keys in placed_on.values() for k in keys}, key=lambda k: (-jobs[k].priority, k)
    )
    for key in others:
        if rights.may(jobs[key], victim):
            return key
    return None
