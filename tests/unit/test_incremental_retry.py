"""Waiting jobs are retried by the incremental solve (issue #13): a commit that only adds
or edits jobs decides, beside them, the head of the waiting queue that may fit now, so a
job does not wait for a full solve that a stream of such commits never brings."""

from __future__ import annotations

import dataclasses

from gitsched.engine.core import ApplyCommit, decide
from gitsched.engine.model import Job, Placement, Policy, ReplicaPlacement
from gitsched.engine.placement.incremental import waiting_to_retry
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.engine.state import ClusterState, fold
from gitsched.reconciler.step import _changed_jobs, solve_step
from tests.support.factories import commit, desired, instance, job, node, queue

NOW = "2026-11-20T10:00:00+00:00"
NODES = [node("h", flavor="h100", gpus=8), node("a", flavor="a100", gpus=8)]


def _commit(state: ClusterState, n: int, jobs: list[Job], solver: str) -> ClusterState:
    """The reconciler's step for a commit of `jobs`: its events, then the solve they
    lead to (incremental when it only adds or edits a few jobs)."""
    policy = Policy(solver=solver, time_limit_s=5.0)
    events = decide(state, ApplyCommit(commit(n), desired(jobs, nodes=NODES, policy=policy)))
    state = fold(events, state)
    return solve_step(state, commit(n).sha, NOW, changed=_changed_jobs(events)).state


def test_a_waiting_job_is_placed_by_a_later_edit_only_commit_that_frees_room() -> None:
    # r1..r4 fill the one H100 node; "late" (H100 only, lower priority) waits for room.
    runners = [job(f"r{i}", gpu=2, flavors=("h100",)) for i in range(1, 5)]
    late = job("late", gpu=2, flavors=("h100",), priority=100)
    # An edit, and nothing else: r1 may now run on A100 only, which frees its H100 GPUs.
    edited = [dataclasses.replace(runners[0], gpu_flavors=("a100",)), *runners[1:], late]
    for solver in ("highs", "greedy"):
        first = _commit(ClusterState(), 1, [*runners, late], solver)
        assert "q/late" in first.pending, solver
        assert first.placements["q/r1"].flavor == "h100"
        second = _commit(first, 2, edited, solver)
        assert second.placements["q/r1"].flavor == "a100", solver
        # Before the retry, the incremental solve left "late" waiting "as at the last solve".
        assert second.placements["q/late"].flavor == "h100", solver
        assert "q/late" not in second.pending


def _one_node(jobs: list[Job], current: dict[str, Placement] | None = None) -> PlacementInstance:
    return instance([node("h", flavor="h100", gpus=8)], [queue("q")], jobs, current)


def test_retry_takes_the_queue_head_in_priority_then_arrival_order_within_free_room() -> None:
    jobs = [
        job("old", gpu=4, submitted_at="2026-11-20T09:00:00.000000Z"),
        job("new", gpu=4, submitted_at="2026-11-20T09:30:00.000000Z"),
        job("urgent", gpu=4, priority=900, submitted_at="2026-11-20T09:45:00.000000Z"),
        job("huge", gpu=16, priority=900, submitted_at="2026-11-20T08:00:00.000000Z"),
    ]
    # "huge" never fits one 8-GPU node; the 8 free GPUs hold two 4-GPU jobs: the
    # highest priority first, then the older of the rest.
    assert waiting_to_retry(_one_node(jobs), ()) == ("q/urgent", "q/old")
    assert waiting_to_retry(_one_node(jobs), (), limit=1) == ("q/urgent",)
    # A changed job is decided anyway: it is not retried as well.
    assert waiting_to_retry(_one_node(jobs), ("q/urgent",)) == ("q/old", "q/new")


def test_retry_counts_what_runs_but_the_jobs_the_commit_changed() -> None:
    running = {"q/r": Placement("q/r", "h100", (ReplicaPlacement("h", tuple(range(6)), 1000),))}
    inst = _one_node([job("r", gpu=6), job("w", gpu=4)], running)
    assert waiting_to_retry(inst, ()) == ()  # 2 GPUs free, "w" needs 4
    assert waiting_to_retry(inst, ("q/r",)) == ("q/w",)  # "r" is decided again


def test_retry_reads_whole_gpus_on_idle_nodes_and_shares_on_busy_ones() -> None:
    # "h": every GPU 600 milli used by a shared job; "e": one GPU, nothing on it.
    shared = tuple(ReplicaPlacement("h", (g,), 600) for g in range(8))
    running = {"q/f": Placement("q/f", "h100", shared)}
    jobs = [
        job("f", replicas=8, gpu=0.6),
        job("two", gpu=2, submitted_at="1"),  # no node has 2 whole GPUs free
        job("one", gpu=1, submitted_at="2"),  # "e"'s whole GPU
        job("share", gpu=0.4, submitted_at="3"),  # 400 milli left on each of "h"'s GPUs
    ]
    nodes = [node("h", flavor="h100", gpus=8), node("e", flavor="h100", gpus=1)]
    inst = instance(nodes, [queue("q")], jobs, running)
    assert waiting_to_retry(inst, ()) == ("q/one", "q/share")
