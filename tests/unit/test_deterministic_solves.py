"""No wall clock reaches a decision: the node budget stops a solve, the clock is a backstop
whose stop the plan reports (docs/placement.md, "Deterministic solves").

The clock is faked in our own placement modules only (`gitsched.engine.placement.milp`, which sizes
every solve and guards every step); the solver library keeps its own clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gitsched.engine.model import Policy
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.linear import LinearModel, SolveLimits, solve
from gitsched.engine.placement.milp import TIME_LIMIT_STATUS, MilpPlacer
from gitsched.engine.placement.plan import PlacementInstance, PlacementPlan, SolveStats
from gitsched.reconciler.plan import TIME_LIMIT_WARNING, clock_stopped
from gitsched.render_plan import solve_text
from gitsched.simulation.synth import synth_instance, with_new_jobs


class FakeTime:
    """`time` as milp.py sees it: every reading moves the clock on by `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def incremental_case() -> tuple[PlacementInstance, list[str]]:
    """S with its first third running and six new jobs: relax-and-fix, several
    neighbourhoods, the packing's stay-where-possible repacks."""
    base = synth_instance("S", 1, Policy(solver="highs", time_limit_s=600.0, gap_tolerance=0.0))
    inst = replace(base, current=GreedyPlacer().solve(base).placements())
    after = with_new_jobs(inst, 6, 3)
    return after, [j.key for j in after.jobs[len(inst.jobs) :]]


def decided(plan: PlacementPlan) -> tuple[object, ...]:
    """What a plan decides, without its measured seconds."""
    return (plan.outcomes, plan.stats.status, plan.stats.objective, plan.broken_soft)


@pytest.mark.parametrize(
    ("backend", "mode"),
    [("highs", "full"), ("highs", "incremental"), ("cpsat", "incremental")],
)
def test_a_clock_that_runs_slow_or_fast_changes_no_plan(
    monkeypatch: pytest.MonkeyPatch, backend: str, mode: str
) -> None:
    inst, new = incremental_case()

    def run() -> PlacementPlan:
        placer = MilpPlacer(backend)
        return placer.solve_incremental(inst, new) if mode == "incremental" else placer.solve(inst)

    plans = []
    for step in (1e-9, 0.5):  # a machine that looks idle; one loaded a million times as much
        monkeypatch.setattr("gitsched.engine.placement.milp.time", FakeTime(step))
        plans.append(run())
    monkeypatch.undo()
    plans.append(run())  # and the real clock
    assert plans[0].stats.status != TIME_LIMIT_STATUS
    assert decided(plans[1]) == decided(plans[0])
    assert decided(plans[2]) == decided(plans[0])


def test_a_solve_the_clock_stops_says_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock past the time limit at every reading: the backstop skips what it guards, and
    the plan says it is not reproducible (it is still a checked plan: greedy's at worst)."""
    inst, new = incremental_case()
    monkeypatch.setattr("gitsched.engine.placement.milp.time", FakeTime(10_000.0))
    plan = MilpPlacer("highs").solve_incremental(inst, new)
    assert plan.stats.status == TIME_LIMIT_STATUS
    assert clock_stopped(plan.stats)


def knapsacks(seed: int, items: int = 70, rows: int = 6) -> LinearModel:
    """A seeded multi-dimensional knapsack: far more than a handful of nodes to prove."""
    rng = random.Random(seed)
    m = LinearModel()
    cols = [m.var(f"x{i}", 0, 1, cost=rng.randint(20, 99)) for i in range(items)]
    for r in range(rows):
        weights = [rng.randint(5, 60) for _ in cols]
        m.row(f"cap{r}", zip(cols, map(float, weights), strict=True), upper=sum(weights) / 3)
    return m


@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
def test_a_node_limited_solve_is_the_same_every_run(backend: str) -> None:
    model = knapsacks(7)
    limits = SolveLimits(time_limit_s=600.0, gap=0.0, node_limit=3)
    first = solve(model, backend, limits)
    unlimited = solve(model, backend, SolveLimits(time_limit_s=600.0, gap=0.0))
    # The budget, not the gap or the clock, stopped it: it proves less than the full solve.
    assert first.status == "feasible" and not first.clock_stopped
    assert unlimited.status == "optimal"
    for _ in range(2):
        again = solve(model, backend, limits)
        assert (again.status, again.values, again.objective, again.bound) == (
            first.status,
            first.values,
            first.objective,
            first.bound,
        )


def test_plan_says_a_time_limited_solve_may_place_otherwise() -> None:
    stats = SolveStats("highs", TIME_LIMIT_STATUS, 10.0, 12.0, 0.2, seconds=5.1)
    assert TIME_LIMIT_WARNING in solve_text(stats)
    assert (
        TIME_LIMIT_WARNING == "the solve stopped at its time limit: reconcile may place differently"
    )
    assert TIME_LIMIT_WARNING not in solve_text(replace(stats, status="feasible"))
