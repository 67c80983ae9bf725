"""Spread (engine/placement/spread.py): one constraint in every solver. Greedy, the MILP
on HiGHS and on CBC each place a service's replicas with at most maxPerDomain per domain,
keep running ones that obey it, and check.py catches a plan that breaks it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from gitsched.engine.model import Job, Placement, Policy, ReplicaPlacement, Spread
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from tests.support.factories import instance, job, node, queue

SOLVERS = ["greedy", "highs", "cbc"]
EXACT = Policy(gap_tolerance=0.0, fragmentation_weight=0.0, time_limit_s=60.0)


def solve(solver: str, inst: PlacementInstance) -> PlacementPlan:
    placer = GreedyPlacer() if solver == "greedy" else MilpPlacer(solver)
    plan = placer.solve(inst)
    assert check_plan(inst, plan) == []
    if solver != "greedy":
        assert plan.stats.plan_source == "milp", plan.stats  # the MILP's own plan, no fallback
    return plan


def replica(i: int, spread: tuple[Spread, ...], gpu: float = 2) -> Job:
    return dataclasses.replace(
        job(f"chat.{i}", gpu=gpu, priority=900), service="q/chat", spread=spread
    )


# Four 8-GPU nodes: two NVLink domains of two nodes, two racks of two nodes.
NODES = [
    node("n1", nvlink="nv1", rack="r1"),
    node("n2", nvlink="nv1", rack="r1"),
    node("n3", nvlink="nv2", rack="r2"),
    node("n4", nvlink="nv2", rack="r2"),
]


def nodes_of(plan: PlacementPlan, level: str) -> Counter[str]:
    by_name = {n.name: n for n in NODES}
    return Counter(
        by_name[r.node].domain(level)
        for o in plan.outcomes
        if o.running and o.job.startswith("q/chat.")
        for r in o.replicas
    )


@pytest.mark.parametrize("solver", SOLVERS)
def test_at_most_one_replica_per_node(solver: str) -> None:
    spread = (Spread("node", 1),)
    inst = instance(NODES, [queue("q")], [replica(i, spread) for i in range(4)], policy=EXACT)
    plan = solve(solver, inst)
    assert nodes_of(plan, "node") == Counter({"n1": 1, "n2": 1, "n3": 1, "n4": 1})


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_replica_beyond_the_spread_waits_and_says_why(solver: str) -> None:
    spread = (Spread("rack", 1),)
    inst = instance(NODES, [queue("q")], [replica(i, spread) for i in range(3)], policy=EXACT)
    plan = solve(solver, inst)
    assert sorted(nodes_of(plan, "rack").values()) == [1, 1]
    waiting = [o for o in plan.outcomes if o.status is OutcomeStatus.PENDING]
    assert len(waiting) == 1
    assert "spread" in waiting[0].reason or "spread" in waiting[0].constraint, waiting[0]


@pytest.mark.parametrize("solver", SOLVERS)
def test_two_levels_at_once_and_running_replicas_count(solver: str) -> None:
    spread = (Spread("node", 1), Spread("nvlink", 2))
    jobs = [replica(i, spread) for i in range(4)]
    # chat.0 runs on n1 already: the others go where the spread leaves room
    current = {"q/chat.0": Placement("q/chat.0", "h100", (ReplicaPlacement("n1", (0, 1), 1000),))}
    inst = instance(NODES, [queue("q")], jobs, current=current, policy=EXACT)
    plan = solve(solver, inst)
    assert nodes_of(plan, "node") == Counter({"n1": 1, "n2": 1, "n3": 1, "n4": 1})
    assert nodes_of(plan, "nvlink") == Counter({"nv1": 2, "nv2": 2})
    assert plan.outcome("q/chat.0").status is OutcomeStatus.KEPT  # type: ignore[union-attr]


def test_the_checker_catches_a_plan_that_breaks_the_spread() -> None:
    spread = (Spread("node", 1),)
    jobs = [replica(i, spread) for i in range(2)]
    inst = instance(NODES, [queue("q")], jobs, policy=EXACT)
    plan = solve("greedy", inst)
    both_on_n1 = dataclasses.replace(
        plan,
        outcomes=tuple(
            dataclasses.replace(o, replicas=(ReplicaPlacement("n1", (2 * i, 2 * i + 1), 1000),))
            for i, o in enumerate(plan.outcomes)
        ),
    )
    problems = check_plan(inst, both_on_n1)
    assert any(
        p.startswith("spread: service q/chat: 2 replicas in node domain n1") for p in problems
    )


def test_without_a_spread_greedy_packs_the_replicas_on_one_node() -> None:
    inst = instance(NODES, [queue("q")], [replica(i, ()) for i in range(4)], policy=EXACT)
    plan = solve("greedy", inst)
    assert list(nodes_of(plan, "node").values()) == [4]
