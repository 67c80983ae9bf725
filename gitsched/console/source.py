"""What the console reads: the audit view, kept caught up with the log by one thread.

Requests never read the log. A background thread brings the audit view up to date
(`gitsched.audit.catchup.catch_up`, the fold `gitsched audit` runs) whenever the log grows, and
then loads the view's saved fold (the engine's state and the audit fold's job records)
as one immutable `Snapshot`; pages read that snapshot and the view's indexed queries.
When the log cannot be reached the last snapshot stays, and `problem` says why.
A second thread computes, for every branch not merged, the reconciler's own plan
(`gitsched.reconciler.plan.plan_change`, what `gitsched plan` runs), again only when the branch
or the log moved.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gitsched.audit.catchup import catch_up, open_view
from gitsched.audit.projection.cluster_fold import ClusterFold
from gitsched.audit.projection.state import Account, JobInfo, Pool
from gitsched.audit.store import AuditStore
from gitsched.cli_audit import default_db_path
from gitsched.cli_plan import _open_for_reading
from gitsched.engine.errors import GitschedError
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import EventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.plan import PullRequestPlan, plan_change

log = logging.getLogger(__name__)

# How long the first request waits for the first load of the log (then pages answer with
# "reading the log" and follow when it is done).
FIRST_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The view at one offset: the engine's folded state and the audit fold's job records."""

    seq: int
    state: ClusterState
    jobs: dict[str, JobInfo]
    # The audit usage ledger's accounts (queue, flavor) and cohort pools, as of `seq`.
    accounts: dict[str, Account] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    # Derived tables the pages share, computed once per snapshot (gitsched.console.views).
    memo: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class BranchPlan:
    """The plan of merging one branch, for the log at `seq`; `error` when it could not run."""

    branch: str
    sha: str
    subject: str
    seq: int
    plan: PullRequestPlan | None = None
    error: str | None = None


class ConsoleSource:
    """The console's one reader of the log: a caught-up audit view and its snapshot."""

    def __init__(
        self,
        repo: str | Path,
        log_url: str,
        *,
        db_path: str | Path | None = None,
        branch: str = "main",
        interval_s: float = 1.0,
        plans: bool = True,
        prepare: Callable[[Snapshot, AuditStore], None] | None = None,
        first_wait_s: float = FIRST_WAIT_S,
    ) -> None:
        """`prepare`: builds what pages share of a new snapshot before it is shown, so no
        page request pays for it (gitsched.console.views.prepare)."""
        self.repo = str(Path(repo).resolve())
        self.log_url = log_url
        self.db_path = Path(db_path) if db_path else default_db_path(log_url, self.repo)
        self.branch = branch
        self.interval_s = interval_s
        self.with_plans = plans
        self._prepare = prepare
        self.first_wait_s = first_wait_s
        self.loaded = False  # a snapshot was read from the log at least once
        # Nothing read yet: an empty cluster (its own, as each snapshot's memo is its own).
        self.snapshot = Snapshot(0, ClusterState(), {})
        self.problem: str | None = None
        self.plans: dict[str, BranchPlan] = {}
        # (branch, sha, subject) of the open branches, as the plan thread last listed them
        self.branches: list[tuple[str, str, str]] | None = None
        self.plans_problem: str | None = None
        self._read_lock = threading.Lock()
        self._reader: AuditStore | None = None
        self._writer: AuditStore | None = None
        self._log: EventLog | None = None
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._first_done = threading.Event()
        self._start_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        """Follow the log, and wait up to `first_wait_s` for the first load, so the first page
        has data; a log that takes longer (a broker that does not answer) is said on the
        page meanwhile, and pages answer. Idempotent."""
        with self._start_lock:
            if self._started:
                return
            self._started = True
            self.problem = f"reading the event log {self.log_url} for the first time…"
            loops = [self._follow]
            if self.with_plans:
                loops.append(self._plan_loop)
            for loop in loops:
                thread = threading.Thread(target=loop, name=f"console-{loop.__name__}", daemon=True)
                thread.start()
                self._threads.append(thread)
        self._first_done.wait(self.first_wait_s)

    def request_stop(self) -> None:
        """Ask the threads and the pages' event streams to end (returns at once)."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the threads, waiting `timeout_s` in all for them (a plan or a catch-up in
        flight finishes first); one still busy then is left to the process's exit, and
        what it reads stays open for it."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if busy := [t.name for t in self._threads if t.is_alive()]:
            log.warning(
                "console: %s still busy after %.0fs; not waiting", ", ".join(busy), timeout_s
            )
            return
        for closing in (self._log,):
            if closing is not None:
                closing.close()
        with self._read_lock:
            for store in (self._reader, self._writer):
                if store is not None:
                    store.close()
            self._reader = self._writer = None

    @contextmanager
    def reading(self) -> Iterator[AuditStore | None]:
        """The view for a page's queries (None until the log could be read once)."""
        with self._read_lock:
            yield self._reader

    def wait_for_change(self, seq: int, problem: str | None, timeout_s: float) -> None:
        """Block until the snapshot's seq or the problem differs from these, or timeout."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._stop.is_set() or self.snapshot.seq != seq or self.problem != problem,
                timeout=timeout_s,
            )

    # -- following the log ----------------------------------------------------------------

    def _follow(self) -> None:
        self.refresh()
        self._first_done.set()
        while not self._stop.wait(self.interval_s):
            self.refresh()

    def refresh(self) -> None:
        """One pass: catch the view up with the log and load a new snapshot if it moved."""
        try:
            self._catch_up()
            problem = None
        except (GitschedError, OSError) as e:
            problem = f"the event log {self.log_url} cannot be read: {e}"
            self._drop_log()
        except Exception as e:  # a bug: keep serving the last snapshot, say so, log it
            log.exception("console: refreshing from the log failed")
            problem = f"refreshing from the log failed: {type(e).__name__}: {e}"
            self._drop_log()
        if problem != self.problem:
            self.problem = problem
            self._notify()

    def _drop_log(self) -> None:
        if self._log is not None:
            # closing a broken connection: whatever it raises, nothing more to do
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    def _catch_up(self) -> None:
        if self._log is None:
            opened = _open_for_reading(self.log_url, explicit=True)
            assert opened is not None
            self._log = opened
        if self._writer is None:
            writer, _ = open_view(self._log, self.db_path)
            with self._read_lock:
                self._writer = writer
                self._reader = AuditStore(self.db_path)
        else:
            if self._writer.offset()[0] < self._log.last_seq():
                catch_up(self._log, self._writer)
        seq = self._writer.offset()[0]
        if seq != self.snapshot.seq or not self.loaded:
            self._load(seq)

    def _load(self, seq: int) -> None:
        assert self._writer is not None
        saved = self._writer.load_state()
        state = ClusterFold(saved.cluster).state if saved.cluster else ClusterState()
        snapshot = Snapshot(saved.seq or seq, state, saved.jobs, saved.accounts, saved.pools)
        if self._prepare is not None:
            try:
                self._prepare(snapshot, self._writer)
            except Exception:  # a page builds it again, and says what went wrong
                log.exception("console: preparing the snapshot at seq %d failed", snapshot.seq)
        self.snapshot = snapshot
        self.loaded = True
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- plans of open branches -----------------------------------------------------------

    def _plan_loop(self) -> None:
        while not self._first_done.wait(1.0):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            self.refresh_plans()
            self._stop.wait(max(self.interval_s, 2.0))

    def open_branches(self) -> list[tuple[str, str, str]]:
        """(branch, sha, subject) of every local branch not merged into the followed one."""
        try:
            listed = subprocess.run(
                [
                    "git",
                    "-C",
                    self.repo,
                    "for-each-ref",
                    "--format=%(refname:short)%00%(objectname)%00%(subject)",
                    "refs/heads",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise GitschedError(f"cannot list the branches of {self.repo}: {e}") from e
        repo = GitRepo(self.repo)
        followed = repo.resolve(self.branch) if repo.has_revision(self.branch) else None
        out = []
        for line in listed.splitlines():
            name, sha, subject = ([*line.split("\x00"), "", ""])[:3]
            if name == self.branch or not sha:
                continue
            if followed is not None and repo.is_ancestor(sha, followed):
                continue  # merged already: nothing to review
            out.append((name, sha, subject))
        return sorted(out)

    def refresh_plans(self) -> None:
        """Plan every open branch whose head or whose log seq moved since it was planned."""
        seq = self.snapshot.seq
        try:
            branches = self.open_branches()
            self.plans_problem = None
        except GitschedError as e:
            self.plans_problem = str(e)
            return
        if branches != self.branches:
            self.branches = branches
            self._notify()
        fresh: dict[str, BranchPlan] = {}
        for name, sha, subject in branches:
            old = self.plans.get(name)
            if old is not None and old.sha == sha and old.seq == seq:
                fresh[name] = old
                continue
            fresh[name] = self._plan(name, sha, subject, seq)
            if self._stop.is_set():
                return
        if fresh != self.plans:
            self.plans = fresh
            self._notify()

    def _plan(self, name: str, sha: str, subject: str, seq: int) -> BranchPlan:
        try:
            event_log = _open_for_reading(self.log_url, explicit=False)
            try:
                result = plan_change(GitRepo(self.repo), event_log, None, sha)
            finally:
                if event_log is not None:
                    event_log.close()
        except GitschedError as e:
            return BranchPlan(name, sha, subject, seq, error=str(e))
        except Exception as e:  # a bug in planning one branch must not stop the others
            log.exception("console: planning %s failed", name)
            return BranchPlan(name, sha, subject, seq, error=f"{type(e).__name__}: {e}")
        return BranchPlan(name, sha, subject, seq, plan=result)
