"""`audit solves`: every solve the log records, whose plan was applied and why.

The default policy asks for the MILP; where greedy's plan was applied instead
(SolveCompleted v2 `plan_source` "greedy" with a `fallback` reason), an auditor
finds it here, with the solve's gap and bound. Read from the log, not the view.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.events import SolveCompleted
from eventlog.codec import decode
from eventlog.envelope import StoredEvent

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


def solves(stored: Iterable[StoredEvent], *, fallbacks_only: bool = False) -> list[dict[str, Any]]:
    rows = []
    for event in stored:
        if event.type != SolveCompleted.type:
            continue
        solve = decode(event)
        assert isinstance(solve, SolveCompleted)
        if fallbacks_only and not solve.fallback:
            continue
        rows.append(
            {
                "seq": event.seq,
                "time": event.time,
                "cause": event.cause,
                "solver": solve.solver,
                "status": solve.status,
                "plan_source": solve.plan_source,
                "fallback": solve.fallback or None,
                "objective": round(solve.objective, 4),
                "bound": None if solve.bound is None else round(solve.bound, 4),
                "gap_pct": None if solve.gap is None else round(100 * solve.gap, 4),
                "seconds": round(solve.seconds, 3),
            }
        )
    return rows
