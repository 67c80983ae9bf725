"""The solver contract: one suite, run against every MILP backend (HiGHS, CBC and CP-SAT).

Hand-built instances whose optimum is known (and which the greedy baseline gets
wrong) must be solved to that optimum; generated instances must give plans that
pass the checker and never score below greedy; a job that cannot run says why.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitsched.engine.model import Isolation, Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.units import GPU_MILLI
from tests.support.factories import instance, instances, job, node, queue

BACKENDS = ["highs", "cbc", "cpsat"]
EXACT = Policy(gap_tolerance=0.0, fragmentation_weight=0.0, time_limit_s=60.0)


@pytest.fixture(params=BACKENDS)
def placer(request: pytest.FixtureRequest) -> MilpPlacer:
    return MilpPlacer(request.param)


def solve(placer: MilpPlacer, inst: PlacementInstance) -> PlacementPlan:
    plan = placer.solve(inst)
    assert check_plan(inst, plan) == []
    report = placer.last_report
    assert report is not None and report.problems == ()
    assert plan.stats.objective >= report.greedy_objective - 1e-6
    return plan


def status(plan: PlacementPlan, key: str) -> OutcomeStatus:
    outcome = plan.outcome(key)
    assert outcome is not None
    return outcome.status


# -- known optima that greedy misses -----------------------------------------------------------


def test_two_jobs_beat_one_job_of_the_same_priority_that_blocks_both(placer: MilpPlacer) -> None:
    """Knapsack: 5 GPUs submitted first (greedy takes it) against 4 + 4, all one priority."""
    big = job("big", gpu=5, submitted_at="1")
    a = job("a", gpu=4, submitted_at="2")
    b = job("b", gpu=4, submitted_at="3")
    inst = instance([node("n1")], [queue("q")], [big, a, b], policy=EXACT)
    plan = solve(placer, inst)
    assert plan.stats.status == "optimal" and plan.stats.gap == pytest.approx(0.0, abs=1e-9)
    assert status(plan, "q/big") is OutcomeStatus.PENDING
    assert GreedyPlacer().solve(inst).stats.objective < plan.stats.objective


def test_priority_is_an_order_not_a_price(placer: MilpPlacer) -> None:
    """5 GPUs at a higher priority run before 4 + 4 below it, whatever the values."""
    for spacing in (1, 200, 10_000):
        big = job("big", gpu=5, priority=500 + spacing, submitted_at="3")
        a = job("a", gpu=4, submitted_at="1")
        b = job("b", gpu=4, submitted_at="2")
        plan = solve(placer, instance([node("n1")], [queue("q")], [big, a, b], policy=EXACT))
        assert status(plan, "q/big") is OutcomeStatus.PLACED


def test_the_gang_gets_the_only_domain_that_holds_it(placer: MilpPlacer) -> None:
    """Greedy puts the first single-node job in the two-node NVLink domain and strands the gang."""
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d1"), node("n3", nvlink="d2")]
    single = job("single", gpu=8, priority=900, submitted_at="1")
    gang = job("gang", replicas=2, gpu=8, topology="nvlink", submitted_at="2")
    inst = instance(nodes, [queue("q")], [single, gang], policy=EXACT)
    plan = solve(placer, inst)
    assert plan.stats.status == "optimal"
    gang_outcome = plan.outcome("q/gang")
    assert gang_outcome is not None
    assert {r.node for r in gang_outcome.replicas} == {"n1", "n2"}
    assert status(GreedyPlacer().solve(inst), "q/gang") is OutcomeStatus.PENDING


def test_hours_of_unsaved_work_do_not_stop_a_higher_priority_job(placer: MilpPlacer) -> None:
    """Lost work chooses which job stops, never whether priority is honoured."""
    low = job("low", gpu=8, priority=100)
    high = job("high", gpu=8, priority=900)
    running = Placement(
        "q/low",
        "h100",
        (ReplicaPlacement("n1", tuple(range(8)), GPU_MILLI),),
        started_at="2026-11-22T00:00:00+00:00",  # 12 hours, no checkpoint
    )
    inst = instance([node("n1")], [queue("q")], [low, high], {"q/low": running}, policy=EXACT)
    plan = solve(placer, inst)
    victim = plan.outcome("q/low")
    assert victim is not None and victim.status is OutcomeStatus.PREEMPTED
    assert victim.preempted_by == "q/high" and victim.rule == "within-queue"
    assert victim.lost_gpu_seconds == pytest.approx(12 * 3600 * 8.0)


def test_the_victim_with_the_least_lost_work_goes(placer: MilpPlacer) -> None:
    old = job("old", gpu=4, priority=100, submitted_at="1")
    fresh = job("fresh", gpu=4, priority=100, submitted_at="2")
    high = job("high", gpu=4, priority=900, submitted_at="3")
    current = {
        "q/old": Placement(
            "q/old",
            "h100",
            (ReplicaPlacement("n1", (0, 1, 2, 3), GPU_MILLI),),
            "2026-11-22T02:00:00+00:00",
        ),
        "q/fresh": Placement(
            "q/fresh",
            "h100",
            (ReplicaPlacement("n1", (4, 5, 6, 7), GPU_MILLI),),
            "2026-11-22T11:00:00+00:00",
        ),
    }
    plan = solve(placer, instance([node("n1")], [queue("q")], [old, fresh, high], current, EXACT))
    assert status(plan, "q/old") is OutcomeStatus.KEPT
    assert status(plan, "q/fresh") is OutcomeStatus.PREEMPTED


def test_shares_pack_onto_one_gpu_and_the_fifth_waits(placer: MilpPlacer) -> None:
    shares = [job(f"f{i}", gpu=0.25, submitted_at=str(i)) for i in range(5)]
    inst = instance([node("n1", gpus=1)], [queue("q")], shares, policy=EXACT)
    plan = solve(placer, inst)
    placed = [o for o in plan.outcomes if o.status is OutcomeStatus.PLACED]
    assert len(placed) == 4
    assert {r.gpus for o in placed for r in o.replicas} == {(0,)}


def test_an_elastic_gang_takes_what_is_left(placer: MilpPlacer) -> None:
    first = job("first", gpu=8, priority=900)
    elastic = job("elastic", replicas=4, min_replicas=2, gpu=8)
    inst = instance([node(f"n{i}") for i in range(4)], [queue("q")], [first, elastic], policy=EXACT)
    plan = solve(placer, inst)
    outcome = plan.outcome("q/elastic")
    assert outcome is not None and len(outcome.replicas) == 3
    assert plan.stats.status == "optimal"


def test_a_lender_reclaims_its_nominal_quota_from_a_borrower(placer: MilpPlacer) -> None:
    nodes = [node("n1"), node("n2")]
    queues = [
        queue("a", cohort="c", quotas={"h100": (8, None, None)}),
        queue("b", cohort="c", quotas={"h100": (8, None, None)}),
    ]
    borrower = [
        job("b1", queue="b", gpu=8, submitted_at="1"),
        job("b2", queue="b", gpu=8, submitted_at="2"),
    ]
    current = GreedyPlacer().solve(instance(nodes, queues, borrower)).placements()
    owner = job("a1", queue="a", gpu=8, priority=100)
    plan = solve(placer, instance(nodes, queues, [*borrower, owner], current, policy=EXACT))
    assert status(plan, "a/a1") is OutcomeStatus.PLACED
    stopped = [o for o in plan.outcomes if o.status is OutcomeStatus.PREEMPTED]
    assert len(stopped) == 1 and stopped[0].preempted_by == "a/a1"
    assert stopped[0].rule == "reclaim"


def test_isolation_and_residency_are_hard(placer: MilpPlacer) -> None:
    nodes = [node("shared"), node("sec", isolation=Isolation.DEDICATED, region="eu-central")]
    regulated = job("reg", gpu=1, isolation=Isolation.DEDICATED, residency=("eu-central",))
    other = job("other", gpu=1)
    second = job("reg2", gpu=1, isolation=Isolation.DEDICATED, priority=100)
    plan = solve(placer, instance(nodes, [queue("q")], [regulated, other, second], policy=EXACT))
    reg, oth = plan.outcome("q/reg"), plan.outcome("q/other")
    assert reg is not None and reg.replicas[0].node == "sec"
    assert oth is not None and oth.replicas[0].node == "shared"
    assert status(plan, "q/reg2") is OutcomeStatus.PENDING


# -- a job that cannot run says why ---------------------------------------------------------------


def test_an_infeasible_gang_reports_the_topology_that_binds(placer: MilpPlacer) -> None:
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d2"), node("n3", nvlink="d3")]
    gang = job("big", replicas=2, gpu=8, topology="nvlink")
    plan = solve(placer, instance(nodes, [queue("q")], [gang]))
    outcome = plan.outcome("q/big")
    assert outcome is not None and outcome.status is OutcomeStatus.PENDING
    assert outcome.constraint == "topology__q/big__nvlink"
    assert (
        "in one nvlink domain" in outcome.reason and "holds 1 of the 2 replicas" in outcome.reason
    )


def test_a_job_over_quota_names_the_quota(placer: MilpPlacer) -> None:
    inst = instance(
        [node("n1"), node("n2")],
        [queue("a", quotas={"h100": (8, None, None)})],
        [
            job("x", queue="a", gpu=8, submitted_at="1"),
            job("y", queue="a", gpu=8, submitted_at="2"),
        ],
    )
    plan = solve(placer, inst)
    waiting = [o for o in plan.outcomes if o.status is OutcomeStatus.PENDING]
    assert len(waiting) == 1 and waiting[0].constraint == "quota__a__h100"


# -- generated instances -----------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(instances(), st.integers(0, 3))
def test_generated_plans_pass_the_checker_and_never_lose_to_greedy(
    placer: MilpPlacer, inst: PlacementInstance, drop: int
) -> None:
    """On a first solve and on a re-solve with the first plan running."""
    first = solve(placer, inst)
    report = placer.last_report
    assert report is not None and report.warm_started and not report.fell_back
    assert report.model_bound is None or report.model_bound >= first.stats.objective - 1e-6
    assert all(
        o.reason and o.constraint for o in first.outcomes if o.status is OutcomeStatus.PENDING
    )
    remaining = inst.jobs[drop:]
    keys = {j.key for j in remaining}
    current = {
        k: replace(p, started_at="2026-11-22T08:00:00+00:00")
        for k, p in first.placements().items()
        if k in keys
    }
    second = solve(placer, replace(inst, jobs=remaining, current=current))
    assert all(o.reason for o in second.outcomes if o.status is OutcomeStatus.PREEMPTED)
