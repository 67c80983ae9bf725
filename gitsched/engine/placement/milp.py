"""The MILP placer, the orchestration: the greedy plan as warm start and fallback
(`warmstart.py`, `incremental.py`), the formulation of `formulation.py` solved by HiGHS or
CBC (outright, or LP relaxation then neighbourhood searches), its counts packed onto
nodes and GPUs (`realise.py`), and every job that does not run told why (`explain.py`).

The plan it returns is never worse than the greedy plan on the shared objective
and always passes `check.py`: a solve that cannot beat or equal greedy (time out
with nothing better, a packing that loses too much) returns the greedy plan, with
the solve's bound still recorded. An incremental solve's greedy plan is greedy on the
change alone (`incremental_start`): everything that runs stays, the changed jobs go
where they fit.

Class-level counts that do not pack onto the nodes of a small instance are packed
again by the per-node formulation, with every job's choices fixed (`_disaggregate`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from gitsched.engine.model import Job
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.constraints import NodeFree, eligible_flavors
from gitsched.engine.placement.explain import attribution
from gitsched.engine.placement.formulation import (
    BuildOptions,
    Formulation,
    JobVars,
    aux_value,
    build,
    job_columns,
)
from gitsched.engine.placement.fragmentation import NodeScorer
from gitsched.engine.placement.greedy import GreedyPlacer, Packing, claim_shape, priority_key
from gitsched.engine.placement.incremental import incremental_start
from gitsched.engine.placement.levels import solve_levels
from gitsched.engine.placement.linear import LinearModel, LinearSolution, SolveLimits, solve
from gitsched.engine.placement.moves import settle_moves
from gitsched.engine.placement.objective import (
    broken_soft_constraints,
    jobs_by_key,
    objective_terms,
    plan_compactness,
    plan_objective,
    weights,
)
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.placement.preemption import (
    Rights,
    Rule,
    borrowing_reclaimable,
    wait_order,
)
from gitsched.engine.placement.realise import PACKING_ORDERS, best_realisation, realise
from gitsched.engine.placement.running import keep_problem
from gitsched.engine.placement.topology import gang_topology
from gitsched.engine.placement.warmstart import warm_values
from gitsched.engine.units import GPU_MILLI

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
# The wall clock is a backstop only (docs/placement.md, "Deterministic solves"): the node
# budget and counts decide how far a solve goes. The reserve sizes the backstop, so that a
# solve the clock stops still ends near its time limit; a step it skips marks the solve
# `clock_stopped`, and the plan's status says "time_limit".
RESERVE_S = 2.0  # kept back from the time limit for packing and explaining the plan
RESERVE_PER_BUILD = 1.3  # ... or this many times the build's time, where that is less (or more)
RESERVE_MAX_S = 5.0
TIME_LIMIT_STATUS = "time_limit"  # a plan the wall clock cut short: not reproducible
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
    # greedy's plan ran the same and left less for the learned shapes: taken
    greedy_less_fragmented: bool = False


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
        self._clock_stopped = False
        self._node_limit = 0
        # Under `solver.levels: sequential`: the columns of level 1, solved first.
        self._level1: tuple[int, ...] = ()
        # The reclaims an incremental solve must do (greedy on the whole sub-problem).
        self._reclaims: tuple[tuple[str, str], ...] = ()

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        self._start()
        instance = borrowing_reclaimable(instance)
        self._score = lambda outcomes: plan_objective(instance, outcomes)
        greedy = GreedyPlacer().solve(instance)
        self._mark("greedy")
        schedulable = sum(1 for n in instance.nodes if n.schedulable)
        small = schedulable <= SMALL_NODES and len(instance.jobs) <= SMALL_JOBS
        options = BuildOptions(small=small, keep_all=self.mode == "incremental")
        tail = beyond_reach(instance, greedy)
        if not tail:
            return self._solve(instance, instance, greedy, options, {})
        sub = replace(
            instance, jobs=tuple(j for j in instance.jobs if j.key not in tail), basis=instance
        )
        waiting = tuple(o for o in greedy.outcomes if o.job in tail)
        return self._solve(instance, sub, greedy, options, {"waiting": waiting})

    def solve_incremental(
        self, instance: PlacementInstance, changed: Collection[str]
    ) -> PlacementPlan:
        """A re-solve after a small change: the `changed` jobs (new or edited) and running jobs
        whose place went away are free; every other running job stays unless a changed job
        may preempt it (then it stays or stops, it never moves); every other waiting job
        waits on, for the reason the last solve gave."""
        self._start()
        instance = borrowing_reclaimable(instance)
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
        rights = Rights(sub)
        movable = frozenset(
            rights.claimable((jobs[k] for k in sorted(free)), (jobs[k] for k in running))
        )
        if movable:
            # The reclaims the rules require of the change, as greedy finds them on the
            # whole sub-problem (the incremental start keeps every running job): the MILP
            # does them, and that plan, not the start, is what it falls back to.
            whole = GreedyPlacer().solve(sub)
            self._reclaims = reclaims(whole)
            if self._reclaims:
                greedy_sub = whole
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
        schedulable = sum(1 for n in sub.nodes if n.schedulable)
        options = BuildOptions(
            # A small instance's change is modelled node by node, as its full solve is.
            small=schedulable <= SMALL_NODES and len(sub.jobs) <= SMALL_JOBS,
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
        self._clock_stopped = False
        self._reclaims = ()
        self._level1 = ()

    def _run(
        self,
        model: LinearModel,
        limits: SolveLimits,
        warm: Sequence[float] | None = None,
        level1: Sequence[int] = (),
    ) -> LinearSolution:
        """`solve`, noting whether the wall clock stopped it; with `level1` (the columns of
        the objective's level 1, under `solver.levels: sequential`) level by level."""
        if level1:
            solution = solve_levels(model, self.backend, limits, warm, level1)
        else:
            solution = solve(model, self.backend, limits, warm)
        self._clock_stopped |= solution.clock_stopped
        return solution

    def _in_time(self, left: Callable[[], float], need: float) -> bool:
        """Whether the backstop leaves `need` seconds; when it does not, the step it guards
        is skipped and the solve is marked as stopped by the clock."""
        if left() > need:
            return True
        self._clock_stopped = True
        return False

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
        self._node_limit = policy.node_limit
        waiting = extra.get("waiting", ())
        waits = {o.job for o in waiting}
        greedy_sub = replace(
            greedy, outcomes=tuple(o for o in greedy.outcomes if o.job not in waits)
        )
        built = time.perf_counter()
        formulation = build(sub, greedy_sub, options)
        self._level1 = tuple(sorted(formulation.nominal)) if policy.levels == "sequential" else ()
        # Packing the solution and explaining the plan take about as long as the build did.
        self._reserve = min(
            RESERVE_MAX_S, max(0.3, RESERVE_PER_BUILD * (time.perf_counter() - built))
        )
        self._mark("build")
        warm = warm_values(formulation, sub, greedy_sub)
        if warm is not None and formulation.lp.violations(warm):
            warm = None
        self._mark("warm start")
        lp = formulation.lp
        upper = list(lp.col_upper)
        for col in formulation.escapes:
            upper[col] = 0.0
        closed = lp.with_bounds(lp.col_lower, upper) if formulation.escapes else lp
        lower, upper = list(closed.col_lower), list(closed.col_upper)
        forced = self._reclaims or reclaims(greedy_sub)
        if fix_reclaims(formulation, forced, lower, upper):
            closed = closed.with_bounds(lower, upper)
            if warm is not None and any(
                not lo - EPS <= v <= hi + EPS for v, lo, hi in zip(warm, lower, upper, strict=True)
            ):
                warm = None

        def left() -> float:
            return max(0.2, policy.time_limit_s - (time.perf_counter() - started))

        schedulable = sum(1 for n in sub.nodes if n.schedulable)
        tiny = schedulable <= SMALL_NODES and len(sub.jobs) <= SMALL_JOBS
        if (
            lp.num_cols <= DIRECT_COLUMNS
            and not formulation.escapes
            and (not options.keep_all or tiny)
        ):
            # Small enough to solve outright (a small instance's incremental solve too): its
            # MIP bound is the bound; relax-and-fix would report the LP relaxation's, a
            # "gap" of 20-30% on a plan that is optimal.
            limits = SolveLimits(left(), policy.gap_tolerance, node_limit=policy.node_limit)
            # Its MIP bound is the solve's: level by level only where the weights are
            # lexicographic, so that the bound with level 1 held bounds the one objective.
            outright = self._level1 if weights(sub).lexicographic else ()
            solution = self._run(closed, limits, warm, outright)
            bound = solution.bound
            if bound is None and outright and self._in_time(left, self._reserve):
                # Level 1 not proved: the weighted objective's LP relaxation bounds the solve.
                bound = self._run(formulation.lp, SolveLimits(left(), 0.0, relax=True)).bound
            if warm is not None and (
                solution.objective is None or closed.objective(warm) > solution.objective + EPS
            ):
                # A solver may stop within its gap below the start it was given: keep the start.
                solution = replace(self._warm_only(formulation, warm, solution.status), bound=bound)
        else:
            solution, bound = self._relax_and_fix(
                formulation, closed, warm, left, policy.gap_tolerance
            )
        self._mark("solve")
        outcomes: tuple[JobOutcome, ...] | None = None
        if solution.values is not None:
            orders = 1 if options.keep_all else len(PACKING_ORDERS)
            packed, score = best_realisation(
                sub,
                formulation,
                solution.values,
                orders,
                self._template,
                reclaimed=frozenset(victim for victim, _ in forced),
            )
            self._mark("realise")
            if (
                solution.objective is not None
                and score < solution.objective - EPS
                and sum(1 for n in sub.nodes if n.schedulable) <= EXACT_NODES
                and not formulation.small
                and self._in_time(left, RESERVE_S / 4)
            ):
                exact = self._disaggregate(
                    sub, greedy_sub, options, formulation, solution.values, left
                )
                if exact is not None and plan_objective(sub, exact) > score:
                    packed = exact
                self._mark("per-node packing")
            # Small instances only: on larger ones (S: 64 nodes) the pass took 1-3 s and
            # found a tighter plan in one of three seeds, by 0.4% of the cost.
            if (
                formulation.small
                and not options.keep_all
                and _has_gangs(sub, packed)
                and self._in_time(left, RESERVE_S / 4)
            ):
                packed = self._tighten(
                    sub, greedy_sub, options, formulation, solution.values, packed, left
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
            instance, greedy, formulation, solution, outcomes, bound, warm is not None, started
        )

    def _tighten(
        self,
        sub: PlacementInstance,
        greedy_sub: PlacementPlan,
        options: BuildOptions,
        formulation: Formulation,
        values: tuple[float, ...],
        packed: tuple[JobOutcome, ...],
        left: Callable[[], float],
    ) -> tuple[JobOutcome, ...]:
        """The second criterion: the same jobs, flavors and replica counts, packed by the
        per-node model whose objective also charges every domain a gang uses per level
        (topology.py); taken when it scores as well and spans less."""
        tighter = self._disaggregate(
            sub, greedy_sub, options, formulation, values, left, compactness=True
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
        formulation: Formulation,
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
            cv = formulation.jobs.get(key)
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
        node_limit = sub.policy.node_limit
        limits = SolveLimits(max(0.2, left() - RESERVE_S / 2), 0.0, node_limit=node_limit)
        solution = self._run(fixed, limits)
        if solution.values is None:
            return None
        return realise(sub, exact, solution.values, 1, follow=True)

    def _relax_and_fix(
        self,
        formulation: Formulation,
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
        relaxed = self._run(formulation.lp, SolveLimits(left(), 0.0, relax=True))
        self._mark("relaxation")
        bound = relaxed.bound
        if relaxed.values is None:
            return self._warm_only(formulation, warm, "error"), bound
        lp_values = relaxed.values
        best = self._warm_only(formulation, warm, "feasible")

        # Packing the counts onto nodes loses some of the model's value: leave room for it.
        target = None if bound is None else bound - gap * PACKING_SHARE * max(abs(bound), EPS)

        def short_of_gap() -> bool:
            return best.objective is None or (target is not None and best.objective < target)

        def improve(mode: str, share: float, loose: set[str] | None = None) -> bool:
            nonlocal best
            incumbent = best.values if mode != "rens" else None
            sub = self._fix_and_solve(
                formulation, closed, lp_values, incumbent, mode, left, gap, share, target, loose
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
            if best.values is None or not short_of_gap():
                return False
            if not self._in_time(left, self._reserve + margin):
                return False
            short = _short_of_nominal(formulation, lp_values, best.values, tried)
            if short is None:
                return False
            tried.append(short[0])
            improve("quota", QUOTA_TIME_SHARE, short[1])
            return True

        quota()
        filled = (
            short_of_gap() and self._in_time(left, self._reserve + margin) and improve("fill", 1.0)
        )
        if short_of_gap() and not filled and self._in_time(left, self._reserve + margin):
            improve("support", 0.85)
        rounds = 0
        while (
            best.values is not None
            and short_of_gap()
            and rounds < 3
            and self._in_time(left, self._reserve + 2 * margin)
        ):
            rounds += 1
            if not improve("rins", 1.0):
                break
        while quota():
            pass
        return best, bound

    def _fix_and_solve(
        self,
        formulation: Formulation,
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
        hot = _contested_classes(formulation, lp_values) if mode == "support" else set()
        # Under a cap on moves the LP spreads its moves thinly over many jobs: a job it
        # fixes where those part-moves make room would need more whole moves than the cap.
        moving = (
            _moving_classes(formulation, lp_values)
            if formulation.move_cap and mode in ("rens", "fill")
            else None
        )
        for jv in formulation.jobs.values():
            cols = job_columns(jv)
            if mode == "quota":
                settled = jv.job.key not in (loose or ())
            elif mode in ("rens", "fill"):
                settled = all(abs(lp_values[c] - round(lp_values[c])) <= INTEGRAL for c in cols)
                settled = settled and not any(lp_values[c] > INTEGRAL for c in jv.escapes)
                if mode == "fill" and settled and _filler(jv, lp_values):
                    settled = False
                if settled and moving is not None and _on_moving(jv, lp_values, *moving):
                    settled = False
            elif mode == "support":
                settled = all(lp_values[c] <= INTEGRAL for c in cols + jv.escapes) or (
                    jv.keep >= 0
                    and lp_values[jv.keep] >= 1 - INTEGRAL
                    and not any(
                        formulation.node_class.get(r.node) in hot
                        for r in formulation.running[jv.job.key].placement.replicas
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
        fix_settled_aux(formulation, lower, upper)
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
        seconds = max(0.2, left() - self._reserve - margin)  # the backstop
        node_limit = max(1, round(self._node_limit * share))  # what decides
        # A plan as good as the search asks for ends the solve (HiGHS; CBC has no such stop).
        # Not in the quota neighbourhood: there HiGHS dropped the start plan, worse than the
        # target, and found nothing as good in the time (bench synth L: no user solution in
        # its log), where without the target it starts from it.
        extra = () if enough is None or mode == "quota" else (("objective_target", enough),)
        limits = SolveLimits(
            seconds,
            gap / 4 if mode in ("support", "fill", "quota") else gap,
            node_limit=node_limit,
            extra=extra,
        )
        return self._run(closed.with_bounds(lower, upper), limits, incumbent, self._level1)

    def _mark(self, phase: str) -> None:
        now = time.perf_counter()
        self._phases.append((phase, round(now - self._split, 3)))
        self._split = now

    @staticmethod
    def _warm_only(
        formulation: Formulation, warm: list[float] | None, status: str
    ) -> LinearSolution:
        values = tuple(warm) if warm is not None else None
        return LinearSolution(
            status="feasible" if values is not None else status,
            values=values,
            objective=formulation.lp.objective(values) if values is not None else None,
            bound=None,
            seconds=0.0,
            solver="warm",
        )

    def _finish(
        self,
        instance: PlacementInstance,
        greedy: PlacementPlan,
        formulation: Formulation,
        solution: LinearSolution,
        outcomes: tuple[JobOutcome, ...] | None,
        bound: float | None,
        warm_started: bool,
        started: float,
    ) -> PlacementPlan:
        greedy_score = greedy.stats.objective
        if outcomes is not None:
            # The same move rule as greedy's: a move no rule allows is undone (moves.py).
            outcomes = settle_moves(instance, outcomes)
        score = self._score(outcomes) if outcomes is not None else None
        problems = (
            tuple(check_plan(instance, PlacementPlan(outcomes, greedy.stats)))
            + attribution(instance, outcomes).problems
            if outcomes is not None
            else ()
        )
        model_bound = bound
        own_score = score if not problems else None
        greedy_tighter = greedy_less_fragmented = False
        fell_back = (
            outcomes is None or score is None or score < greedy_score - EPS or bool(problems)
        )
        outcomes_found = outcomes is not None
        greedy_earlier = False
        if fell_back or outcomes is None or score is None:
            outcomes, score = greedy.outcomes, greedy_score
        elif score <= greedy_score + EPS and _starts_earlier(instance, greedy.outcomes, outcomes):
            # First among equals: greedy's plan starts the jobs submitted first (wait order,
            # docs/time.md); the objective has no term for it.
            outcomes, score = greedy.outcomes, greedy_score
            greedy_earlier = True
        elif (
            score <= greedy_score + EPS
            and plan_compactness(instance, greedy.outcomes)
            < plan_compactness(instance, outcomes) - EPS
        ):
            # The second criterion: greedy scores as well and its gangs span less.
            outcomes, score = greedy.outcomes, greedy_score
            greedy_tighter = True
        elif _less_fragmented(instance, greedy.outcomes, outcomes):
            # Both run the same: the objective's fragmentation term (per node) is all
            # the MILP gained, and greedy's packing leaves less for the learned shapes.
            outcomes, score = greedy.outcomes, greedy_score
            greedy_less_fragmented = True
        if bound is not None:
            bound = max(bound, score)
        gap = None if bound is None else (bound - score) / max(abs(bound), EPS)
        fallback = ""
        if fell_back:
            fallback = _fallback_reason(solution.status, outcomes_found, problems, own_score)
        elif greedy_less_fragmented:
            fallback = (
                "greedy's plan scores the same but for fragmentation and leaves less "
                "capacity unusable to the learned job shapes"
            )
        elif greedy_tighter:
            fallback = "greedy's plan scores as well and its gangs span fewer domains"
        elif greedy_earlier:
            fallback = "greedy's plan scores as well and starts the jobs submitted first"
        if solution.status == "infeasible":
            status = "infeasible"
        elif self._clock_stopped:
            status = TIME_LIMIT_STATUS  # whatever plan it is, another run may differ
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
            small=formulation.small,
            pruned=len(formulation.pruned),
            phases=tuple(self._phases),
            fixed_jobs=self._rens[0],
            free_jobs=self._rens[1],
            problems=problems,
            model_bound=model_bound,
            milp_objective=own_score,
            greedy_tighter=greedy_tighter,
            greedy_less_fragmented=greedy_less_fragmented,
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
                variables=formulation.lp.num_cols,
                constraints=formulation.lp.num_rows,
                plan_source="greedy"
                if fell_back or greedy_tighter or greedy_less_fragmented or greedy_earlier
                else "milp",
                fallback=fallback,
                levels=instance.policy.levels,
            ),
            broken_soft=broken_soft_constraints(instance, outcomes),
        )


def beyond_reach(instance: PlacementInstance, greedy: PlacementPlan) -> frozenset[str]:
    """Waiting jobs no plan can start, left out of the model: those past the first K of
    their shape (`claim_shape`: the same queue, priority and placement fields), where K
    jobs of the shape would take every GPU of its flavors that is free or held by a running
    job some rule may stop (or whose place went away). Jobs of one shape have the same
    columns and rows and differ in the objective only by their place in wait order
    (objective.wait_order_bonus: the earlier scores higher), so every optimal plan starts
    a prefix of them, never longer than K: the model without the rest has the same optima.
    A backlog of hundreds of alike jobs then costs the model the few that could start.
    They wait for the reason greedy gave (greedy left them pending: only those are left out)."""
    pending = {o.job for o in greedy.outcomes if o.status is OutcomeStatus.PENDING}
    groups: dict[tuple[object, ...], list[Job]] = defaultdict(list)
    for job in sorted(instance.jobs, key=wait_order):
        if job.key in instance.current or job.resources.gpu_milli <= 0:
            continue
        shape = claim_shape(job)
        if shape is not None:
            groups[shape].append(job)
    if not any(len(members) > 1 for members in groups.values()):
        return frozenset()
    jobs = jobs_by_key(instance)
    nodes = {n.name: n for n in instance.nodes}
    queues = {q.name: q for q in instance.queues}
    room: dict[str | None, int] = defaultdict(int)  # milli-GPU per flavor
    for n in instance.nodes:
        if n.schedulable:
            room[n.flavor] += n.gpus * GPU_MILLI
    rights = Rights(instance)
    # What running jobs nobody may stop hold, with the flavors they may use: counted against
    # a shape only when those all are the shape's (a move keeps it within them).
    fixed: list[tuple[frozenset[str | None], int]] = []
    for key in sorted(instance.current):
        runs = jobs.get(key)
        placement = instance.current[key]
        if runs is None or rights.anyone_may(runs):
            continue
        if keep_problem(instance, runs, placement, nodes) is not None:
            continue
        held = sum(
            r.gpu_milli * len(r.gpus)
            for r in placement.replicas
            if r.node in nodes and nodes[r.node].schedulable
        )
        fixed.append((frozenset(eligible_flavors(runs, queues.get(runs.queue))), held))
    out: list[str] = []
    for members in groups.values():
        first = members[0]
        flavors = frozenset(eligible_flavors(first, queues.get(first.queue)))
        avail = sum(room[f] for f in flavors) - sum(h for fl, h in fixed if fl <= flavors)
        reach = max(0, avail) // (first.smallest_gang * first.resources.gpu_milli)
        out.extend(j.key for j in members[reach:] if j.key in pending)
    return frozenset(out)


def _starts_earlier(
    instance: PlacementInstance,
    greedy: tuple[JobOutcome, ...],
    outcomes: tuple[JobOutcome, ...],
) -> bool:
    """Whether the first job, in wait order, that one plan starts and the other does not is
    greedy's."""
    placed = OutcomeStatus.PLACED
    mine = {o.job for o in greedy if o.status is placed}
    theirs = {o.job for o in outcomes if o.status is placed}
    differ = mine ^ theirs
    if not differ:
        return False
    jobs = jobs_by_key(instance)
    return min(differ, key=lambda key: priority_key(jobs[key])) in mine


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


def _same_but_fragmentation(
    instance: PlacementInstance, first: tuple[JobOutcome, ...], second: tuple[JobOutcome, ...]
) -> bool:
    """Whether two plans score the same on every term of the objective but fragmentation:
    the same GPUs run (in and beyond nominal quota, per priority), moved, stopped, shared
    and spread."""
    a, b = objective_terms(instance, first), objective_terms(instance, second)
    pairs = (
        (a.value, b.value),
        (a.nominal_bonus, b.nominal_bonus),
        (a.moves, b.moves),
        (a.preemptions, b.preemptions),
        (a.fairness, b.fairness),
        (a.topology, b.topology),
        (a.wait_order, b.wait_order),
    )
    return all(abs(x - y) <= _noise(max(abs(x), abs(y))) for x, y in pairs)


def _noise(score: float) -> float:
    """What summing a plan's terms in another order may change a term by."""
    return EPS + 1e-9 * abs(score)


def _less_fragmented(
    instance: PlacementInstance, greedy: tuple[JobOutcome, ...], milp: tuple[JobOutcome, ...]
) -> bool:
    """Whether greedy's plan scores what the MILP's does on every term but fragmentation
    and leaves less of the nodes either plan placed on unusable to the workload's learned
    job shapes (FGD's measure plus stranded GPU, as greedy places by:
    engine.placement.fragmentation). The objective's fragmentation term counts per node;
    over a stream of commits the learned measure is the one that keeps room for the pods
    that come (openb batch, issue #13)."""
    scorer = NodeScorer.of(instance)
    if scorer is None or any(j.topology is not None for j in instance.jobs):
        return False
    if not _same_but_fragmentation(instance, greedy, milp):
        return False
    return _shape_fragmentation(instance, scorer, greedy, milp) < -EPS


def _shape_fragmentation(
    instance: PlacementInstance,
    scorer: NodeScorer,
    first: tuple[JobOutcome, ...],
    second: tuple[JobOutcome, ...],
) -> float:
    """The learned measure of `first` minus that of `second`, over the nodes where either
    places a job anew (elsewhere they agree: both keep what runs)."""
    touched = sorted(
        {
            r.node
            for o in (*first, *second)
            if o.status in (OutcomeStatus.PLACED, OutcomeStatus.MOVED)
            for r in o.replicas
        }
    )
    nodes = {n.name: n for n in instance.nodes}
    jobs = {j.key: j for j in instance.jobs}

    def measure(outcomes: tuple[JobOutcome, ...]) -> float:
        free = {name: NodeFree.of(nodes[name]) for name in touched if name in nodes}
        for o in outcomes:
            if not o.running or o.job not in jobs:
                continue
            r = jobs[o.job].resources
            for replica in o.replicas:
                node = free.get(replica.node)
                if node is None:
                    continue
                for g in replica.gpus:
                    node.gpu_free[g] -= replica.gpu_milli
                node.cpu_free -= r.cpu_milli
                node.memory_free -= r.memory_mib
        total = 0.0
        for node in free.values():
            gpus = tuple(sorted(node.gpu_free))
            total += scorer.fragmentation(
                node.node.flavor, gpus, node.cpu_free, node.memory_free
            ) + scorer.stranded(sum(gpus), node.cpu_free, node.memory_free)
        return total

    return measure(first) - measure(second)


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


def fix_settled_aux(formulation: Formulation, lower: list[float], upper: list[float]) -> None:
    """Fix the auxiliary columns (blocked slots, touched nodes, borrowed and nominal use ...)
    whose terms are all fixed, at the value they then take in every optimal solution, so
    that the solver gets only what is left to decide."""
    for col, terms, const, kind, param in formulation.aux:
        if any(lower[c] != upper[c] for c, _ in terms):
            continue
        value = aux_value(kind, terms, const, param, lower, lower[col])
        if lower[col] - INTEGRAL <= value <= upper[col] + INTEGRAL:
            lower[col] = upper[col] = value


def _short_of_nominal(
    formulation: Formulation,
    lp_values: tuple[float, ...],
    incumbent: tuple[float, ...],
    tried: Collection[int],
) -> tuple[int, set[str]] | None:
    """The priority class, of those not `tried`, whose nominal quotas the incumbent fills
    furthest short of the LP's (in the objective's value), and its jobs in the queues where
    it falls short; None where no class falls short."""
    lost: dict[tuple[str, str, int], float] = {}
    for col, where in formulation.nominal.items():
        lost[where] = formulation.lp.col_cost[col] * (lp_values[col] - incumbent[col])
    by_priority: dict[int, float] = defaultdict(float)
    for (_, _, p), v in lost.items():
        if p not in tried:
            by_priority[p] += max(0.0, v)
    if not by_priority or max(by_priority.values()) <= 0:
        return None
    top = max(sorted(by_priority), key=lambda p: by_priority[p])
    queues = {q for (q, _, p), v in lost.items() if p == top and v > 0}
    return top, {
        key
        for key, jv in formulation.jobs.items()
        if jv.job.priority == top and jv.job.queue in queues
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


def _moving_classes(
    formulation: Formulation, lp_values: tuple[float, ...]
) -> tuple[set[int], set[int]]:
    """Fine and coarse classes where the LP moves part of a running job away."""
    fine: set[int] = set()
    for key, jv in formulation.jobs.items():
        if jv.keep < 0 or not INTEGRAL < lp_values[jv.keep] < 1 - INTEGRAL:
            continue
        for r in formulation.running[key].placement.replicas:
            cid = formulation.node_class.get(r.node)
            if cid is not None:
                fine.add(cid)
    return fine, {formulation.classes[cid].coarse for cid in fine}


def _on_moving(jv: JobVars, lp_values: tuple[float, ...], fine: set[int], coarse: set[int]) -> bool:
    """Whether the LP puts some of the job where it moves part of a running job away."""
    return any(lp_values[c] > INTEGRAL for cid, c in jv.per_class.items() if cid in fine) or any(
        lp_values[c] > INTEGRAL for kid, c in jv.per_coarse.items() if kid in coarse
    )


def _contested_classes(formulation: Formulation, lp_values: tuple[float, ...]) -> set[int]:
    """Fine classes where the LP runs part of a job: the running jobs there may have to make
    room for the whole of it."""
    hot: set[int] = set()
    domains: set[str] = set()
    for jv in formulation.jobs.values():
        if jv.place < 0 or not INTEGRAL < lp_values[jv.place] < 1 - INTEGRAL:
            continue
        hot.update(cid for cid, c in jv.per_class.items() if lp_values[c] > INTEGRAL)
        domains.update(d for (_, d), c in jv.domain.items() if lp_values[c] > INTEGRAL)
    if domains:
        hot.update(cls.id for cls in formulation.classes if domains & set(cls.domains.values()))
    return hot


def reclaims(plan: PlacementPlan) -> tuple[tuple[str, str], ...]:
    """(victim, claimant) of every reclaim in a plan that applies the rules' victim choice
    (greedy's): what the MILP must do too."""
    return tuple(
        (o.job, o.preempted_by)
        for o in plan.outcomes
        if o.status is OutcomeStatus.PREEMPTED and o.rule == Rule.RECLAIM and o.preempted_by
    )


def fix_reclaims(
    formulation: Formulation,
    forced: Sequence[tuple[str, str]],
    lower: list[float],
    upper: list[float],
) -> bool:
    """Fix in the model the reclaims the rules require (docs/quotas-and-preemption.md:
    reclaim comes before waiting and before preempting the own queue): each victim stops,
    each claimant runs. The objective weighs priority within nominal quota, which reclaim
    with `Any` ignores; the rules decide reclaim, the MILP the rest. Whether it fixed any."""
    fixed = False
    for victim, claimant in forced:
        v, c = formulation.jobs.get(victim), formulation.jobs.get(claimant)
        if v is None or c is None or c.place < 0:
            continue
        for col in (v.keep, v.place):
            if col >= 0:
                lower[col] = upper[col] = 0.0
        lower[c.place] = upper[c.place] = 1.0
        fixed = True
    return fixed
