"""The reconcile loop: new commits in, events out, placement after each change.

Where it stands is read from the log itself (the last applied or rejected
commit), so a crashed or restarted reconciler resumes exactly; event ids are
derived from the commit sha, so a retried append is recognised, never doubled.
A reconciler that finds another one has written first re-reads the log and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core import ApplyCommit, ApplyPlan, RejectCommit, decide, placement_instance
from engine.events import Event
from engine.model import CommitInfo, Finding
from engine.placement.plan import PlacementPlan
from engine.placement.solvers import solve
from engine.state import ClusterState, fold
from eventlog.base import (
    Clock,
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    LogCorrupted,
    utc_now,
)
from eventlog.codec import encode
from eventlog.envelope import canonical_json, format_time
from eventlog.replay import replay
from reconciler.approval import missing_approvals
from reconciler.git import GitRepo
from reconciler.specs import load_commit, to_finding

log = logging.getLogger("gitsched.reconciler")

SOLVER_ACTOR = "solver"
# How often one pass starts over after another reconciler wrote to the log first.
MAX_RESTARTS = 20


class _Superseded(Exception):
    """Another writer appended first: this pass's state no longer matches the log."""


@dataclass
class CommitOutcome:
    commit: CommitInfo
    applied: bool
    errors: tuple[Finding, ...] = ()
    events: int = 0


@dataclass
class ReconcileReport:
    commits: list[CommitOutcome] = field(default_factory=list)
    events_appended: int = 0
    plan: PlacementPlan | None = None
    state: ClusterState = field(default_factory=ClusterState)
    last_seq: int = 0

    @property
    def newest_rejected(self) -> bool:
        """This run rejected the branch's newest commit (not one another writer built on)."""
        if not self.commits or self.commits[-1].applied:
            return False
        newest = self.state.last_commit
        return newest is None or newest.sha == self.commits[-1].commit.sha


class Reconciler:
    def __init__(
        self,
        repo: GitRepo,
        event_log: EventLog,
        *,
        branch: str = "main",
        clock: Clock = utc_now,
        solver: str | None = None,
    ) -> None:
        self.repo = repo
        self.log = event_log
        self.branch = branch
        self.clock = clock
        self.solver = solver

    def run_once(self) -> ReconcileReport:
        report = ReconcileReport()
        for _ in range(MAX_RESTARTS):
            try:
                self._pass(report)
            except _Superseded:
                # Another reconciler wrote first; our in-memory state is stale, so
                # start over from the log (event ids make the replayed work a no-op).
                log.info("another writer appended to the log; re-reading it")
                continue
            return report
        raise ConcurrencyConflict(report.last_seq, self.log.last_seq())

    def _pass(self, report: ReconcileReport) -> None:
        replayed = replay(self.log, verify=True)
        state, last_seq = replayed.state, replayed.last_seq
        report.state, report.last_seq = state, last_seq
        if state.needs_placement and state.last_commit is not None:
            # A log written before commits and their solves shared one append may
            # hold a commit without its solve: finish that solve first.
            cause = state.last_commit.sha
            solved = self._solve(state, cause, report)
            state, last_seq = self._append(state, last_seq, [solved], report)
        last = state.last_commit.sha if state.last_commit else None
        for commit in self.repo.commits_since(self.branch, last):
            loaded = load_commit(self.repo, commit.sha)
            intent: ApplyCommit | RejectCommit
            unapproved = missing_approvals(self.repo, state, commit, loaded)
            if loaded.desired is None:
                intent = RejectCommit(commit, tuple(to_finding(e) for e in loaded.errors))
                log.info("commit %s rejected: %d error(s)", commit.sha[:12], len(loaded.errors))
            elif unapproved:
                intent = RejectCommit(commit, unapproved)
                log.info("commit %s rejected: owner approval missing", commit.sha[:12])
            else:
                intent = ApplyCommit(commit, loaded.desired)
            events = decide(state, intent)
            groups = [_Group(events, commit.sha, commit.actor, commit.sha)]
            applied = fold(events, state)
            if applied.needs_placement:
                # The commit and the placement it leads to are one append: no reader
                # ever sees a change the solver has not answered yet.
                groups.append(self._solve(applied, commit.sha, report))
            state, last_seq = self._append(state, last_seq, groups, report)
            report.commits.append(
                CommitOutcome(
                    commit,
                    isinstance(intent, ApplyCommit),
                    getattr(intent, "errors", ()),
                    len(events),
                )
            )
            report.state, report.last_seq = state, last_seq

    def _solve(self, state: ClusterState, cause: str, report: ReconcileReport) -> _Group:
        """The solver's events for `state`, to append after what led to it."""
        if state.cluster is None:
            return _Group((), f"{cause}/solve", SOLVER_ACTOR, cause)
        now = format_time(self.clock())
        plan = solve(placement_instance(state, now), self.solver)
        report.plan = plan
        events = decide(state, ApplyPlan(plan, solve_id=f"{cause}/solve", at=now))
        return _Group(events, f"{cause}/solve", SOLVER_ACTOR, cause)

    def _append(
        self,
        state: ClusterState,
        last_seq: int,
        groups: Sequence[_Group],
        report: ReconcileReport,
    ) -> tuple[ClusterState, int]:
        """Append the groups' events in one transaction; the state after them."""
        events = [event for group in groups for event in group.events]
        batch = [
            encode(e, id=f"{group.id_prefix}/{i}", actor=group.actor, cause=group.cause)
            for group in groups
            for i, e in enumerate(group.events)
        ]
        if not batch:
            return fold(events, state), last_seq
        try:
            stored = self.log.append(batch, expected_last_seq=last_seq)
        except ConcurrencyConflict as e:
            raise _Superseded from e
        except DuplicateEvent:
            if self.log.last_seq() == last_seq:
                raise  # nobody else wrote: the log and this commit's events disagree
            raise _Superseded from None
        if stored[0].seq <= last_seq:
            raise LogCorrupted(
                f"events {stored[0].id} ... are already in the log at seq {stored[0].seq}, "
                f"but replaying the log up to seq {last_seq} does not account for them: "
                "the log was altered; run `gitsched audit verify`"
            )
        if stored[0].seq != last_seq + 1 or any(
            canonical_json(s.data) != canonical_json(b.data)
            for s, b in zip(stored, batch, strict=True)
        ):
            # Another writer got to this commit first, from a state we have not seen.
            raise _Superseded
        report.events_appended += len(stored)
        return fold(events, state), stored[-1].seq


@dataclass(frozen=True, slots=True)
class _Group:
    """Events with one id prefix, actor and cause, within an append."""

    events: Sequence[Event]
    id_prefix: str
    actor: str
    cause: str
