"""Placement history: every interval a job held nodes, from the log's events.

Like Slurm's `sacct` with NodeList, Start, End, State and Reason: each interval
says why it started (admitted, moved) and why it ended (moved, preempted,
withdrawn, finished, node gone, spec changed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine import events as ev
from engine.model import GPU_MILLI, Placement
from eventlog.envelope import StoredEvent


@dataclass
class Interval:
    job: str
    queue: str
    flavor: str | None
    nodes: tuple[str, ...]
    replicas: int
    gpus: float
    start: str
    start_seq: int
    start_reason: str
    end: str | None = None
    end_seq: int | None = None
    end_reason: str | None = None
    cause: str = ""
    actor: str = ""

    @property
    def state(self) -> str:
        return "RUNNING" if self.end is None else (self.end_reason or "ended").split(":")[0].split(" ")[0].upper()

    def to_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "queue": self.queue,
            "flavor": self.flavor,
            "nodes": list(self.nodes),
            "replicas": self.replicas,
            "gpus": self.gpus,
            "start": self.start,
            "start_seq": self.start_seq,
            "start_reason": self.start_reason,
            "end": self.end,
            "end_seq": self.end_seq,
            "end_reason": self.end_reason,
            "state": self.state,
        }


@dataclass
class _Open:
    interval: Interval
    placement: Placement


@dataclass
class HistoryBuilder:
    """Folds (stored, decoded) event pairs into placement intervals."""

    intervals: list[Interval] = field(default_factory=list)
    open: dict[str, Interval] = field(default_factory=dict)
    node_of_jobs: dict[str, set[str]] = field(default_factory=dict)

    def _close(self, job: str, stored: StoredEvent, reason: str) -> None:
        interval = self.open.pop(job, None)
        if interval is not None:
            interval.end = stored.time
            interval.end_seq = stored.seq
            interval.end_reason = reason

    def feed(self, stored: StoredEvent, event: ev.Event) -> None:
        if isinstance(event, ev.PlacementDecided):
            self._close(event.job, stored, f"moved: {event.reason}")
            gpus = sum(r.gpu_milli * len(r.gpus) for r in event.replicas) / GPU_MILLI
            interval = Interval(
                job=event.job,
                queue=event.job.split("/", 1)[0],
                flavor=event.flavor,
                nodes=tuple(sorted({r.node for r in event.replicas})),
                replicas=len(event.replicas),
                gpus=gpus,
                start=stored.time,
                start_seq=stored.seq,
                start_reason=event.action if event.action != "moved" else f"moved: {event.reason}",
                cause=stored.cause,
                actor=stored.actor,
            )
            self.intervals.append(interval)
            self.open[event.job] = interval
        elif isinstance(event, ev.JobPreempted):
            self._close(event.job, stored, f"preempted: {event.reason}")
        elif isinstance(event, ev.JobPending):
            self._close(event.job, stored, f"stopped: {event.reason}")
        elif isinstance(event, ev.JobWithdrawn):
            self._close(event.job, stored, f"withdrawn in {stored.cause[:12]}")
        elif isinstance(event, ev.JobFinished):
            self._close(event.job, stored, "finished")


def build_history(pairs: Iterable[tuple[StoredEvent, ev.Event]]) -> list[Interval]:
    builder = HistoryBuilder()
    for stored, event in pairs:
        builder.feed(stored, event)
    return builder.intervals


def select(
    intervals: Iterable[Interval],
    *,
    job: str | None = None,
    node: str | None = None,
    team: str | None = None,
    flavor: str | None = None,
) -> list[Interval]:
    out = []
    for i in intervals:
        if job is not None and i.job != job and i.job.split("/", 1)[-1] != job:
            continue
        if node is not None and node not in i.nodes:
            continue
        if team is not None and i.queue != team:
            continue
        if flavor is not None and i.flavor != flavor:
            continue
        out.append(i)
    return out
