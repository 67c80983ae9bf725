"""Decisions at chosen times through the reconciler's own step (`gitsched.reconciler.step`): a
commit decided at its committer date, then the solve it asks for, as `reconcile` and
`plan` make them; for tests of rules that read the decision's time."""

from __future__ import annotations

from gitsched.engine.core import ApplyCommit, DesiredState, decide, decision_time
from gitsched.engine.model import CommitInfo
from gitsched.engine.state import ClusterState, fold
from gitsched.reconciler.step import solve_step


def at(minute: int, second: int = 0) -> str:
    """2026-11-20 10:MM:SS UTC, in the log's time format."""
    return f"2026-11-20T10:{minute:02d}:{second:02d}.000000Z"


def commit_at(n: int, minute: int) -> CommitInfo:
    return CommitInfo(f"{n:040x}", "Ana", "ana@example.com", at(minute), f"commit {n}")


def commit(state: ClusterState, n: int, minute: int, d: DesiredState, solver: str) -> ClusterState:
    """Commit `d` at 10:`minute` and place as the reconciler does."""
    c = commit_at(n, minute)
    state = fold(decide(state, ApplyCommit(c, d)), state)
    return solve_step(state, c.sha, decision_time(c), solver).state
