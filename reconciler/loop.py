"""The reconcile loop: new commits in, events out, placement after each change.

Where it stands is read from the log itself (the last applied or rejected
commit), so a crashed or restarted reconciler resumes exactly; event ids are
derived from the commit sha, so a retried append is recognised, never doubled.
A reconciler that finds another one has written first re-reads the log and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.core import (
    ApplyCommit,
    ApplyPlan,
    RejectCommit,
    decide,
    decision_time,
    keep_waiting_reasons,
    placement_instance,
)
from engine.events import (
    ApprovalChecked,
    CommitApplied,
    Event,
    JobChanged,
    JobSubmitted,
    OwnersChanged,
)
from engine.model import CommitInfo, Finding
from engine.placement.plan import PlacementPlan
from engine.placement.solvers import solve, solve_changed
from engine.state import ClusterState, fold
from eventlog.base import (
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    EventLogError,
    LogCorrupted,
)
from eventlog.codec import encode
from eventlog.envelope import canonical_json
from eventlog.replay import Replayed, replay, snapshot
from reconciler.approval import commit_approval
from reconciler.git import GitRepo
from reconciler.specs import SpecCache, load_commit, to_finding

log = logging.getLogger("gitsched.reconciler")

SOLVER_ACTOR = "solver"
# How often one pass starts over after another reconciler wrote to the log first.
MAX_RESTARTS = 20
# A commit that only adds or edits jobs, at most this share of them, is placed by an
# incremental solve: those jobs are free, every other job stays where it runs or waits.
INCREMENTAL_SHARE = 0.25
# A snapshot of the folded state after every this many events, so a restart replays
# at most this many (eventlog.snapshot); 0 writes none.
SNAPSHOT_EVERY = 100_000


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
        """The log's newest commit, the branch's tip once a pass has read it, stands
        rejected: whether this run rejected it or an earlier one did, the cluster is not
        at the branch's tip until a new commit fixes it."""
        return bool(self.state.last_rejection)


class Reconciler:
    def __init__(
        self,
        repo: GitRepo,
        event_log: EventLog,
        *,
        branch: str = "main",
        solver: str | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.repo = repo
        self.log = event_log
        self.branch = branch
        self.solver = solver
        self.snapshot_every = snapshot_every
        self._snapshot_seq: int | None = None  # the newest snapshot's seq, once known
        # The log as this reconciler last knew it: a pass folds only what came after.
        self._tip: Replayed | None = None
        # The files of the commits read last: the next reads only what changed.
        self._specs = SpecCache()

    def run_once(self) -> ReconcileReport:
        report = ReconcileReport()
        for _ in range(MAX_RESTARTS):
            try:
                self._pass(report)
                self._keep_snapshot()
            except _Superseded:
                # Another reconciler wrote first; our in-memory state is stale, so
                # start over from the log (event ids make the replayed work a no-op).
                log.info("another writer appended to the log; re-reading it")
                continue
            return report
        raise ConcurrencyConflict(report.last_seq, self.log.last_seq())

    def _pass(self, report: ReconcileReport) -> None:
        tip = self._tip = replay(self.log, since=self._tip, verify=True)
        report.state, report.last_seq = tip.state, tip.last_seq
        if tip.state.needs_placement and tip.state.last_commit is not None:
            # A log written before commits and their solves shared one append may
            # hold a commit without its solve: finish that solve first.
            self._append([self._solve(tip.state, tip.state.last_commit, report)], report)
        state = self._tip.state
        last = state.last_commit.sha if state.last_commit else None
        for commit in self.repo.commits_since(self.branch, last):
            state = self._tip.state
            loaded = load_commit(self.repo, commit.sha, cache=self._specs)
            intent: ApplyCommit | RejectCommit
            approval = commit_approval(self.repo, state, commit, loaded, self._specs)
            unapproved = approval.findings
            if loaded.desired is None:
                intent = RejectCommit(commit, tuple(to_finding(e) for e in loaded.errors))
                log.info("commit %s rejected: %d error(s)", commit.sha[:12], len(loaded.errors))
            elif unapproved:
                intent = RejectCommit(commit, unapproved)
                log.info("commit %s rejected: owner approval missing", commit.sha[:12])
            else:
                intent = ApplyCommit(commit, loaded.desired, approval.records)
            events = decide(state, intent)
            groups = [_Group(events, commit.sha, commit.actor, commit.sha)]
            applied = fold(events, state)
            if applied.needs_placement:
                # The commit and the placement it leads to are one append: no reader
                # ever sees a change the solver has not answered yet.
                groups.append(self._solve(applied, commit, report, _changed_jobs(events)))
            self._append(groups, report)
            report.commits.append(
                CommitOutcome(
                    commit,
                    isinstance(intent, ApplyCommit),
                    getattr(intent, "errors", ()),
                    len(events),
                )
            )

    def _keep_snapshot(self) -> None:
        """Snapshot the tip when SNAPSHOT_EVERY events have come since the newest one."""
        tip = self._tip
        store = self.log.snapshots()
        if tip is None or store is None or self.snapshot_every <= 0:
            return
        if self._snapshot_seq is None:
            infos = store.infos()
            self._snapshot_seq = infos[0].seq if infos else 0
        if tip.last_seq - self._snapshot_seq < self.snapshot_every:
            return
        try:
            snapshot(self.log, tip)
        except EventLogError as e:
            # A cache that could not be written costs a longer restart, nothing else.
            log.warning("could not write a snapshot at seq %d: %s", tip.last_seq, e)
            return
        self._snapshot_seq = tip.last_seq
        log.info("snapshot of the state at seq %d written", tip.last_seq)

    def _solve(
        self,
        state: ClusterState,
        commit: CommitInfo,
        report: ReconcileReport,
        changed: frozenset[str] | None = None,
    ) -> _Group:
        """The solver's events for `state`, to append after `commit`, which led to it.

        When only a few jobs changed (`changed`) and others run, those jobs alone
        are placed (an incremental solve); anything else re-solves the cluster.
        The solve is decided at the commit's time (`decision_time`), never the clock's.
        """
        cause = commit.sha
        if state.cluster is None:
            return _Group((), f"{cause}/solve", SOLVER_ACTOR, cause)
        now = decision_time(commit)
        instance = placement_instance(state, now)
        plan = None
        if (
            changed is not None
            and state.placements
            and len(changed) <= INCREMENTAL_SHARE * len(state.jobs)
        ):
            plan = solve_changed(instance, changed, self.solver)
            if plan is not None:
                plan = keep_waiting_reasons(plan, state, changed)
        if plan is None:
            plan = solve(instance, self.solver)
        report.plan = plan
        events = decide(state, ApplyPlan(plan, solve_id=f"{cause}/solve", at=now))
        return _Group(events, f"{cause}/solve", SOLVER_ACTOR, cause)

    def _append(self, groups: Sequence[_Group], report: ReconcileReport) -> None:
        """Append the groups' events in one transaction and fold them into the tip."""
        tip = self._tip
        assert tip is not None  # a pass starts by reading the log
        events = [event for group in groups for event in group.events]
        batch = [
            encode(e, id=f"{group.id_prefix}/{i}", actor=group.actor, cause=group.cause)
            for group in groups
            for i, e in enumerate(group.events)
        ]
        if not batch:
            self._tip = replace(tip, state=fold(events, tip.state))
            report.state = self._tip.state
            return
        try:
            stored = self.log.append(batch, expected_last_seq=tip.last_seq)
        except ConcurrencyConflict as e:
            raise _Superseded from e
        except DuplicateEvent:
            if self.log.last_seq() == tip.last_seq:
                raise  # nobody else wrote: the log and this commit's events disagree
            raise _Superseded from None
        if stored[0].seq <= tip.last_seq:
            raise LogCorrupted(
                f"events {stored[0].id} ... are already in the log at seq {stored[0].seq}, "
                f"but replaying the log up to seq {tip.last_seq} does not account for them: "
                "the log was altered; run `gitsched audit verify`"
            )
        if stored[0].seq != tip.last_seq + 1 or any(
            canonical_json(s.data) != canonical_json(b.data)
            for s, b in zip(stored, batch, strict=True)
        ):
            # Another writer got to this commit first, from a state we have not seen.
            raise _Superseded
        report.events_appended += len(stored)
        last = stored[-1]
        self._tip = Replayed(fold(events, tip.state), last.seq, last.time, last.hash)
        report.state, report.last_seq = self._tip.state, self._tip.last_seq


def _changed_jobs(events: Sequence[Event]) -> frozenset[str] | None:
    """The jobs a commit added or edited, when that is all it did; None otherwise
    (a withdrawn job frees room for waiting ones, a quota or node change moves
    every bound: the cluster is re-solved)."""
    jobs: set[str] = set()
    for event in events:
        if isinstance(event, JobSubmitted | JobChanged):
            jobs.add(event.job.key)
        elif not isinstance(event, CommitApplied | OwnersChanged | ApprovalChecked):
            return None
    return frozenset(jobs)


@dataclass(frozen=True, slots=True)
class _Group:
    """Events with one id prefix, actor and cause, within an append."""

    events: Sequence[Event]
    id_prefix: str
    actor: str
    cause: str
