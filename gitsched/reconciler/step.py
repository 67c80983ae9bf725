"""The reconciler's decision step: a commit in, the events it appends out.

decide -> fold -> solve (incremental when few jobs changed) -> decide(ApplyPlan), with
the event ids, actor and cause each group is appended under. The loop runs it and
appends; `plan` runs it and appends nothing; the benchmarks time it. One path, so
what `plan` predicts and what the benchmarks measure is what `reconcile` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gitsched.engine.core import (
    ApplyCommit,
    ApplyPlan,
    RejectCommit,
    decide,
    decision_time,
    keep_waiting_reasons,
    placement_instance,
    service_steps,
)
from gitsched.engine.events import (
    ApprovalChecked,
    CommitApplied,
    Event,
    JobChanged,
    JobSubmitted,
    MembersChanged,
    OwnersChanged,
)
from gitsched.engine.model import CommitInfo
from gitsched.engine.placement.incremental import waiting_to_retry
from gitsched.engine.placement.plan import PlacementPlan
from gitsched.engine.placement.solvers import solve, solve_changed
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.timelimits import due_events
from gitsched.eventlog.collector import collector_paused
from gitsched.reconciler.approval import CommitApproval, commit_approval
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.specs import LoadedSpecs, SpecCache, load_commit

SOLVER_ACTOR = "solver"
TIME_ACTOR = "gitsched"  # who appends what the time alone makes due (a limit reached)
# A commit that only adds or edits jobs, at most this share of them, is placed by an
# incremental solve: those jobs are free, every other job stays where it runs or waits.
INCREMENTAL_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class EventGroup:
    """Events with one id prefix, actor and cause, within an append."""

    events: tuple[Event, ...]
    id_prefix: str
    actor: str
    cause: str

    def ids(self) -> tuple[str, ...]:
        """The event ids the log keeps them under: a retried append is recognised by them."""
        return tuple(f"{self.id_prefix}/{i}" for i in range(len(self.events)))


@dataclass(frozen=True, slots=True)
class Step:
    """One decision: the groups to append in one transaction, in order, and the state
    they fold into."""

    groups: tuple[EventGroup, ...]
    state: ClusterState
    plan: PlacementPlan | None = None  # the solve's, when the step placed
    intent: ApplyCommit | RejectCommit | None = None  # the commit's, when it had one

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(e for group in self.groups for e in group.events)


def place(
    state: ClusterState,
    now: str,
    changed: frozenset[str] | None = None,
    solver: str | None = None,
) -> PlacementPlan:
    """The placement the reconciler decides for `state` at `now`.

    When only a few jobs changed (`changed`) and others run, those jobs alone are
    placed (an incremental solve), with the waiting jobs that may fit now beside them
    (`waiting_to_retry`: the head of the queue, bounded); anything else re-solves the
    cluster. `solver` overrides the Policy's.
    """
    instance = placement_instance(state, now)
    if (
        changed is not None
        and state.placements
        and len(changed) <= INCREMENTAL_SHARE * len(state.jobs)
    ):
        # The collector off for the incremental solve (see commit_steps); a full solve
        # keeps it on: it runs for its time limit and may leave cycles (the MILP's model).
        with collector_paused():
            retried = waiting_to_retry(instance, changed)
            plan = solve_changed(instance, (*sorted(changed), *retried), solver)
            if plan is not None:
                # A retried job that still waits keeps the reason it had: no new JobPending.
                return keep_waiting_reasons(plan, state, changed)
    return solve(instance, solver)


def solve_step(
    state: ClusterState,
    cause: str,
    now: str,
    solver: str | None = None,
    changed: frozenset[str] | None = None,
) -> Step:
    """The solver's events for `state`, appended after `cause` (a commit's sha, or the
    cluster events that led to it), decided at `now`: the commit's time
    (`decision_time`) or the events' own, never the clock's."""
    prefix = f"{cause}/solve"
    if state.cluster is None:
        return Step((EventGroup((), prefix, SOLVER_ACTOR, cause),), state)
    # The services' replica steps first (engine/services.py): the solve places what they add.
    steps = service_steps(state, now) if state.services else ()
    if steps:
        state, changed = fold(steps, state), None
    plan = place(state, now, changed, solver)
    events = (*steps, *decide(state, ApplyPlan(plan, solve_id=prefix, at=now)))
    return Step(
        (EventGroup(events, prefix, SOLVER_ACTOR, cause),), fold(events[len(steps) :], state), plan
    )


def due_step(state: ClusterState, at: str, solver: str | None = None) -> Step | None:
    """What is due at `at` (a running job reached its time limit: engine.timelimits), and
    the placement after it; None when nothing is. `serve` asks it on every pass with the
    time it runs at; each event carries the time its limit was reached, so a replay folds
    the same events, and the solve is decided at the latest of them, never the clock."""
    due = due_events(state, at)
    if not due:
        return None
    cause = f"due/{due[-1].at}"
    group = EventGroup(due, cause, TIME_ACTOR, cause)
    after = fold(due, state)
    placed = cluster_solve(after, cause, due[-1].at, solver)
    if placed is None:
        return Step((group,), after)
    return Step((group, *placed.groups), placed.state, placed.plan)


def owed_solve(state: ClusterState, solver: str | None = None) -> Step | None:
    """The solve a log written before commits and their solves shared one append may
    still owe its newest commit; None when it owes none."""
    owed = state.last_commit
    if not state.needs_placement or owed is None:
        return None
    return solve_step(state, owed.sha, decision_time(owed), solver)


def cluster_solve(
    state: ClusterState, cause: str, now: str, solver: str | None = None
) -> Step | None:
    """Place again after events no commit made (a job finished, a node failed), if they
    left the state in need of it; None otherwise."""
    if not state.needs_placement or state.cluster is None:
        return None
    return solve_step(state, cause, now, solver)


def commit_intent(
    commit: CommitInfo, loaded: LoadedSpecs, approval: CommitApproval
) -> ApplyCommit | RejectCommit:
    """Apply the commit, or reject it: its files are invalid, or an owner's approval
    the Policy requires is missing."""
    if loaded.desired is None:
        return RejectCommit(commit, loaded.errors)
    if unapproved := approval.findings:
        return RejectCommit(commit, unapproved)
    return ApplyCommit(commit, loaded.desired, approval.records)


def commit_step(
    state: ClusterState,
    commit: CommitInfo,
    loaded: LoadedSpecs,
    approval: CommitApproval,
    solver: str | None = None,
) -> Step:
    """The commit's events and, when they leave the state in need of it, the placement
    they lead to: one append, so no reader ever sees a change the solver has not
    answered yet."""
    intent = commit_intent(commit, loaded, approval)
    # The time limits reached by the commit's time come first: the commit is decided on
    # the cluster as it is then (docs/time.md), in `plan` as in `reconcile`.
    due = due_events(state, decision_time(commit))
    before: tuple[EventGroup, ...] = ()
    if due:
        # Caused by the time, not by the commit: each stop's fact time is its own `at`.
        before = (EventGroup(due, f"{commit.sha}/due", TIME_ACTOR, f"due/{due[-1].at}"),)
        state = fold(due, state)
    events = decide(state, intent)
    group = EventGroup(events, commit.sha, commit.actor, commit.sha)
    applied = fold(events, state)
    if not applied.needs_placement:
        return Step((*before, group), applied, intent=intent)
    changed = None if due else _changed_jobs(events)
    placed = solve_step(applied, commit.sha, decision_time(commit), solver, changed)
    return Step((*before, group, *placed.groups), placed.state, placed.plan, intent)


def commit_steps(
    repo: GitRepo,
    state: ClusterState,
    commits: Iterable[CommitInfo],
    *,
    solver: str | None = None,
    specs: SpecCache | None = None,
) -> Iterator[Step]:
    """Each commit's step in turn, each from the state the one before folds into: what
    the reconciler appends for `commits`, oldest first, from `state`."""
    for commit in commits:
        # The collector off while a commit is loaded: on an XL cluster this allocates
        # hundreds of thousands of objects, and each collection they set off walked the
        # whole heap (the state, 50,000 parsed documents) for cycles that are not there.
        with collector_paused():
            loaded = load_commit(repo, commit.sha, cache=specs)
            approval = commit_approval(repo, state, commit, loaded, specs)
        step = commit_step(state, commit, loaded, approval, solver)
        yield step
        state = step.state


def _changed_jobs(events: Sequence[Event]) -> frozenset[str] | None:
    """The jobs a commit added or edited, when that is all it did; None otherwise
    (a withdrawn job frees room for waiting ones, a quota or node change moves
    every bound: the cluster is re-solved)."""
    jobs: set[str] = set()
    for event in events:
        if isinstance(event, JobSubmitted | JobChanged):
            jobs.add(event.job.key)
        elif not isinstance(
            event, CommitApplied | OwnersChanged | MembersChanged | ApprovalChecked
        ):
            return None
    return frozenset(jobs)
