"""`audit at`: the cluster exactly as it was after event N, or at a moment in time.

Every fact that holds for a stretch of the log (a placement, a pending job, a
node, a queue, the policy) is a row with the seqs it started and stopped holding.
The fold writes a checkpoint listing the open rows every few thousand events, so
the state at seq N is that list plus the rows opened since: a bounded read, not
a replay, and the same answer as `gitsched.eventlog.replay` gives.
"""

from __future__ import annotations

import json
from typing import Any

from gitsched.audit.projection.vocabulary import (
    KIND_CLUSTER,
    KIND_NODE,
    KIND_PENDING,
    KIND_POLICY,
    KIND_QUEUE,
    epoch,
)
from gitsched.audit.store import AuditStore, rows
from gitsched.engine.units import gpus_from_milli, gpus_or_none


def seq_at_time(store: AuditStore, time_text: str) -> int:
    """The last seq of the prefix of the log whose facts happened at or before `time_text`
    (fact times, `gitsched.eventlog.timeline`, as `replay(until_time=...)` reads them)."""
    row = store.db.execute(
        "SELECT seq FROM marks WHERE time > ? ORDER BY time LIMIT 1", (time_text,)
    ).fetchone()
    if row is None or row[0] is None:
        return store.offset()[0]
    return int(row[0]) - 1


def _live(store: AuditStore, table: str, tbl: int, start: str, end: str, seq: int) -> list[Any]:
    """Rows of `table` (and of `open_<table>`) open at `seq`: the checkpoint before it,
    plus rows opened since, read by id (ids follow the order rows were opened)."""
    mark = store.db.execute(
        "SELECT seq, placement_max, version_max FROM checkpoint_marks WHERE seq <= ? "
        "ORDER BY seq DESC LIMIT 1",
        (seq,),
    ).fetchone()
    after = store.db.execute(
        "SELECT placement_max, version_max FROM checkpoint_marks WHERE seq > ? "
        "ORDER BY seq LIMIT 1",
        (seq,),
    ).fetchone()
    base_seq, low = (mark[0], mark[1 + tbl]) if mark else (0, 0)
    high = after[tbl] if after else 2**62
    found: list[Any] = []
    for source in (table, f"open_{table}"):
        found += rows(
            store,
            f"SELECT t.* FROM checkpoints c JOIN {source} t ON t.id = c.id "
            f"WHERE c.seq = ? AND c.tbl = ? AND (t.{end} IS NULL OR t.{end} > ?)",
            (base_seq, tbl, seq),
        )
        found += rows(
            store,
            f"SELECT * FROM {source} WHERE id > ? AND id <= ? AND {start} <= ? "
            f"AND ({end} IS NULL OR {end} > ?)",
            (low, high, seq, seq),
        )
    return found


def _quota_dict(quota: dict[str, Any]) -> dict[str, float | None]:
    return {
        "nominal": gpus_or_none(quota.get("nominal")),
        "borrowingLimit": gpus_or_none(quota.get("borrowing_limit")),
        "lendingLimit": gpus_or_none(quota.get("lending_limit")),
    }


def cluster_at(store: AuditStore, seq: int) -> dict[str, Any]:
    """Placements, pending jobs, queues, nodes and policy right after event `seq`."""
    seq = max(0, min(seq, store.offset()[0]))
    placements = sorted(
        _live(store, "placements", 0, "start_seq", "end_seq", seq), key=lambda r: r["job"]
    )
    versions = _live(store, "versions", 1, "from_seq", "to_seq", seq)
    by_kind: dict[str, list[Any]] = {}
    for v in versions:
        by_kind.setdefault(v["kind"], []).append(v)
    for group in by_kind.values():
        group.sort(key=lambda r: r["key"])
    commit = store.db.execute(
        "SELECT sha, author, email, subject, committed_at, applied FROM commits WHERE seq <= ? "
        "ORDER BY seq DESC LIMIT 1",
        (seq,),
    ).fetchone()
    cluster = [json.loads(v["data"]) for v in by_kind.get(KIND_CLUSTER, [])]
    policy = [json.loads(v["data"]) for v in by_kind.get(KIND_POLICY, [])]
    used = sum(p["gpu_milli"] for p in placements)
    nodes = []
    for v in by_kind.get(KIND_NODE, []):
        data = json.loads(v["data"])
        nodes.append(
            {
                "name": v["key"],
                "flavor": data.get("flavor"),
                "gpus": data.get("gpus"),
                "state": data.get("state"),
                "isolation": data.get("isolation"),
                "region": data.get("region"),
                "since_seq": v["from_seq"],
            }
        )
    queues = []
    for v in by_kind.get(KIND_QUEUE, []):
        data = json.loads(v["data"])
        queues.append(
            {
                "name": v["key"],
                "team": data.get("team") or v["key"],
                "cohort": data.get("cohort"),
                "quotas": {q["flavor"]: _quota_dict(q) for q in data.get("quotas", [])},
                "since_seq": v["from_seq"],
            }
        )
    return {
        "seq": seq,
        "cluster": cluster[0]["name"] if cluster else None,
        "commit": None
        if commit is None
        else {
            "sha": commit[0],
            "author": f"{commit[1]} <{commit[2]}>",
            "subject": commit[3],
            "committed_at": commit[4],
            "applied": bool(commit[5]),
        },
        "gpus_total": sum(n["gpus"] or 0 for n in nodes),
        "gpus_used": gpus_from_milli(used),
        "placements": [
            {
                "job": p["job"],
                "queue": p["queue"],
                "flavor": p["flavor"],
                "nodes": p["nodes"].split(),
                "gpus": gpus_from_milli(p["gpu_milli"]),
                "replicas": p["replicas"],
                "since": p["start_time"],
                "since_seq": p["start_seq"],
                "queued": p["queued_time"] or None,
                "wait_s": round(p["start_ts"] - epoch(p["queued_time"]), 6)
                if p["queued_time"]
                else None,
            }
            for p in placements
        ],
        "pending": [
            {
                "job": v["key"],
                "reason": json.loads(v["data"]).get("reason"),
                "constraint": json.loads(v["data"]).get("constraint"),
                "since": v["from_time"],
                "since_seq": v["from_seq"],
            }
            for v in by_kind.get(KIND_PENDING, [])
        ],
        "queues": queues,
        "nodes": nodes,
        "policy": policy[0] if policy else None,
    }
