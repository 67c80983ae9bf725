"""A backfill reservation and a queue reclaiming its nominal quota (docs/time.md,
"Reservations and reclaim"): a reservation promises only what its queue is entitled to,
so the part it borrows does not hold back a queue below its nominal quota that may
reclaim from it; a reservation within its queue's nominal quota is kept. Greedy and HiGHS.

Two 8-GPU nodes, cohort c: queues svc and train with 8 GPUs nominal each. train runs t1
on n1 (limit 60 min: ends 12:30) and t2 on n2 (no limit), borrowing 8; its waiting job
big (8 GPUs) is reserved on n1 from 12:30, when train would hold 16 of its 8: all 8
reserved GPUs borrowed. svc's replica (1 GPU, no limit) comes after big in wait order.
"""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine.model import BackfillPolicy, Job, Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance
from gitsched.engine.placement.preemption import Rule
from gitsched.engine.placement.reservations import RESERVED, reserve
from gitsched.engine.placement.solvers import solve
from tests.support.factories import CLUSTER, job, node, queue

NOW = "2026-11-22T12:00:00.000000Z"
STARTED = "2026-11-22T11:30:00.000000Z"
SOLVERS = ("greedy", "highs")


def limited(j: Job, minutes: int | None) -> Job:
    return dataclasses.replace(j, time_limit_minutes=minutes)


def on(node_name: str, key: str) -> Placement:
    replicas = tuple(ReplicaPlacement(node_name, (g,), 1000) for g in range(8))
    return Placement(key, "h100", replicas, started_at=STARTED)


def scene(
    solver: str,
    *,
    t2_queue: str = "train",
    svc_nominal: int = 8,
    other_nominal: int = 0,
    preemption: bool = True,
    big_waits: bool = True,
    svc_priority: int = 500,
    yield_to_reclaim: bool = True,
) -> PlacementInstance:
    t1 = limited(job("t1", queue="train", replicas=8, submitted_at="2026-11-22T11:00:00Z"), 60)
    t2 = job("t2", queue=t2_queue, replicas=8, submitted_at="2026-11-22T11:00:00Z")
    big = limited(job("big", queue="train", gpu=8, submitted_at="2026-11-22T11:50:00Z"), 120)
    svc = job("r0", queue="svc", priority=svc_priority, submitted_at="2026-11-22T11:55:00Z")
    quotas = {
        "svc": svc_nominal,
        "train": 8,
        "other": other_nominal,
    }
    return PlacementInstance(
        cluster=CLUSTER,
        nodes=(node("n1"), node("n2")),
        queues=tuple(
            queue(name, cohort="c", quotas={"h100": (float(n), None, None)})
            for name, n in quotas.items()
        ),
        jobs=(t1, t2, *((big,) if big_waits else ()), svc),
        current={t1.key: on("n1", t1.key), t2.key: on("n2", t2.key)},
        policy=Policy(
            solver=solver,
            preemption_enabled=preemption,
            backfill=BackfillPolicy(reservations=1, yield_to_reclaim=yield_to_reclaim),
        ),
        now=NOW,
    )


def test_the_reservation_says_what_it_borrows_and_yields_to_the_queue_below_nominal() -> None:
    book = reserve(scene("greedy"))
    (r,) = book.reservations
    assert (r.job, r.start, r.nodes, r.gpu_milli) == (
        "train/big",
        "2026-11-22T12:30:00.000000Z",
        ("n1",),
        8000,
    )
    assert r.borrowed_milli == 8000  # train holds t2's 8 beyond its nominal 8 then
    assert ("svc/r0", "train/big") in book.yields


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_queue_below_nominal_reclaims_past_a_borrowing_reservation(solver: str) -> None:
    instance = scene(solver)
    plan = solve(instance)
    assert plan is not None
    assert check_plan(instance, plan) == []
    r0 = plan.outcome("svc/r0")
    assert r0 is not None and r0.status is OutcomeStatus.PLACED, r0
    preempted = [o for o in plan.outcomes if o.status is OutcomeStatus.PREEMPTED]
    assert [o.job for o in preempted] in (["train/t1"], ["train/t2"])
    assert "reclaims its nominal" in preempted[0].reason
    assert preempted[0].rule == Rule.RECLAIM


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_replica_alone_reclaims_the_same_way(solver: str) -> None:
    # the serving bench's contrast: with no training job waiting, no reservation in play
    plan = solve(scene(solver, big_waits=False))
    assert plan is not None
    r0 = plan.outcome("svc/r0")
    assert r0 is not None and r0.status is OutcomeStatus.PLACED


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_reservation_within_its_queues_nominal_quota_is_kept(solver: str) -> None:
    # t2 is another queue's borrowing: at 12:30 train holds 8 of its 8, nothing borrowed
    instance = scene(solver, t2_queue="other")
    book = reserve(instance)
    (r,) = book.reservations
    assert r.borrowed_milli == 0 and not book.yields
    plan = solve(instance)
    assert plan is not None
    assert check_plan(instance, plan) == []
    r0, big = plan.outcome("svc/r0"), plan.outcome("train/big")
    assert big is not None and big.constraint == RESERVED
    assert r0 is not None and r0.status is OutcomeStatus.PENDING
    # it says which reservation holds it, not only that no node has room
    assert r0.reason.startswith("cohort c shares 16 h100 GPUs and 16 are in use")
    assert r0.reason.endswith(
        "; held for the reservation of train/big: it neither takes reserved nodes nor preempts"
    )
    assert not [o for o in plan.outcomes if o.status is OutcomeStatus.PREEMPTED]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    ("why", "change"),
    [
        # the cohort's pool stays 16: svc's 8 are another queue's nominal quota
        ("svc at its nominal quota", {"svc_nominal": 0, "other_nominal": 8}),
        ("preemption off", {"preemption": False}),
        # EASY's promise: backfill.yieldToReclaim false (built in) keeps every reservation
        ("yieldToReclaim false", {"yield_to_reclaim": False}),
    ],
)
def test_no_reclaim_no_yield(solver: str, why: str, change: dict[str, object]) -> None:
    instance = scene(solver, **change)  # type: ignore[arg-type]
    book = reserve(instance)
    assert not book.yields, why
    plan = solve(instance)
    assert plan is not None
    r0 = plan.outcome("svc/r0")
    assert r0 is not None and r0.status is OutcomeStatus.PENDING, why
    assert "held for the reservation of train/big" in r0.reason, why


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_higher_priority_replica_is_ahead_of_any_reservation(solver: str) -> None:
    # the replica's class is higher than big's: first in wait order, no reservation is
    # held against it (it is the top job that cannot start without preemption), and the
    # solve reclaims for it from other, which borrows
    instance = scene(solver, t2_queue="other", svc_priority=900)
    assert reserve(instance).constraining(instance.jobs[-1]) == ()
    plan = solve(instance)
    assert plan is not None
    assert check_plan(instance, plan) == []
    r0 = plan.outcome("svc/r0")
    assert r0 is not None and r0.status is OutcomeStatus.PLACED
    assert [o.job for o in plan.outcomes if o.status is OutcomeStatus.PREEMPTED] == ["other/t2"]
