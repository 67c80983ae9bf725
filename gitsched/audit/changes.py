"""`audit changes`: every change of queues, OWNERS, priorities and policies, with its provenance.

For each: the commit, its author and when they wrote it, its committer (who merged
it) and approvers, when it was merged (the committer date, when it took effect) and
applied (when the log recorded it), all in UTC, and what it caused: the placement
events of the solve that followed it (admitted, moved, preempted, left pending).
For a change to a team's queue or OWNERS, also the approval rule's verdict from the
log: who wrote it, each approver, whether they were an owner at the base, and the
fingerprint of the key that signed their approval.
"""

from __future__ import annotations

from typing import Any

import orjson

from gitsched.audit.store import AuditStore, rows
from gitsched.policies.approval import PLATFORM, email_of

# Changes the platform owners govern (cluster.yaml's priorities, the Policy): their
# approval record is the platform's.
PLATFORM_KINDS = ("priorities", "policy")

HEADERS = [
    "applied_seq",
    "commit",
    "kind",
    "target",
    "change",
    "author",
    "committer",
    "approvers",
    "approval",
    "merged",
    "applied",
    "caused",
]


def changes(
    store: AuditStore,
    *,
    team: str | None = None,
    after_seq: int = 0,
    until_seq: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The changes applied at seqs `after_seq < seq <= until_seq`, the first `limit` of
    them (all by default), in the order they were applied."""
    where = "WHERE ch.commit_seq > ? AND ch.commit_seq <= ?"
    params: list[Any] = [after_seq, until_seq if until_seq is not None else 2**62]
    if team is not None:
        where += " AND (ch.team = ? OR ch.target = ?)"
        params += [team, team]
    if limit is not None:
        params.append(limit)
    # Walks changes_commit in order and stops at `limit`: a page costs its rows, not the log's.
    found = rows(
        store,
        "SELECT ch.commit_seq, ch.seq, ch.kind, ch.target, ch.team, ch.summary, c.sha, c.author, "
        "c.email, c.approvers, c.committed_at, c.applied_time, c.subject, c.authored_at, "
        "c.committer FROM changes ch "
        f"JOIN commits c ON c.seq = ch.commit_seq {where} ORDER BY ch.commit_seq, ch.seq, ch.id"
        + (" LIMIT ?" if limit is not None else ""),
        params,
    )
    effects: dict[int, list[dict[str, Any]]] = {}
    approvals: dict[tuple[int, str], dict[str, Any]] = {}
    commit_seqs = sorted({r["commit_seq"] for r in found})
    for start in range(0, len(commit_seqs), 500):
        chunk = commit_seqs[start : start + 500]
        for e in rows(
            store,
            "SELECT commit_seq, seq, type, job, detail FROM effects WHERE commit_seq IN ("
            + ",".join("?" * len(chunk))
            + ") ORDER BY commit_seq, seq",
            chunk,
        ):
            effects.setdefault(e["commit_seq"], []).append(
                {"seq": e["seq"], "type": e["type"], "job": e["job"], "detail": e["detail"]}
            )
        for a in rows(
            store,
            "SELECT commit_seq, team, status, data FROM approvals WHERE commit_seq IN ("
            + ",".join("?" * len(chunk))
            + ")",
            chunk,
        ):
            approvals[(a["commit_seq"], a["team"])] = {
                "status": a["status"],
                **orjson.loads(a["data"]),
            }
    out = []
    for r in found:
        caused = effects.get(r["commit_seq"], [])
        governed_by = PLATFORM if r["kind"] in PLATFORM_KINDS else r["team"]
        approval = approvals.get((r["commit_seq"], governed_by))
        out.append(
            {
                "applied_seq": r["commit_seq"],
                "seq": r["seq"],
                "commit": r["sha"],
                "subject": r["subject"],
                "kind": r["kind"],
                "target": r["target"],
                "team": r["team"],
                "change": r["summary"],
                "author": _author(f"{r['author']} <{r['email']}>", r["email"], approval),
                "authored": r["authored_at"] or None,
                "committer": r["committer"] or None,
                "approvers": approvers_of(r["approvers"], approval),
                "approval": approval,
                "merged": r["committed_at"],
                "applied": r["applied_time"],
                "effects": caused,
                "caused": _caused_text(caused),
            }
        )
    return out


def approvers_of(trailers: str, approval: dict[str, Any] | None) -> list[str]:
    """Who approved a change: the one answer every audit output gives. For a governed
    change, the approvers the approval rule counted (what the reconciler counted, judged
    again from the log: a merge's branch commits included); otherwise the commit's own
    Approved-by/Reviewed-by trailers, as written."""
    written = [a for a in trailers.split("\n") if a]
    if approval is None or approval.get("status") == "bootstrap":
        return written
    # a counted approver named by the commit's own trailer keeps the name it gave
    named = {email_of(a): a for a in written}
    return [
        named.get(str(a["approver"]), str(a["approver"]))
        for a in approval.get("approvals", ())
        if a.get("counted")
    ]


def _author(committed: str, email: str, approval: dict[str, Any] | None) -> str:
    """Who wrote the change: for a merge, the authors of the commits it brought in
    (the approval record's), with the commit's own author as the one who merged it."""
    authors = list(approval.get("authors", ())) if approval else []
    if not authors or email.lower() in authors:
        return committed
    return f"{', '.join(authors)} (merged by {committed})"


def _caused_text(effects: list[dict[str, Any]]) -> str:
    if not effects:
        return "no placement change"
    counts: dict[str, list[str]] = {}
    for e in effects:
        verb = e["detail"].split(" ", 1)[0].rstrip(":")
        counts.setdefault(verb, []).append(e["job"])
    return "; ".join(f"{verb} {', '.join(jobs)}" for verb, jobs in counts.items())


def approval_text(approval: dict[str, Any] | None) -> str:
    """One cell: the verdict, and each approver with their owner status and key."""
    if approval is None:
        return "-"
    if approval["status"] == "bootstrap":
        return "bootstrap (no owners at the base)"
    people = []
    for a in approval.get("approvals", ()):
        marks = ["owner" if a["owner_at_base"] else "not an owner"]
        if a.get("fingerprint"):
            marks.append(f"signed {a['fingerprint']}")
        if not a.get("counted"):
            marks.append("not counted")
        people.append(f"{a['approver']} ({', '.join(marks)})")
    status = str(approval["status"])
    return status + (": " + "; ".join(people) if people else "")
