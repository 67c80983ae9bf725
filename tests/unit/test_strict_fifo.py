"""Kueue's queueing strategies (docs/time.md, Queueing strategy), in both solvers.

The scene: n1 is full (q/x runs there), n2 has 4 of its 8 GPUs free. In queue q, the head
q/head (8 GPUs) cannot start; q/small (4 GPUs) behind it would fit on n2, and so would
r/other (4 GPUs, queue r, submitted later). BestEffortFIFO: q/small starts (it is older
than r/other). StrictFIFO on q: q/small waits behind q/head, and r/other, of another
queue, takes the room.
"""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine.model import (
    BackfillPolicy,
    Job,
    Placement,
    Policy,
    QueueingStrategy,
    ReplicaPlacement,
)
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.solvers import solve, solve_changed
from gitsched.engine.placement.strict_fifo import STRICT_FIFO, with_strict_fifo
from tests.support.factories import CLUSTER, job, node, queue

NOW = "2026-11-22T12:00:00.000000Z"
SOLVERS = ("greedy", "highs")

HEAD = job("head", gpu=8, submitted_at="2026-11-22T11:00:00Z")
SMALL = job("small", gpu=4, submitted_at="2026-11-22T11:10:00Z")
LATER = job("later", gpu=4, submitted_at="2026-11-22T11:30:00Z")
OTHER = job("other", queue="r", gpu=4, submitted_at="2026-11-22T11:20:00Z")


def on(node_name: str, gpus: range, key: str) -> Placement:
    replicas = (ReplicaPlacement(node_name, tuple(gpus), 1000),)
    return Placement(key, "h100", replicas, started_at="2026-11-22T10:00:00.000000Z")


def scene(
    solver: str, strategy: QueueingStrategy, waiting: tuple[Job, ...], reservations: int = 0
) -> PlacementInstance:
    running = (
        job("x", gpu=8, submitted_at="2026-11-22T09:00:00Z"),
        job("y", queue="r", gpu=4, submitted_at="2026-11-22T09:00:00Z"),
    )
    q = dataclasses.replace(queue("q"), queueing_strategy=strategy)
    return PlacementInstance(
        cluster=CLUSTER,
        nodes=(node("n1"), node("n2")),
        queues=(q, queue("r")),
        jobs=(*running, *waiting),
        current={"q/x": on("n1", range(8), "q/x"), "r/y": on("n2", range(4), "r/y")},
        policy=Policy(
            solver=solver,
            preemption_enabled=False,
            backfill=BackfillPolicy(reservations=reservations),
        ),
        now=NOW,
    )


def status(plan: object, key: str) -> OutcomeStatus:
    outcome = plan.outcome(key)  # type: ignore[attr-defined]
    assert outcome is not None, key
    return outcome.status  # type: ignore[no-any-return]


@pytest.mark.parametrize("solver", SOLVERS)
def test_best_effort_fifo_a_head_that_cannot_start_does_not_block(solver: str) -> None:
    instance = scene(solver, QueueingStrategy.BEST_EFFORT_FIFO, (HEAD, SMALL, OTHER))
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    assert status(plan, "q/head") is OutcomeStatus.PENDING
    assert status(plan, "q/small") is OutcomeStatus.PLACED
    assert status(plan, "r/other") is OutcomeStatus.PENDING


@pytest.mark.parametrize("solver", SOLVERS)
def test_strict_fifo_the_head_blocks_its_queue_not_the_others(solver: str) -> None:
    instance = scene(solver, QueueingStrategy.STRICT_FIFO, (HEAD, SMALL, LATER, OTHER))
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    assert status(plan, "q/head") is OutcomeStatus.PENDING
    held = plan.outcome("q/small")
    assert held is not None and held.status is OutcomeStatus.PENDING
    assert held.constraint == STRICT_FIFO
    assert held.reason == "queue q is StrictFIFO and q/head waits ahead of it"
    later = plan.outcome("q/later")  # behind the head too, whether it would fit or not
    assert later is not None and later.status is OutcomeStatus.PENDING
    assert (later.constraint, later.reason) == (STRICT_FIFO, held.reason)
    placed = plan.outcome("r/other")
    assert placed is not None and placed.status is OutcomeStatus.PLACED
    assert {r.node for r in placed.replicas} == {"n2"}


@pytest.mark.parametrize("solver", SOLVERS)
def test_strict_fifo_starts_a_prefix_of_the_queue(solver: str) -> None:
    # n2 has 4 GPUs free: s0 (2) fits, s1 (4) then does not, s2 (1) would fit behind it.
    jobs = tuple(
        job(f"s{i}", gpu=g, submitted_at=f"2026-11-22T11:0{i}:00Z") for i, g in enumerate((2, 4, 1))
    )
    instance = scene(solver, QueueingStrategy.STRICT_FIFO, jobs)
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    started = sorted(o.job for o in plan.outcomes if o.status is OutcomeStatus.PLACED)
    assert started == ["q/s0"]
    s2 = plan.outcome("q/s2")
    assert s2 is not None and s2.constraint == STRICT_FIFO
    if solver == "greedy":  # best-effort: greedy fills in order, skipping what does not fit
        plan = solve(scene(solver, QueueingStrategy.BEST_EFFORT_FIFO, jobs))
        started = sorted(o.job for o in plan.outcomes if o.status is OutcomeStatus.PLACED)
        assert started == ["q/s0", "q/s2"]


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_head_that_can_never_run_blocks_nobody(solver: str) -> None:
    never = job("never", replicas=1, gpu=16, submitted_at="2026-11-22T10:30:00Z")
    instance = scene(solver, QueueingStrategy.STRICT_FIFO, (never, SMALL))
    plan = solve(instance)
    outcome = plan.outcome("q/never")
    assert outcome is not None and outcome.reason.startswith("can never run")
    assert status(plan, "q/small") is OutcomeStatus.PLACED


def test_the_incremental_solve_obeys_it_too() -> None:
    instance = scene("highs", QueueingStrategy.STRICT_FIFO, (HEAD, SMALL, OTHER))
    plan = solve_changed(instance, ["q/small", "r/other"])
    assert plan is not None
    assert check_plan(instance, plan) == []
    held = plan.outcome("q/small")
    assert held is not None and held.constraint == STRICT_FIFO
    assert status(plan, "r/other") is OutcomeStatus.PLACED


@pytest.mark.parametrize("solver", SOLVERS)
def test_strict_fifo_under_backfill_the_head_holds_its_reservation(solver: str) -> None:
    limited = tuple(dataclasses.replace(j, time_limit_minutes=30) for j in (HEAD, SMALL))
    instance = scene(solver, QueueingStrategy.STRICT_FIFO, limited, reservations=1)
    running = tuple(
        dataclasses.replace(j, time_limit_minutes=180) if j.key in instance.current else j
        for j in instance.jobs
    )
    instance = dataclasses.replace(instance, jobs=running)
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    assert [r.job for r in plan.reservations] == ["q/head"]
    held = plan.outcome("q/small")
    assert held is not None and held.status is OutcomeStatus.PENDING
    assert held.constraint == STRICT_FIFO


def test_a_long_queue_behind_a_head_costs_one_more_solve() -> None:
    """Every job behind the head is held at once: the decision is two solves however many
    of them would fit (it was one more solve per round of jobs started behind a head, and
    ~3 s a decision in a strict-FIFO replay with long queues)."""
    small = tuple(
        job(f"s{i:02d}", gpu=1, submitted_at=f"2026-11-22T11:{10 + i:02d}:00Z") for i in range(12)
    )
    instance = scene("greedy", QueueingStrategy.STRICT_FIFO, (HEAD, *small, OTHER))
    solves: list[int] = []

    def counted(part: PlacementInstance) -> PlacementPlan:
        solves.append(len(part.jobs))
        return GreedyPlacer().solve(part)

    plan = with_strict_fifo(instance, counted)
    assert plan is not None and check_plan(instance, plan) == []
    assert len(solves) == 2 and solves[1] == solves[0] - len(small)
    assert all(plan.outcome(j.key).constraint == STRICT_FIFO for j in small)  # type: ignore[union-attr]
    assert status(plan, "r/other") is OutcomeStatus.PLACED
