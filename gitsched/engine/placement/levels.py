"""The lexicographic objective solved level by level (Policy `solver.levels: sequential`).

The formulation's objective is one weighted sum whose level 1 (GPUs within nominal quota,
by priority: `Formulation.nominal`) outweighs everything below it. Here the same model is
solved twice by the same engine: first for level 1 alone, then for the whole weighted
objective with level 1 held at the value the first solve reached (a row added to the
model: no rule is written twice, and every engine takes it). The node budget, the one
deterministic stop, is split between the two solves; the wall clock stays a backstop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from gitsched.engine.placement.linear import LinearModel, LinearSolution, SolveLimits, solve

LEVELS = ("weighted", "sequential")
# Level 1 gets this share of the node budget (and of the backstop); the rest of the
# objective gets what is left.
LEVEL1_SHARE = 0.5
# Level 1 is held at `>= value - tolerance`, never `== value`: the second solve may still
# raise level 1 when the first stopped short of its optimum (its budget), so the levels'
# values only go up. The tolerance absorbs the engines' row feasibility (HiGHS: 1e-7
# absolute), far below one replica's step of level 1. CP-SAT takes the row in integers,
# rounded outward finely enough that the first solve's plan meets it (linear.integer_model;
# at 2^20 of its largest coefficient it did not: tests/unit/test_levels.py).
LEVEL1_RELATIVE_TOLERANCE = 1e-8
LEVEL1_ABSOLUTE_TOLERANCE = 1e-6
LEVEL1_ROW = "levels__nominal"


def level_value(model: LinearModel, level: Sequence[int], values: Sequence[float]) -> float:
    """The level's part of the objective at `values` (its columns' costs only)."""
    return sum(model.col_cost[c] * values[c] for c in level)


def level1_tolerance(value: float) -> float:
    return LEVEL1_ABSOLUTE_TOLERANCE + LEVEL1_RELATIVE_TOLERANCE * abs(value)


def only_level(model: LinearModel, level: Sequence[int]) -> LinearModel:
    """The same rows and bounds, the objective of `level`'s columns alone."""
    cost = [0.0] * model.num_cols
    for c in level:
        cost[c] = model.col_cost[c]
    return LinearModel(
        model.col_names,
        model.col_lower,
        model.col_upper,
        cost,
        model.col_integer,
        model.row_names,
        model.row_lower,
        model.row_upper,
        model.row_index,
        model.row_value,
        0.0,
        model._flat,
    )


def holding_level(model: LinearModel, level: Sequence[int], at_least: float) -> LinearModel:
    """The model with one more row: `level`'s part of the objective >= `at_least`. The rows
    are copied (the model's lists are shared by its `with_bounds` siblings); the flattened
    matrix is extended, not rebuilt."""
    terms = [(c, model.col_cost[c]) for c in level if model.col_cost[c]]
    held = LinearModel(
        model.col_names,
        model.col_lower,
        model.col_upper,
        model.col_cost,
        model.col_integer,
        list(model.row_names),
        list(model.row_lower),
        list(model.row_upper),
        list(model.row_index),
        list(model.row_value),
        model.offset,
    )
    if model.num_rows:
        import numpy as np

        starts, index, value = model.flat_rows()
        held.row(LEVEL1_ROW, terms, lower=at_least)
        if held.num_rows == model.num_rows + 1:
            held._flat[:] = [
                (
                    np.append(starts, starts[-1] + len(held.row_index[-1])),
                    np.concatenate([index, np.asarray(held.row_index[-1], dtype=index.dtype)]),
                    np.concatenate([value, np.asarray(held.row_value[-1], dtype=value.dtype)]),
                )
            ]
    else:
        held.row(LEVEL1_ROW, terms, lower=at_least)
    return held


def solve_levels(
    model: LinearModel,
    solver: str,
    limits: SolveLimits,
    warm: Sequence[float] | None,
    level1: Sequence[int],
) -> LinearSolution:
    """Level 1 alone, then the weighted objective with level 1 held where the first solve
    left it. The answer is scored by `model`'s own objective. Its bound is the second solve's
    when the first proved level 1 optimal (then no plan of a lower level 1 outweighs those
    the second solve searched: the weights are lexicographic, objective.weights), else none:
    the caller needs a bound of its own then."""
    priced = [c for c in level1 if model.col_cost[c]]
    if not priced or limits.relax:
        return solve(model, solver, limits, warm)
    nodes = limits.node_limit
    first_nodes = None if nodes is None else max(1, math.ceil(nodes * LEVEL1_SHARE))
    # HiGHS's objective target is in the weighted objective's units: not level 1's.
    first_extra = tuple((k, v) for k, v in limits.extra if k != "objective_target")
    first = solve(
        only_level(model, priced),
        solver,
        replace(
            limits,
            time_limit_s=limits.time_limit_s * LEVEL1_SHARE,
            node_limit=first_nodes,
            extra=first_extra,
        ),
        warm,
    )
    start = first.values if first.values is not None else warm
    if start is None:
        # No plan of level 1: the whole objective, with what is left of the budget.
        second = solve(model, solver, _rest(limits, first, first_nodes), None)
        return replace(
            second,
            bound=None,
            seconds=first.seconds + second.seconds,
            clock_stopped=first.clock_stopped or second.clock_stopped,
        )
    reached = level_value(model, priced, start)
    held = holding_level(model, priced, reached - level1_tolerance(reached))
    second = solve(held, solver, _rest(limits, first, first_nodes), start)
    values = second.values
    if values is None or model.objective(values) < model.objective(start):
        values = tuple(start)
    # Level 1 is proved when its engine says optimal: optimal within the solve's gap, the
    # same standard a weighted solve's status has (CBC through PuLP reports no dual bound,
    # only that).
    proved = first.status == "optimal"
    return LinearSolution(
        status=second.status if second.values is not None and proved else "feasible",
        values=values,
        objective=model.objective(values),
        bound=second.bound if proved and second.bound is not None else None,
        seconds=first.seconds + second.seconds,
        solver=solver,
        clock_stopped=first.clock_stopped or second.clock_stopped,
    )


def _rest(limits: SolveLimits, first: LinearSolution, first_nodes: int | None) -> SolveLimits:
    nodes = limits.node_limit
    return replace(
        limits,
        time_limit_s=max(0.2, limits.time_limit_s - first.seconds),
        node_limit=None if nodes is None or first_nodes is None else max(1, nodes - first_nodes),
    )
