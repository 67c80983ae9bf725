"""A service's counts after an event, one function for `audit history --service` (a fold
of the log) and the audit view's `service_counts` rows (the engine's fold the view runs,
`gitsched.audit.projection.cluster_fold`), so both say the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gitsched.engine import events as ev
from gitsched.engine.services import desired_replicas, replica_key
from gitsched.engine.state import ClusterState


def about(event: ev.Event) -> str:
    """The service ("team/name") an event is about; "" for any other event."""
    if isinstance(event, ev.ServiceSubmitted | ev.ServiceChanged):
        return event.service.key
    if isinstance(event, ev.ServiceWithdrawn | ev.ServiceScaled | ev.ServiceReplicasChanged):
        return event.service
    return ""


def why(event: ev.Event) -> str:
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
    if isinstance(event, ev.ServiceWithdrawn):
        return "withdrawn"
    job = getattr(event, "job", None)
    return f"{event.type} {job}" if isinstance(job, str) else event.type


def event_time(stored_time: str, event: ev.Event) -> str:
    """When a service event happened: a step's or a scaling's own `at`, else the log's."""
    if isinstance(event, ev.ServiceScaled | ev.ServiceReplicasChanged):
        return event.at
    return stored_time


@dataclass(frozen=True, slots=True)
class Counts:
    """A service's replica counts in a folded state: what it wants, what it has, what runs,
    and its bounds."""

    desired: int
    replicas: int
    running: int
    min: int
    max: int


def counts(state: ClusterState, service: str, before: ClusterState | None = None) -> Counts:
    """`service`'s counts in `state`; a service `state` no longer has counts 0, with the
    bounds it had in `before`."""
    status = state.services.get(service)
    if status is None:
        gone = before.services.get(service) if before is not None else None
        low = gone.service.min_replicas if gone is not None else 0
        high = gone.service.max_replicas if gone is not None else 0
        return Counts(0, 0, 0, low, high)
    keys = [replica_key(status.service, r.index) for r in status.replicas]
    return Counts(
        desired_replicas(status),
        len(keys),
        sum(1 for k in keys if k in state.started),
        status.service.min_replicas,
        status.service.max_replicas,
    )


class ServiceRows:
    """The audit view's service history (table `service_counts`), written by the engine's
    fold (`gitsched.audit.projection.cluster_fold`): a row for every event about a service,
    and one whenever another event (a replica started, preempted, finished) changes a
    service's counts, so the report and the console read counts over time by index. A
    row keeps its seq (its fact time is the view's timeline's, `marks`) and the event's
    own `at` where it states one (a scaling decision, a step)."""

    def __init__(self, state: ClusterState) -> None:
        self.last: dict[str, Counts] = {key: counts(state, key) for key in state.services}

    def fold(
        self,
        seq: int,
        event: ev.Event,
        before: ClusterState,
        after: ClusterState,
        out: list[tuple[Any, ...]],
    ) -> None:
        named = about(event)
        if named:
            changed = [named]
        elif (after.started is not before.started or after.jobs is not before.jobs) and (
            after.services
        ):
            changed = sorted(after.services)
        else:
            return
        for key in changed:
            now = counts(after, key, before)
            if not named and self.last.get(key) == now:
                continue
            self.last[key] = now
            if key not in after.services:
                self.last.pop(key, None)
            out.append(
                (
                    key,
                    seq,
                    event_time("", event),
                    event.type,
                    now.desired,
                    now.replicas,
                    now.running,
                    now.min,
                    now.max,
                    why(event),
                    *_scaling(event),
                )
            )


def _scaling(event: ev.Event) -> tuple[float | None, float | None, str | None]:
    if isinstance(event, ev.ServiceScaled):
        return (event.metric_value, event.target, event.bound_by)
    return (None, None, None)


ROW_COLUMNS = (
    "service",
    "seq",
    "at",
    "event",
    "desired",
    "replicas",
    "running",
    "min",
    "max",
    "why",
    "metric_value",
    "target",
    "bound_by",
)
