"""The MILP placer: the greedy plan as warm start and fallback, the model of `model.py`
solved by HiGHS or CBC, its counts packed onto nodes and GPUs, and every job that
does not run told why.

The plan it returns is never worse than the greedy plan on the shared objective
and always passes `check.py`: a solve that cannot beat or equal greedy (time out
with nothing better, a packing that loses too much) returns the greedy plan, with
the solve's bound still recorded. An incremental solve's greedy plan is greedy on the
change alone (`incremental_start`): everything that runs stays, the changed jobs go
where they fit.

Class-level counts that do not pack onto the nodes of a small instance are packed
again by the per-node model, with every job's choices fixed (`_disaggregate`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from engine.model import GPU_MILLI, Job, Node, Placement, ReplicaPlacement
from engine.placement.check import check_plan
from engine.placement.constraints import node_rejection
from engine.placement.greedy import Fit, GreedyPlacer, Miss, Packing, priority_order
from engine.placement.linear import LinearModel, LinearSolution, SolveLimits, solve
from engine.placement.model import (
    BuildOptions,
    JobVars,
    PlacementModel,
    build,
    job_columns,
    keep_problem,
    warm_values,
)
from engine.placement.objective import (
    broken_soft_constraints,
    lost_gpu_seconds,
    plan_compactness,
    plan_objective,
)
from engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from engine.placement.preemption import Attribution, Rights, attribute
from engine.placement.topology import compact_allocation, explain_spans, gang_topology

# Instances up to this size get the node-exact model (every node that runs a movable
# job is its own class, every job gets per-class columns, no domain is pruned).
SMALL_NODES = 24
SMALL_JOBS = 80
# Instances up to this many nodes have a class-level solution that did not pack exactly
# packed again by the per-node model (exact rows) with every job's choices fixed.
EXACT_NODES = 128
# Models up to this many columns are solved outright; larger ones relax, then fix.
DIRECT_COLUMNS = 6000
INTEGRAL = 1e-6
EPS = 1e-6
RESERVE_S = 2.0  # kept back from the time limit for packing and explaining the plan
RESERVE_PER_BUILD = 1.3  # ... or this many times the build's time, where that is less (or more)
RESERVE_MAX_S = 5.0
# Neighbourhood searches go on while the model's own gap is above this share of the policy's
# gap: the rest is left for what packing the counts onto nodes loses.
PACKING_SHARE = 0.5
QUOTA_TIME_SHARE = 1.0  # of the time left: the quota neighbourhood gains most where it runs


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
    greedy_tighter: bool = False  # greedy's plan scored as well and spanned less: taken


class MilpPlacer:
    """Placement by MILP. `mode`: "full" re-decides every movable running job;
    "incremental" keeps every running job the greedy plan keeps and decides the rest."""

    def __init__(self, backend: str, mode: str = "full") -> None:
        self.backend = backend
        self.name = backend
        self.mode = mode
        self.last_report: SolveReport | None = None
        # Per solve: how the plan is scored, a packing whose caches to share, the time kept
        # back for packing and explaining.
        self._score: Callable[[tuple[JobOutcome, ...]], float] = lambda outcomes: 0.0
        self._template: Packing | None = None
        self._reserve = RESERVE_S

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        self._start()
        self._score = lambda outcomes: plan_objective(instance, outcomes)
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
            basis=instance,
        )
        greedy_sub, self._template = incremental_start(sub, free)
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
        waits = {o.job for o in waiting}
        if instance.policy.fairness_weight:
            self._score = lambda outcomes: plan_objective(instance, outcomes)
        else:
            # Waiting jobs add nothing to the score but to fair shares: score the part.
            self._score = lambda outcomes: plan_objective(
                sub, tuple(o for o in outcomes if o.job not in waits)
            )
        greedy = replace(
            greedy_sub,
            outcomes=greedy_sub.outcomes + waiting,
            stats=replace(
                greedy_sub.stats,
                objective=self._score(greedy_sub.outcomes + waiting)
                if instance.policy.fairness_weight
                else greedy_sub.stats.objective,
            ),
        )
        self._mark("greedy")
        rights = Rights(sub)
        movable = frozenset(
            rights.claimable((jobs[k] for k in sorted(free)), (jobs[k] for k in running))
        )
        options = BuildOptions(
            small=False,
            keep_all=True,
            movable=movable,
            moves=False,
            unkeepable=frozenset(affected),
        )
        return self._solve(instance, sub, greedy, options, {"waiting": waiting})

    def _start(self) -> None:
        self._reserve = RESERVE_S
        self._template = None
        self._score = lambda outcomes: 0.0
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
        built = time.perf_counter()
        model = build(sub, greedy_sub, options)
        # Packing the solution and explaining the plan take about as long as the build did.
        self._reserve = min(
            RESERVE_MAX_S, max(0.3, RESERVE_PER_BUILD * (time.perf_counter() - built))
        )
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

        if lp.num_cols <= DIRECT_COLUMNS and not model.escapes and not options.keep_all:
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
            orders = 1 if options.keep_all else len(PACKING_ORDERS)
            # Explaining and checking the plan take about a third of the reserve.
            deadline = started + policy.time_limit_s - self._reserve / 3
            packed, score = best_realisation(
                sub, model, solution.values, orders, self._template, deadline
            )
            self._mark("realise")
            if (
                solution.objective is not None
                and score < solution.objective - EPS
                and sum(1 for n in sub.nodes if n.schedulable) <= EXACT_NODES
                and not model.small
                and left() > RESERVE_S / 4
            ):
                exact = self._disaggregate(sub, greedy_sub, options, model, solution.values, left)
                if exact is not None and plan_objective(sub, exact) > score:
                    packed = exact
                self._mark("per-node packing")
            # Small instances only: on larger ones (S: 64 nodes) the pass took 1-3 s and
            # found a tighter plan in one of three seeds, by 0.4% of the cost.
            if (
                model.small
                and not options.keep_all
                and left() > RESERVE_S / 4
                and _has_gangs(sub, packed)
            ):
                packed = self._tighten(
                    sub, greedy_sub, options, model, solution.values, packed, left
                )
                self._mark("compaction")
            outcomes = packed + waiting
        if bound is not None and waiting and policy.fairness_weight:
            # The bound is the sub-problem's; the waiting jobs add what they add to the score.
            plan = outcomes or greedy.outcomes
            bound += plan_objective(instance, plan) - plan_objective(
                sub, tuple(o for o in plan if o.job not in waits)
            )
        return self._finish(
            instance, greedy, model, solution, outcomes, bound, warm is not None, started
        )

    def _tighten(
        self,
        sub: PlacementInstance,
        greedy_sub: PlacementPlan,
        options: BuildOptions,
        model: PlacementModel,
        values: tuple[float, ...],
        packed: tuple[JobOutcome, ...],
        left: Callable[[], float],
    ) -> tuple[JobOutcome, ...]:
        """The second criterion: the same jobs, flavors and replica counts, packed by the
        per-node model whose objective also charges every domain a gang uses per level
        (topology.py); taken when it scores as well and spans less."""
        tighter = self._disaggregate(
            sub, greedy_sub, options, model, values, left, compactness=True
        )
        if tighter is None:
            return packed
        if plan_objective(sub, tighter) >= plan_objective(sub, packed) - EPS and (
            plan_compactness(sub, tighter) < plan_compactness(sub, packed) - EPS
        ):
            return tighter
        return packed

    def _disaggregate(
        self,
        sub: PlacementInstance,
        greedy_sub: PlacementPlan,
        options: BuildOptions,
        model: PlacementModel,
        values: tuple[float, ...],
        left: Callable[[], float],
        compactness: bool = False,
    ) -> tuple[JobOutcome, ...] | None:
        """Pack a class-level solution exactly: the per-node model (whose rows are exact)
        with every job's choices fixed where the class model made them (run, keep, replicas,
        flavor, domain), solved for the nodes and GPUs of each replica. With `compactness`
        the domains are free too and every domain a gang uses costs."""
        exact = build(
            sub, greedy_sub, replace(options, small=True, per_node=True, compactness=compactness)
        )
        lower = list(exact.lp.col_lower)
        upper = list(exact.lp.col_upper)
        for key, jv in exact.jobs.items():
            cv = model.jobs.get(key)
            if cv is None:
                continue
            pairs = [(jv.place, cv.place), (jv.keep, cv.keep), (jv.spread, cv.spread)]
            if jv.replicas >= 0 and cv.replicas >= 0:
                pairs.append((jv.replicas, cv.replicas))
            pairs += [(c, cv.flavor.get(f, -1)) for f, c in jv.flavor.items() if c != jv.place]
            if not compactness:
                pairs += [(c, cv.domain.get(d, -1)) for d, c in jv.domain.items()]
            for col, source in pairs:
                if col >= 0:
                    lower[col] = upper[col] = float(round(values[source])) if source >= 0 else 0.0
        fixed = exact.lp.with_bounds(lower, upper)
        limits = SolveLimits(max(0.2, left() - RESERVE_S / 2), 0.0)
        solution = solve(fixed, self.backend, limits)
        if solution.values is None:
            return None
        return realise(sub, exact, solution.values, 1, follow=True)

    def _relax_and_fix(
        self,
        model: PlacementModel,
        closed: LinearModel,
        warm: list[float] | None,
        left: Callable[[], float],
        gap: float,
    ) -> tuple[LinearSolution, float | None]:
        """LP relaxation (every domain open: the bound); then MIPs over neighbourhoods the LP
        suggests, each from the best plan so far: the jobs the LP left fractional, every
        other job fixed where the LP put it (RENS); the jobs of the priority class whose
        nominal quotas the best plan fills furthest short of the LP's, every other job only
        free to stop (quota: level 1 of the lexicographic objective is a subset sum per queue
        that the LP fills with part-gangs, and whose integral answer moves hundreds of jobs,
        far from where RENS fixes them); the same with the single-replica jobs the
        LP leaves out free too, to fill what an integral plan leaves of the LP's part-gangs
        (fill); where that finds nothing better, the jobs the LP runs at all, with the jobs it
        leaves out and the running jobs it keeps fixed (its support); then, while time and gap
        allow, the jobs where the LP and the best plan disagree (RINS), and the quota
        neighbourhood of the other classes."""
        relaxed = solve(model.lp, self.backend, SolveLimits(left(), 0.0, relax=True))
        self._mark("relaxation")
        bound = relaxed.bound
        if relaxed.values is None:
            return self._warm_only(model, warm, "error"), bound
        lp_values = relaxed.values
        best = self._warm_only(model, warm, "feasible")

        # Packing the counts onto nodes loses some of the model's value: leave room for it.
        target = None if bound is None else bound - gap * PACKING_SHARE * max(abs(bound), EPS)

        def short_of_gap() -> bool:
            return best.objective is None or (target is not None and best.objective < target)

        def improve(mode: str, share: float, loose: set[str] | None = None) -> bool:
            nonlocal best
            incumbent = best.values if mode != "rens" else None
            sub = self._fix_and_solve(
                model, closed, lp_values, incumbent, mode, left, gap, share, target, loose
            )
            if sub.values is None or sub.objective is None:
                return False
            if best.objective is None or sub.objective > best.objective + EPS:
                best = sub
                return True
            return False

        improve("rens", 1.0)
        # A solver stops a little after its time limit: a second of margin on large models.
        margin = min(1.0, self._reserve / 4)
        tried: list[int] = []

        def quota() -> bool:
            """The next priority class short of its nominal quotas, from the best plan."""
            if best.values is None or not short_of_gap() or left() <= self._reserve + margin:
                return False
            short = _short_of_nominal(model, lp_values, best.values, tried)
            if short is None:
                return False
            tried.append(short[0])
            improve("quota", QUOTA_TIME_SHARE, short[1])
            return True

        quota()
        filled = short_of_gap() and left() > self._reserve + margin and improve("fill", 1.0)
        if short_of_gap() and not filled and left() > self._reserve + margin:
            improve("support", 0.85)
        rounds = 0
        while (
            best.values is not None
            and short_of_gap()
            and left() > self._reserve + 2 * margin
            and rounds < 3
        ):
            rounds += 1
            if not improve("rins", 1.0):
                break
        while quota():
            pass
        return best, bound

    def _fix_and_solve(
        self,
        model: PlacementModel,
        closed: LinearModel,
        lp_values: tuple[float, ...],
        incumbent: tuple[float, ...] | None,
        mode: str,
        left: Callable[[], float],
        gap: float,
        share: float,
        enough: float | None = None,
        loose: set[str] | None = None,
    ) -> LinearSolution:
        """Fix every job whose columns the neighbourhood settles and solve the MIP over the
        others, from the incumbent if there is one, for `share` of the time left or until it
        finds a plan worth `enough`.
        `mode`: "rens" settles the jobs the LP makes integral; "fill" those but the
        single-replica jobs without topology the LP leaves out; "support" the jobs the LP
        leaves out entirely and the running jobs it keeps; "rins" the jobs where the LP and
        the incumbent agree; "quota" every job but `loose`, each only between the incumbent's
        values and zero (it may stop, to make room)."""
        lower = list(closed.col_lower)
        upper = list(closed.col_upper)
        fixed_jobs = free_jobs = 0
        target = lp_values if incumbent is None or mode not in ("rins", "quota") else incumbent
        hot = _contested_classes(model, lp_values) if mode == "support" else set()
        for jv in model.jobs.values():
            cols = job_columns(jv)
            if mode == "quota":
                settled = jv.job.key not in (loose or ())
            elif mode in ("rens", "fill"):
                settled = all(abs(lp_values[c] - round(lp_values[c])) <= INTEGRAL for c in cols)
                settled = settled and not any(lp_values[c] > INTEGRAL for c in jv.escapes)
                if mode == "fill" and settled and _filler(jv, lp_values):
                    settled = False
            elif mode == "support":
                settled = all(lp_values[c] <= INTEGRAL for c in cols + jv.escapes) or (
                    jv.keep >= 0
                    and lp_values[jv.keep] >= 1 - INTEGRAL
                    and not any(
                        model.node_class.get(r.node) in hot
                        for r in model.running[jv.job.key].placement.replicas
                    )
                )
            else:
                assert incumbent is not None
                settled = all(abs(lp_values[c] - incumbent[c]) <= INTEGRAL for c in cols)
            if settled and mode == "quota":
                for c in cols:
                    lower[c], upper[c] = 0.0, float(round(target[c]))
            elif settled:
                fixed_jobs += 1
                for c in cols:
                    lower[c] = upper[c] = float(round(target[c]))
            else:
                free_jobs += 1
        if mode == "rens":
            self._rens = (fixed_jobs, free_jobs)
        fix_settled_aux(model, lower, upper)
        if (
            incumbent is not None
            and mode != "rins"
            and any(
                not lower[c] - INTEGRAL <= incumbent[c] <= upper[c] + INTEGRAL
                for c in range(len(lower))
            )
        ):
            incumbent = None  # it must agree with what is fixed, or the solver drops it
        margin = min(1.0, self._reserve / 4)
        seconds = max(0.2, (left() - self._reserve - margin) * share)
        # A plan as good as the search asks for ends the solve (HiGHS; CBC has no such stop).
        # Not in the quota neighbourhood: there HiGHS dropped the start plan, worse than the
        # target, and found nothing as good in the time (bench synth L: no user solution in
        # its log), where without the target it starts from it.
        extra = () if enough is None or mode == "quota" else (("objective_target", enough),)
        limits = SolveLimits(
            seconds, gap / 4 if mode in ("support", "fill", "quota") else gap, extra=extra
        )
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
        score = self._score(outcomes) if outcomes is not None else None
        problems = (
            tuple(check_plan(instance, PlacementPlan(outcomes, greedy.stats)))
            + attribution(instance, outcomes).problems
            if outcomes is not None
            else ()
        )
        model_bound = bound
        own_score = score if not problems else None
        greedy_tighter = False
        fell_back = (
            outcomes is None or score is None or score < greedy_score - EPS or bool(problems)
        )
        outcomes_found = outcomes is not None
        if fell_back or outcomes is None or score is None:
            outcomes, score = greedy.outcomes, greedy_score
        elif (
            score <= greedy_score + EPS
            and plan_compactness(instance, greedy.outcomes)
            < plan_compactness(instance, outcomes) - EPS
        ):
            # The second criterion: greedy scores as well and its gangs span less.
            outcomes, score = greedy.outcomes, greedy_score
            greedy_tighter = True
        if bound is not None:
            bound = max(bound, score)
        gap = None if bound is None else (bound - score) / max(abs(bound), EPS)
        fallback = ""
        if fell_back:
            fallback = _fallback_reason(solution.status, outcomes_found, problems, own_score)
        elif greedy_tighter:
            fallback = "greedy's plan scores as well and its gangs span fewer domains"
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
            greedy_tighter=greedy_tighter,
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
                plan_source="greedy" if fell_back or greedy_tighter else "milp",
                fallback=fallback,
            ),
            broken_soft=broken_soft_constraints(instance, outcomes),
        )


def _fallback_reason(
    status: str, found: bool, problems: tuple[str, ...], own_score: float | None
) -> str:
    """Why the MILP's own plan was not used, in a line for the solve event."""
    if not found:
        if status == "infeasible":
            return "the model was infeasible"
        return f"no feasible MILP solution within the time limit (solver status {status})"
    if problems:
        return f"the MILP's plan broke a rule: {problems[0]}"
    return "the MILP's packed plan scored below greedy's"


def _has_gangs(instance: PlacementInstance, outcomes: tuple[JobOutcome, ...]) -> bool:
    """Whether the plan places a gang of several replicas that compactness applies to."""
    jobs = {j.key: j for j in instance.jobs}
    return any(
        o.status in (OutcomeStatus.PLACED, OutcomeStatus.MOVED)
        and len({r.node for r in o.replicas}) > 1
        and gang_topology(jobs[o.job]).compact
        for o in outcomes
        if o.job in jobs
    )


def fix_settled_aux(model: PlacementModel, lower: list[float], upper: list[float]) -> None:
    """Fix the auxiliary columns (blocked slots, touched nodes, borrowed and nominal use ...)
    whose terms are all fixed, at the value they then take in every optimal solution, so
    that the solver gets only what is left to decide."""
    for col, terms, const, kind, param in model.aux:
        if any(lower[c] != upper[c] for c, _ in terms):
            continue
        used = const + sum(lower[c] * v for c, v in terms)
        if kind == "excess":
            value = max(0.0, used - param)
        elif kind == "min":
            value = max(0.0, min(param, used))
        elif kind == "short":
            value = max(0.0, param - used)
        elif kind == "touched":
            value = max(lower[col], float(math.ceil(used / param - 1e-9)))
        elif kind == "over":
            value = 1.0 if used > param + 1e-9 else 0.0
        else:  # "max"
            value = max((lower[c] for c, _ in terms), default=0.0)
        if lower[col] - INTEGRAL <= value <= upper[col] + INTEGRAL:
            lower[col] = upper[col] = value


def _short_of_nominal(
    model: PlacementModel,
    lp_values: tuple[float, ...],
    incumbent: tuple[float, ...],
    tried: Collection[int],
) -> tuple[int, set[str]] | None:
    """The priority class, of those not `tried`, whose nominal quotas the incumbent fills
    furthest short of the LP's (in the objective's value), and its jobs in the queues where
    it falls short; None where no class falls short."""
    lost: dict[tuple[str, str, int], float] = {}
    for col, where in model.nominal.items():
        lost[where] = model.lp.col_cost[col] * (lp_values[col] - incumbent[col])
    by_priority: dict[int, float] = defaultdict(float)
    for (_, _, p), v in lost.items():
        if p not in tried:
            by_priority[p] += max(0.0, v)
    if not by_priority or max(by_priority.values()) <= 0:
        return None
    top = max(sorted(by_priority), key=lambda p: by_priority[p])
    queues = {q for (q, _, p), v in lost.items() if p == top and v > 0}
    return top, {
        key for key, jv in model.jobs.items() if jv.job.priority == top and jv.job.queue in queues
    }


def _filler(jv: JobVars, lp_values: tuple[float, ...]) -> bool:
    """A waiting job of one replica and no topology that the LP leaves out: what fills the
    holes an integral plan leaves where the LP ran part of a gang."""
    job = jv.job
    return (
        jv.keep < 0
        and job.replicas == 1
        and jv.level is None
        and jv.place >= 0
        and lp_values[jv.place] <= INTEGRAL
    )


def _contested_classes(model: PlacementModel, lp_values: tuple[float, ...]) -> set[int]:
    """Fine classes where the LP runs part of a job: the running jobs there may have to make
    room for the whole of it."""
    hot: set[int] = set()
    domains: set[str] = set()
    for jv in model.jobs.values():
        if jv.place < 0 or not INTEGRAL < lp_values[jv.place] < 1 - INTEGRAL:
            continue
        hot.update(cid for cid, c in jv.per_class.items() if lp_values[c] > INTEGRAL)
        domains.update(d for (_, d), c in jv.domain.items() if lp_values[c] > INTEGRAL)
    if domains:
        hot.update(cls.id for cls in model.classes if domains & set(cls.domains.values()))
    return hot


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
        amount = len(placement.replicas) * job.resources.gpu_milli
        if _can_take(packing, job, placement.replicas) and (
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
    instance: PlacementInstance,
    model: PlacementModel,
    values: tuple[float, ...],
    orders: int = len(PACKING_ORDERS),
    template: Packing | None = None,
    deadline: float = math.inf,
) -> tuple[tuple[JobOutcome, ...], float]:
    """The best of packing the solution in each of the first `orders` PACKING_ORDERS (another
    order only while it would end before `deadline`, a perf_counter time), and its score."""
    best: Packed | None = None
    best_score = 0.0
    best_order = 0
    last = 0.0
    for order in range(orders):
        began = time.perf_counter()
        if best is not None and began + last > deadline:
            break
        packed = pack_solution(instance, model, values, order, template=template)
        template = packed.packing
        score = plan_objective(instance, packed.outcomes(instance, explain=False))
        if best is None or score > best_score + EPS:
            best, best_score, best_order = packed, score, order
        last = time.perf_counter() - began
    assert best is not None
    best, best_score = _stay_where_possible(
        instance, model, values, best, best_score, best_order, deadline
    )
    return best.outcomes(instance), best_score


def _stay_where_possible(
    instance: PlacementInstance,
    model: PlacementModel,
    values: tuple[float, ...],
    best: Packed,
    best_score: float,
    order: int,
    deadline: float,
    follow: bool = False,
) -> tuple[Packed, float]:
    """A running job the model could only keep or stop (it has no column to move it: an
    incremental solve) and that the packing did not keep stays where it is when no rule
    allows its stop, or when the plan then scores at least as well. The model ties stops
    to the rules per queue, not per preemptor, and counts room by class in aggregate: it
    may stop a job that no admitted job may preempt, or whose room the new jobs did not
    need. Per round: every such job whose place is still free stays (the plan only
    gains); those no rule lets stop stay together (one repack: a plan that stops them is
    not lawful); then, while time allows, each other one, highest priority first, if the
    plan scores as well. A job that stays can change which stops are lawful: a few rounds."""
    candidates = [
        job
        for job in priority_order(instance.jobs)
        if (jv := model.jobs.get(job.key)) is not None
        and jv.keep >= 0
        and jv.place < 0
        and job.key in instance.current
    ]
    # Any running job the plan stops, moveable or not: a stop no rule allows is undone.
    running = [job for job in priority_order(instance.jobs) if job.key in instance.current]
    stay: set[str] = set()

    def repack(keys: set[str]) -> tuple[Packed, float]:
        packed = pack_solution(
            instance, model, values, order, follow, template=best.packing, stay=frozenset(keys)
        )
        return packed, plan_objective(instance, packed.outcomes(instance, explain=False))

    for _ in range(3):
        changed = False
        stopped = [j for j in candidates if best.status.get(j.key) is None]
        if not stopped and all(best.status.get(j.key) is not None for j in running):
            break
        for job in stopped:
            placement = instance.current[job.key]
            amount = len(placement.replicas) * job.resources.gpu_milli
            if _can_take(best.packing, job, placement.replicas) and (
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
        last = 0.0
        for job in candidates:
            if best.status.get(job.key) is not None or job.key in unlawful:
                continue
            began = time.perf_counter()
            if began + last > deadline:
                return best, best_score
            packed, score = repack(stay | {job.key})
            if packed.status.get(job.key) is OutcomeStatus.KEPT and score >= best_score - _noise(
                best_score
            ):
                stay.add(job.key)
                best, best_score = packed, score
                changed = True
            last = time.perf_counter() - began
        if not changed:
            break
    return best, best_score


def _noise(score: float) -> float:
    """What summing a plan's terms in another order may change its score by."""
    return EPS + 1e-12 * abs(score)


def realise(
    instance: PlacementInstance,
    model: PlacementModel,
    values: tuple[float, ...],
    order: int = 0,
    follow: bool = False,
) -> tuple[JobOutcome, ...]:
    """Pack the solution onto nodes and GPUs; jobs that do not pack go through greedy repair.
    `follow`: a per-node solution, whose replicas go exactly to the nodes it names (a job
    it moves back onto its own nodes stays put afterwards, where its GPUs are still free)."""
    packed = pack_solution(instance, model, values, order, follow)
    score = plan_objective(instance, packed.outcomes(instance, explain=False))
    packed, _ = _stay_where_possible(
        instance, model, values, packed, score, order, math.inf, follow
    )
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
            return _outcomes(instance, self.packing, self.status, self.notes)
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
    model: PlacementModel,
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

    # 1. What stays where it is: first the jobs that are not decided (the warm start kept
    # them all together, so they fit together), then those the solution keeps.
    for key, rj in model.running.items():
        if rj.fixed:
            commit(rj.job, Fit(rj.placement.flavor, rj.placement.replicas), kept=True)
            status[key] = OutcomeStatus.KEPT
    for key, rj in model.running.items():
        jv = model.jobs.get(key)
        if (
            key not in status
            and jv is not None
            and (_chosen(values, jv.keep) or key in stay)
            and try_keep(rj.job, rj.placement)
        ):
            status[key] = OutcomeStatus.KEPT

    # 2. What is placed anew, biggest and most constrained first.
    chosen = [
        jv for key, jv in model.jobs.items() if key not in status and _chosen(values, jv.place)
    ]
    chosen.sort(key=lambda jv: PACKING_ORDERS[order](jv, _replicas(jv, values)))
    for jv in chosen:
        job = jv.job
        placement = instance.current.get(job.key)
        if follow:
            fit = _follow_job(packing, model, jv, values)
            if fit is not None and _quota_ok(packing, job, fit):
                commit(job, fit, kept=False)
                status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED
            continue
        if (
            placement is not None
            and len(placement.replicas) == _replicas(jv, values)
            and _in_chosen_domain(instance, jv, values, placement)
            and _on_chosen_classes(model, jv, values, placement)
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT  # asked to move, but its place is still free
            continue
        fit = _realise_job(packing, model, jv, values)
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
    # column to move) stays where it is or stops, as the model allowed, never moves.
    for job in priority_order(j for j in instance.jobs if j.key not in status):
        placement = instance.current.get(job.key)
        if (
            placement is not None
            and keep_problem(instance, job, placement) is None
            and try_keep(job, placement)
        ):
            status[job.key] = OutcomeStatus.KEPT
            continue
        jv = model.jobs.get(job.key)
        if placement is not None and job.preemptible and jv is not None and jv.place < 0:
            continue
        result = packing.find(job)
        if isinstance(result, Fit):
            commit(job, result, kept=False)
            status[job.key] = OutcomeStatus.MOVED if placement else OutcomeStatus.PLACED
            notes[job.key] = "placed by repair after the solve"

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
    model: PlacementModel, jv: JobVars, values: tuple[float, ...], placement: Placement
) -> bool:
    """Whether a running job's replicas lie on the node classes the model counted them on
    (then keeping it where it is uses what the model gave it; elsewhere it takes room the
    model gave to others)."""
    fine: dict[int, int] = defaultdict(int)
    coarse: dict[int, int] = defaultdict(int)
    for r in placement.replicas:
        cid = model.node_class.get(r.node)
        if cid is None:
            return False
        fine[cid] += 1
        coarse[model.classes[cid].coarse] += 1
    singles = [slot for slot, c in jv.single.items() if _chosen(values, c)]
    if singles:
        nodes = {r.node for r in placement.replicas}
        slot = singles[0]
        if len(nodes) != 1:
            return False
        cid = model.node_class[next(iter(nodes))]
        return slot == cid if slot >= 0 else -1 - slot == model.classes[cid].coarse
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


def _can_take(packing: Packing, job: Job, replicas: tuple[ReplicaPlacement, ...]) -> bool:
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
    packing: Packing, model: PlacementModel, jv: JobVars, values: tuple[float, ...]
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
            counts.extend((node, n) for node in model.classes[cid].nodes[:1])
    for slot, c in jv.single.items():
        if _chosen(values, c) and slot >= 0:
            size = job.replicas
            if slot in jv.single_replicas:
                size = round(values[jv.single_replicas[slot]])
            counts.append((model.classes[slot].nodes[0], size))
    if sum(n for _, n in counts) != _replicas(jv, values) or any(
        len(model.classes[model.node_class[node.name]].nodes) != 1 for node, _ in counts
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
    amount = len(fit.replicas) * job.resources.gpu_milli
    return packing.ledger.rejection(job.queue, fit.flavor, amount) is None


def _realise_job(
    packing: Packing, model: PlacementModel, jv: JobVars, values: tuple[float, ...]
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
                return _realise_slices(packing, model, jv, values, flavor, allowed, count, rooms)
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
            if gang.slice_size > 1:
                return _realise_slices(packing, model, jv, values, flavor, allowed, count, rooms)
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
    groups = [(model.classes[cid].nodes, n) for cid, n in per_class]
    if per_coarse:
        groups = [(model.coarse[kid].nodes, n) for kid, n in per_coarse] + groups
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
    model: PlacementModel,
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
            chosen.update(n.name for n in model.classes[cid].nodes)
    for kid, c in jv.per_coarse.items():
        if values[c] > 0.5:
            chosen.update(n.name for n in model.coarse[kid].nodes)
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


# -- outcomes and their reasons ------------------------------------------------------------------


def _outcomes(
    instance: PlacementInstance,
    packing: Packing,
    status: dict[str, OutcomeStatus],
    notes: dict[str, str],
) -> tuple[JobOutcome, ...]:
    out: dict[str, JobOutcome] = {}
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
        why = keep_problem(instance, job, was)
        out[key] = JobOutcome(
            key,
            OutcomeStatus.PREEMPTED,
            reason=f"{why}; no other place: {miss.reason}" if why else miss.reason,
            constraint=miss.constraint if why else "preemption",
            lost_gpu_seconds=lost,
        )
    found = attribution(instance, tuple(out.values()), placed_on)
    for key, (by, rule, reason) in found.by.items():
        o = out[key]
        if by is not None:
            o = replace(o, reason=reason, preempted_by=by)
        out[key] = replace(o, rule=rule)
    return explain_spans(instance, tuple(out[j.key] for j in priority_order(instance.jobs)))


def attribution(
    instance: PlacementInstance,
    outcomes: tuple[JobOutcome, ...],
    placed_on: dict[str, set[str]] | None = None,
) -> Attribution:
    """What allowed each preemption of a plan (engine.placement.preemption.attribute): a
    job placed on the victim's nodes is tried first, highest priority first."""
    if placed_on is None:
        placed_on = defaultdict(set)
        for o in outcomes:
            if o.status in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
                for r in o.replicas:
                    placed_on[r.node].add(o.job)
    jobs = {j.key: j for j in instance.jobs}

    def near(victim: Job) -> list[str]:
        was = instance.current[victim.key]
        keys = {k for r in was.replicas for k in placed_on.get(r.node, ())}
        return sorted(keys, key=lambda k: (-jobs[k].priority, k))

    return attribute(instance, outcomes, lambda j, p: keep_problem(instance, j, p), near)
