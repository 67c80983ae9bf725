"""How long jobs waited to run, as users and operators read it: count, mean, p50, p95,
p99 and max wait per queue, priority class or job size, over a period.

A wait is one admission's: from when the job began waiting (its commit, the end of
its last interval, or the end of its retry backoff) to the start of the interval it
was admitted to, the same figure `audit history` shows as `wait_s`. Moves are no
admissions and are left out. Read from the view's `placements` rows by their start
time (an indexed range), so the cost follows the admissions in the period, not the
length of the log.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gitsched.audit.projection.vocabulary import START_ADMITTED
from gitsched.audit.store import AuditStore

BY = ("queue", "priority", "size")
HEADERS = [
    "group",
    "count",
    "mean_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "max_wait_s",
]

_SQL = (
    "SELECT queue, priority_class, gpu_milli, start_ts - queued_ts FROM {table} "
    "WHERE start_kind = ? AND queued_ts IS NOT NULL AND start_ts >= ? AND start_ts < ?"
)


def size_group(gpu_milli: int) -> str:
    """A job's size class by the GPUs it was admitted with: 0 (no GPU), 1 (one GPU or a
    share of one), then ranges that double: 2, 3-4, 5-8, 9-16, ..."""
    if gpu_milli <= 0:
        return "0"
    gpus = math.ceil(gpu_milli / 1000)
    if gpus <= 2:
        return str(gpus)
    top = 1 << (gpus - 1).bit_length()
    return f"{top // 2 + 1}-{top}"


def percentile(ordered: list[float], p: float) -> float:
    """The nearest-rank percentile of sorted values: the smallest value with at least p %
    of the values at or below it (what Slurm's and Kueue's users compute by hand)."""
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summary(group: str, values: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(max(0.0, v) for v in values)
    if not ordered:
        return {"group": group, "count": 0, **dict.fromkeys(HEADERS[2:])}
    return {
        "group": group,
        "count": len(ordered),
        "mean_wait_s": round(sum(ordered) / len(ordered), 3),
        "p50_wait_s": round(percentile(ordered, 50), 3),
        "p95_wait_s": round(percentile(ordered, 95), 3),
        "p99_wait_s": round(percentile(ordered, 99), 3),
        "max_wait_s": round(ordered[-1], 3),
    }


def admissions(store: AuditStore, since: float, until: float) -> list[tuple[str, str, int, float]]:
    """(queue, priority class, milli-GPU, wait in seconds) of every admission that started
    in [since, until), in no particular order."""
    rows: list[tuple[str, str, int, float]] = []
    for table in ("placements", "open_placements"):
        rows += store.db.execute(
            _SQL.format(table=table), (START_ADMITTED, since, until)
        ).fetchall()
    return rows


def waits(store: AuditStore, *, by: str = "queue", since: float, until: float) -> dict[str, Any]:
    """Wait figures per group (sorted by name) and over every admission (`all`)."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    groups: dict[str, list[float]] = defaultdict(list)
    every: list[float] = []
    for queue, priority_class, milli, wait in admissions(store, since, until):
        key = queue if by == "queue" else priority_class if by == "priority" else size_group(milli)
        groups[key].append(wait)
        every.append(wait)
    order = sorted(groups, key=_size_order) if by == "size" else sorted(groups)
    return {
        "rows": [summary(g, groups[g]) for g in order],
        "all": summary("all", every),
    }


def _size_order(group: str) -> int:
    return int(group.split("-")[0])


def waits_over_time(
    store: AuditStore, since: float, until: float, buckets: int = 48
) -> dict[str, list[tuple[float, float, int]]]:
    """Per queue, the mean wait of the admissions started in each of `buckets` equal
    slices of the period: (slice start, mean wait s, admissions), slices with none left out
    (the report's wait chart)."""
    width = max((until - since) / buckets, 1e-9)
    sums: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
    rows: list[tuple[str, float, float]] = []
    for table in ("placements", "open_placements"):
        rows += store.db.execute(
            f"SELECT queue, start_ts, start_ts - queued_ts FROM {table} WHERE start_kind = ? "
            "AND queued_ts IS NOT NULL AND start_ts >= ? AND start_ts < ?",
            (START_ADMITTED, since, until),
        ).fetchall()
    for queue, start, wait in rows:
        index = min(buckets - 1, int((start - since) / width))
        cell = sums[(queue, index)]
        cell[0] += max(0.0, wait)
        cell[1] += 1
    out: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for (queue, index), (total, count) in sorted(sums.items()):
        out[queue].append((since + index * width, round(total / count, 3), int(count)))
    return dict(out)
