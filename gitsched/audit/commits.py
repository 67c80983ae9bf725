"""Commits as the audit view recorded them, and what each moved: the console's lookups.

`audit changes` lists the changes of queues, OWNERS, priorities and policies; the web
console also shows every commit (job specs too), the placements a commit started or
ended, the commit that last set a job, a job's pending stretches and wait times per
queue. All indexed reads of the view (or one pass over the placement rows), no replay.
"""

from __future__ import annotations

import heapq
import json
from typing import Any

from gitsched.audit.projection.vocabulary import KIND_PENDING, epoch
from gitsched.audit.store import AuditStore, rows

COMMIT_COLUMNS = (
    "seq, sha, applied, author, email, approvers, committed_at, applied_time, subject, detail, "
    "authored_at, committer"
)


def _commit(r: Any) -> dict[str, Any]:
    return {
        "seq": r["seq"],
        "sha": r["sha"],
        "applied": bool(r["applied"]),
        "author": f"{r['author']} <{r['email']}>" if r["email"] else r["author"],
        "approvers": [a for a in r["approvers"].split("\n") if a],
        "merged": r["committed_at"],
        "recorded": r["applied_time"],
        "subject": r["subject"],
        # applied: how many changes it made; rejected: how many errors it had
        "detail": r["detail"],
        "committer": r["committer"] or None,
    }


def recent_commits(
    store: AuditStore, *, before_seq: int | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """The newest `limit` commits the log recorded (applied or rejected) before `before_seq`,
    newest first."""
    found = rows(
        store,
        f"SELECT {COMMIT_COLUMNS} FROM commits WHERE seq < ? ORDER BY seq DESC LIMIT ?",
        (before_seq if before_seq is not None else 2**62, limit),
    )
    return [_commit(r) for r in found]


def commit_count(store: AuditStore) -> int:
    return int(store.db.execute("SELECT COUNT(*) FROM commits").fetchone()[0])


def find_commit(store: AuditStore, sha: str) -> dict[str, Any] | None:
    """The commit whose sha is `sha` or starts with it (at least 7 hex digits); None if the
    log never recorded one, or if the prefix names more than one."""
    if len(sha) < 7:
        return None
    found = rows(
        store,
        f"SELECT {COMMIT_COLUMNS} FROM commits WHERE sha >= ? AND sha < ? ORDER BY seq LIMIT 3",
        (sha, sha + "\U0010ffff"),
    )
    shas = {r["sha"] for r in found}
    if len(shas) != 1:
        return None
    return _commit(found[-1])


def commit_that_made(store: AuditStore, seq: int) -> dict[str, Any] | None:
    """The applied commit whose events include `seq` (its CommitApplied comes after them)."""
    found = rows(
        store,
        f"SELECT {COMMIT_COLUMNS} FROM commits WHERE seq >= ? AND applied = 1 ORDER BY seq LIMIT 1",
        (seq,),
    )
    return _commit(found[0]) if found else None


def commit_changes(store: AuditStore, commit_seq: int) -> list[dict[str, Any]]:
    """The queue, OWNERS, priority and policy changes a commit made (`audit changes`' rows)."""
    return [
        {"kind": r["kind"], "target": r["target"], "team": r["team"], "change": r["summary"]}
        for r in rows(
            store,
            "SELECT kind, target, team, summary FROM changes WHERE commit_seq = ? ORDER BY seq, id",
            (commit_seq,),
        )
    ]


def moved_by(store: AuditStore, shas: list[str], shown: int) -> dict[str, dict[str, Any]]:
    """sha -> what the commit moved: `counts` of the placements it started or ended by kind
    (admitted, moved, preempted, stopped...), `total`, and the first `shown` of them in log
    order. Read from the placement intervals' causes; a commit that placed 10,000 jobs
    costs the count, not 10,000 rows."""
    out: dict[str, dict[str, Any]] = {sha: {"counts": [], "shown": [], "total": 0} for sha in shas}
    if not shas:
        return out
    marks = ",".join("?" * len(shas))
    moved = (
        "WITH moved AS ("
        "SELECT start_cause AS cause, start_seq AS seq, start_kind AS what, job, nodes, "
        f"gpu_milli FROM all_placements WHERE start_cause IN ({marks}) "
        "UNION ALL SELECT end_cause, end_seq, end_kind, job, nodes, gpu_milli "
        f"FROM all_placements WHERE end_cause IN ({marks}) AND end_seq IS NOT NULL) "
    )
    by_cause: dict[str, list[tuple[Any, ...]]] = {}
    # One pass over the matching intervals as plain tuples (no sort in SQL: a window over
    # thousands of rows cost three times as much), counted and cut here.
    for row in store.db.execute(
        moved + "SELECT cause, seq, what, job, nodes, gpu_milli FROM moved", (*shas, *shas)
    ):
        by_cause.setdefault(row[0], []).append(row)
    for cause, found in by_cause.items():
        counts: dict[str, int] = {}
        for row in found:
            counts[row[2]] = counts.get(row[2], 0) + 1
        first = heapq.nsmallest(shown, found, key=lambda r: (r[1], r[3]))
        out[cause] = {
            "counts": sorted(counts.items()),
            "total": len(found),
            "shown": [
                {"seq": seq, "job": job, "what": what, "nodes": nodes.split(), "gpu_milli": milli}
                for _, seq, what, job, nodes, milli in first
            ],
        }
    return out


def pending_stretches(store: AuditStore, job: str) -> list[dict[str, Any]]:
    """Every stretch of the log during which `job` waited, with the solver's reason."""
    return [
        {
            "from_seq": r["from_seq"],
            "from": r["from_time"],
            "to_seq": r["to_seq"],
            "to": r["to_time"],
            **{k: v for k, v in json.loads(r["data"]).items() if k in ("reason", "constraint")},
        }
        for r in rows(
            store,
            "SELECT from_seq, from_time, to_seq, to_time, data FROM all_versions "
            "WHERE kind = ? AND key = ? ORDER BY from_seq",
            (KIND_PENDING, job),
        )
    ]


def wait_seconds_by_queue(store: AuditStore) -> dict[str, list[float]]:
    """queue -> how long each admission waited (seconds from queued to placed), sorted."""
    out: dict[str, list[float]] = {}
    for queue, start_ts, queued in store.db.execute(
        "SELECT queue, start_ts, queued_time FROM all_placements "
        "WHERE start_kind = 'admitted' AND queued_time != ''"
    ):
        out.setdefault(queue, []).append(max(0.0, start_ts - epoch(queued)))
    for waits in out.values():
        waits.sort()
    return out
