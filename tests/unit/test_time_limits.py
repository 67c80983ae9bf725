"""Time limits and backfill with reservations (docs/time.md), in both solvers.

The scenes: n1 has 4 of its 8 GPUs taken by q/a until 12:30 (its limit); n2 and n3 are
held by jobs without a limit. q/big (8 GPUs, high priority) cannot start at 12:00: it
gets a reservation on n1 from 12:30, and the 4-GPU jobs below it start only if they
cannot delay that.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gitsched.audit.projection.diffs import queue_diff
from gitsched.engine import events as ev
from gitsched.engine.core import ApplyCommit, DesiredState, decide, placement_instance
from gitsched.engine.model import (
    BackfillPolicy,
    CommitInfo,
    Job,
    Placement,
    Policy,
    QueueTimeLimits,
    ReplicaPlacement,
)
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import priority_key
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance
from gitsched.engine.placement.reservations import HELD, RESERVED, reserve
from gitsched.engine.placement.solvers import solve
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.timelimits import due_events, next_due, plus_minutes
from gitsched.eventlog import codec
from gitsched.eventlog.envelope import GENESIS_HASH, NewEvent, StoredEvent, seal
from gitsched.policies.approval import describe_queue_change
from gitsched.reconciler.step import due_step
from tests.support.factories import CLUSTER, job, node, queue

NOW = "2026-11-22T12:00:00.000000Z"
STARTED = "2026-11-22T11:30:00.000000Z"
SOLVERS = ("greedy", "highs")


def limited(j: Job, minutes: int | None) -> Job:
    return dataclasses.replace(j, time_limit_minutes=minutes)


def on(node_name: str, gpus: range, key: str) -> Placement:
    replicas = tuple(ReplicaPlacement(node_name, (g,), 1000) for g in gpus)
    return Placement(key, "h100", replicas, started_at=STARTED)


def scene(
    solver: str,
    reservations: int = 1,
    *,
    a_limit: int | None = 60,
    n3_taken: range = range(8),
    waiting: tuple[Job, ...] = (),
) -> PlacementInstance:
    running = [
        limited(job("a", replicas=4, submitted_at="2026-11-22T11:00:00Z"), a_limit),
        job("c", replicas=8, submitted_at="2026-11-22T11:00:00Z"),
        job("e", replicas=len(n3_taken), submitted_at="2026-11-22T11:00:00Z"),
    ]
    big = limited(job("big", gpu=8, priority=900, submitted_at="2026-11-22T11:50:00Z"), 120)
    current = {
        "q/a": on("n1", range(4), "q/a"),
        "q/c": on("n2", range(8), "q/c"),
        "q/e": on("n3", n3_taken, "q/e"),
    }
    return PlacementInstance(
        cluster=CLUSTER,
        nodes=tuple(node(n) for n in ("n1", "n2", "n3")),
        queues=(queue("q"),),
        jobs=(*running, big, *waiting),
        current=current,
        policy=Policy(
            solver=solver,
            preemption_enabled=False,
            backfill=BackfillPolicy(reservations=reservations),
        ),
        now=NOW,
    )


LONG = limited(job("long", gpu=4, submitted_at="2026-11-22T11:51:00Z"), 600)
SHORT = limited(job("short", gpu=4, submitted_at="2026-11-22T11:52:00Z"), 20)
FOREVER = job("forever", gpu=4, submitted_at="2026-11-22T11:51:00Z")


def test_the_top_job_that_cannot_start_gets_a_reservation_when_a_limit_frees_room() -> None:
    book = reserve(scene("greedy", waiting=(LONG,)))
    (r,) = book.reservations
    assert (r.job, r.start, r.nodes, r.flavor, r.gpu_milli) == (
        "q/big",
        "2026-11-22T12:30:00.000000Z",
        ("n1",),
        "h100",
        8000,
    )
    assert r.waits_for == ("q/a",)
    assert book.constraining(LONG) == (r,)
    assert book.constraining(SHORT) == ()  # not in the book: it ends 12:20 anyway


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_job_that_would_delay_the_reservation_is_held_one_that_ends_in_time_starts(
    solver: str,
) -> None:
    instance = scene(solver, waiting=(LONG, SHORT))
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    big, long, short = (plan.outcome(k) for k in ("q/big", "q/long", "q/short"))
    assert big is not None and long is not None and short is not None
    assert big.status is OutcomeStatus.PENDING and big.constraint == RESERVED
    assert big.reason.startswith("reserved from 2026-11-22 12:30 UTC on node n1")
    assert "when q/a reaches its limit" in big.reason
    assert long.status is OutcomeStatus.PENDING and long.constraint == HELD
    assert "held for the reservation of q/big" in long.reason
    assert short.status is OutcomeStatus.PLACED
    assert {r.node for r in short.replicas} == {"n1"}
    assert [r.job for r in plan.reservations] == ["q/big"]


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_job_without_a_limit_is_held_and_the_plan_says_why(solver: str) -> None:
    plan = solve(scene(solver, waiting=(FOREVER,)))
    forever = plan.outcome("q/forever")
    assert forever is not None and forever.status is OutcomeStatus.PENDING
    assert "has no time limit" in forever.reason


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_job_on_nodes_the_reservation_does_not_take_starts(solver: str) -> None:
    # n3 keeps 2 GPUs free: too few for q/big even if the MILP moved things around.
    small = dataclasses.replace(LONG, resources=dataclasses.replace(LONG.resources, gpu_milli=2000))
    instance = scene(solver, n3_taken=range(6), waiting=(small,))
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    long = plan.outcome("q/long")
    assert long is not None and long.status is OutcomeStatus.PLACED
    assert {r.node for r in long.replicas} == {"n3"}


@pytest.mark.parametrize("solver", SOLVERS)
def test_no_reservations_is_todays_behaviour(solver: str) -> None:
    instance = scene(solver, reservations=0, waiting=(LONG, SHORT))
    plan = solve(instance)
    long, short = plan.outcome("q/long"), plan.outcome("q/short")
    assert long is not None and long.status is OutcomeStatus.PLACED  # first in order, fits now
    assert short is not None and short.status is OutcomeStatus.PENDING
    assert plan.reservations == ()


@pytest.mark.parametrize("solver", SOLVERS)
def test_running_jobs_without_limits_make_no_reservation_and_the_plan_names_them(
    solver: str,
) -> None:
    plan = solve(scene(solver, a_limit=None, waiting=(LONG,)))
    big, long = plan.outcome("q/big"), plan.outcome("q/long")
    assert plan.reservations == ()
    assert big is not None and "no reservation: q/a, q/c and q/e have no time limit" in big.reason
    assert long is not None and long.status is OutcomeStatus.PLACED


# -- a job stopped at its limit ----------------------------------------------------------


def running_state(limit: int | None) -> ClusterState:
    commit = CommitInfo("a" * 40, "Ana", "ana@example.com", "2026-11-22T11:30:00+00:00", "jobs")
    jobs = [limited(job("train", gpu=8), limit), job("next", gpu=8)]
    desired = DesiredState(
        cluster=CLUSTER,
        policy=Policy(),
        nodes={"n1": node("n1")},
        queues={"q": queue("q")},
        jobs={j.key: j for j in jobs},
    )
    state = fold(decide(ClusterState(), ApplyCommit(commit, desired)), ClusterState())
    replicas = (ReplicaPlacement("n1", tuple(range(8)), 1000),)
    return fold(
        [
            ev.PlacementDecided("q/train", "h100", replicas, "admitted", "", "s1", STARTED),
            ev.JobPending("q/next", "no room", "capacity", "s1"),
            ev.SolveCompleted(
                "s1", "greedy", "heuristic", 0.0, None, None, 0.0, 0, 0, 1, 0, 0, 0, 1
            ),
        ],
        state,
    )


def test_a_running_job_reaches_its_limit_at_start_plus_limit_and_is_stopped_then() -> None:
    state = running_state(45)
    assert next_due(state) == "2026-11-22T12:15:00.000000Z"
    assert due_events(state, "2026-11-22T12:14:59+00:00") == ()
    (timed_out,) = due_events(state, "2026-11-22T13:00:00+00:00")
    # The event's time is when the limit was reached, not when anyone looked.
    assert timed_out == ev.JobTimedOut(
        job="q/train",
        at="2026-11-22T12:15:00.000000Z",
        started_at=STARTED,
        limit_minutes=45,
    )
    after = fold([timed_out], state)
    assert "q/train" not in after.placements and after.ended["q/train"] == "timed_out"
    assert after.needs_placement


def test_serve_appends_the_stop_and_places_the_waiting_job_at_the_limits_time() -> None:
    state = running_state(45)
    assert due_step(state, "2026-11-22T12:00:00+00:00") is None
    step = due_step(state, "2026-11-22T13:00:00+00:00", solver="greedy")
    assert step is not None
    types = [e.type for e in step.events]
    assert types[0] == "JobTimedOut" and "PlacementDecided" in types
    placed = next(e for e in step.events if isinstance(e, ev.PlacementDecided))
    assert (placed.job, placed.at) == ("q/next", "2026-11-22T12:15:00.000000Z")
    # Looked at later, the same events: the log does not depend on when the daemon woke.
    again = due_step(state, "2026-11-22T18:00:00+00:00", solver="greedy")
    assert again is not None
    decided = [e for e in step.events if not isinstance(e, ev.SolveCompleted)]
    assert [e for e in again.events if not isinstance(e, ev.SolveCompleted)] == decided
    assert [g.ids() for g in again.groups] == [g.ids() for g in step.groups]


def test_a_job_without_a_limit_is_never_due() -> None:
    state = running_state(None)
    assert next_due(state) is None
    assert due_events(state, "2030-01-01T00:00:00+00:00") == ()


# -- wait order --------------------------------------------------------------------------


def test_jobs_of_equal_priority_go_in_the_order_of_the_commits_that_submitted_them() -> None:
    """Two commits in the same second (git dates have whole seconds): the first commit's
    job is first, though its name sorts last; jobs of one commit go by key."""
    desired = DesiredState(
        cluster=CLUSTER,
        policy=Policy(),
        nodes={"n1": node("n1")},
        queues={"q": queue("q")},
        jobs={},
    )
    state = ClusterState()
    when = "2026-11-22T12:00:00+00:00"
    for sha, names in (("a" * 40, ("z",)), ("b" * 40, ("a", "m"))):
        jobs = {**desired.jobs, **{f"q/{n}": job(n, gpu=8) for n in names}}
        desired = dataclasses.replace(desired, jobs=jobs)
        commit = CommitInfo(sha, "Ana", "ana@example.com", when, "jobs")
        state = fold(decide(state, ApplyCommit(commit, desired)), state)
    assert {j.submitted_at for j in state.jobs.values()} == {when}
    ordered = sorted(state.jobs.values(), key=priority_key)
    assert [j.key for j in ordered] == ["q/z", "q/a", "q/m"]
    for solver in SOLVERS:
        # (The MILP's objective has no term for it: of plans that score alike, it takes the
        # one that starts the jobs submitted first.)
        plan = solve(placement_instance(state, NOW), solver)
        placed = [o.job for o in plan.outcomes if o.status is OutcomeStatus.PLACED]
        assert placed == ["q/z"], solver


def test_a_change_of_a_queues_time_limits_is_told_to_its_reviewers_and_in_audit() -> None:
    before = queue("q")
    after = dataclasses.replace(before, time_limits=QueueTimeLimits(60, 600))
    assert describe_queue_change(before, after) == (
        "changes queue q: timeLimits - -> default 60/max 600 min"
    )
    old: dict[str, object] = {
        "cohort": None,
        "quotas": [],
    }  # a QueueConfigured logged before time limits
    new = {**old, "time_limits": {"default_minutes": 60, "max_minutes": 600}}
    assert queue_diff(old, new) == "time limits default -/max - min -> default 60/max 600 min"
    assert queue_diff(
        old, {**old, "time_limits": {"default_minutes": None, "max_minutes": None}}
    ) == ("no effective change")


def stored(type_name: str, version: int, data: dict[str, Any]) -> StoredEvent:
    return seal(
        NewEvent("x/0", type_name, version, data, "a", "c"),
        seq=1,
        time="2026-01-01T00:00:00.000000Z",
        prev_hash=GENESIS_HASH,
    )


def test_events_logged_before_time_limits_read_as_no_limit_no_backfill() -> None:
    """The new fields have defaults that mean what the old log did: no limit, no queue
    limits, backfill off, submission order unknown (0: before every new commit)."""
    old_job = {
        "name": "a",
        "queue": "q",
        "replicas": 1,
        "resources": {"gpu_milli": 1000, "cpu_milli": 1000, "memory_mib": 1024},
        "priority_class": "normal",
        "priority": 500,
        "submitted_at": "2025-01-01T00:00:00+00:00",
    }
    submitted = codec.decode(stored("JobSubmitted", 1, {"job": old_job}))
    assert isinstance(submitted, ev.JobSubmitted)
    assert (submitted.job.time_limit_minutes, submitted.job.submission) == (None, 0)
    queued = codec.decode(stored("QueueConfigured", 1, {"queue": {"name": "q", "team": "q"}}))
    assert isinstance(queued, ev.QueueConfigured)
    assert queued.queue.time_limits == QueueTimeLimits(None, None)
    policy = codec.decode(stored("PolicyChanged", 1, {"policy": {"solver": "greedy"}}))
    assert isinstance(policy, ev.PolicyChanged)
    assert policy.policy.backfill == BackfillPolicy(reservations=0)


# -- the rule, on random clusters -----------------------------------------------------------

scenes = st.tuples(
    st.lists(
        # mostly limited, mostly still running at 12:00 (started 11:30): ends ahead
        st.tuples(
            st.integers(1, 8), st.one_of(st.none(), st.integers(5, 240), st.integers(31, 240))
        ),
        min_size=1,
        max_size=10,
    ),
    st.lists(
        st.tuples(
            st.sampled_from((1, 2, 4, 8)),
            st.integers(1, 2),
            st.sampled_from((100, 500, 900)),
            st.one_of(st.none(), st.integers(5, 600)),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 3),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(scene=scenes, solver=st.sampled_from(SOLVERS))
def test_no_job_a_plan_starts_delays_a_reservation_it_holds(
    scene: tuple[list[tuple[int, int | None]], list[tuple[int, int, int, int | None]], int],
    solver: str,
) -> None:
    """Running jobs (GPUs, limit) packed on three 8-GPU nodes, waiting jobs (GPUs a replica,
    replicas, priority, limit): whatever the solver, the plan is legal, and no job it starts
    behind a reserved job and past the reservation's start takes a reserved node."""
    running, waiting, reservations = scene
    nodes = [node(f"n{i}") for i in range(3)]
    free = {n.name: list(range(8)) for n in nodes}
    jobs: list[Job] = []
    current: dict[str, Placement] = {}
    for i, (gpus, limit) in enumerate(running):
        where = next((n for n, g in free.items() if len(g) >= gpus), None)
        if where is None:
            continue
        taken, free[where] = free[where][:gpus], free[where][gpus:]
        j = limited(job(f"r{i}", gpu=gpus, submitted_at="2026-11-22T10:00:00Z"), limit)
        jobs.append(j)
        replicas = (ReplicaPlacement(where, tuple(taken), 1000),)
        current[j.key] = Placement(j.key, "h100", replicas, started_at=STARTED)
    for i, (gpus, count, priority, limit) in enumerate(waiting):
        at = f"2026-11-22T11:{i:02d}:00Z"
        jobs.append(
            limited(
                job(f"w{i}", gpu=gpus, replicas=count, priority=priority, submitted_at=at), limit
            )
        )
    instance = PlacementInstance(
        cluster=CLUSTER,
        nodes=tuple(nodes),
        queues=(queue("q", quotas={"h100": (24, None, None)}),),
        jobs=tuple(jobs),
        current=current,
        policy=Policy(
            solver=solver,
            preemption_enabled=False,
            backfill=BackfillPolicy(reservations=reservations),
        ),
        now=NOW,
    )
    plan = solve(instance)
    assert check_plan(instance, plan) == []
    by_key = {j.key: j for j in jobs}
    assert len(plan.reservations) <= reservations
    event(f"reservations held: {min(len(plan.reservations), 2)}")
    event(f"jobs held: {'some' if any(o.constraint == HELD for o in plan.outcomes) else 'none'}")
    for r in plan.reservations:
        reserved = plan.outcome(r.job)
        assert reserved is not None and reserved.status is OutcomeStatus.PENDING
        assert r.start >= NOW  # a running job past its limit (not yet stopped) ends now
        for o in plan.outcomes:
            if o.status is not OutcomeStatus.PLACED:
                continue
            started = by_key[o.job]
            if priority_key(started) < priority_key(by_key[r.job]):
                continue
            limit = started.time_limit_minutes
            if limit is not None and plus_minutes(NOW, limit) <= r.start:
                continue
            assert not {x.node for x in o.replicas} & set(r.nodes), (o.job, r)
