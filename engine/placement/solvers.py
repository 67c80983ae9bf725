"""Solver selection by name. The one module that knows every solver."""

from __future__ import annotations

from engine.errors import UsageError
from engine.placement.greedy import GreedyPlacer
from engine.placement.milp import MilpPlacer
from engine.placement.plan import PlacementInstance, PlacementPlan, Placer

SOLVERS: dict[str, Placer] = {
    "greedy": GreedyPlacer(),
    "highs": MilpPlacer("highs"),
    "cbc": MilpPlacer("cbc"),
}


def placer(name: str) -> Placer:
    try:
        return SOLVERS[name]
    except KeyError:
        raise UsageError(f"unknown solver {name!r}; known: {', '.join(sorted(SOLVERS))}") from None


def solve(instance: PlacementInstance, solver: str | None = None) -> PlacementPlan:
    return placer(solver or instance.policy.solver).solve(instance)
