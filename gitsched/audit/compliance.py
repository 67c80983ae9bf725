"""`audit compliance`: the checks an auditor asks for, each with the events that show it.

The fold checks every placement, preemption, solve and queue change as it reads
them (`gitsched.audit.projection.checks`); this module lists the results. A violation names the
seqs of its evidence, and `describe` turns them into event types and ids read
back from the log, so anyone can check them with `gitsched state --seq`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from gitsched.audit.projection.vocabulary import (
    CHECK_APPROVAL,
    CHECK_ISOLATION,
    CHECK_LIMITS,
    CHECK_MEMBERSHIP,
    CHECK_PREEMPTION,
    CHECK_PREEMPTION_RULES,
    CHECK_RESERVATIONS,
    CHECK_RESIDENCY,
    CHECK_STRICT_FIFO,
    CHECKS,
)
from gitsched.audit.store import AuditStore, LogReader, rows
from gitsched.audit.window import read_page
from gitsched.eventlog.base import EventLogError

DESCRIPTIONS = {
    CHECK_ISOLATION: "regulated jobs (isolation: dedicated) run only on dedicated nodes, "
    "and never beside another job",
    CHECK_RESIDENCY: "jobs with data residency run only on nodes in their allowed regions",
    CHECK_PREEMPTION: "jobs with preemptible: false are never preempted "
    "(a node failure, drain or removal is not a preemption)",
    CHECK_LIMITS: "after every solve, no queue uses more than nominal + borrowing limit "
    "and no cohort borrows more than its members can lend",
    CHECK_APPROVAL: "every change to a team's queue (its quota) or OWNERS is approved by an "
    "owner of that team (or a platform owner) at the base, not its author, signed when the "
    "Policy requires it; every change to cluster.yaml, inventory/, policies/, the root OWNERS, "
    "and the creation or removal of a team by a platform owner; nobody to ask at the base "
    "(bootstrap) needs none; the reconciler's rule, run on the log (SOC 2 CC8.1, change "
    "management)",
    CHECK_MEMBERSHIP: "with approval.requireMemberForJobs, every job, workspace and inference "
    "service a commit adds, changes or removes under teams/<team>/ comes from a member or owner of that team at the base, or is "
    "approved by one of its owners; the reconciler's rule, run on the log",
    CHECK_STRICT_FIFO: "in a queue whose queueingStrategy is StrictFIFO, no job is admitted "
    "while a job ahead of it in that queue's wait order (higher priority, then earlier "
    "submission: the engine's wait_order) still waits after the same decision, unless that "
    "job can never run on the cluster; the engine's StrictFIFO rule, run on the log",
    CHECK_PREEMPTION_RULES: "every preemption is one the quota and preemption rules allow "
    "(within a queue, reclaim within a cohort, never to borrow, never before the victim's "
    "minimum run time), judged on the state at the time",
    CHECK_RESERVATIONS: "no job started on a node reserved for a job ahead of it in wait order "
    "unless its time limit ended before the reservation's start (backfill, docs/time.md)",
}

CHECKED_WHAT = {
    CHECK_ISOLATION: "placements",
    CHECK_RESIDENCY: "placements with residency",
    CHECK_PREEMPTION: "preemptions",
    CHECK_LIMITS: "solves",
    CHECK_APPROVAL: "commits changing queues, OWNERS or the platform's files",
    CHECK_MEMBERSHIP: "commits changing work (jobs, workspaces, services) under the rule",
    CHECK_PREEMPTION_RULES: "preemptions",
    CHECK_RESERVATIONS: "job starts while a reservation was held",
    CHECK_STRICT_FIFO: "admissions in StrictFIFO queues",
}

HEADERS = ["check", "seq", "time", "subject", "message", "evidence", "until_seq"]


def compliance(
    store: AuditStore,
    *,
    since_seq: int = 0,
    until_seq: int | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The checks over violations found at seqs `since_seq < seq <= until_seq`, counted in
    full, and the first `limit` of those violations listed (all by default); with a
    `limit`, `truncated` says whether any were left out."""
    upper = until_seq if until_seq is not None else 2**62
    select = (
        "SELECT check_name, seq, time, subject, message, evidence, end_seq, end_time "
        "FROM violations WHERE seq > ? AND seq <= ? ORDER BY seq, id"
    )
    found, truncated = read_page(
        lambda after, upto, n: (
            rows(store, select, (after, upto))
            if n is None
            else rows(store, select + " LIMIT ?", (after, upto, n))
        ),
        since_seq,
        upper,
        limit,
        lambda r: int(r["seq"]),
    )
    checked = store.checked()
    violations = [
        {
            "check": r["check_name"],
            "seq": r["seq"],
            "time": r["time"],
            "subject": r["subject"],
            "message": r["message"],
            "evidence": orjson.loads(r["evidence"]),
            "until_seq": r["end_seq"],
            "until": r["end_time"],
        }
        for r in found
    ]
    if limit is None:
        counts = Counter(r["check_name"] for r in found)
    else:
        counts = Counter(
            dict(
                store.db.execute(
                    "SELECT check_name, COUNT(*) FROM violations WHERE seq > ? AND seq <= ? "
                    "GROUP BY check_name",
                    (since_seq, upper),
                ).fetchall()
            )
        )
    checks = []
    for name in CHECKS:
        count = counts[name]
        checks.append(
            {
                "check": name,
                "description": DESCRIPTIONS[name],
                "checked": checked.get(name, 0),
                "checked_what": CHECKED_WHAT[name],
                "violations": count,
                "status": "FAIL" if count else "PASS",
            }
        )
    result = {
        "ok": not counts,
        "events": store.offset()[0],
        "checks": checks,
        "violations": violations,
    }
    if limit is not None:
        result["truncated"] = truncated
    return result


def describe(log: LogReader, violations: list[dict[str, Any]], limit: int = 500) -> None:
    """Replace evidence seqs by {seq, type, id} read from the log (for the first `limit` violations)."""
    for v in violations[:limit]:
        named = []
        for seq in v["evidence"]:
            try:
                event = next(iter(log.read(seq - 1, until_seq=seq)), None)
            except EventLogError:
                event = None  # unreadable now: `log verify` says why
            named.append(
                {
                    "seq": seq,
                    "type": event.type if event else None,
                    "id": event.id if event else None,
                }
            )
        v["evidence"] = named
