"""Retries (engine/retries.py) through the reconciler's own step: a failed job is requeued
after a backoff computed from the failure's time, waits it out, runs again, and gives up
after maxRetries; preempted jobs use up no retry; the requeue order follows the policy."""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine import events as ev
from gitsched.engine.model import NodeState, Policy, RequeueTimestamp, RetryPolicy
from gitsched.engine.retries import backoff_seconds, due_retries, held_back, next_due, with_requeues
from gitsched.engine.state import ClusterState, fold
from gitsched.reconciler.step import solve_step
from tests.support.factories import desired, job, node, queue
from tests.support.time_steps import at, commit

SOLVERS = ["greedy", "highs"]
RETRY = RetryPolicy(max_retries=3, backoff_seconds=30, max_backoff_seconds=100)


def cluster(state: ClusterState, events: list[ev.Event], now: str, solver: str):  # type: ignore[no-untyped-def]
    """What `serve` appends for what the cluster reported, then the solve it asks for."""
    told = with_requeues(state, events)
    state = fold(told, state)
    step = solve_step(state, f"kubernetes/{now}", now, solver)
    return step.state, told, step.events


def failed(key: str, when: str, reason: str = "Error: exit 1") -> ev.JobFailed:
    return ev.JobFailed(job=key, reason=reason, exit_code=1, replica=0, at=when)


def started(solver: str, policy: Policy | None = None, jobs=None) -> ClusterState:  # type: ignore[no-untyped-def]
    d = desired(
        jobs or [dataclasses.replace(job("train", gpu=8), retry=RETRY)],
        nodes=[node("n1")],
        policy=policy or Policy(solver=solver),
    )
    return commit(ClusterState(), 1, 0, d, solver)


def test_the_backoff_doubles_from_the_first_and_stops_at_the_maximum() -> None:
    assert [backoff_seconds(RETRY, n) for n in (1, 2, 3, 4, 5)] == [30, 60, 100, 100, 100]
    assert backoff_seconds(RetryPolicy(5, 0, 0), 1) == 0
    huge = RetryPolicy(max_retries=1000, backoff_seconds=1, max_backoff_seconds=7)
    assert backoff_seconds(huge, 1000) == 7  # no overflow far past the cap


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_failed_job_waits_its_backoff_from_the_failure_time_then_runs_again(solver: str) -> None:
    state = started(solver)
    assert "q/train" in state.placements
    state, told, solved = cluster(state, [failed("q/train", at(5))], at(5), solver)
    requeued = [e for e in told if isinstance(e, ev.JobRequeued)]
    assert len(requeued) == 1
    r = requeued[0]
    assert (r.attempt, r.max_retries, r.failed_at, r.ready_at) == (1, 3, at(5), at(5, 30))
    assert r.reason == "Error: exit 1" and r.cause == "failed" and r.backoff_seconds == 30
    # Not placed by the solve at the failure's time, though the node is free.
    assert "q/train" not in state.placements
    assert not any(isinstance(e, ev.PlacementDecided) for e in solved)
    assert "waits until 2026-11-20T10:05:30" in state.pending["q/train"].reason
    assert held_back(state, at(5, 29)) == {"q/train"}
    assert next_due(state) == at(5, 30)
    # serve records the end of the backoff at its own time, whenever it looks.
    assert due_retries(state, at(5, 29)) == ()
    due = due_retries(state, at(9))
    assert due == (ev.JobBackoffEnded("q/train", 1, at(5, 30)),)
    state = fold(due, state)
    step = solve_step(state, "kubernetes/due", due[0].at, solver)
    placed = [e for e in step.events if isinstance(e, ev.PlacementDecided)]
    assert [p.job for p in placed] == ["q/train"] and placed[0].at == at(5, 30)
    assert due_retries(step.state, at(9)) == ()  # recorded once


@pytest.mark.parametrize("solver", SOLVERS)
def test_each_attempt_waits_longer_and_after_max_retries_the_job_fails_with_its_last_reason(
    solver: str,
) -> None:
    state = started(solver)
    ready = []
    minute = 5
    for n in range(1, 4):
        state, told, _ = cluster(
            state, [failed("q/train", at(minute), f"boom {n}")], at(minute), solver
        )
        (r,) = [e for e in told if isinstance(e, ev.JobRequeued)]
        assert r.attempt == n
        ready.append(r.ready_at)
        state = fold(due_retries(state, r.ready_at), state)
        state = solve_step(state, f"due/{n}", r.ready_at, solver).state
        assert "q/train" in state.placements
        minute += 5
    assert ready == [at(5, 30), at(11), at(16, 40)]  # 30 s, 60 s, then capped at 100 s
    state, told, _ = cluster(state, [failed("q/train", at(minute), "boom 4")], at(minute), solver)
    assert [type(e) for e in told] == [ev.JobFailed]
    assert state.ended["q/train"] == "failed" and "q/train" not in state.jobs
    assert told[0].reason == "boom 4"


@pytest.mark.parametrize("solver", SOLVERS)
def test_an_interrupted_gang_counts_an_attempt_and_gives_up_with_a_job_failed(solver: str) -> None:
    one = RetryPolicy(max_retries=1, backoff_seconds=60, max_backoff_seconds=60)
    state = started(solver, jobs=[dataclasses.replace(job("train", gpu=8), retry=one)])
    lost = ev.JobInterrupted(job="q/train", reason="node n1 lost", at=at(5))
    state, told, _ = cluster(state, [lost], at(5), solver)
    assert [type(e) for e in told] == [ev.JobInterrupted, ev.JobRequeued]
    assert told[1].cause == "was interrupted" and told[1].ready_at == at(6)
    assert "q/train" not in state.placements
    state = fold(due_retries(state, at(6)), state)
    state = solve_step(state, "due", at(6), solver).state
    again = ev.JobInterrupted(job="q/train", reason="node n1 lost again", at=at(8))
    state, told, _ = cluster(state, [again], at(8), solver)
    assert [type(e) for e in told] == [ev.JobInterrupted, ev.JobFailed]
    assert told[1].reason == "node n1 lost again (gave up after 1 retries)"
    assert state.ended["q/train"] == "failed"


@pytest.mark.parametrize("solver", SOLVERS)
def test_without_a_retry_policy_a_failure_is_final_as_before(solver: str) -> None:
    state = started(solver, jobs=[job("train", gpu=8)])
    state, told, _ = cluster(state, [failed("q/train", at(5))], at(5), solver)
    assert [type(e) for e in told] == [ev.JobFailed]
    assert state.ended["q/train"] == "failed"


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_queue_then_the_policy_give_the_default(solver: str) -> None:
    policy = Policy(solver=solver, retry=RetryPolicy(2, 5, 5))
    d = desired(
        [job("a", gpu=4), job("b", gpu=4, queue="r")],
        nodes=[node("n1")],
        queues=[queue("q"), dataclasses.replace(queue("r"), retry=RetryPolicy(1, 7, 7))],
        policy=policy,
    )
    state = commit(ClusterState(), 1, 0, d, solver)
    state, told, _ = cluster(state, [failed("q/a", at(5)), failed("r/b", at(5))], at(5), solver)
    requeued = {e.job.key: e for e in told if isinstance(e, ev.JobRequeued)}
    assert (requeued["q/a"].max_retries, requeued["q/a"].ready_at) == (2, at(5, 5))
    assert (requeued["r/b"].max_retries, requeued["r/b"].ready_at) == (1, at(5, 7))


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_preempted_job_is_requeued_at_once_and_uses_up_no_retry(solver: str) -> None:
    low = dataclasses.replace(job("low", gpu=8, priority=100), retry=RETRY)
    state = started(solver, jobs=[low])
    high = job("high", gpu=8, priority=900)
    state = commit(
        state, 2, 2, desired([low, high], nodes=[node("n1")], policy=Policy(solver=solver)), solver
    )
    assert "q/high" in state.placements and state.pending["q/low"].constraint == "preempted"
    assert "q/low" not in state.retries
    # The high job ends: the low one runs again at once, no backoff.
    state, told, _ = cluster(state, [ev.JobFinished("q/high", at(3))], at(3), solver)
    assert not any(isinstance(e, ev.JobRequeued) for e in told)
    assert "q/low" in state.placements
    # Its first failure is its first retry.
    state, told, _ = cluster(state, [failed("q/low", at(4))], at(4), solver)
    (r,) = [e for e in told if isinstance(e, ev.JobRequeued)]
    assert r.attempt == 1 and r.ready_at == at(4, 30)


@pytest.mark.parametrize(
    ("timestamp", "first"),
    [(RequeueTimestamp.CREATION, "q/old"), (RequeueTimestamp.EVICTION, "q/new")],
)
def test_a_requeued_job_keeps_its_place_or_goes_to_the_back_as_the_policy_says(
    timestamp: RequeueTimestamp, first: str
) -> None:
    policy = Policy(solver="greedy", requeue_timestamp=timestamp)
    now = RetryPolicy(max_retries=2, backoff_seconds=0, max_backoff_seconds=0)
    old = dataclasses.replace(job("old", gpu=8), retry=now)
    state = commit(
        ClusterState(), 1, 0, desired([old], nodes=[node("n1")], policy=policy), "greedy"
    )
    new = job("new", gpu=8)
    state = commit(state, 2, 1, desired([old, new], nodes=[node("n1")], policy=policy), "greedy")
    assert "q/old" in state.placements and "q/new" in state.pending
    state, told, _ = cluster(state, [failed("q/old", at(5))], at(5), "greedy")
    (r,) = [e for e in told if isinstance(e, ev.JobRequeued)]
    expected = at(0) if timestamp is RequeueTimestamp.CREATION else at(5)
    assert r.job.submitted_at == expected
    assert list(state.placements) == [first]


def test_a_failure_that_says_no_time_is_timed_by_the_log_not_the_clock() -> None:
    state = started("greedy")
    lost = ev.JobInterrupted(job="q/train", reason="pod deleted outside gitsched")
    told = with_requeues(state, [lost])
    # The latest time the log told: the placement at the commit's time (10:00).
    requeued = told[1]
    assert isinstance(requeued, ev.JobRequeued)
    assert requeued.failed_at == at(0) and requeued.ready_at == at(0, 30)


def test_replaying_the_events_gives_the_same_state() -> None:
    state = started("greedy")
    log: list[ev.Event] = []
    told = with_requeues(state, [failed("q/train", at(5))])
    log += told
    s1 = fold(told, state)
    due = due_retries(s1, at(7))
    log += due
    s2 = fold(due, s1)
    assert fold(log, state) == s2
    assert s2.retries["q/train"].due and s2.needs_placement


def test_a_node_failed_state_does_not_start_a_retry_early() -> None:
    state = started("greedy")
    state, _, _ = cluster(state, [failed("q/train", at(5))], at(5), "greedy")
    state = fold([ev.NodeStateChanged("n1", NodeState.READY, "ok")], state)
    assert "q/train" not in solve_step(state, "x", at(5, 10), "greedy").state.placements
