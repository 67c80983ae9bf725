"""A backlog of alike waiting jobs (a queue's stream of 1-GPU jobs at load): what one job of
a shape finds is what the next finds while nothing changes, and jobs past what could ever
start leave the MILP's model without changing its plan (milp.beyond_reach)."""

from __future__ import annotations

import pytest

import gitsched.engine.placement.greedy as greedy_module
import gitsched.engine.placement.milp as milp
from gitsched.engine.model import Placement, ReplicaPlacement
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer, beyond_reach
from gitsched.engine.placement.objective import plan_objective
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance
from tests.support.factories import instance, job, node, queue


def _at(i: int) -> str:
    return f"2026-11-22T{10 + i // 60:02d}:{i % 60:02d}:00+00:00"


def backlog(waiting: int = 30, *, urgent: bool = False) -> PlacementInstance:
    """Two 8-GPU nodes, 12 GPUs held by running 1-GPU jobs of the queue, and a backlog of
    alike 1-GPU jobs and a few 2-GPU ones; `urgent` adds a waiting job of higher priority,
    which may preempt the running ones."""
    nodes = [node("n1", gpus=8), node("n2", gpus=8)]
    queues = [queue("q", quotas={"h100": (16.0, None, None)})]
    running = [job(f"r{i:02d}", flavors=("h100",), submitted_at=_at(i)) for i in range(12)]
    current = {
        r.key: Placement(
            r.key,
            "h100",
            (ReplicaPlacement("n1" if i < 8 else "n2", (i % 8,), 1000),),
            started_at="2026-11-22T09:00:00+00:00",
        )
        for i, r in enumerate(running)
    }
    ones = [job(f"w{i:03d}", flavors=("h100",), submitted_at=_at(20 + i)) for i in range(waiting)]
    twos = [job(f"t{i}", gpu=2, flavors=("h100",), submitted_at=_at(200 + i)) for i in range(5)]
    extra = [job("hot", priority=900, gpu=8, flavors=("h100",), submitted_at=_at(300))]
    jobs = running + ones + twos + (extra if urgent else [])
    return instance(nodes, queues, jobs, current)


def test_jobs_past_what_could_ever_start_leave_the_model() -> None:
    inst = backlog()
    plan = GreedyPlacer().solve(inst)
    tail = beyond_reach(inst, plan)
    # 4 GPUs are free and nobody may stop a running job: at most 4 of the 1-GPU shape, 2 of
    # the 2-GPU shape could start, the first in wait order.
    assert tail == {f"q/w{i:03d}" for i in range(4, 30)} | {f"q/t{i}" for i in range(2, 5)}


def test_what_rules_may_stop_counts_as_room() -> None:
    """A waiting job of higher priority may preempt the running ones: their GPUs are room
    for every shape, so only what exceeds the cluster's 16 GPUs leaves the model."""
    inst = backlog(urgent=True)
    tail = beyond_reach(inst, GreedyPlacer().solve(inst))
    assert tail == {f"q/w{i:03d}" for i in range(16, 30)}  # all five 2-GPU jobs could start


@pytest.mark.parametrize("urgent", [False, True])
def test_the_plan_is_the_plan_of_the_whole_model(
    monkeypatch: pytest.MonkeyPatch, urgent: bool
) -> None:
    """The same starts and the same score with the backlog left out as with every job in."""
    inst = backlog(urgent=urgent)
    fast = MilpPlacer("highs").solve(inst)
    monkeypatch.setattr(milp, "beyond_reach", lambda instance, plan: frozenset())
    whole = MilpPlacer("highs").solve(inst)

    def started(outcomes: tuple) -> set[str]:  # type: ignore[type-arg]
        return {o.job for o in outcomes if o.running}

    assert started(fast.outcomes) == started(whole.outcomes)
    assert plan_objective(inst, fast.outcomes) == pytest.approx(
        plan_objective(inst, whole.outcomes)
    )
    left = beyond_reach(inst, GreedyPlacer().solve(inst))
    assert left
    assert all(
        o.status is OutcomeStatus.PENDING and o.reason for o in fast.outcomes if o.job in left
    )


def test_greedy_asks_once_per_shape_while_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full cluster, a backlog of alike jobs: the victim search runs once for the shape,
    and every job gets the answer the search without the memo gives it."""
    inst = backlog(waiting=40)
    calls: list[str] = []
    victims = GreedyPlacer._victims

    def counted(packing, job, jobs):  # type: ignore[no-untyped-def]
        calls.append(job.key)
        return victims(packing, job, jobs)

    monkeypatch.setattr(GreedyPlacer, "_victims", staticmethod(counted))
    remembered = GreedyPlacer().solve(inst)
    shapes = len(calls)
    monkeypatch.setattr(greedy_module, "claim_shape", lambda job: None)
    calls.clear()
    asked = GreedyPlacer().solve(inst)
    assert shapes == 2  # one 1-GPU and one 2-GPU shape once the free GPUs are taken
    assert len(calls) > 30
    assert [(o.job, o.status, o.reason, o.constraint) for o in remembered.outcomes] == [
        (o.job, o.status, o.reason, o.constraint) for o in asked.outcomes
    ]
