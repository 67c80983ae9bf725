"""`audit solves`: every solve the log records, whose plan was applied and why.

The default policy asks for the MILP; where greedy's plan was applied instead
(SolveCompleted v2 `plan_source` "greedy" with a `fallback` reason), an auditor
finds it here, with the solve's gap and bound. Read from the audit view's `solves`
rows (`gitsched.audit.projection.cluster_fold` writes one per SolveCompleted), not the log.
`decided` is the solve's fact time (its commit's date, or the cluster events' own), the
time `--since/--until` select by; `time` is when the log recorded it.
"""

from __future__ import annotations

from typing import Any

from gitsched.audit.store import AuditStore

HEADERS = [
    "seq",
    "decided",
    "time",
    "cause",
    "solver",
    "status",
    "plan_source",
    "fallback",
    "objective",
    "bound",
    "gap_pct",
    "seconds",
]


def solves(
    store: AuditStore,
    *,
    fallbacks_only: bool = False,
    after_seq: int = 0,
    until_seq: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The solves logged at seqs `after_seq < seq <= until_seq`, the first `limit` of them
    (all by default): a page costs its rows (a range of the primary key)."""
    where = " AND fallback != ''" if fallbacks_only else ""
    params: list[Any] = [after_seq, until_seq if until_seq is not None else 2**62]
    if limit is not None:
        params.append(limit)
    cursor = store.db.execute(
        "SELECT seq, time, cause, solver, status, plan_source, fallback, objective, bound, gap, "
        f"seconds FROM solves WHERE seq > ? AND seq <= ?{where} ORDER BY seq"
        + (" LIMIT ?" if limit is not None else ""),
        params,
    )
    rows = cursor.fetchall()
    decided = _fact_times(store, [int(r[0]) for r in rows])
    return [
        {
            "seq": seq,
            "decided": decided.get(seq),
            "time": time,
            "cause": cause,
            "solver": solver,
            "status": status,
            "plan_source": plan_source,
            "fallback": fallback or None,
            "objective": round(objective, 4),
            "bound": None if bound is None else round(bound, 4),
            "gap_pct": None if gap is None else round(100 * gap, 4),
            "seconds": round(seconds, 3),
        }
        for seq, time, cause, solver, status, plan_source, fallback, objective, bound, gap, seconds in rows
    ]


def _fact_times(store: AuditStore, seqs: list[int]) -> dict[int, str]:
    """Each seq's fact time: the view's `marks` note where the fact timeline moves on (the
    seq of its first event and the time), so a seq's is the last mark at or before it, as
    `gitsched.audit.window.seqs_between` reads them. One range read for a sorted page of seqs."""
    if not seqs:
        return {}
    first, last = seqs[0], seqs[-1]
    before = store.db.execute(
        "SELECT seq, time FROM marks WHERE seq <= ? ORDER BY seq DESC LIMIT 1", (first,)
    ).fetchone()
    marks = ([before] if before is not None else []) + store.db.execute(
        "SELECT seq, time FROM marks WHERE seq > ? AND seq <= ? ORDER BY seq", (first, last)
    ).fetchall()
    out: dict[int, str] = {}
    i, current = 0, None
    for seq in seqs:
        while i < len(marks) and marks[i][0] <= seq:
            current = marks[i][1]
            i += 1
        if current is not None:
            out[seq] = current
    return out
