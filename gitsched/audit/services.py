"""A service's replica counts over time, from the log alone: `audit history --service`.

Folded with the engine's own fold (engine.state), so the counts are the reconciler's:
after each event about the service, what it wanted (desired), what it had (replicas) and
why (the step's reason, or the ServiceScaled inputs: metric, target, the bound that
decided it), so `audit` can say why the service had 7 replicas at 14:02.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gitsched.engine import events as ev
from gitsched.engine.services import desired_replicas
from gitsched.engine.state import ClusterState, evolve
from gitsched.eventlog.envelope import StoredEvent

HEADERS = ["seq", "time", "event", "desired", "replicas", "running", "why"]

_ABOUT = (
    ev.ServiceSubmitted,
    ev.ServiceChanged,
    ev.ServiceWithdrawn,
    ev.ServiceScaled,
    ev.ServiceReplicasChanged,
)


def _names(event: ev.Event) -> str:
    if isinstance(event, ev.ServiceSubmitted | ev.ServiceChanged):
        return event.service.key
    if isinstance(event, ev.ServiceWithdrawn | ev.ServiceScaled | ev.ServiceReplicasChanged):
        return event.service
    return ""


def _why(event: ev.Event) -> str:
    if isinstance(event, ev.ServiceReplicasChanged):
        return event.reason
    if isinstance(event, ev.ServiceScaled):
        metric = "no metric" if event.metric_value is None else f"metric {event.metric_value:g}"
        target = "" if event.target is None else f", target {event.target:g}"
        return (
            f"scaled {event.from_replicas} -> {event.to_replicas} ({metric}{target};"
            f" bound by {event.bound_by})"
        )
    if isinstance(event, ev.ServiceChanged):
        return "spec changed: " + ", ".join(event.fields)
    if isinstance(event, ev.ServiceSubmitted):
        return f"submitted ({event.service.file})"
    return "withdrawn"


def _time(stored: StoredEvent, event: ev.Event) -> str:
    if isinstance(event, ev.ServiceScaled | ev.ServiceReplicasChanged):
        return event.at
    return stored.time


def service_history(
    events: Iterable[tuple[StoredEvent, ev.Event]], service: str
) -> list[dict[str, Any]] | None:
    """One row per event about `service` ("team/name"), with its counts after it; None
    when the log never saw the service."""
    state = ClusterState()
    rows: list[dict[str, Any]] = []
    seen = False
    for stored, event in events:
        state = evolve(state, event)
        if not isinstance(event, _ABOUT) or _names(event) != service:
            continue
        seen = True
        status = state.services.get(service)
        keys = []
        if status is not None:
            keys = [
                f"{status.service.queue}/{status.service.name}.{r.index}" for r in status.replicas
            ]
        rows.append(
            {
                "seq": stored.seq,
                "time": _time(stored, event),
                "event": event.type,
                "desired": desired_replicas(status) if status is not None else 0,
                "replicas": len(keys),
                "running": sum(1 for k in keys if k in state.started),
                "why": _why(event),
            }
        )
    return rows if seen else None
