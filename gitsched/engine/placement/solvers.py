"""Solver selection by name. The one module that knows every solver.

A MILP that fails outright (its library missing or failing, out of memory, or one of our
typed errors) is answered with the greedy plan, and the plan says so (SolveStats.fallback):
a commit is always decided. Anything else (a KeyError or TypeError in our formulation) is a
bug in gitsched and propagates: it must not hide behind a plan that looks merely greedy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from gitsched.engine.errors import PermanentError, SolverFailed, TemporaryError, UsageError
from gitsched.engine.placement.decompose import DecomposedPlacer, should_decompose
from gitsched.engine.placement.explain import tell_never_runs
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.plan import PlacementInstance, PlacementPlan, Placer
from gitsched.engine.placement.preemption import borrowing_reclaimable
from gitsched.engine.placement.reservations import with_reservations
from gitsched.engine.placement.strict_fifo import with_strict_fifo

SOLVERS: dict[str, Placer] = {
    "greedy": GreedyPlacer(),
    "highs": MilpPlacer("highs"),
    "cbc": MilpPlacer("cbc"),
    "cpsat": MilpPlacer("cpsat"),
}
# The same MILP backends over parts, for instances above decompose.DECOMPOSE_NODES (kept
# here, like SOLVERS, so a benchmark can read the last solve's report).
DECOMPOSED: dict[str, DecomposedPlacer] = {
    "highs": DecomposedPlacer("highs"),
    "cbc": DecomposedPlacer("cbc"),
    "cpsat": DecomposedPlacer("cpsat"),
}

# What a MILP solve may legitimately fail with. The libraries' own errors reach us as
# SolverFailed (engine.placement.linear wraps them where it calls highspy, PuLP and
# OR-Tools); a
# MemoryError may come from the solver (pybind11's std::bad_alloc) or from building a
# model too large; Permanent/TemporaryError are our typed errors, raised on purpose.
SOLVER_FAILURES: tuple[type[Exception], ...] = (
    SolverFailed,
    MemoryError,
    PermanentError,
    TemporaryError,
)


def placer(name: str) -> Placer:
    try:
        return SOLVERS[name]
    except KeyError:
        raise UsageError(f"unknown solver {name!r}; known: {', '.join(sorted(SOLVERS))}") from None


def solve(instance: PlacementInstance, solver: str | None = None) -> PlacementPlan:
    """The plan of the instance; a MILP solver on a very large instance solves it in parts
    (engine.placement.decompose). A MILP that fails falls back to greedy's plan. Every
    solver decides under the Policy's reservations (engine.placement.reservations) and the
    queues' StrictFIFO (engine.placement.strict_fifo), and a job that can never run says so
    (explain.tell_never_runs)."""
    plan = with_strict_fifo(
        instance, lambda part: with_reservations(part, lambda p: _solve(p, solver))
    )
    assert plan is not None
    return tell_never_runs(instance, plan)


def _solve(instance: PlacementInstance, solver: str | None) -> PlacementPlan:
    chosen = placer(solver or instance.policy.solver)
    instance = borrowing_reclaimable(instance)
    if not isinstance(chosen, MilpPlacer):
        return chosen.solve(instance)
    try:
        if should_decompose(instance):
            return DECOMPOSED[chosen.backend].solve(instance)
        return chosen.solve(instance)
    except SOLVER_FAILURES as e:  # the commit is still decided
        return greedy_fallback(instance, chosen.name, e)


def solve_changed(
    instance: PlacementInstance, changed: Collection[str], solver: str | None = None
) -> PlacementPlan | None:
    """An incremental solve: only the `changed` jobs (and what they may preempt) are
    decided, every other job runs or waits on. None for a solver without one (greedy
    re-places everything, and costs little doing it)."""
    if not isinstance(placer(solver or instance.policy.solver), MilpPlacer):
        return None  # before the reservations are worked out: `solve` works them out

    def part_solve(part: PlacementInstance) -> PlacementPlan | None:
        if part is instance:
            return _solve_changed(part, changed, solver)
        kept = {j.key for j in part.jobs}
        return _solve_changed(part, [k for k in changed if k in kept], solver)

    plan = with_strict_fifo(instance, lambda part: with_reservations(part, part_solve))
    return tell_never_runs(instance, plan) if plan is not None else None


def _solve_changed(
    instance: PlacementInstance, changed: Collection[str], solver: str | None
) -> PlacementPlan | None:
    chosen = placer(solver or instance.policy.solver)
    instance = borrowing_reclaimable(instance)
    if isinstance(chosen, MilpPlacer):
        try:
            if should_decompose(instance):
                return DECOMPOSED[chosen.backend].solve_incremental(instance, changed)
            return chosen.solve_incremental(instance, changed)
        except SOLVER_FAILURES as e:  # the commit is still decided
            return greedy_fallback(instance, chosen.name, e)
    return None


def greedy_fallback(instance: PlacementInstance, solver: str, error: Exception) -> PlacementPlan:
    """Greedy's plan for a MILP that failed, recorded as the MILP's solve that fell back."""
    plan = GreedyPlacer().solve(instance)
    why = f"the {solver} solver failed: {type(error).__name__}: {error}"
    stats = dataclasses.replace(plan.stats, solver=solver, fallback=why[:300])
    return dataclasses.replace(plan, stats=stats)
