"""`audit changes`: every change of queues, priorities and policies, with its provenance.

For each: the commit, its author and when they wrote it, its committer (who merged
it) and approvers, when it was merged (the committer date, when it took effect) and
applied (when the log recorded it), all in UTC, and what it caused: the placement
events of the solve that followed it (admitted, moved, preempted, left pending).
"""

from __future__ import annotations

from typing import Any

from audit.store import AuditStore, rows

HEADERS = [
    "applied_seq",
    "commit",
    "kind",
    "target",
    "change",
    "author",
    "committer",
    "approvers",
    "merged",
    "applied",
    "caused",
]


def changes(store: AuditStore, *, team: str | None = None) -> list[dict[str, Any]]:
    where, params = "", []
    if team is not None:
        where, params = "WHERE ch.team = ? OR ch.target = ?", [team, team]
    found = rows(
        store,
        "SELECT ch.commit_seq, ch.seq, ch.kind, ch.target, ch.team, ch.summary, c.sha, c.author, "
        "c.email, c.approvers, c.committed_at, c.applied_time, c.subject, c.authored_at, "
        "c.committer FROM changes ch "
        f"JOIN commits c ON c.seq = ch.commit_seq {where} ORDER BY ch.commit_seq, ch.seq, ch.id",
        params,
    )
    effects: dict[int, list[dict[str, Any]]] = {}
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
    out = []
    for r in found:
        caused = effects.get(r["commit_seq"], [])
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
                "author": f"{r['author']} <{r['email']}>",
                "authored": r["authored_at"] or None,
                "committer": r["committer"] or None,
                "approvers": [a for a in r["approvers"].split("\n") if a],
                "merged": r["committed_at"],
                "applied": r["applied_time"],
                "effects": caused,
                "caused": _caused_text(caused),
            }
        )
    return out


def _caused_text(effects: list[dict[str, Any]]) -> str:
    if not effects:
        return "no placement change"
    counts: dict[str, list[str]] = {}
    for e in effects:
        verb = e["detail"].split(" ", 1)[0].rstrip(":")
        counts.setdefault(verb, []).append(e["job"])
    return "; ".join(f"{verb} {', '.join(jobs)}" for verb, jobs in counts.items())
