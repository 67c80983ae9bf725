"""The greedy baseline: scenarios a scheduler must get right, and invariants for any input."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitsched.engine.model import Isolation, Placement, Policy, TopologyMode
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.plan import OutcomeStatus, PlacementPlan
from tests.support.factories import instance, instances, job, node, queue

GREEDY = GreedyPlacer()


def solve(inst) -> PlacementPlan:  # type: ignore[no-untyped-def]
    plan = GREEDY.solve(inst)
    assert check_plan(inst, plan) == []
    return plan


def status(plan: PlacementPlan, key: str) -> OutcomeStatus:
    outcome = plan.outcome(key)
    assert outcome is not None
    return outcome.status


def test_gang_needs_one_nvlink_domain_and_says_how_big_the_largest_is() -> None:
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d2"), node("n3", nvlink="d3")]
    big = job("big", replicas=2, gpu=8, topology="nvlink")
    plan = solve(instance(nodes, [queue("q")], [big]))
    outcome = plan.outcome("q/big")
    assert outcome is not None and outcome.status is OutcomeStatus.PENDING
    assert "one nvlink domain" in outcome.reason
    assert "holds 1 of the 2 replicas" in outcome.reason
    assert outcome.constraint == "topology__q/big__nvlink"


def test_gang_fits_in_a_two_node_domain_and_never_splits() -> None:
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d2"), node("n3", nvlink="d2")]
    plan = solve(instance(nodes, [queue("q")], [job("big", replicas=2, gpu=8, topology="nvlink")]))
    outcome = plan.outcome("q/big")
    assert outcome is not None and outcome.status is OutcomeStatus.PLACED
    assert {r.node for r in outcome.replicas} == {"n2", "n3"}


def test_preferred_topology_falls_back_to_any_nodes() -> None:
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d2")]
    plan = solve(
        instance(
            nodes,
            [queue("q")],
            [job("big", replicas=2, gpu=8, topology="nvlink", mode=TopologyMode.PREFERRED)],
        )
    )
    assert status(plan, "q/big") is OutcomeStatus.PLACED


def test_best_fit_fills_a_used_node_before_an_empty_one() -> None:
    nodes = [node("a"), node("b")]
    first = job("first", gpu=4, submitted_at="1")
    second = job("second", gpu=4, submitted_at="2")
    plan = solve(instance(nodes, [queue("q")], [first, second]))
    a, b = plan.outcome("q/first"), plan.outcome("q/second")
    assert a is not None and b is not None
    assert a.replicas[0].node == b.replicas[0].node


def test_fractional_requests_share_one_physical_gpu() -> None:
    nodes = [node("a", gpus=1)]
    jobs = [job(f"f{i}", gpu=0.25) for i in range(4)]
    plan = solve(instance(nodes, [queue("q")], jobs))
    assert all(status(plan, f"q/f{i}") is OutcomeStatus.PLACED for i in range(4))
    fifth = solve(instance(nodes, [queue("q")], [*jobs, job("f4", gpu=0.25, priority=1)]))
    assert status(fifth, "q/f4") is OutcomeStatus.PENDING


def test_quota_borrowing_within_cohort_up_to_the_borrowing_limit() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    queues = [
        queue("a", cohort="c", quotas={"h100": (8, 8, None)}),
        queue("b", cohort="c", quotas={"h100": (24, None, None)}),
    ]
    jobs = [
        job("x", queue="a", gpu=8, submitted_at="1"),
        job("y", queue="a", gpu=8, submitted_at="2"),
        job("z", queue="a", gpu=8, submitted_at="3"),
    ]
    plan = solve(instance(nodes, queues, jobs))
    assert status(plan, "a/x") is OutcomeStatus.PLACED
    assert status(plan, "a/y") is OutcomeStatus.PLACED  # borrows 8 from b
    z = plan.outcome("a/z")
    assert z is not None and z.status is OutcomeStatus.PENDING
    assert "borrowing limit" in z.reason and z.constraint == "quota__a__h100"


def test_lending_limit_keeps_part_of_nominal_for_the_owner() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    queues = [
        queue("a", cohort="c", quotas={"h100": (8, None, None)}),
        queue("b", cohort="c", quotas={"h100": (24, None, 8)}),
    ]
    jobs = [job(f"x{i}", queue="a", gpu=8, submitted_at=str(i)) for i in range(3)]
    plan = solve(instance(nodes, queues, jobs))
    placed = [o for o in plan.outcomes if o.status is OutcomeStatus.PLACED]
    assert len(placed) == 2  # a's own 8 plus the 8 b lends; b keeps 16
    pending = [o for o in plan.outcomes if o.status is OutcomeStatus.PENDING]
    assert "cohort c shares 16 h100 GPUs and 16 are in use" in pending[0].reason


def test_no_cohort_means_no_borrowing() -> None:
    plan = solve(
        instance(
            [node("n1"), node("n2")],
            [queue("a", quotas={"h100": (8, None, None)})],
            [
                job("x", queue="a", gpu=8, submitted_at="1"),
                job("y", queue="a", gpu=8, submitted_at="2"),
            ],
        )
    )
    assert status(plan, "a/y") is OutcomeStatus.PENDING


def test_higher_priority_preempts_lower_in_the_same_queue() -> None:
    nodes = [node("n1")]
    low = job("low", gpu=8, priority=100)
    high = job("high", gpu=8, priority=900)
    running = {
        "q/low": Placement(
            "q/low", "h100", GREEDY.solve(instance(nodes, [queue("q")], [low])).outcomes[0].replicas
        )
    }
    plan = solve(instance(nodes, [queue("q")], [low, high], current=running))
    assert status(plan, "q/high") is OutcomeStatus.PLACED
    victim = plan.outcome("q/low")
    assert victim is not None and victim.status is OutcomeStatus.PREEMPTED
    assert victim.preempted_by == "q/high"


def test_non_preemptible_jobs_are_never_preempted() -> None:
    nodes = [node("n1")]
    low = job("low", gpu=8, priority=100, preemptible=False)
    high = job("high", gpu=8, priority=900)
    current = {
        "q/low": Placement(
            "q/low", "h100", GREEDY.solve(instance(nodes, [queue("q")], [low])).outcomes[0].replicas
        )
    }
    plan = solve(instance(nodes, [queue("q")], [low, high], current=current))
    assert status(plan, "q/low") is OutcomeStatus.KEPT
    assert status(plan, "q/high") is OutcomeStatus.PENDING


def test_preemption_off_in_policy() -> None:
    nodes = [node("n1")]
    low, high = job("low", gpu=8, priority=100), job("high", gpu=8, priority=900)
    current = {
        "q/low": Placement(
            "q/low", "h100", GREEDY.solve(instance(nodes, [queue("q")], [low])).outcomes[0].replicas
        )
    }
    plan = solve(
        instance(
            nodes,
            [queue("q")],
            [low, high],
            current=current,
            policy=Policy(preemption_enabled=False),
        )
    )
    assert status(plan, "q/low") is OutcomeStatus.KEPT


def test_a_queue_reclaims_its_nominal_from_a_borrower() -> None:
    nodes = [node("n1"), node("n2")]
    queues = [
        queue("a", cohort="c", quotas={"h100": (8, None, None)}),
        queue("b", cohort="c", quotas={"h100": (8, None, None)}),
    ]
    borrower = [
        job("b1", queue="b", gpu=8, submitted_at="1"),
        job("b2", queue="b", gpu=8, submitted_at="2"),
    ]
    first = GREEDY.solve(instance(nodes, queues, borrower))
    current = first.placements()
    assert len(current) == 2
    owner = job("a1", queue="a", gpu=8, priority=100)
    plan = solve(instance(nodes, queues, [*borrower, owner], current=current))
    assert status(plan, "a/a1") is OutcomeStatus.PLACED
    assert sorted(o.status for o in plan.outcomes if o.job.startswith("b/")) == [
        OutcomeStatus.KEPT,
        OutcomeStatus.PREEMPTED,
    ]


def test_dedicated_jobs_get_dedicated_nodes_alone() -> None:
    nodes = [node("shared"), node("sec", isolation=Isolation.DEDICATED, region="eu-central")]
    regulated = job("reg", gpu=1, isolation=Isolation.DEDICATED, residency=("eu-central",))
    other = job("other", gpu=1)
    another_regulated = job("reg2", gpu=1, isolation=Isolation.DEDICATED, priority=100)
    plan = solve(instance(nodes, [queue("q")], [regulated, other, another_regulated]))
    reg = plan.outcome("q/reg")
    assert reg is not None and reg.replicas[0].node == "sec"
    oth = plan.outcome("q/other")
    assert oth is not None and oth.replicas[0].node == "shared"
    assert status(plan, "q/reg2") is OutcomeStatus.PENDING


def test_residency_is_a_hard_rule() -> None:
    plan = solve(instance([node("n1", region="us")], [queue("q")], [job("x", residency=("eu",))]))
    outcome = plan.outcome("q/x")
    assert outcome is not None and outcome.status is OutcomeStatus.PENDING
    assert "regions eu" in outcome.reason


def test_a_running_job_on_a_failed_node_moves() -> None:
    from dataclasses import replace

    from gitsched.engine.model import NodeState

    nodes = [node("n1"), node("n2")]
    plan0 = GREEDY.solve(instance(nodes, [queue("q")], [job("x", gpu=8)]))
    current = plan0.placements()
    host = current["q/x"].replicas[0].node
    failed = [replace(n, state=NodeState.FAILED) if n.name == host else n for n in nodes]
    plan = solve(instance(failed, [queue("q")], [job("x", gpu=8)], current=current))
    moved = plan.outcome("q/x")
    assert moved is not None and moved.status is OutcomeStatus.MOVED
    assert moved.replicas[0].node != host


def test_elastic_gang_runs_with_fewer_replicas() -> None:
    plan = solve(
        instance(
            [node("n1"), node("n2")], [queue("q")], [job("e", replicas=4, min_replicas=2, gpu=8)]
        )
    )
    outcome = plan.outcome("q/e")
    assert (
        outcome is not None
        and outcome.status is OutcomeStatus.PLACED
        and len(outcome.replicas) == 2
    )


# -- invariants over generated clusters --------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(0, 3))
def test_greedy_plans_always_pass_the_checker_across_re_solves(inst, drop) -> None:  # type: ignore[no-untyped-def]
    """Capacity, gangs, topology, quota, isolation hold on the first solve and on a re-solve."""
    first = GREEDY.solve(inst)
    assert check_plan(inst, first) == []
    assert all(o.reason for o in first.outcomes if o.status is OutcomeStatus.PENDING)
    # Re-solve with the first plan running and some jobs gone: still legal, nothing lost silently.
    from dataclasses import replace

    remaining = inst.jobs[drop:]
    keys = {j.key for j in remaining}
    current = {k: p for k, p in first.placements().items() if k in keys}
    second_inst = replace(inst, jobs=remaining, current=current)
    second = GREEDY.solve(second_inst)
    assert check_plan(second_inst, second) == []
    for key in current:
        # A running job stays put unless a higher-priority job, for which the dropped jobs
        # made room, preempts it (or moves it to make room).
        outcome = second.outcome(key)
        assert outcome is not None
        assert (
            outcome.status is OutcomeStatus.KEPT
            or outcome.preempted_by
            or "make room" in outcome.reason
        )


def test_checker_catches_an_over_committed_gpu() -> None:
    from gitsched.engine.model import ReplicaPlacement
    from gitsched.engine.placement.plan import JobOutcome, SolveStats

    inst = instance([node("n1", gpus=1)], [queue("q")], [job("a"), job("b")])
    bad = PlacementPlan(
        outcomes=(
            JobOutcome("q/a", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n1", (0,), 1000),)),
            JobOutcome("q/b", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n1", (0,), 1000),)),
        ),
        stats=SolveStats("hand", "feasible", 0.0),
    )
    assert any("over-committed" in p for p in check_plan(inst, bad))


def test_checker_catches_a_split_gang_and_a_broken_domain() -> None:
    from gitsched.engine.model import ReplicaPlacement
    from gitsched.engine.placement.plan import JobOutcome, SolveStats

    inst = instance(
        [node("n1", nvlink="d1"), node("n2", nvlink="d2")],
        [queue("q")],
        [job("g", replicas=3, gpu=8, topology="nvlink")],
    )
    bad = PlacementPlan(
        outcomes=(
            JobOutcome(
                "q/g",
                OutcomeStatus.PLACED,
                "h100",
                (
                    ReplicaPlacement("n1", tuple(range(8)), 1000),
                    ReplicaPlacement("n2", tuple(range(8)), 1000),
                ),
            ),
        ),
        stats=SolveStats("hand", "feasible", 0.0),
    )
    problems = check_plan(inst, bad)
    assert any("gang split" in p for p in problems)
    assert any("spans 2 nvlink domains" in p for p in problems)


def test_one_replica_is_one_replica_in_a_reason() -> None:
    nodes = [node("n1", nvlink="d1")]
    running = job("running", gpu=8, submitted_at="1", preemptible=False)
    waiting = job("waiting", gpu=8, submitted_at="2")
    plan = solve(instance(nodes, [queue("q")], [running, waiting]))
    outcome = plan.outcome("q/waiting")
    assert outcome is not None and outcome.status is OutcomeStatus.PENDING
    assert "needs 1 replica of 8" in outcome.reason, outcome.reason
