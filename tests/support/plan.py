"""Pull requests on a real cluster repo and the plans gitsched makes of them."""

from __future__ import annotations

import json
from typing import Any

from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import encode
from gitsched.eventlog.envelope import canonical_json
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import PullRequestPlan, plan_change
from tests.support.cluster_repo import (
    PRIYA,
    ClusterRepo,
    git,
    gitsched,
)

PR = "pr/change"


def open_pr(
    repo: ClusterRepo,
    files: dict[str, str],
    message: str = "change",
    *,
    author: tuple[str, str] = PRIYA,
    trailers: tuple[tuple[str, str], ...] = (),
    remove: tuple[str, ...] = (),
) -> str:
    """A branch PR off main with one commit; main stays checked out and unchanged."""
    git(repo.path, "checkout", "-q", "-b", PR)
    repo.write_all(files)
    for rel in remove:
        repo.remove(rel)
    sha = repo.commit(message, author=author, trailers=trailers)
    git(repo.path, "checkout", "-q", "main")
    return sha


def reconcile(repo: ClusterRepo) -> None:
    gitsched("reconcile", "--once", repo.path, expect=0)


def plan_json(repo: ClusterRepo, revisions: str = f"main..{PR}", expect: int = 1) -> Any:
    return gitsched("plan", repo.path, revisions, "--format", "json", expect=expect).json()


def effects(plan: Any, action: str) -> list[dict[str, Any]]:
    return [e for e in plan["effects"] if e["action"] == action]


def predicted(plan_groups: Any) -> list[tuple[Any, ...]]:
    """The plan's events as the loop encodes them for the log."""
    out = []
    for group in plan_groups:
        for event_id, e in zip(group.ids(), group.events, strict=True):
            new = encode(e, id=event_id, actor=group.actor, cause=group.cause)
            out.append((new.id, new.type, new.actor, new.cause, payload(new.type, new.data)))
    return out


def payload(kind: str, data: dict[str, Any]) -> bytes:
    if kind == "SolveCompleted":
        data = {**data, "seconds": 0.0}  # the solve's own wall time, measured twice
    return canonical_json(data)


def planned_then_reconciled(
    repo: ClusterRepo, event_log: EventLog, reconciler: Reconciler, message: str
) -> tuple[list[tuple[Any, ...]], PullRequestPlan]:
    """Commit, plan it, reconcile it: the events, once the plan predicted them exactly, and
    the plan."""
    sha = repo.commit(message, allow_empty=True)
    plan = plan_change(GitRepo(repo.path), event_log, None, sha)
    seq = event_log.last_seq()
    reconciler.run_once()
    appended = [
        (s.id, s.type, s.actor, s.cause, payload(s.type, s.data)) for s in event_log.read(seq)
    ]
    assert predicted(plan.groups) == appended, message
    return appended, plan


def of(events: list[tuple[Any, ...]], kind: str) -> list[dict[str, Any]]:
    """The payloads of the events of type `kind`."""
    return [json.loads(e[4]) for e in events if e[1] == kind]
