"""The reconcile loop: new commits in, events out, placement after each change.

Where it stands is read from the log itself (the last applied or rejected
commit), so a crashed or restarted reconciler resumes exactly; event ids are
derived from the commit sha, so a retried append is recognised, never doubled.
A reconciler that finds another one has written first re-reads the log and goes on.
What to append is reconciler.step's to decide; this module reads, appends, retries
and keeps snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gitsched.engine.core import RejectCommit
from gitsched.engine.model import CommitInfo
from gitsched.engine.placement.plan import PlacementPlan
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import (
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    EventLogError,
    LogCorrupted,
)
from gitsched.eventlog.codec import encode
from gitsched.eventlog.envelope import canonical_json
from gitsched.eventlog.replay import Replayed, replay, snapshot
from gitsched.findings import Finding
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.specs import SpecCache
from gitsched.reconciler.step import Step, cluster_solve, commit_steps, due_step, owed_solve

log = logging.getLogger("gitsched.reconciler")

# How often one pass starts over after another reconciler wrote to the log first.
MAX_RESTARTS = 20
# A snapshot of the folded state after every this many events, so a restart replays
# at most this many (eventlog.snapshot); 0 writes none.
SNAPSHOT_EVERY = 100_000


class _Superseded(Exception):
    """Another writer appended first: this pass's state no longer matches the log."""


class _JobsEnded(Exception):
    """Jobs a step would stop had ended: the cluster's side appended that (under `cause`)
    instead of the step. Place after it, as after any cluster event, then decide again."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


# Asked before a step that stops running jobs is appended, with the log it was decided on
# and the jobs it stops: whether what the cluster did since says otherwise about them (a
# job ended: its pods Succeeded or Failed). If so, the cluster's side appends that first,
# at its own time, and answers the cause to place after it (as `solve_now` takes); the
# step is then decided again from the log that holds it. None: the step stands.
StoppedCheck = Callable[[Replayed, frozenset[str]], str | None]


def stopped_jobs(before: ClusterState, after: ClusterState) -> frozenset[str]:
    """The jobs running in `before` whose placement `after` no longer holds: preempted,
    moved, timed out, or stopped by any other decision."""
    return frozenset(
        job
        for job, started_at in before.started.items()
        if (placement := before.placements.get(job)) is not None
        and placement.started_at == started_at
        and after.placements.get(job) != placement
    )


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
        check_stopped: StoppedCheck | None = None,
    ) -> None:
        self.repo = repo
        # A decision that stops a running job must not rest on a log that has not yet heard
        # the job ended: the cluster controller's check (docs/kubernetes.md, "One pass").
        self.check_stopped = check_stopped
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
            except _JobsEnded as e:
                self.solve_now(e.cause)
                continue
            except _Superseded:
                # Another reconciler wrote first; our in-memory state is stale, so
                # start over from the log (event ids make the replayed work a no-op).
                log.info("another writer appended to the log; re-reading it")
                continue
            return report
        raise ConcurrencyConflict(report.last_seq, self.log.last_seq())

    def solve_now(self, cause: str) -> ReconcileReport:
        """Place again after events no commit made (the cluster's: a job finished, a node
        failed), if they left the state in need of it. `cause` names those events and
        prefixes the solve's event ids, so a retried append is recognised."""
        report = ReconcileReport()
        for _ in range(MAX_RESTARTS):
            try:
                tip = self._tip = replay(self.log, since=self._tip, verify=True)
                report.state, report.last_seq = tip.state, tip.last_seq
                # Decided at the time of the last event that asked for it: never the clock.
                step = cluster_solve(tip.state, cause, tip.last_time or "", self.solver)
                if step is not None:
                    self._append(step, report)
            except _JobsEnded as e:
                cause = e.cause  # the placement after them is this one, decided again
                continue
            except _Superseded:
                log.info("another writer appended to the log; re-reading it")
                continue
            return report
        raise ConcurrencyConflict(report.last_seq, self.log.last_seq())

    def solve_due(self, at: str) -> ReconcileReport:
        """Append what became due by `at` (a running job reached its time limit) and the
        placement after it. `at` is only when the daemon looks: each event carries the time
        its limit was reached (engine.timelimits), so the log is the same whenever it looks."""
        report = ReconcileReport()
        for _ in range(MAX_RESTARTS):
            try:
                tip = self._tip = replay(self.log, since=self._tip, verify=True)
                report.state, report.last_seq = tip.state, tip.last_seq
                step = due_step(tip.state, at, self.solver)
                if step is not None:
                    self._append(step, report)
            except _JobsEnded as e:
                self.solve_now(e.cause)
                continue
            except _Superseded:
                log.info("another writer appended to the log; re-reading it")
                continue
            return report
        raise ConcurrencyConflict(report.last_seq, self.log.last_seq())

    def _pass(self, report: ReconcileReport) -> None:
        tip = self._tip = replay(self.log, since=self._tip, verify=True)
        report.state, report.last_seq = tip.state, tip.last_seq
        owed = owed_solve(tip.state, self.solver)
        if owed is not None:
            self._append(owed, report)
        state = self._tip.state
        last = state.last_commit.sha if state.last_commit else None
        commits = self.repo.commits_since(self.branch, last)
        steps = commit_steps(self.repo, state, commits, solver=self.solver, specs=self._specs)
        for step in steps:
            intent = step.intent
            assert intent is not None  # a commit's step
            self._append(step, report)
            errors = intent.errors if isinstance(intent, RejectCommit) else ()
            if isinstance(intent, RejectCommit):
                log.info("commit %s rejected: %d finding(s)", intent.commit.sha[:12], len(errors))
            report.commits.append(
                CommitOutcome(
                    intent.commit,
                    not isinstance(intent, RejectCommit),
                    errors,
                    len(next(g for g in step.groups if g.id_prefix == intent.commit.sha).events),
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

    def _append(self, step: Step, report: ReconcileReport) -> None:
        """Append the step's events in one transaction and take its state as the tip."""
        tip = self._tip
        assert tip is not None  # a pass starts by reading the log
        if self.check_stopped is not None:
            stopped = stopped_jobs(tip.state, step.state)
            cause = self.check_stopped(tip, stopped) if stopped else None
            if cause is not None:
                log.info("jobs this step stops ended meanwhile; deciding again from the log")
                raise _JobsEnded(cause)
        if step.plan is not None:
            report.plan = step.plan
        batch = [
            encode(e, id=event_id, actor=group.actor, cause=group.cause)
            for group in step.groups
            for event_id, e in zip(group.ids(), group.events, strict=True)
        ]
        if not batch:
            self._tip = replace(tip, state=step.state)
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
                "the log was altered; run `gitsched log verify`"
            )
        if stored[0].seq != tip.last_seq + 1 or any(
            canonical_json(s.data) != canonical_json(b.data)
            for s, b in zip(stored, batch, strict=True)
        ):
            # Another writer got to this commit first, from a state we have not seen.
            raise _Superseded
        report.events_appended += len(stored)
        last = stored[-1]
        self._tip = Replayed(step.state, last.seq, last.time, last.hash)
        report.state, report.last_seq = self._tip.state, self._tip.last_seq
