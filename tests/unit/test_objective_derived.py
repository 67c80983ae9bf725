"""What the objective works out once per instance (weights, fair shares, jobs by key) must
give the score a fresh instance gives, and must never outlive the instance it came from."""

from __future__ import annotations

import dataclasses
import pickle

from hypothesis import given, settings

from gitsched.engine.model import Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.objective import (
    instance_fair_targets,
    objective_terms,
    plan_objective,
    weights,
)
from gitsched.engine.placement.plan import PlacementInstance
from tests.support.factories import instance, instances, job, node, queue


def _fresh(inst: PlacementInstance) -> PlacementInstance:
    return dataclasses.replace(inst)


@settings(max_examples=60, deadline=None)
@given(instances())
def test_a_plan_scores_the_same_on_a_fresh_and_on_a_scored_instance(
    inst: PlacementInstance,
) -> None:
    inst = dataclasses.replace(inst, policy=Policy(fairness_weight=1.0))
    plan = GreedyPlacer().solve(inst)
    first = plan_objective(inst, plan.outcomes)
    assert plan_objective(inst, plan.outcomes) == first
    assert plan_objective(_fresh(inst), plan.outcomes) == first
    # The score leaves the second criterion out, and is the terms' total to the bit.
    assert objective_terms(_fresh(inst), plan.outcomes).total == first


def test_worked_out_once_per_instance() -> None:
    inst = instance([node("n1")], [queue("q")], [job("a"), job("b", priority=900)])
    assert inst.derived(weights) is inst.derived(weights)
    calls: list[int] = []

    def count(i: PlacementInstance) -> int:
        calls.append(1)
        return len(i.jobs)

    assert inst.derived(count) == inst.derived(count) == 2
    assert len(calls) == 1


def test_a_changed_instance_works_it_out_anew() -> None:
    before = instance(
        [node("n1")],
        [queue("q"), queue("r")],
        [job("a", gpu=4), job("b", queue="r", gpu=4)],
        policy=Policy(fairness_weight=1.0),
    )
    targets = instance_fair_targets(before)
    w = weights(before)
    after = dataclasses.replace(before, jobs=before.jobs[:1])
    assert instance_fair_targets(after).keys() == {"q"} != targets.keys()
    assert weights(after) is not w


def test_the_worked_out_values_are_no_part_of_equality_nor_of_a_pickle() -> None:
    inst = instance([node("n1")], [queue("q")], [job("a")])
    running = {"q/a": Placement("q/a", "h100", (ReplicaPlacement("n1", (0,), 1000),))}
    inst = dataclasses.replace(inst, current=running)
    weights(inst)
    assert inst == _fresh(inst)
    again = pickle.loads(pickle.dumps(inst))
    assert again == inst
    assert not again._derived  # a worker works them out for itself
    assert weights(again) == weights(inst)
