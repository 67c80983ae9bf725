"""`audit fairshare`: each queue's decayed usage against its fair share, over time.

Read from the audit view's fair-share rows, which the engine's own fold writes as the
log is projected (`gitsched.audit.projection.cluster_fold`): audit reports the very usage the
solver weighed at each moment, and a query reads rows by index seeks, not the log.
The maths is engine/fairshare.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gitsched.audit.projection.cluster_fold import QueueInputs, global_inputs, queue_inputs
from gitsched.audit.store import AuditStore
from gitsched.engine.fairshare import QueueUsage, fair_share_rows, usage_at
from gitsched.engine.model import Queue
from gitsched.engine.state import ClusterState

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


def rows_at(
    queues: Mapping[str, QueueInputs], half_life_hours: float, capacity: int, at: float
) -> list[dict[str, Any]]:
    """The rows at `at` from fair share's inputs as they were then."""
    usage = usage_at({name: q.usage for name, q in queues.items()}, at, half_life_hours)
    configs = {name: Queue(name, "", q.cohort, q.weight) for name, q in queues.items()}
    by_queue, cohorts = fair_share_rows(configs, usage, capacity, half_life_hours)
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
            *((r.name, r, queues[r.name].idle_jobs) for r in by_queue),
            *((f"cohort {r.name}", r, None) for r in cohorts),
        )
    ]


def rows_of_state(state: ClusterState, at: float) -> list[dict[str, Any]]:
    """The rows at `at` of a folded state: what the view's rows must give back."""
    half_life, capacity = global_inputs(state)
    return rows_at(queue_inputs(state), half_life, capacity, at)


def _cutoff(store: AuditStore, at: float) -> int:
    """The last seq whose fold's clock had not passed `at`: the state a sample at `at` reads
    is the fold up to it (the engine's clock never goes back, so one index seek)."""
    row = store.db.execute(
        "SELECT seq FROM fairshare_clock WHERE clock > ? ORDER BY clock LIMIT 1", (at,)
    ).fetchone()
    return store.offset()[0] if row is None else int(row[0]) - 1


# Every queue name, one index seek each (a loose index scan: DISTINCT would read every row).
_QUEUE_NAMES = """
WITH RECURSIVE n(queue) AS (
    SELECT MIN(queue) FROM fairshare_queues
    UNION ALL
    SELECT (SELECT MIN(queue) FROM fairshare_queues WHERE queue > n.queue) FROM n
    WHERE n.queue IS NOT NULL
)
SELECT queue FROM n WHERE queue IS NOT NULL
"""
_QUEUE_AT = """
SELECT present, cohort, weight, gpu_seconds, as_of, running_gpu_milli, idle_jobs
FROM fairshare_queues WHERE queue = ? AND seq <= ? ORDER BY seq DESC LIMIT 1
"""


def _inputs_at(
    store: AuditStore, names: Sequence[str], seq: int
) -> tuple[dict[str, QueueInputs], float, int]:
    """Fair share's inputs as the fold left them after event `seq`."""
    db = store.db
    row = db.execute(
        "SELECT half_life_hours, capacity_gpus FROM fairshare_globals WHERE seq <= ? "
        "ORDER BY seq DESC LIMIT 1",
        (seq,),
    ).fetchone()
    half_life, capacity = global_inputs(ClusterState()) if row is None else (row[0], row[1])
    queues: dict[str, QueueInputs] = {}
    for name in names:
        q = db.execute(_QUEUE_AT, (name, seq)).fetchone()
        if q is not None and q[0]:
            queues[name] = QueueInputs(q[1], q[2], QueueUsage(q[3], q[4], q[5]), q[6])
    return queues, float(half_life), int(capacity)


def fair_share_over_time(store: AuditStore, times: Sequence[float]) -> list[dict[str, Any]]:
    """The rows at each of `times`, from the events whose own times (commits, decisions,
    the cluster's end times: the fold's clock) come before it."""
    names = [str(r[0]) for r in store.db.execute(_QUEUE_NAMES)]
    rows: list[dict[str, Any]] = []
    last: tuple[int, tuple[dict[str, QueueInputs], float, int]] | None = None
    for at in times:
        seq = _cutoff(store, at)
        if last is None or last[0] != seq:
            last = (seq, _inputs_at(store, names, seq))
        queues, half_life, capacity = last[1]
        rows += rows_at(queues, half_life, capacity, at)
    return rows
