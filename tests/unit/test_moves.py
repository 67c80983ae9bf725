"""Moves that pay: a running job moves only for a reason a rule gives (engine/placement/moves.py),
the same for greedy and the MILP on every backend, at most maxMovesPerSolve of its own accord."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gitsched.engine.model import NodeState, Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.moves import MoveReason, move_reasons, settle_moves
from gitsched.engine.placement.objective import move_penalty
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementPlan,
    Placer,
    SolveStats,
)
from tests.support.factories import instance, job, node, queue

STARTED = "2026-11-22T10:00:00+00:00"  # two hours before the factories' "now"
SOLVERS: dict[str, Placer] = {
    "greedy": GreedyPlacer(),
    "highs": MilpPlacer("highs"),
    "cbc": MilpPlacer("cbc"),
}


def on(key: str, node_name: str, gpus: tuple[int, ...]) -> Placement:
    return Placement(key, "h100", (ReplicaPlacement(node_name, gpus, 1000),), started_at=STARTED)


def crowded(cap: int | None):  # type: ignore[no-untyped-def]
    """Two 2-GPU nodes, a 1-GPU job on each; a 2-GPU job of higher priority waits. Only by
    moving one running job next to the other (or stopping it) does the waiting job run."""
    nodes = [node("n1", gpus=2), node("n2", gpus=2)]
    jobs = [job("a", gpu=1), job("b", gpu=1), job("big", gpu=2, priority=900)]
    current = {"q/a": on("q/a", "n1", (0,)), "q/b": on("q/b", "n2", (0,))}
    return instance(nodes, [queue("q")], jobs, current, Policy(max_moves_per_solve=cap))


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_a_move_that_lets_waiting_work_run_is_made_and_says_why(solver: str) -> None:
    inst = crowded(None)
    plan = SOLVERS[solver].solve(inst)
    assert check_plan(inst, plan) == []
    assert plan.counts()[OutcomeStatus.PLACED] == 1
    moved = [o for o in plan.outcomes if o.status is OutcomeStatus.MOVED]
    assert len(moved) == 1 and plan.counts()[OutcomeStatus.PREEMPTED] == 0
    (move,) = moved
    assert move.rule == MoveReason.MAKES_ROOM
    assert "q/big" in move.reason
    # Two hours run with no checkpoint: two GPU-hours lost.
    assert move.lost_gpu_seconds == pytest.approx(7200.0)


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_with_a_cap_of_zero_no_running_job_migrates(solver: str) -> None:
    inst = crowded(0)
    plan = SOLVERS[solver].solve(inst)
    assert check_plan(inst, plan) == []
    assert plan.counts()[OutcomeStatus.MOVED] == 0
    # The waiting job still runs: a lower-priority job stops for it instead (Kueue's way).
    assert plan.counts()[OutcomeStatus.PLACED] == 1
    assert plan.counts()[OutcomeStatus.PREEMPTED] == 1


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_a_job_whose_node_failed_moves_whatever_the_cap(solver: str) -> None:
    nodes = [replace(node("n1", gpus=2), state=NodeState.FAILED), node("n2", gpus=2)]
    inst = instance(
        nodes,
        [queue("q")],
        [job("a", gpu=1)],
        {"q/a": on("q/a", "n1", (0,))},
        Policy(max_moves_per_solve=0),
    )
    plan = SOLVERS[solver].solve(inst)
    assert check_plan(inst, plan) == []
    move = plan.outcome("q/a")
    assert move is not None and move.status is OutcomeStatus.MOVED
    assert move.rule == MoveReason.PLACE_GONE and "Failed" in move.reason


def test_a_move_for_nothing_is_undone_and_the_check_names_it() -> None:
    """A plan that moves a job when nothing waits for its place (a tidier packing, a solver
    stopped short): the check finds it, and settling keeps the job where it is."""
    inst = instance(
        [node("n1", gpus=2), node("n2", gpus=2)],
        [queue("q")],
        [job("a", gpu=1)],
        {"q/a": on("q/a", "n1", (0,))},
    )
    wandered = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n2", (1,), 1000),)),
    )
    plan = PlacementPlan(wandered, SolveStats("test", "heuristic", 0.0))
    assert move_reasons(inst, wandered) == {"q/a": None}
    assert check_plan(inst, plan) == ["q/a: moved, but no rule allows the move"]
    (settled,) = settle_moves(inst, wandered)
    assert settled.status is OutcomeStatus.KEPT
    assert settled.replicas == inst.current["q/a"].replicas
    assert check_plan(inst, PlacementPlan((settled,), plan.stats)) == []


def test_a_move_that_makes_room_for_a_move_that_makes_room_is_allowed() -> None:
    """A chain: c is admitted where b was, b went where a was, a went elsewhere."""
    nodes = [node("n1", gpus=1), node("n2", gpus=1), node("n3", gpus=1)]
    inst = instance(
        nodes,
        [queue("q")],
        [job("a", gpu=1), job("b", gpu=1), job("c", gpu=1)],
        {"q/a": on("q/a", "n1", (0,)), "q/b": on("q/b", "n2", (0,))},
    )
    outcomes = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n3", (0,), 1000),)),
        JobOutcome("q/b", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n1", (0,), 1000),)),
        JobOutcome("q/c", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n2", (0,), 1000),)),
    )
    found = move_reasons(inst, outcomes)
    assert {k: v[0] if v else None for k, v in found.items()} == {
        "q/a": MoveReason.MAKES_ROOM,
        "q/b": MoveReason.MAKES_ROOM,
    }
    assert check_plan(inst, PlacementPlan(outcomes, SolveStats("test", "heuristic", 0.0))) == []


def test_more_moves_than_the_cap_are_a_finding() -> None:
    nodes = [node("n1", gpus=1), node("n2", gpus=1), node("n3", gpus=1)]
    inst = instance(
        nodes,
        [queue("q")],
        [job("a", gpu=1), job("b", gpu=1), job("c", gpu=1)],
        {"q/a": on("q/a", "n1", (0,)), "q/b": on("q/b", "n2", (0,))},
        Policy(max_moves_per_solve=1),
    )
    outcomes = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n3", (0,), 1000),)),
        JobOutcome("q/b", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n1", (0,), 1000),)),
        JobOutcome("q/c", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n2", (0,), 1000),)),
    )
    problems = check_plan(inst, PlacementPlan(outcomes, SolveStats("test", "heuristic", 0.0)))
    assert problems == ["moves: 2 running jobs moved, maxMovesPerSolve is 1"]


def test_a_move_costs_a_restart_per_replica_and_the_work_since_the_checkpoint() -> None:
    policy = Policy()
    small, gang = job("s", gpu=1), job("g", gpu=1, replicas=4)
    assert move_penalty(gang, 0.0, policy) == pytest.approx(4 * move_penalty(small, 0.0, policy))
    assert move_penalty(small, 3600.0, policy) > move_penalty(small, 0.0, policy)
    assert move_penalty(small, 0.0, replace(policy, move_cost=0.0)) == 0.0


def test_a_job_admitted_beside_the_old_place_is_no_reason_to_move() -> None:
    """The admitted job took other GPUs of the node the job left: the job could have stayed."""
    inst = instance(
        [node("n1", gpus=2), node("n2", gpus=2)],
        [queue("q")],
        [job("a", gpu=1), job("c", gpu=1)],
        {"q/a": on("q/a", "n1", (0,))},
    )
    outcomes = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n2", (0,), 1000),)),
        JobOutcome("q/c", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n1", (1,), 1000),)),
    )
    assert move_reasons(inst, outcomes) == {"q/a": None}
    settled = settle_moves(inst, outcomes)
    assert [o.status for o in settled] == [OutcomeStatus.KEPT, OutcomeStatus.PLACED]
    assert check_plan(inst, PlacementPlan(settled, SolveStats("test", "heuristic", 0.0))) == []


def test_a_move_whose_cpu_went_to_an_admitted_job_made_room() -> None:
    """Other GPUs, but the node's CPU: the job could not go back, so its move made room."""
    inst = instance(
        [node("n1", gpus=2, cpu=4), node("n2", gpus=2, cpu=4)],
        [queue("q")],
        [job("a", gpu=1, cpu=3), job("c", gpu=1, cpu=3)],
        {"q/a": on("q/a", "n1", (0,))},
    )
    outcomes = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n2", (0,), 1000),)),
        JobOutcome("q/c", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n1", (1,), 1000),)),
    )
    found = move_reasons(inst, outcomes)["q/a"]
    assert found is not None and found[0] is MoveReason.MAKES_ROOM and "q/c" in found[1]


def half(key: str, node_name: str) -> Placement:
    return Placement(key, "h100", (ReplicaPlacement(node_name, (0,), 500),), started_at=STARTED)


def shared_gpu():  # type: ignore[no-untyped-def]
    """One GPU on n1 shared by two half-GPU jobs; `grow` (elastic, 1 to 2 replicas) may run
    only on n1 (its residency), so it grows only if `other` leaves for n2."""
    nodes = [node("n1", gpus=1), node("n2", gpus=1, region="us")]
    jobs = [
        job("other", gpu=0.5, priority=100),
        job("grow", gpu=0.5, replicas=2, min_replicas=1, priority=900, residency=("eu",)),
    ]
    current = {"q/other": half("q/other", "n1"), "q/grow": half("q/grow", "n1")}
    return instance(nodes, [queue("q")], jobs, current)


def test_a_move_that_lets_an_elastic_job_grow_on_a_gpu_it_shares_made_room() -> None:
    """Hypothesis found it (tests/contract/test_solvers.py): the grown replica takes more of
    a GPU the job already shared, which read as no arrival there, so `other`'s move was
    undone and put it back beside both replicas: that GPU 150% full."""
    inst = shared_gpu()
    grown = (ReplicaPlacement("n1", (0,), 500), ReplicaPlacement("n1", (0,), 500))
    outcomes = (
        JobOutcome("q/other", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n2", (0,), 500),)),
        JobOutcome("q/grow", OutcomeStatus.MOVED, "h100", grown),
    )
    found = move_reasons(inst, outcomes)["q/other"]
    assert found is not None and found[0] is MoveReason.MAKES_ROOM and "q/grow" in found[1]
    settled = settle_moves(inst, outcomes)
    assert [o.status for o in settled] == [OutcomeStatus.MOVED, OutcomeStatus.MOVED]
    assert check_plan(inst, PlacementPlan(settled, SolveStats("test", "optimal", 0.0))) == []


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_an_elastic_job_grows_on_its_shared_gpu_with_the_milp(solver: str) -> None:
    """(Greedy grows no running job: it keeps it as it is.)"""
    inst = shared_gpu()
    placer = SOLVERS[solver]
    plan = placer.solve(inst)
    assert check_plan(inst, plan) == []
    report = getattr(placer, "last_report", None)
    assert report is None or report.problems == ()
    assert len(plan.outcome("q/grow").replicas) == 2  # type: ignore[union-attr]
    assert plan.outcome("q/other").status is OutcomeStatus.MOVED  # type: ignore[union-attr]


def test_plan_says_why_a_job_moved_and_what_it_loses() -> None:
    from gitsched.reconciler.plan import Action, JobEffect
    from gitsched.render_plan import effect_detail

    move = JobEffect(
        "q/a",
        Action.MOVED,
        "moved to make room on n1 for q/big (admitted by this plan)",
        "h100",
        1000,
        ("n1",),
        ("n2",),
        lost_gpu_seconds=7200.0,
        rule=MoveReason.MAKES_ROOM,
    )
    where, why = effect_detail(move)
    assert where == "1 GPU h100: n1 -> n2; makes-room, loses 2.0 GPU-h since its last checkpoint"
    assert "for q/big" in why


def test_past_the_cap_a_job_that_made_room_stops_instead_where_the_rules_allow() -> None:
    """Two moves each make room for a higher-priority job; with a cap of 1 the lower in
    victim order stops instead (its preemptor may preempt it), and the plan is lawful."""
    nodes = [node("n1", gpus=1), node("n2", gpus=1), node("n3", gpus=1), node("n4", gpus=1)]
    jobs = [
        job("a", gpu=1, priority=100),
        job("b", gpu=1, priority=500),
        job("x", gpu=1, priority=900),
        job("y", gpu=1, priority=900),
    ]
    current = {"q/a": on("q/a", "n1", (0,)), "q/b": on("q/b", "n2", (0,))}
    inst = instance(nodes, [queue("q")], jobs, current, Policy(max_moves_per_solve=1))
    outcomes = (
        JobOutcome("q/a", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n3", (0,), 1000),)),
        JobOutcome("q/b", OutcomeStatus.MOVED, "h100", (ReplicaPlacement("n4", (0,), 1000),)),
        JobOutcome("q/x", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n1", (0,), 1000),)),
        JobOutcome("q/y", OutcomeStatus.PLACED, "h100", (ReplicaPlacement("n2", (0,), 1000),)),
    )
    settled = {o.job: o for o in settle_moves(inst, outcomes)}
    assert settled["q/a"].status is OutcomeStatus.PREEMPTED
    assert settled["q/a"].preempted_by == "q/x" and "maxMovesPerSolve 1" in settled["q/a"].reason
    assert settled["q/b"].status is OutcomeStatus.MOVED
    assert settled["q/b"].rule == MoveReason.MAKES_ROOM
    plan = PlacementPlan(tuple(settled.values()), SolveStats("test", "heuristic", 0.0))
    assert check_plan(inst, plan) == []


def test_a_solve_in_parts_shares_the_cap_so_the_whole_plan_keeps_it() -> None:
    from gitsched.engine.placement.decompose import _move_share

    def shares(cap: int | None, parts: int) -> list[int | None]:
        return [_move_share(Policy(max_moves_per_solve=cap), parts, i) for i in range(parts)]

    assert shares(8, 3) == [3, 3, 2]
    assert shares(2, 5) == [1, 1, 0, 0, 0]
    assert shares(None, 2) == [None, None]
