"""decide/evolve: what a commit means, and that replaying the log always gives the same state."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.engine import events as ev
from gitsched.engine.codec import from_data, to_data
from gitsched.engine.core import (
    ApplyCommit,
    ApplyPlan,
    RejectCommit,
    decide,
    keep_waiting_reasons,
    placement_instance,
)
from gitsched.engine.model import Approval, NodeState, Owner, Policy
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus
from gitsched.engine.placement.solvers import solve
from gitsched.engine.state import ClusterState, fold
from gitsched.findings import Finding
from tests.support.factories import commit, desired, job, node


def apply(state: ClusterState, intent) -> ClusterState:  # type: ignore[no-untyped-def]
    return fold(decide(state, intent), state)


def test_first_commit_registers_everything_and_ends_with_commit_applied() -> None:
    events = decide(ClusterState(), ApplyCommit(commit(1), desired([job("a")])))
    types = [type(e).__name__ for e in events]
    assert types == [
        "ClusterConfigured",
        "NodeRegistered",
        "NodeRegistered",
        "QueueConfigured",
        "JobSubmitted",
        "CommitApplied",
    ]
    submitted = events[4]
    assert isinstance(submitted, ev.JobSubmitted)
    assert submitted.job.submitted_at == commit(1).committed_at


def test_an_unchanged_commit_yields_only_commit_applied() -> None:
    state = apply(ClusterState(), ApplyCommit(commit(1), desired([job("a")])))
    events = decide(state, ApplyCommit(commit(2), desired([job("a")])))
    assert [type(e) for e in events] == [ev.CommitApplied]
    assert events[0].changes == 0  # type: ignore[attr-defined]


def test_changes_withdrawals_and_node_state() -> None:
    state = apply(ClusterState(), ApplyCommit(commit(1), desired([job("a"), job("b")])))
    drained = dataclasses.replace(node("n2"), state=NodeState.DRAINED)
    events = decide(
        state, ApplyCommit(commit(2), desired([job("a", gpu=2)], nodes=[node("n1"), drained]))
    )
    kinds = {type(e) for e in events}
    assert {ev.JobChanged, ev.JobWithdrawn, ev.NodeStateChanged} <= kinds
    changed = next(e for e in events if isinstance(e, ev.JobChanged))
    assert changed.fields == ("resources",)
    assert changed.job.submitted_at == commit(1).committed_at, (
        "a change keeps the job's place in line"
    )


def test_a_rejected_commit_changes_nothing_but_is_recorded() -> None:
    state = apply(ClusterState(), ApplyCommit(commit(1), desired([job("a")])))
    finding = Finding("teams/q/jobs/x.yaml", 3, 5, "$.spec", "bad", "schema")
    after = apply(state, RejectCommit(commit(2), (finding,)))
    assert after.jobs == state.jobs and after.last_good_commit == commit(1)
    assert after.last_commit == commit(2) and after.last_rejection == (finding,)


def test_placement_events_fold_into_placements_and_pending() -> None:
    state = apply(
        ClusterState(),
        ApplyCommit(commit(1), desired([job("a", gpu=8), job("big", gpu=8, replicas=3)])),
    )
    assert state.needs_placement
    plan = GreedyPlacer().solve(placement_instance(state, "2026-11-20T10:00:00+00:00"))
    state = apply(state, ApplyPlan(plan, "s1", "2026-11-20T10:00:00+00:00"))
    assert not state.needs_placement
    assert set(state.placements) == {"q/a"}
    assert "q/big" in state.pending
    # Solving again with nothing changed emits no new pending event (the reason is the same).
    again = decide(
        state, ApplyPlan(GreedyPlacer().solve(placement_instance(state, "t")), "s2", "t")
    )
    assert [type(e) for e in again] == [ev.SolveCompleted]


def test_a_commit_of_jobs_hands_the_solver_the_same_node_list_and_a_node_change_a_new_one() -> None:
    state = apply(ClusterState(), ApplyCommit(commit(1), desired([job("a")])))
    first = placement_instance(state, "t1")
    more = apply(state, ApplyCommit(commit(2), desired([job("a"), job("b")])))
    second = placement_instance(more, "t2")
    # The same tuple, so caches kept per node list (trees, the decomposed cut) serve again.
    assert second.nodes is first.nodes and second.queues is first.queues
    assert [j.key for j in second.jobs] == ["q/a", "q/b"]
    drained = dataclasses.replace(node("n2"), state=NodeState.DRAINED)
    changed = apply(more, ApplyCommit(commit(3), desired([job("a")], nodes=[node("n1"), drained])))
    third = placement_instance(changed, "t3")
    assert third.nodes is not first.nodes
    assert [(n.name, n.state) for n in third.nodes] == [
        ("n1", NodeState.READY),
        ("n2", NodeState.DRAINED),
    ]


def test_an_incremental_plan_keeps_the_reasons_of_waiting_jobs_it_did_not_decide() -> None:
    jobs = [job("a", gpu=8), job("big", gpu=8, replicas=3), job("late", gpu=8, replicas=3)]
    state = apply(ClusterState(), ApplyCommit(commit(1), desired(jobs[:2])))
    plan = GreedyPlacer().solve(placement_instance(state, "t1"))
    state = apply(state, ApplyPlan(plan, "s1", "t1"))
    before = state.pending["q/big"]
    state = apply(state, ApplyCommit(commit(2), desired(jobs)))
    # An incremental plan: "big" waits as it did (the plan does not say why), "late" is new.
    outcomes = [
        dataclasses.replace(o, reason="waits as at the last solve", constraint="")
        if o.job == "q/big"
        else o
        for o in plan.outcomes
    ]
    outcomes.append(
        JobOutcome("q/late", OutcomeStatus.PENDING, reason="no room", constraint="capacity")
    )
    waits = dataclasses.replace(plan, outcomes=tuple(outcomes))
    kept = keep_waiting_reasons(waits, state, frozenset({"q/late"}))
    by_job = {o.job: o for o in kept.outcomes}
    assert (by_job["q/big"].reason, by_job["q/big"].constraint) == (
        before.reason,
        before.constraint,
    )
    assert by_job["q/late"].reason == "no room"
    assert by_job["q/a"] == next(o for o in plan.outcomes if o.job == "q/a")
    # Only the job the plan decided gets a JobPending.
    events = decide(state, ApplyPlan(kept, "s2", "t2"))
    assert [e.job for e in events if isinstance(e, ev.JobPending)] == ["q/late"]


def test_every_event_type_round_trips_through_the_codec() -> None:
    state = apply(
        ClusterState(),
        ApplyCommit(
            commit(1), desired([job("a", gpu=0.5), job("b", replicas=2, topology="nvlink")])
        ),
    )
    plan = GreedyPlacer().solve(placement_instance(state, "2026-11-20T10:00:00+00:00"))
    produced = [
        *decide(ClusterState(), ApplyCommit(commit(1), desired([job("a", gpu=0.5)]))),
        *decide(state, ApplyPlan(plan, "s", "2026-11-20T10:00:00+00:00")),
        ev.CommitRejected(commit(3), (Finding("f", None, None, "$", "m", "yaml"),)),
        ev.NodeStateChanged("n1", NodeState.FAILED, "fan"),
        ev.JobPreempted("q/a", "r", "q/b", 12.5, "s"),
        ev.PolicyChanged(Policy(solver="highs")),
    ]
    for event in produced:
        data = to_data(event)
        assert from_data(type(event), data) == event


# -- replay determinism ------------------------------------------------------------------------

job_strategy = st.builds(
    lambda name, gpu, replicas, prio: job(
        name, gpu=gpu, replicas=replicas, priority=prio, submitted_at=name
    ),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.sampled_from([0.5, 1, 4, 8]),
    st.integers(1, 3),
    st.sampled_from([100, 500, 900]),
)
commits_strategy = st.lists(st.lists(job_strategy, max_size=5), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(commits_strategy)
def test_replaying_the_log_always_gives_the_same_state(history) -> None:  # type: ignore[no-untyped-def]
    """Fold the events of a commit history twice, and through the codec: identical states."""
    state = ClusterState()
    log: list[ev.Event] = []
    for n, jobs in enumerate(history):
        unique = {j.key: j for j in jobs}
        for intent in (ApplyCommit(commit(n), desired(list(unique.values()))),):
            events = decide(state, intent)
            log.extend(events)
            state = fold(events, state)
        plan = GreedyPlacer().solve(placement_instance(state, f"2026-11-20T10:{n:02d}:00+00:00"))
        events = decide(state, ApplyPlan(plan, f"s{n}", f"2026-11-20T10:{n:02d}:00+00:00"))
        log.extend(events)
        state = fold(events, state)
    assert fold(log) == state
    assert state.events_applied == len(log)
    decoded = [from_data(type(e), to_data(e)) for e in log]
    assert fold(decoded) == state
    assert set(state.placements) <= set(state.jobs)
    assert not (set(state.placements) & set(state.pending))


def test_owners_are_recorded_when_they_change_and_approvals_before_commit_applied() -> None:
    ana, kai = Owner("ana@example.com"), Owner("kai@example.com", "ssh-ed25519 AAAA")
    first = dataclasses.replace(desired(), owners={"q": (ana,)})
    state = apply(ClusterState(), ApplyCommit(commit(1), first))
    assert state.owners["q"] == (ana,)
    # unchanged OWNERS: nothing recorded again
    again = decide(state, ApplyCommit(commit(2), first))
    assert [type(e).__name__ for e in again] == ["CommitApplied"]
    checked = ev.ApprovalChecked(
        "q", ("priya@example.com",), (Approval("ana@example.com", "trailer", "c3"),)
    )
    rekeyed = dataclasses.replace(first, owners={"q": (ana, kai)})
    events = decide(state, ApplyCommit(commit(3), rekeyed, (checked,)))
    assert events == (
        ev.OwnersChanged("q", (ana, kai)),
        checked,
        ev.CommitApplied(commit(3), changes=1),
    )
    gone = apply(fold(events, state), ApplyCommit(commit(4), desired()))
    assert "q" not in gone.owners
    for event in (*events, ev.OwnersChanged("q", ())):
        assert from_data(type(event), to_data(event)) == event


# -- the built-in policy -----------------------------------------------------------------------


def builtin_policy() -> Policy:
    from gitsched.policies.policy import default_policy
    from gitsched.reconciler.specs import policy_of

    return policy_of(default_policy())


def test_the_builtin_policy_places_with_the_milp_and_fairness_on() -> None:
    policy = builtin_policy()
    assert policy.solver == "highs" and policy.fairness_weight > 0
    assert policy.idle.enabled and policy.usage_half_life_hours == 24.0
    state = apply(ClusterState(), ApplyCommit(commit(1), desired([job("a", gpu=4)], policy=policy)))
    plan = solve(placement_instance(state, "2026-11-20T10:01:00+00:00"))
    events = decide(state, ApplyPlan(plan, solve_id="s", at="2026-11-20T10:01:00+00:00"))
    (done,) = [e for e in events if isinstance(e, ev.SolveCompleted)]
    assert (done.solver, done.plan_source, done.fallback) == ("highs", "milp", "")
    assert done.bound is not None and done.gap is not None


def test_a_failing_milp_falls_back_to_greedy_and_the_solve_event_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gitsched.engine.errors import SolverFailed
    from gitsched.engine.placement import solvers

    def broken(self: object, instance: object) -> None:
        raise SolverFailed("HiGHS crashed")

    monkeypatch.setattr(solvers.MilpPlacer, "solve", broken)
    state = apply(
        ClusterState(), ApplyCommit(commit(1), desired([job("a", gpu=4)], policy=builtin_policy()))
    )
    plan = solve(placement_instance(state, "2026-11-20T10:01:00+00:00"))
    assert plan.outcome("q/a").status is OutcomeStatus.PLACED
    events = decide(state, ApplyPlan(plan, solve_id="s", at="2026-11-20T10:01:00+00:00"))
    (done,) = [e for e in events if isinstance(e, ev.SolveCompleted)]
    assert (done.solver, done.plan_source) == ("highs", "greedy")
    assert done.fallback == "the highs solver failed: SolverFailed: HiGHS crashed"


def test_with_the_builtin_policy_the_job_that_loses_least_since_its_checkpoint_stops() -> None:
    policy = builtin_policy()
    keep = job("long", gpu=4, priority=100)
    ckpt = dataclasses.replace(job("ckpt", gpu=4, priority=100), checkpoint_interval_minutes=10)
    urgent = job("urgent", gpu=4, priority=900)
    nodes = [node("n1")]
    state = apply(
        ClusterState(), ApplyCommit(commit(1), desired([keep, ckpt], nodes=nodes, policy=policy))
    )
    first = "2026-11-20T10:01:00+00:00"
    state = apply(state, ApplyPlan(solve(placement_instance(state, first)), "s1", first))
    assert set(state.placements) == {"q/long", "q/ckpt"}
    state = apply(
        state, ApplyCommit(commit(2), desired([keep, ckpt, urgent], nodes=nodes, policy=policy))
    )
    later = "2026-11-20T13:01:00+00:00"  # three hours on
    plan = solve(placement_instance(state, later))
    assert plan.stats.plan_source == "milp"
    stopped = plan.outcome("q/ckpt")
    assert stopped is not None and stopped.status is OutcomeStatus.PREEMPTED
    assert stopped.lost_gpu_seconds == pytest.approx(4 * 600)  # ten minutes since its checkpoint
    assert plan.outcome("q/long").status is OutcomeStatus.KEPT
    assert plan.outcome("q/urgent").status is OutcomeStatus.PLACED
