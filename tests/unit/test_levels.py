"""The lexicographic objective level by level (`solver.levels: sequential`, levels.py): level 1
is solved first and held, the node budget is split, and the plan keeps every rule."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.engine.model import Policy
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.levels import (
    LEVEL1_ROW,
    holding_level,
    level1_tolerance,
    level_value,
    solve_levels,
)
from gitsched.engine.placement.linear import LinearModel, SolveLimits, integer_model, solve
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.objective import plan_objective, weights
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.reconciler.specs import policy_of
from gitsched.simulation.synth import synth_instance, with_new_jobs
from tests.support.factories import instance, job, node, queue


def subset_sum(seed: int, items: int = 25) -> tuple[LinearModel, list[int], int]:
    """Level 1 as the formulation writes it: a nominal column worth W per GPU, at most the
    quota and at most what the chosen jobs use (a subset sum); level 2 a small value per job."""
    rng = random.Random(seed)
    m = LinearModel()
    sizes = [rng.randint(1000, 9999) for _ in range(items)]
    xs = [m.var(f"x{i}", 0, 1, cost=rng.uniform(0.0, 1.0)) for i in range(items)]
    quota = sum(sizes) // 2 + 1
    nominal = m.var("nominal", 0, quota, cost=1000.0, integer=False)
    m.row("capacity", list(zip(xs, sizes, strict=True)), upper=quota)
    m.row("min", [(nominal, 1.0), *((x, -s) for x, s in zip(xs, sizes, strict=True))], upper=0)
    return m, [nominal], quota


def test_level_1_first_reaches_the_subset_sum_the_weighted_objective_misses() -> None:
    """Seed 2: one node of budget. The weighted objective stops 38 GPUs short of the quota;
    level 1 alone fills it exactly (the quota is its bound: optimal), and the second solve
    keeps it."""
    m, level1, quota = subset_sum(2)
    limits = SolveLimits(time_limit_s=600.0, gap=0.0, node_limit=1)
    weighted = solve(m, "highs", limits)
    sequential = solve_levels(m, "highs", limits, None, level1)
    assert weighted.values is not None and sequential.values is not None
    assert level_value(m, level1, weighted.values) < 1000.0 * quota - 1.0
    assert level_value(m, level1, sequential.values) == pytest.approx(1000.0 * quota)
    assert sequential.objective is not None and weighted.objective is not None
    assert sequential.objective > weighted.objective
    assert not sequential.clock_stopped


@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
@pytest.mark.parametrize("seed", [0, 3, 5])
def test_level_1_never_drops_below_the_start_and_the_answer_is_scored_whole(
    backend: str, seed: int
) -> None:
    m, level1, _ = subset_sum(seed, items=12)
    warm = [0.0] * m.num_cols
    warm[0] = 1.0
    warm[level1[0]] = m.row_value[0][0]  # the first job alone, its GPUs in quota
    assert m.violations(warm) == []
    limits = SolveLimits(time_limit_s=600.0, gap=0.0, node_limit=2)
    got = solve_levels(m, backend, limits, warm, level1)
    assert got.values is not None and got.objective is not None
    assert m.violations(got.values, tol=1e-5) == []
    assert level_value(m, level1, got.values) >= level_value(m, level1, warm) - 1e-6
    assert got.objective == pytest.approx(m.objective(got.values))
    assert got.objective >= m.objective(warm) - 1e-6


def test_the_held_row_is_the_level_and_the_model_is_left_as_it_was() -> None:
    m, level1, _ = subset_sum(1, items=6)
    rows, flat = m.num_rows, m.flat_rows()
    held = holding_level(m, level1, 5000.0)
    assert m.num_rows == rows and m.flat_rows()[0] is flat[0]  # shared lists untouched
    assert held.row_names[-1] == LEVEL1_ROW
    assert held.row_index[-1] == level1 and held.row_value[-1] == [1000.0]
    assert held.row_lower[-1] == 5000.0
    starts, index, value = held.flat_rows()
    assert len(starts) == rows + 2 and list(index[starts[-2] :]) == level1
    assert list(value[starts[-2] :]) == [1000.0]
    assert level1_tolerance(1e8) < 1000.0  # far below one GPU's step of level 1


def held_at_start(
    weights: list[float], quotas: list[int], used: list[int]
) -> tuple[LinearModel, list[float]]:
    """Level 1 as the formulation writes it (a nominal column per priority class, continuous,
    in GPUs, worth a weight that is no round number), held at the value of a plan that uses
    `used` milli-GPUs of each class."""
    m = LinearModel()
    cols = [
        m.var(f"nominal__q__h100__{i}", 0, quota, cost=w, integer=False)
        for i, (w, quota) in enumerate(zip(weights, quotas, strict=True))
    ]
    start = [u / 1000 for u in used]
    reached = level_value(m, cols, start)
    return holding_level(m, cols, reached - level1_tolerance(reached)), start


def held_row_admits(held: LinearModel, start: list[float]) -> bool:
    """Whether CP-SAT's integer model of the held row admits the plan it holds."""
    im = integer_model(held)
    (row,) = [r for r in im.rows if r.name == LEVEL1_ROW]
    y = [round(v * s) for v, s in zip(start, im.scale, strict=True)]
    assert row.lower is not None
    return sum(c * y[j] for j, c in zip(row.index, row.coef, strict=True)) >= row.lower


def test_cpsat_takes_the_held_row_so_that_the_plan_it_holds_meets_it() -> None:
    """The reclaim scenario's level 1 (tests/acceptance/test_reclaim.py): CP-SAT rounded the
    held row's coefficients down at 2^20 of the largest, which took 0.0045 from level 1's
    value, 112 times the tolerance: no plan with level 1 at its optimum was left, the second
    solve was infeasible, and the plan of level 1 alone was kept. Now the row is rounded
    finely enough to be exact to its slack, and CP-SAT's bound is a bound."""
    weights = [592.8663228788859, 195.3366686036328, 196.31335194665098]
    held, start = held_at_start(weights, [8, 8, 16], [0, 4000, 16000])
    assert held.violations(start) == []
    assert held_row_admits(held, start)
    assert integer_model(held).exact
    limits = SolveLimits(time_limit_s=600.0, gap=0.0, node_limit=100)
    answer = solve(held, "cpsat", limits, start)
    assert answer.status == "optimal" and answer.bound is not None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(1.0, 1e4, allow_nan=False),  # a priority class's weight
            st.integers(1, 512),  # its nominal quota, GPUs
            st.floats(0.0, 1.0, allow_nan=False),  # the share of it the plan uses
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_held_row_admits_the_plan_it_holds_in_cpsats_integers(
    classes: list[tuple[float, int, float]],
) -> None:
    weights = [w for w, _, _ in classes]
    quotas = [q for _, q, _ in classes]
    used = [round(q * 1000 * share) for _, q, share in classes]
    held, start = held_at_start(weights, quotas, used)
    assert held_row_admits(held, start)


def test_the_policy_names_the_mode_and_the_default_is_one_weighted_objective() -> None:
    assert Policy().levels == "weighted"
    assert policy_of({"solver": {"name": "highs", "levels": "sequential"}}).levels == "sequential"


def test_synth_s_weights_are_spaced_so_its_outright_solve_stays_one_weighted_objective() -> None:
    """Synth's levels do not fit WEIGHT_RANGE: a level no longer outweighs all below it, the
    bound of a solve with level 1 held would not bound the one objective, and the outright
    solve (whose MIP bound is the solve's) stays weighted: the same plan and bound."""
    policy = Policy(solver="highs", time_limit_s=600.0, gap_tolerance=0.0, node_limit=20)
    inst = synth_instance("S", 1, policy)
    assert not weights(inst).lexicographic
    weighted = MilpPlacer("highs").solve(inst)
    sequential = MilpPlacer("highs").solve(
        replace(inst, policy=replace(policy, levels="sequential"))
    )
    assert check_plan(inst, sequential) == []
    assert sequential.outcomes == weighted.outcomes
    assert sequential.stats.bound == weighted.stats.bound
    assert (sequential.stats.levels, weighted.stats.levels) == ("sequential", "weighted")


def gangs_and_singles(levels: str) -> PlacementInstance:
    """One queue, a 12-GPU nominal quota on a 16-GPU node: which gangs fill it exactly is
    level 1; the rest borrows (level 2). Three priorities; the weights are lexicographic."""
    sizes = [(5, 2), (3, 0), (4, 1), (7, 0), (2, 2), (6, 1), (1, 0), (3, 2)]
    jobs = [
        job(f"j{i}", gpu=gpus, priority=100 + 10 * level, flavors=("h100",))
        for i, (gpus, level) in enumerate(sizes)
    ]
    policy = Policy(solver="highs", gap_tolerance=0.0, time_limit_s=600.0, levels=levels)
    return instance(
        [node("n1", gpus=16)], [queue("q", quotas={"h100": (12, 4, None)})], jobs, None, policy
    )


@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
def test_where_the_weights_are_lexicographic_the_bound_with_level_1_held_bounds_the_weighted_plan(
    backend: str,
) -> None:
    inst = gangs_and_singles("sequential")
    assert weights(inst).lexicographic
    weighted = MilpPlacer(backend).solve(
        replace(inst, policy=replace(inst.policy, levels="weighted"))
    )
    sequential = MilpPlacer(backend).solve(inst)
    for plan in (weighted, sequential):
        assert check_plan(inst, plan) == []
        assert plan.stats.status == "optimal"
    assert sequential.stats.bound is not None
    score = plan_objective(inst, weighted.outcomes)
    assert sequential.stats.bound >= score - 1e-6 * abs(score)
    assert plan_objective(inst, sequential.outcomes) == pytest.approx(score)


class FakeTime:
    """`time` as milp.py sees it: every reading moves the clock on by `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_level_by_level_a_clock_that_runs_slow_or_fast_changes_no_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The budget split between the levels is the node budget's: S with its first third
    running and six new jobs (relax-and-fix, whose neighbourhoods go level by level), the
    same plan whatever the clock reads, and no solve stopped by it."""
    policy = Policy(solver="highs", time_limit_s=600.0, gap_tolerance=0.0, levels="sequential")
    base = synth_instance("S", 1, policy)
    inst = replace(base, current=GreedyPlacer().solve(base).placements())
    later = with_new_jobs(inst, 6, 3)
    new = [j.key for j in later.jobs[len(inst.jobs) :]]
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return solve_levels(*args, **kwargs)

    monkeypatch.setattr("gitsched.engine.placement.milp.solve_levels", counted)
    plans = []
    for step in (1e-9, 0.5):
        monkeypatch.setattr("gitsched.engine.placement.milp.time", FakeTime(step))
        plans.append(MilpPlacer("highs").solve_incremental(later, new))
    monkeypatch.setattr("gitsched.engine.placement.milp.time", time)
    plans.append(MilpPlacer("highs").solve_incremental(later, new))
    assert calls  # the neighbourhoods went level by level
    assert plans[0].stats.status != "time_limit"
    assert plans[0].stats.levels == "sequential"
    decided = [(p.outcomes, p.stats.status, p.stats.objective) for p in plans]
    assert decided[1] == decided[0] and decided[2] == decided[0]
