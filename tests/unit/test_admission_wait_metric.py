"""serve's /metrics: gitsched_admission_wait_seconds{queue,priority_class} observes each
admission's wait in the log's times (a move is no admission; a requeued job waits from
the end of its backoff), and gitsched_jobs_pending counts waiting jobs per queue."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from gitsched.cluster.controller import StepReport
from gitsched.engine import events as ev
from gitsched.engine.model import RetryPolicy
from gitsched.engine.retries import due_retries, with_requeues
from gitsched.engine.state import ClusterState, fold
from gitsched.metrics import Metrics
from gitsched.reconciler.step import solve_step
from tests.support.factories import desired, job, node
from tests.support.time_steps import at, commit


def observed(metrics: Metrics, queue: str = "q") -> tuple[float | None, float | None]:
    labels = {"queue": queue, "priority_class": "x"}
    registry = metrics.registry
    return (
        registry.get_sample_value("gitsched_admission_wait_seconds_count", labels),
        registry.get_sample_value("gitsched_admission_wait_seconds_sum", labels),
    )


def record(metrics: Metrics, state: ClusterState) -> None:
    metrics.record(StepReport(state=state), datetime(2030, 1, 1, tzinfo=UTC))


def test_each_admission_is_observed_once_with_its_wait_from_the_log() -> None:
    metrics = Metrics()
    retry = RetryPolicy(max_retries=1, backoff_seconds=60, max_backoff_seconds=60)
    a = dataclasses.replace(job("a", gpu=8), retry=retry)
    b = job("b", gpu=8)
    record(metrics, ClusterState())  # the first pass learns what runs
    state = commit(ClusterState(), 1, 0, desired([a, b], nodes=[node("n1")]), "greedy")
    record(metrics, state)
    assert observed(metrics) == (1.0, 0.0)  # a at once
    assert metrics.registry.get_sample_value("gitsched_jobs_pending", {"queue": "q"}) == 1
    # a fails at 10:05; b is admitted then (it waited 5 minutes since its commit).
    told = with_requeues(state, [ev.JobFailed("q/a", "Error", 1, 0, at(5))])
    state = solve_step(fold(told, state), "k/1", at(5), "greedy").state
    record(metrics, state)
    assert observed(metrics) == (2.0, 300.0)
    record(metrics, state)  # nothing new: nothing observed again
    assert observed(metrics) == (2.0, 300.0)
    # b finishes at 10:20; a, whose backoff ended at 10:06, runs again: 14 minutes' wait.
    state = fold([ev.JobFinished("q/b", at(20))], state)
    state = fold(due_retries(state, at(20)), state)
    state = solve_step(state, "k/2", at(20), "greedy").state
    assert "q/a" in state.placements
    record(metrics, state)
    assert observed(metrics) == (3.0, 300.0 + 14 * 60)


def test_what_ran_before_the_daemon_started_is_not_an_admission_of_its_own() -> None:
    metrics = Metrics()
    state = commit(ClusterState(), 1, 0, desired([job("a", gpu=8)], nodes=[node("n1")]), "greedy")
    record(metrics, state)
    assert observed(metrics) == (None, None)
