"""Solver selection by name. The one module that knows every solver."""

from __future__ import annotations

from collections.abc import Collection

from engine.errors import UsageError
from engine.placement.decompose import DecomposedPlacer, should_decompose
from engine.placement.greedy import GreedyPlacer
from engine.placement.milp import MilpPlacer
from engine.placement.plan import PlacementInstance, PlacementPlan, Placer

SOLVERS: dict[str, Placer] = {
    "greedy": GreedyPlacer(),
    "highs": MilpPlacer("highs"),
    "cbc": MilpPlacer("cbc"),
}
# The same MILP backends over parts, for instances above decompose.DECOMPOSE_NODES (kept
# here, like SOLVERS, so a benchmark can read the last solve's report).
DECOMPOSED: dict[str, DecomposedPlacer] = {
    "highs": DecomposedPlacer("highs"),
    "cbc": DecomposedPlacer("cbc"),
}


def placer(name: str) -> Placer:
    try:
        return SOLVERS[name]
    except KeyError:
        raise UsageError(f"unknown solver {name!r}; known: {', '.join(sorted(SOLVERS))}") from None


def solve(instance: PlacementInstance, solver: str | None = None) -> PlacementPlan:
    """The plan of the instance; a MILP solver on a very large instance solves it in parts
    (engine.placement.decompose)."""
    chosen = placer(solver or instance.policy.solver)
    if isinstance(chosen, MilpPlacer) and should_decompose(instance):
        return DECOMPOSED[chosen.backend].solve(instance)
    return chosen.solve(instance)


def solve_changed(
    instance: PlacementInstance, changed: Collection[str], solver: str | None = None
) -> PlacementPlan | None:
    """An incremental solve: only the `changed` jobs (and what they may preempt) are
    decided, every other job runs or waits on. None for a solver without one (greedy
    re-places everything, and costs little doing it)."""
    chosen = placer(solver or instance.policy.solver)
    if isinstance(chosen, MilpPlacer) and should_decompose(instance):
        return DECOMPOSED[chosen.backend].solve_incremental(instance, changed)
    if isinstance(chosen, MilpPlacer):
        return chosen.solve_incremental(instance, changed)
    return None
