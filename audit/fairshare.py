"""`audit fairshare`: each queue's decayed usage against its fair share, over time.

Read from the log itself through the engine's own fold (engine/fairshare.py), so audit
reports the very usage the solver weighed at each moment: the queues' shares of the
cluster, and their usage decayed with the policy's half-life, sampled at even times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from engine.fairshare import capacity_gpus, fair_share_rows, usage_at
from engine.state import ClusterState, evolve
from eventlog.codec import decode
from eventlog.envelope import StoredEvent

HEADERS = [
    "time",
    "queue",
    "cohort",
    "fair_share_pct",
    "used_gpu_hours_decayed",
    "used_share_pct",
    "idle_jobs",
]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sample_times(since: float, until: float, every_s: float) -> list[float]:
    """`since`, then every `every_s`, up to and with `until`."""
    times: list[float] = []
    t = since
    while t < until and len(times) < 10_000:
        times.append(t)
        t += every_s
    times.append(until)
    return times


def _rows(state: ClusterState, at: float) -> list[dict[str, Any]]:
    half_life = state.policy.usage_half_life_hours
    usage = usage_at(state.usage, at, half_life)
    queues, cohorts = fair_share_rows(
        dict(state.queues), usage, capacity_gpus(state.nodes), half_life
    )
    idle: dict[str, int] = {}
    for key in state.idle:
        queue = key.partition("/")[0]
        idle[queue] = idle.get(queue, 0) + 1
    return [
        {
            "time": _iso(at),
            "queue": name,
            "cohort": r.cohort,
            "fair_share_pct": round(100 * r.share, 2),
            "used_gpu_hours_decayed": round(r.usage_gpu_hours, 2),
            "used_share_pct": round(100 * r.usage_share, 2),
            "idle_jobs": idle_jobs,
        }
        for name, r, idle_jobs in (
            *((r.name, r, idle.get(r.name, 0)) for r in queues),
            *((f"cohort {r.name}", r, None) for r in cohorts),
        )
    ]


def fair_share_over_time(
    stored: Iterable[StoredEvent], times: Sequence[float]
) -> list[dict[str, Any]]:
    """The rows at each of `times`, from the events whose own times (commits, decisions,
    the cluster's end times: the fold's clock) come before it."""
    state = ClusterState()
    rows: list[dict[str, Any]] = []
    i = 0
    for event in stored:
        after = evolve(state, decode(event))
        while i < len(times) and times[i] < after.clock:
            rows += _rows(state, times[i])
            i += 1
        state = after
    for at in times[i:]:
        rows += _rows(state, at)
    return rows
