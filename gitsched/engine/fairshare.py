"""Fair share over time: each queue's GPU usage from the log's history, decaying with a
half-life (Slurm's PriorityDecayHalfLife), so a team that ran much lately yields
contended GPUs to one that did not (engine.placement.objective.usage_weights).

Kept in the folded state, one queue's entry updated per placement or stop, and timed by
the events alone (decision times, the cluster's own end times), never the clock: a replay
gives the same usage, and so the same decisions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gitsched.engine.model import Node, Queue
from gitsched.engine.units import gpus_from_milli

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class QueueUsage:
    """A queue's decayed GPU-seconds as of `as_of` (seconds since the epoch), and the
    milli-GPUs its running jobs hold from then on."""

    gpu_seconds: float = 0.0
    as_of: float = 0.0
    running_gpu_milli: int = 0


@functools.lru_cache(maxsize=1024)
def moment(text: str) -> float | None:
    """An ISO-8601 time with an offset as seconds since the epoch; None when it is not one.
    Cached: every event of a solve carries the same decision time, and a replay folds them all."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def decay_window_s(half_life_hours: float) -> float:
    """The seconds of full use a decayed sum tends to: the integral of 2^(-t/H), H/ln 2."""
    return max(half_life_hours, 1e-9) * HOUR_S / math.log(2.0)


def advance(usage: QueueUsage, at: float, half_life_hours: float) -> QueueUsage:
    """`usage` carried forward to `at`: the past halves every half-life, and the running
    jobs add their GPU-seconds, each decayed from when it was used."""
    if at <= usage.as_of:
        return usage
    if usage.as_of == 0.0:
        return QueueUsage(usage.gpu_seconds, at, usage.running_gpu_milli)
    window = decay_window_s(half_life_hours)
    kept = 2.0 ** (-(at - usage.as_of) / (half_life_hours * HOUR_S))
    gpus = gpus_from_milli(usage.running_gpu_milli)
    return QueueUsage(
        usage.gpu_seconds * kept + gpus * window * (1.0 - kept), at, usage.running_gpu_milli
    )


def runs(usage: QueueUsage, gpu_milli: int, at: float, half_life_hours: float) -> QueueUsage:
    """A job of the queue started (`gpu_milli` > 0) or stopped (< 0) holding GPUs at `at`."""
    moved = advance(usage, at, half_life_hours)
    return QueueUsage(moved.gpu_seconds, moved.as_of, max(0, moved.running_gpu_milli + gpu_milli))


def usage_at(
    usage: Mapping[str, QueueUsage], at: float, half_life_hours: float
) -> dict[str, float]:
    """Every queue's decayed GPU-seconds at `at`, by queue name (sorted)."""
    return {q: advance(usage[q], at, half_life_hours).gpu_seconds for q in sorted(usage)}


def capacity_gpus(nodes: Mapping[str, Node]) -> int:
    return sum(n.gpus for n in nodes.values() if n.schedulable)


def usage_shares(
    usage: Mapping[str, float], capacity: int, half_life_hours: float
) -> dict[str, float]:
    """Each queue's decayed GPU-seconds as a share of what the whole cluster could have run
    over the decay window: 1.0 means the queue alone kept every GPU busy for ever."""
    full = max(capacity, 1) * decay_window_s(half_life_hours)
    return {q: used / full for q, used in usage.items() if used > 0.0}


@dataclass(frozen=True, slots=True)
class FairShareRow:
    """One queue (or cohort) in `plan` and audit: its weight's share of the cluster and its
    recent usage as a share of the cluster, both 0..1."""

    name: str
    cohort: str | None
    share: float
    usage_gpu_hours: float
    usage_share: float


def fair_share_rows(
    queues: Mapping[str, Queue], usage: Mapping[str, float], capacity: int, half_life_hours: float
) -> tuple[tuple[FairShareRow, ...], tuple[FairShareRow, ...]]:
    """(per queue, per cohort): fair share from the queues' weights against decayed usage."""
    shares = usage_shares(usage, capacity, half_life_hours)
    total = sum(max(q.weight, 0.0) for q in queues.values()) or 1.0
    rows = tuple(
        FairShareRow(
            name,
            queues[name].cohort,
            max(queues[name].weight, 0.0) / total,
            usage.get(name, 0.0) / HOUR_S,
            shares.get(name, 0.0),
        )
        for name in sorted(queues)
    )
    cohorts: dict[str, list[FairShareRow]] = {}
    for row in rows:
        if row.cohort is not None:
            cohorts.setdefault(row.cohort, []).append(row)
    cohort_rows = tuple(
        FairShareRow(
            name,
            name,
            sum(r.share for r in members),
            sum(r.usage_gpu_hours for r in members),
            sum(r.usage_share for r in members),
        )
        for name, members in sorted(cohorts.items())
    )
    return rows, cohort_rows
