"""Minimum run time before preemption (engine/placement/preemption.py, too_young): a job
younger than its queue's or priority class's minRuntimeMinutes is no victim, in greedy and
the MILP alike, except for a non-preemptible preemptor or a node loss; `audit compliance`
re-judges every preemption on the decision's own time."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gitsched.audit import compliance as compliance_query
from gitsched.engine import events as ev
from gitsched.engine.core import DesiredState
from gitsched.engine.model import NodeState, Policy, PriorityClass
from gitsched.engine.placement.preemption import min_runtime_minutes, too_young
from gitsched.engine.state import ClusterState, fold
from gitsched.eventlog.envelope import format_time
from gitsched.reconciler.step import solve_step
from tests.support.audit_log import LogBuilder, bootstrap, hours, placed, submit, violations
from tests.support.factories import CLUSTER, desired, job, node, queue
from tests.support.time_steps import at, commit

SOLVERS = ["greedy", "highs", "cbc", "cpsat"]


def protected_queue(minutes: int | None = 30):  # type: ignore[no-untyped-def]
    return dataclasses.replace(queue("q"), min_runtime_minutes=minutes)


def running_low(solver: str, queues=None, cluster=CLUSTER):  # type: ignore[no-untyped-def]
    """q/low (priority 100) runs on the one node from 10:00."""
    d = desired(
        [job("low", gpu=8, priority=100)],
        nodes=[node("n1")],
        queues=queues or [protected_queue()],
        policy=Policy(solver=solver),
    )
    d = dataclasses.replace(d, cluster=cluster)
    state = commit(ClusterState(), 1, 0, d, solver)
    assert state.placements["q/low"].started_at == at(0)
    return state, d


def with_high(d: DesiredState, **kwargs: Any) -> DesiredState:
    jobs = dict(d.jobs)
    high = job("high", gpu=8, priority=900, **kwargs)
    jobs[high.key] = high
    return dataclasses.replace(d, jobs=jobs)


def test_too_young_reads_the_minimum_and_the_two_times() -> None:
    assert too_young("q/a", 30, at(0), at(29), preemptor_preemptible=True) is not None
    assert "29.0 of its 30 minimum minutes" in (
        too_young("q/a", 30, at(0), at(29), preemptor_preemptible=True) or ""
    )
    assert too_young("q/a", 30, at(0), at(30), preemptor_preemptible=True) is None
    assert too_young("q/a", 30, at(0), at(1), preemptor_preemptible=False) is None
    assert too_young("q/a", 0, at(0), at(1), preemptor_preemptible=True) is None


def test_the_longer_of_the_queue_and_the_priority_class_protects() -> None:
    cluster = dataclasses.replace(
        CLUSTER, priority_classes=(PriorityClass("x", 100, 45), PriorityClass("y", 200))
    )
    low = job("low")  # priority class "x"
    queues = {"q": protected_queue(30)}
    assert min_runtime_minutes(low, queues, cluster) == 45
    assert min_runtime_minutes(low, {"q": protected_queue(60)}, cluster) == 60
    assert min_runtime_minutes(low, {"q": protected_queue(None)}, CLUSTER) == 0


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_young_job_is_no_victim_and_an_old_one_is(solver: str) -> None:
    state, d = running_low(solver)
    young = commit(state, 2, 10, with_high(d), solver)
    assert "q/low" in young.placements and "q/high" in young.pending
    # The same state decided after the minimum: the low job stops for the high one.
    old = solve_step(young, "later", at(31), solver)
    preempted = [e for e in old.events if isinstance(e, ev.JobPreempted)]
    assert [(p.job, p.preempted_by, p.rule, p.at) for p in preempted] == [
        ("q/low", "q/high", "within-queue", at(31))
    ]
    assert "q/high" in old.state.placements


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_priority_class_minimum_protects_too(solver: str) -> None:
    cluster = dataclasses.replace(CLUSTER, priority_classes=(PriorityClass("x", 100, 20),))
    state, d = running_low(solver, queues=[protected_queue(None)], cluster=cluster)
    young = commit(state, 2, 10, with_high(d), solver)
    assert "q/low" in young.placements
    assert "q/high" in solve_step(young, "later", at(20), solver).state.placements


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_non_preemptible_preemptor_still_preempts_a_young_job(solver: str) -> None:
    state, d = running_low(solver)
    after = commit(state, 2, 10, with_high(d, preemptible=False), solver)
    assert "q/high" in after.placements and "q/low" not in after.placements


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_node_loss_stops_a_young_job(solver: str) -> None:
    state, _ = running_low(solver)
    state = fold([ev.NodeStateChanged("n1", NodeState.FAILED, "lost")], state)
    step = solve_step(state, "kubernetes/1", at(5), solver)
    preempted = [e for e in step.events if isinstance(e, ev.JobPreempted)]
    assert [(p.job, p.rule) for p in preempted] == [("q/low", "place-gone")]


@pytest.mark.parametrize("solver", SOLVERS)
def test_without_a_minimum_the_young_job_stops_as_before(solver: str) -> None:
    state, d = running_low(solver, queues=[protected_queue(None)])
    after = commit(state, 2, 1, with_high(d), solver)
    assert "q/high" in after.placements and "q/low" not in after.placements


# -- audit compliance re-judges it --------------------------------------------------------


def test_audit_finds_a_preemption_before_the_minimum_and_accepts_the_allowed_ones() -> None:
    log = LogBuilder()
    bootstrap(log)
    a = dataclasses.replace(
        queue("a", cohort="c", quotas={"h100": (8, 8, None)}), min_runtime_minutes=30
    )
    log.commit(0.5, [ev.QueueConfigured(a)])
    sha = submit(
        log,
        1,
        job("low", queue="a", gpu=8, priority=100),
        job("old", queue="a", gpu=8, priority=100),
    )
    log.solve(1, sha, [placed("a/low", ("n1", 8)), placed("a/old", ("n2", 8))])
    # 15 minutes in: too early.
    sha = submit(log, 1.25, job("high", queue="a", gpu=8, priority=900))
    seqs = log.solve(
        1.25,
        sha,
        [
            ev.JobPreempted(
                "a/low", "preempted by a/high", "a/high", 0.0, "s", "within-queue",
                format_time(hours(1.25)),
            ),
            placed("a/high", ("n1", 8)),
        ],
    )  # fmt: skip
    # An hour in: allowed; and a non-preemptible preemptor is always allowed.
    sha = submit(log, 2, job("urgent", queue="a", gpu=8, priority=900, preemptible=False))
    log.solve(
        2,
        sha,
        [
            ev.JobPreempted(
                "a/old", "preempted by a/urgent", "a/urgent", 0.0, "s", "within-queue",
                format_time(hours(2)),
            ),
            placed("a/urgent", ("n2", 8)),
        ],
    )  # fmt: skip
    with log.view() as store:
        found = violations(store)
        assert [(c, s) for c, s, _ in found] == [("preemption-rules", "a/low")]
        assert seqs[0] in found[0][2]
        (v,) = compliance_query.compliance(store)["violations"]
        assert "too early" in v["message"] and "15.0 of its 30 minimum minutes" in v["message"]


def test_audit_accepts_the_young_stop_of_a_non_preemptible_preemptor() -> None:
    log = LogBuilder()
    bootstrap(log)
    a = dataclasses.replace(
        queue("a", cohort="c", quotas={"h100": (8, 8, None)}), min_runtime_minutes=30
    )
    log.commit(0.5, [ev.QueueConfigured(a)])
    sha = submit(log, 1, job("low", queue="a", gpu=8, priority=100))
    log.solve(1, sha, [placed("a/low", ("n1", 8))])
    sha = submit(log, 1.1, job("urgent", queue="a", gpu=8, priority=900, preemptible=False))
    log.solve(
        1.1,
        sha,
        [
            ev.JobPreempted(
                "a/low", "preempted by a/urgent", "a/urgent", 0.0, "s", "within-queue",
                format_time(hours(1.1)),
            ),
            placed("a/urgent", ("n1", 8)),
        ],
    )  # fmt: skip
    with log.view() as store:
        assert violations(store) == []
