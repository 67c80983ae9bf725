"""Wait order in the objective (engine.placement.objective.wait_order_bonus): among plans
that run as much, the one that starts the jobs waiting longest scores higher, so the
MILP's own plan starts the oldest jobs as greedy does; it never costs a GPU."""

from __future__ import annotations

import pytest

from gitsched.engine.model import Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.objective import (
    WAIT_ORDER_SHARE,
    objective_terms,
    plan_objective,
    weights,
)
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus
from tests.support.factories import instance, job, node, queue

EXACT = Policy(gap_tolerance=0.0, fragmentation_weight=0.0, time_limit_s=60.0)


def started(key: str, node_name: str, gpus: int) -> JobOutcome:
    return JobOutcome(
        key,
        OutcomeStatus.PLACED,
        flavor="h100",
        replicas=(ReplicaPlacement(node_name, tuple(range(gpus)), 1000),),
    )


def test_the_older_of_two_jobs_that_run_as_much_scores_higher_by_less_than_a_gpu() -> None:
    old = job("old", gpu=4, submitted_at="2026-11-22T10:00:00+00:00")
    young = job("young", gpu=4, submitted_at="2026-11-22T11:00:00+00:00")
    inst = instance([node("n1", gpus=4)], [queue("q")], [young, old])
    first = plan_objective(inst, (started("q/old", "n1", 4),))
    second = plan_objective(inst, (started("q/young", "n1", 4),))
    assert first > second
    one_gpu = weights(inst).value(old, 1) / 4
    assert first - second < one_gpu
    # The first in wait order is worth WAIT_ORDER_SHARE per GPU, the last of n 1/n of it.
    terms = objective_terms(inst, (started("q/old", "n1", 4),))
    assert terms.wait_order == pytest.approx(WAIT_ORDER_SHARE * 4)


def test_utilisation_comes_first_a_younger_job_that_runs_more_gpus_wins() -> None:
    old = job("old", gpu=2, submitted_at="2026-11-22T10:00:00+00:00")
    young = job("young", gpu=4, submitted_at="2026-11-22T11:00:00+00:00")
    inst = instance([node("n1", gpus=4)], [queue("q")], [young, old])
    assert plan_objective(inst, (started("q/young", "n1", 4),)) > plan_objective(
        inst, (started("q/old", "n1", 2),)
    )


def test_a_running_job_earns_no_wait_order_bonus() -> None:
    running = job("running", gpu=4, submitted_at="2026-11-22T09:00:00+00:00")
    placement = Placement(
        "q/running", "h100", (ReplicaPlacement("n1", (0, 1, 2, 3), 1000),), "2026-11-22T11:00"
    )
    inst = instance([node("n1", gpus=4)], [queue("q")], [running], {"q/running": placement})
    kept = JobOutcome("q/running", OutcomeStatus.KEPT, "h100", placement.replicas)
    assert objective_terms(inst, (kept,)).wait_order == 0.0


@pytest.mark.parametrize("solver", ["greedy", "highs", "cbc"])
def test_every_solver_starts_the_oldest_jobs_of_equal_priority_by_its_own_plan(
    solver: str,
) -> None:
    """Eight 1-GPU jobs of one priority, room for four: the four submitted first start, and
    the MILP's own plan is the one applied (no fallback to greedy's for order's sake)."""
    # Names that sort against submission order, so no tie falls to the name by luck.
    jobs = [job(f"z{7 - i}", gpu=1, submitted_at=f"2026-11-22T10:0{i}:00+00:00") for i in range(8)]
    inst = instance([node("n1", gpus=4)], [queue("q")], list(reversed(jobs)), policy=EXACT)
    placer = GreedyPlacer() if solver == "greedy" else MilpPlacer(solver)
    plan = placer.solve(inst)
    assert check_plan(inst, plan) == []
    placed = sorted(o.job for o in plan.outcomes if o.status is OutcomeStatus.PLACED)
    assert placed == ["q/z4", "q/z5", "q/z6", "q/z7"]  # submitted at 10:00-10:03
    if solver != "greedy":
        assert plan.stats.plan_source == "milp", plan.stats.fallback
