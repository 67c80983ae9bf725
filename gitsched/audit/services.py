"""A service's replica counts over time, from the log alone: `audit history --service`.

Folded with the engine's own fold (engine.state), so the counts are the reconciler's:
after each event about the service, what it wanted (desired), what it had (replicas) and
why (the step's reason, or the ServiceScaled inputs: metric, target, the bound that
decided it), so `audit` can say why the service had 7 replicas at 14:02. The audit
view keeps the same rows (`service_counts`, plus a row whenever a replica's start or
stop moves the counts) for the report and the console to read by index.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gitsched.audit.projection.service_rows import ROW_COLUMNS, about, counts, event_time, why
from gitsched.audit.store import AuditStore, rows
from gitsched.engine import events as ev
from gitsched.engine.state import ClusterState, evolve
from gitsched.eventlog.envelope import StoredEvent

HEADERS = ["seq", "time", "event", "desired", "replicas", "running", "why"]


def service_history(
    events: Iterable[tuple[StoredEvent, ev.Event]], service: str
) -> list[dict[str, Any]] | None:
    """One row per event about `service` ("team/name"), with its counts after it; None
    when the log never saw the service."""
    state = ClusterState()
    out: list[dict[str, Any]] = []
    seen = False
    for stored, event in events:
        before, state = state, evolve(state, event)
        if about(event) != service:
            continue
        seen = True
        c = counts(state, service, before)
        out.append(
            {
                "seq": stored.seq,
                "time": event_time(stored.time, event),
                "event": event.type,
                "desired": c.desired,
                "replicas": c.replicas,
                "running": c.running,
                "why": why(event),
            }
        )
    return out if seen else None


# A row's fact time: the view's timeline at its seq (the last mark at or before it).
_COLUMNS = ", ".join(f'c."{c}"' for c in ROW_COLUMNS) + (
    ", coalesce((SELECT m.time FROM marks m WHERE m.seq <= c.seq ORDER BY m.seq DESC LIMIT 1),"
    " '') AS time"
)


def view_rows(
    store: AuditStore, *, service: str | None = None, until_seq: int | None = None
) -> list[dict[str, Any]]:
    """The view's service rows (`service_counts`), by service then seq: all services, or
    one; each with its fact time."""
    where: list[str] = []
    args: list[object] = []
    if service is not None:
        where.append("c.service = ?")
        args.append(service)
    if until_seq is not None:
        where.append("c.seq <= ?")
        args.append(until_seq)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    found = rows(
        store,
        f"SELECT {_COLUMNS} FROM service_counts c{clause} ORDER BY c.service, c.seq",
        tuple(args),
    )
    return [dict(r) for r in found]


def scaling_decisions(store: AuditStore, service: str, limit: int = 10) -> list[dict[str, Any]]:
    """The last `limit` ServiceScaled of `service`, newest first, with their inputs."""
    found = rows(
        store,
        f"SELECT {_COLUMNS} FROM service_counts c WHERE c.service = ? "
        "AND c.event = 'ServiceScaled' ORDER BY c.seq DESC LIMIT ?",
        (service, limit),
    )
    return [dict(r) for r in found]
