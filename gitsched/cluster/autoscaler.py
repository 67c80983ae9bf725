"""`serve`'s autoscaler: asks Prometheus for each service's metric on an interval, folds
the answers into windows (ServiceMetricObserved), and appends the ServiceScaled that
engine/autoscaling.py decides from the log, so a replay, `plan` and `audit` give the
same answer as the daemon did.

A window is a run of answers that give the same recommendation; it is appended only
when it could change a decision: when the recommendation changes, when a decision is
taken at its end, or when Prometheus stops answering (so what held before the outage
still counts in the stabilisation windows afterwards). Prometheus down, slow or
answering garbage: the count stays, `status` says why (/metrics), and the next try
waits longer (exponential backoff).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gitsched.cluster.prometheus import MetricAnswer, PrometheusClient, PrometheusError
from gitsched.engine import events as ev
from gitsched.engine.autoscaling import (
    AutoscalingSpec,
    decide,
    horizon_seconds,
    metric_recommendation,
    parse_autoscaling,
    prune,
)
from gitsched.engine.fairshare import moment
from gitsched.engine.services import desired_replicas
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import ConcurrencyConflict, DuplicateEvent, EventLog
from gitsched.eventlog.codec import decode, encode
from gitsched.reconciler.telemetry import iso

log = logging.getLogger("gitsched.autoscaler")

ACTOR = "autoscaler"
DEFAULT_INTERVAL_S = 15.0  # HPA's --horizontal-pod-autoscaler-sync-period
MAX_BACKOFF_S = 300.0
_TYPES = (ev.ServiceMetricObserved.type, ev.ServiceScaled.type)
# Every other event is only counted past: its payload is never parsed.
_OTHER_TYPES = frozenset(ev.EVENT_TYPES) - set(_TYPES)


@dataclass(frozen=True, slots=True)
class ScaledService:
    """A service to scale, as the InferenceService fold knows it now: its name
    ("team/name"), its current desired replica count, its bounds and its spec."""

    name: str
    current: int
    min_replicas: int
    max_replicas: int
    spec: AutoscalingSpec


def no_services() -> Sequence[ScaledService]:
    """No services to scale (an autoscaler not yet given a folded state)."""
    return ()


def services_of(state: ClusterState) -> list[ScaledService]:
    """The services of the folded state that have an autoscaling block and are not
    suspended, in name order, each at the replica count the fold wants now."""
    out: list[ScaledService] = []
    for key in sorted(state.services):
        status = state.services[key]
        service = status.service
        if service.autoscaling is None or service.suspend:
            continue
        out.append(
            ScaledService(
                name=key,
                current=desired_replicas(status),
                min_replicas=service.min_replicas,
                max_replicas=service.max_replicas,
                spec=parse_autoscaling(service.autoscaling),
            )
        )
    return out


@dataclass(slots=True)
class AutoscalerStatus:
    """What /metrics says about the autoscaler: whether Prometheus answered every query
    of the last poll, the last error, and counts of failures and ignored answers."""

    up: bool = True
    last_error: str = ""
    last_success_at: float | None = None  # Prometheus' time of the last usable answer
    failures: dict[str, int] = field(default_factory=dict)  # error class -> count
    ignored: int = 0  # NaN or negative answers
    decisions: int = 0


@dataclass(frozen=True, slots=True)
class _Window:
    """The open window of one service: answers since `start` that all gave `recommendation`."""

    query: str
    start: float
    end: float
    total: float
    count: int
    replicas: int
    target: float
    recommendation: int

    def event(self, service: str) -> ev.ServiceMetricObserved:
        return ev.ServiceMetricObserved(
            service=service,
            query=self.query,
            start=iso(self.start),
            end=iso(self.end),
            value=round(self.total / self.count, 6),
            samples=self.count,
            replicas=self.replicas,
        )


class Autoscaler:
    """One poll per `interval_s` over `services()`; `tick` is called from serve's loop
    (the thread that holds the Lease), appends to `event_log` with its fencing."""

    def __init__(
        self,
        client: PrometheusClient,
        services: Callable[[], Sequence[ScaledService]] = no_services,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.services = services
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.status = AutoscalerStatus()
        self._monotonic = monotonic
        self._next_poll = 0.0
        self._backoff = interval_s
        self._seq = 0  # the log is read up to here
        self._samples: dict[str, tuple[ev.ServiceMetricObserved, ...]] = {}
        self._history: dict[str, tuple[ev.ServiceScaled, ...]] = {}
        self._open: dict[str, _Window] = {}

    # -- the log's side ---------------------------------------------------------------------

    def catch_up(self, event_log: EventLog) -> int:
        """Read the log's windows and scaling events since the last read; the seq read to."""
        for stored in event_log.read(self._seq, skip_data_of=_OTHER_TYPES):
            self._seq = stored.seq
            if stored.type not in _TYPES:
                continue
            event = decode(stored)
            if isinstance(event, ev.ServiceMetricObserved):
                self._samples[event.service] = (*self._samples.get(event.service, ()), event)
            elif isinstance(event, ev.ServiceScaled):
                self._history[event.service] = (*self._history.get(event.service, ()), event)
                self._open.pop(event.service, None)  # a window never spans a change of count
        return self._seq

    def known(
        self, service: str
    ) -> tuple[tuple[ev.ServiceMetricObserved, ...], tuple[ev.ServiceScaled, ...]]:
        """The windows and scaling events of `service` the log holds (within the horizon)."""
        return self._samples.get(service, ()), self._history.get(service, ())

    # -- one poll -----------------------------------------------------------------------------

    def tick(self, event_log: EventLog) -> list[ev.Event]:
        """Poll if it is time: the events appended (none when not due, or on a conflict)."""
        now = self._monotonic()
        if now < self._next_poll:
            return []
        appended = self.poll(event_log)
        if self.status.up:
            self._backoff = self.interval_s
            self._next_poll = now + self.interval_s
        else:
            log.warning(
                "autoscaler: %s; keeping every service's replicas, next try in %.0fs",
                self.status.last_error,
                self._backoff,
            )
            self._next_poll = now + self._backoff
            self._backoff = min(self._backoff * 2, self.max_backoff_s)
        return appended

    def poll(self, event_log: EventLog) -> list[ev.Event]:
        """Ask Prometheus for every service's metric, decide, append; the events appended."""
        tip = self.catch_up(event_log)
        services = sorted(self.services(), key=lambda s: s.name)
        events: list[ev.Event] = []
        opened = dict(self._open)
        failed = False
        for service in services:
            try:
                answer = self.client.query(service.spec.query)
            except PrometheusError as e:
                failed = True
                kind = type(e).__name__
                self.status.failures[kind] = self.status.failures.get(kind, 0) + 1
                self.status.last_error = f"{service.name}: {e}"
                events.extend(self._close(opened, service.name))
                continue
            if answer.value is None:
                self.status.ignored += 1
                log.warning("autoscaler: %s: %s", service.name, answer.warning)
                events.extend(self._close(opened, service.name))
                continue
            self.status.last_success_at = max(self.status.last_success_at or 0.0, answer.at)
            events.extend(self._observe(opened, service, answer))
        self.status.up = not failed
        if not failed:
            self.status.last_error = ""
        if events and not self._append(event_log, tip, events):
            return []
        self._open = opened
        self._forget(services)
        return events

    def _close(self, opened: dict[str, _Window], service: str) -> list[ev.Event]:
        window = opened.pop(service, None)
        return [window.event(service)] if window is not None else []

    def _observe(
        self, opened: dict[str, _Window], service: ScaledService, answer: MetricAnswer
    ) -> list[ev.Event]:
        """The events one usable answer brings: the window it closes (the recommendation
        changed), and the window it ends with the decision taken at its time."""
        assert answer.value is not None
        spec = service.spec
        rec = metric_recommendation(answer.value, service.current, spec.target, spec.tolerance)
        out: list[ev.Event] = []
        window = opened.get(service.name)
        if window is not None and answer.at <= window.end:
            return []  # the same evaluation time again: nothing new
        same = window is not None and (
            window.recommendation,
            window.replicas,
            window.query,
            window.target,
        ) == (
            rec,
            service.current,
            spec.query,
            spec.target,
        )
        if window is not None and same:
            window = replace(
                window, end=answer.at, total=window.total + answer.value, count=window.count + 1
            )
        else:
            if window is not None:
                out.append(window.event(service.name))
            window = _Window(
                spec.query, answer.at, answer.at, answer.value, 1, service.current, spec.target, rec
            )
        opened[service.name] = window
        samples, history = self.known(service.name)
        closed = [e for e in out if isinstance(e, ev.ServiceMetricObserved)]
        candidate = window.event(service.name)
        scaled = decide(
            service.name,
            service.current,
            service.min_replicas,
            service.max_replicas,
            spec,
            (*samples, *closed, candidate),
            history,
            candidate.end,
        )
        if scaled is not None:
            out.extend((candidate, scaled))
            opened.pop(service.name, None)
            log.info(
                "autoscaler: %s %d -> %d (%s, %s per replica against %s)",
                service.name,
                scaled.from_replicas,
                scaled.to_replicas,
                scaled.bound_by,
                scaled.metric_value,
                scaled.target,
            )
        return out

    def _append(self, event_log: EventLog, tip: int, events: list[ev.Event]) -> bool:
        batch = [
            encode(e, id=f"{ACTOR}/{tip}/{i}", actor=ACTOR, cause=ACTOR)
            for i, e in enumerate(events)
        ]
        try:
            event_log.append(batch, expected_last_seq=tip)
        except (ConcurrencyConflict, DuplicateEvent):
            log.info("autoscaler: another writer appended first; polling again next time")
            return False
        self.status.decisions += sum(isinstance(e, ev.ServiceScaled) for e in events)
        self.catch_up(event_log)
        return True

    def _forget(self, services: Sequence[ScaledService]) -> None:
        """Drop what no decision can read any more (older than each spec's horizon)."""
        for service in services:
            samples, history = self.known(service.name)
            newest = max(
                (moment(s.end) or 0.0 for s in samples),
                default=0.0,
            )
            if not newest:
                continue
            kept, recent = prune(samples, history, iso(newest), horizon_seconds(service.spec))
            self._samples[service.name], self._history[service.name] = kept, recent
