"""`audit solves`: every solve the log records, whose plan was applied and why.

The default policy asks for the MILP; where greedy's plan was applied instead
(SolveCompleted v2 `plan_source` "greedy" with a `fallback` reason), an auditor
finds it here, with the solve's gap and bound. Read from the audit view's `solves`
rows (`audit.projection.cluster_fold` writes one per SolveCompleted), not the log.
"""

from __future__ import annotations

from typing import Any

from audit.store import AuditStore

HEADERS = [
    "seq",
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
    return [
        {
            "seq": seq,
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
        for seq, time, cause, solver, status, plan_source, fallback, objective, bound, gap, seconds in cursor
    ]
