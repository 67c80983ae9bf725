"""Placement history: every interval a job held nodes, like Slurm's `sacct`.

Each interval has NodeList, Start, End, State and why it started (admitted,
moved) and ended (moved, preempted, node failed, drained or removed, finished,
failed, withdrawn), and the job's attempt it belongs to (a job requeued after a
failure runs again as attempt 2, 3, ...), read from the audit view's `placements` table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from gitsched.audit.catchup import catch_up
from gitsched.audit.projection.vocabulary import (
    END_FAILED,
    END_FINISHED,
    END_MOVED,
    END_NODE_DRAINED,
    END_NODE_FAILED,
    END_NODE_REMOVED,
    END_PREEMPTED,
    END_STOPPED,
    END_TIMED_OUT,
    END_WITHDRAWN,
    KIND_CLUSTER,
    KIND_NODE,
    KIND_PENDING,
    KIND_QUEUE,
    epoch,
)
from gitsched.audit.store import AuditStore, EventList
from gitsched.audit.window import placement_window
from gitsched.engine import events as ev
from gitsched.engine.units import gpus_from_milli
from gitsched.eventlog.envelope import StoredEvent

# sacct's State column, from why the interval ended.
STATES = {
    None: "RUNNING",
    END_FINISHED: "COMPLETED",
    END_FAILED: "FAILED",
    END_TIMED_OUT: "TIMEOUT",
    END_WITHDRAWN: "CANCELLED",
    END_PREEMPTED: "PREEMPTED",
    END_NODE_FAILED: "NODE_FAIL",
    END_NODE_DRAINED: "DRAINED",
    END_NODE_REMOVED: "NODE_GONE",
    END_MOVED: "MOVED",
    END_STOPPED: "REQUEUED",
}

HEADERS = [
    "job",
    "attempt",
    "user",
    "nodes",
    "replicas",
    "gpus",
    "flavor",
    "queued",
    "start",
    "wait_s",
    "end",
    "state",
    "start_reason",
    "end_reason",
]


class Interval(NamedTuple):
    job: str
    queue: str
    team: str
    user: str
    flavor: str | None
    nodes: tuple[str, ...]
    replicas: int
    gpus: float
    start: str
    start_seq: int
    start_kind: str
    start_reason: str
    end: str | None
    end_seq: int | None
    end_kind: str | None
    end_reason: str | None
    cause: str
    end_cause: str | None
    gpu_hours: float | None
    # When the job began waiting for this placement (its commit, or the end of its last
    # interval) and how long it waited, in seconds (0 for a move).
    queued: str = ""
    wait_s: float | None = None
    # Which attempt of the job (1, then one more per requeue after a failure: retries),
    # and the job's priority class when it started.
    attempt: int = 1
    priority_class: str = ""

    @property
    def state(self) -> str:
        return STATES.get(self.end_kind, (self.end_kind or "ended").upper())

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "attempt": self.attempt,
            "queue": self.queue,
            "team": self.team,
            "user": self.user,
            "flavor": self.flavor,
            "nodes": list(self.nodes),
            "replicas": self.replicas,
            "gpus": self.gpus,
            "queued": self.queued or None,
            "wait_s": self.wait_s,
            "start": self.start,
            "start_seq": self.start_seq,
            "start_kind": self.start_kind,
            "start_reason": _reason(self.start_kind, self.start_reason),
            "end": self.end,
            "end_seq": self.end_seq,
            "end_kind": self.end_kind,
            "end_reason": None
            if self.end_kind is None
            else _reason(self.end_kind, self.end_reason),
            "state": self.state,
            "gpu_hours": self.gpu_hours,
            "cause": self.cause,
            "end_cause": self.end_cause,
        }


def _reason(kind: str, detail: str | None) -> str:
    kind = kind.replace("_", " ")
    if not detail or detail == kind:
        return kind
    return f"{kind}: {detail}"


_COLUMNS = (
    "p.id, p.job, p.queue, p.team, p.user, p.flavor, p.nodes, p.replicas, p.gpu_milli, "
    "p.start_time, p.start_seq, p.start_kind, p.start_reason, p.end_time, p.end_seq, p.end_kind, "
    "p.end_reason, p.start_cause, p.end_cause, p.start_ts, p.end_ts, p.queued_time, "
    "p.priority_class, p.attempt"
)


def _interval(r: tuple[Any, ...]) -> Interval:
    (_, job, queue, team, user, flavor, nodes, replicas, milli, start, start_seq, start_kind,
     start_reason, end, end_seq, end_kind, end_reason, cause, end_cause, start_ts, end_ts,
     queued, priority_class, attempt) = r  # fmt: skip
    gpus = gpus_from_milli(milli)
    return Interval(
        job,
        queue,
        team,
        user,
        flavor,
        tuple(nodes.split()),
        replicas,
        gpus,
        start,
        start_seq,
        start_kind,
        start_reason,
        end,
        end_seq,
        end_kind,
        end_reason,
        cause,
        end_cause,
        None if end_ts is None else round(gpus * (end_ts - start_ts) / 3600.0, 6),
        queued,
        round(start_ts - epoch(queued), 6) if queued else None,
        attempt,
        priority_class,
    )


def query(
    store: AuditStore,
    *,
    job: str | None = None,
    node: str | None = None,
    team: str | None = None,
    flavor: str | None = None,
    since: float | None = None,
    until: float | None = None,
    queue: str | None = None,
) -> list[Interval]:
    """Intervals that match every filter given, in the order they started; `team` is
    a team, or failing that a queue.

    Indexed reads only: ended intervals by id range (and the checkpoint's open ones
    when a period starts mid-log), open ones from their own small table.
    """
    where: list[str] = []
    params: list[Any] = []
    if job is not None:
        where.append("p.job = ?" if "/" in job else "p.name = ?")
        params.append(job)
    if team is not None:
        if not _has_team(store, team):
            return query(
                store, job=job, node=node, flavor=flavor, since=since, until=until, queue=team
            )
        where.append("p.team = ?")
        params.append(team)
    if queue is not None:
        where.append("p.queue = ?")
        params.append(queue)
    if flavor is not None:
        where.append("p.flavor = ?")
        params.append(flavor)
    if until is not None:
        where.append("p.start_ts < ?")
        params.append(until)
    if since is not None:
        where.append("(p.end_ts IS NULL OR p.end_ts > ?)")
        params.append(since)
    window = placement_window(store, since, until)

    def select(table: str, extra: str, extra_params: list[Any], node_key: str) -> list[Any]:
        source = f"{table} p"
        conditions = list(where)
        values: list[Any] = []
        if node is not None:
            source = f"placement_nodes n JOIN {table} p ON p.id = n.placement"
            conditions.insert(0, "n.node = ?")
            values.append(node)
        if extra:
            conditions.insert(len(values), extra.replace("{id}", node_key if node else "p.id"))
        sql = f"SELECT {_COLUMNS} FROM {source}"
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        return store.db.execute(sql, [*values, *extra_params, *params]).fetchall()

    found = select(
        "placements", "{id} >= ? AND {id} < ?", [window.first, window.stop], "n.placement"
    )
    if window.checkpoint_seq:
        found += select(
            "placements",
            "{id} IN (SELECT id FROM checkpoints WHERE seq = ? AND tbl = 0 AND id < ?)",
            [window.checkpoint_seq, window.first],
            "n.placement",
        )
    found += select("open_placements", "", [], "n.placement")
    found.sort(key=lambda r: (r[10], r[0]))
    return [_interval(r) for r in found]


def missing_subject(
    store: AuditStore,
    *,
    job: str | None = None,
    node: str | None = None,
    team: str | None = None,
    flavor: str | None = None,
) -> str | None:
    """What a history query names that the log never saw ("job 'x'"), or None.

    An empty answer about a job that ran nowhere is an answer; about a job nobody
    ever submitted it is a typo, and says so.
    """
    db = store.db

    def seen(sql: str, *params: str) -> bool:
        return db.execute(sql + " LIMIT 1", params).fetchone() is not None

    if job is not None:
        column = "job" if "/" in job else "name"
        like = job if "/" in job else f"%/{job}"
        if not (
            any(seen(f"SELECT 1 FROM {t} WHERE {column} = ?", job) for t in _INTERVAL_TABLES)
            or seen("SELECT 1 FROM all_versions WHERE kind = ? AND key LIKE ?", KIND_PENDING, like)
        ):
            return f"job '{job}'"
    if node is not None and not seen(
        "SELECT 1 FROM all_versions WHERE kind = ? AND key = ?", KIND_NODE, node
    ):
        return f"node '{node}'"
    if team is not None and not (
        _has_team(store, team)
        or seen("SELECT 1 FROM all_versions WHERE kind = ? AND key = ?", KIND_QUEUE, team)
    ):
        return f"team or queue '{team}'"
    if flavor is not None and not seen(
        "SELECT 1 FROM all_versions WHERE kind IN (?, ?) AND data LIKE ?",
        KIND_NODE,
        KIND_CLUSTER,
        f'%"{flavor}"%',
    ):
        return f"GPU flavor '{flavor}'"
    return None


_INTERVAL_TABLES = ("placements", "open_placements")


def never_placed(store: AuditStore, job: str) -> list[dict[str, Any]]:
    """For a job that never ran anywhere: each job of that name that waited, with its
    newest pending reason and since when it waited (its first pending record) and since
    when for that reason; [] when none did. An empty history alone reads as "no data"."""
    column = "key = ?" if "/" in job else "key LIKE ?"
    param = job if "/" in job else f"%/{job}"
    found = store.db.execute(
        "SELECT key, from_time, to_time, data, from_seq FROM all_versions "
        f"WHERE kind = ? AND {column} ORDER BY key, from_seq",
        (KIND_PENDING, param),
    ).fetchall()
    by_job: dict[str, list[tuple[Any, ...]]] = {}
    for row in found:
        by_job.setdefault(row[0], []).append(row)
    out = []
    for key, versions in sorted(by_job.items()):
        newest = versions[-1]
        data = json.loads(newest[3])
        out.append(
            {
                "job": key,
                "placed": False,
                "pending_since": versions[0][1],
                "reason": data.get("reason"),
                "constraint": data.get("constraint"),
                "reason_since": newest[1],
                "still_pending": newest[2] is None,
                "until": newest[2],
            }
        )
    return out


def never_placed_text(entries: list[dict[str, Any]]) -> str:
    lines = []
    for e in entries:
        waits = "pending" if e["still_pending"] else f"waited until {e['until']}"
        lines.append(
            f"{e['job']}: never placed; {waits} since {e['pending_since']}: {e['reason']}"
            + (
                f" (this reason since {e['reason_since']})"
                if e["reason_since"] != e["pending_since"]
                else ""
            )
        )
    return "\n".join(lines)


def _has_team(store: AuditStore, team: str) -> bool:
    for table in ("placements", "open_placements"):
        if store.db.execute(f"SELECT 1 FROM {table} WHERE team = ? LIMIT 1", (team,)).fetchone():
            return True
    return False


def build_history(pairs: Iterable[tuple[StoredEvent, ev.Event]]) -> list[Interval]:
    """Every interval of a sequence of events, through an in-memory view (the CLI's code path)."""
    with AuditStore(":memory:") as store:
        catch_up(EventList(stored for stored, _ in pairs), store)
        return query(store)


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
        if team is not None and team not in (i.queue, i.team):
            continue
        if flavor is not None and i.flavor != flavor:
            continue
        out.append(i)
    return out
