"""The console's pages as data: what each page shows, read from a snapshot and the audit view.

Tables that depend only on the snapshot (GPUs by flavor, the node map, the job rows, the
queues) are computed once per snapshot and kept in its memo; per-job, per-commit and
compliance reads are indexed queries of the view (audit.commits, audit.history,
audit.compliance, audit.fairshare, audit.services). Nothing here renders HTML or escapes text: the
templates do, with autoescape on.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from markupsafe import Markup, escape

from gitsched.audit import commits as commits_query
from gitsched.audit import compliance as compliance_query
from gitsched.audit import fairshare as fairshare_query
from gitsched.audit import history as history_query
from gitsched.audit import services as services_query
from gitsched.audit.store import AuditStore
from gitsched.console.source import Snapshot
from gitsched.engine.model import WORKSPACE, Job, NodeState
from gitsched.engine.units import GPU_MILLI, gpus_text
from gitsched.render import services_view

T = TypeVar("T")

JOB_STATES = ("running", "pending", "suspended", "waiting", "finished", "failed")
PAGE_SIZE = 100
# A service's last scaling decisions shown on the services page.
SCALING_SHOWN = 5
# Colours for the node map: a queue's GPUs share one.
QUEUE_COLOURS = 10


def memo(snapshot: Snapshot, key: str, build: Callable[[], T]) -> T:
    """`build()` once per snapshot (a race builds it twice, with the same result)."""
    if key not in snapshot.memo:
        snapshot.memo[key] = build()
    value: T = snapshot.memo[key]
    return value


def colour_of(snapshot: Snapshot, queue: str) -> int:
    """A queue's colour on the node map: its place among the queues, so neighbours differ."""
    order = memo(
        snapshot, "queue_order", lambda: {q: i for i, q in enumerate(sorted(snapshot.state.queues))}
    )
    index = order.get(queue)
    return (
        index % QUEUE_COLOURS if index is not None else zlib.crc32(queue.encode()) % QUEUE_COLOURS
    )


def job_state(snapshot: Snapshot, key: str) -> str:
    s = snapshot.state
    if key in s.placements:
        return "running"
    ended = s.ended.get(key)
    if ended is not None:
        return str(ended)
    if key in s.pending:
        return "pending"
    if key in s.idle:
        return "suspended"  # reclaimed while idle: it waits until its owner changes it
    return "waiting"


def team_of(snapshot: Snapshot, queue: str) -> str:
    q = snapshot.state.queues.get(queue)
    return q.team if q is not None else queue


def job_flavor(snapshot: Snapshot, job: Job) -> str:
    placed = snapshot.state.placements.get(job.key)
    if placed is not None and placed.flavor:
        return placed.flavor
    return ",".join(job.gpu_flavors) or "-"


def prepare(snapshot: Snapshot, store: AuditStore) -> None:
    """Build the tables every page shares, once, before the snapshot is shown."""
    overview(snapshot)
    filter_values(snapshot)
    queues(snapshot, store)


# -- overview ---------------------------------------------------------------------------


def overview(snapshot: Snapshot) -> dict[str, Any]:
    return memo(snapshot, "overview", lambda: _overview(snapshot))


def _overview(snapshot: Snapshot) -> dict[str, Any]:
    s = snapshot.state
    idle_jobs = set(s.idle.keys())
    # node -> GPU index -> [job keys]
    held: dict[str, dict[int, list[str]]] = {}
    for key, p in s.placements.items():
        for r in p.replicas:
            gpus = held.setdefault(r.node, {})
            for index in r.gpus:
                gpus.setdefault(index, []).append(key)
    flavors: dict[str, dict[str, float]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    # Nodes grouped by the level above the finest (racks, not NVLink domains), where there is one.
    levels = s.cluster.topology_levels if s.cluster else ()
    level = levels[1] if len(levels) > 1 else (levels[0] if levels else None)
    for name in sorted(s.nodes):
        node = s.nodes[name]
        flavor = node.flavor or "none"
        row = flavors.setdefault(
            flavor,
            {"total": 0, "allocated": 0, "free": 0, "idle": 0, "unschedulable": 0},
        )
        row["total"] += node.gpus
        cells = []
        for index in range(node.gpus):
            jobs = sorted(held.get(name, {}).get(index, ()))
            if jobs:
                idle = any(j in idle_jobs for j in jobs)
                row["allocated"] += 1
                row["idle"] += 1 if idle else 0
                queue = jobs[0].split("/", 1)[0]
                cells.append(
                    {
                        "index": index,
                        "jobs": jobs,
                        "idle": idle,
                        "colour": colour_of(snapshot, queue),
                    }
                )
            else:
                if node.state is NodeState.READY:
                    row["free"] += 1
                else:
                    row["unschedulable"] += 1
                cells.append({"index": index, "jobs": [], "idle": False, "colour": None})
        group = node.topology.get(level, "-") if level else "-"
        groups.setdefault(group, []).append(
            {
                "name": name,
                "flavor": flavor,
                "state": str(node.state),
                "isolation": str(node.isolation),
                "cells": cells,
            }
        )
    queues: dict[str, dict[str, int]] = {q: dict.fromkeys(JOB_STATES, 0) for q in sorted(s.queues)}
    for key, job in s.jobs.items():
        counts = queues.setdefault(job.queue, dict.fromkeys(JOB_STATES, 0))
        counts[job_state(snapshot, key)] += 1
    return {
        "flavors": [{"flavor": f, **v} for f, v in sorted(flavors.items())],
        "level": level,
        "node_map": node_map_html(sorted(groups.items()), level),
        "queues": [{"queue": q, "team": team_of(snapshot, q), **c} for q, c in queues.items()],
        "totals": {
            "nodes": len(s.nodes),
            "gpus": sum(f["total"] for f in flavors.values()),
            "allocated": sum(f["allocated"] for f in flavors.values()),
            "jobs": len(s.jobs),
            "running": len(s.placements),
            "pending": len(s.pending),
            "services": len(s.services),
            "workspaces": sum(1 for j in s.jobs.values() if j.kind == WORKSPACE),
            "suspended": len(s.suspended),
        },
    }


def node_map_html(groups: list[tuple[str, list[dict[str, Any]]]], level: str | None) -> Markup:
    """The node map as HTML, built here rather than in the template: a cluster of 1,000 nodes
    has 8,000 GPU cells, and a template loop over them cost most of the page. Every text
    that comes from the log goes through `escape`."""
    out: list[str] = ['<div class="groups">']
    for group, nodes in groups:
        out.append(f'<div class="group"><h3>{escape(level or "nodes")} {escape(group)}</h3>')
        out.append('<div class="nodes">')
        for n in nodes:
            ready = n["state"] == "Ready"
            title = escape(f"{n['name']}: {n['flavor']}, {n['state']}, {n['isolation']}")
            out.append(
                f'<div class="node{"" if ready else " down"}" title="{title}">'
                f'<div class="nodename">{escape(n["name"])}</div><div class="gpus">'
            )
            for c in n["cells"]:
                if c["jobs"]:
                    idle = " idle" if c["idle"] else ""
                    holders = escape(", ".join(c["jobs"]) + (" (idle)" if c["idle"] else ""))
                    out.append(
                        f'<span class="gpu held q{c["colour"]}{idle}" '
                        f'title="GPU {c["index"]}: {holders}"></span>'
                    )
                else:
                    kind = "free" if ready else "off"
                    out.append(f'<span class="gpu {kind}" title="GPU {c["index"]}: free"></span>')
            out.append("</div></div>")
        out.append("</div></div>")
    out.append("</div>")
    return Markup("".join(out))


# -- queues -----------------------------------------------------------------------------


def _percentile(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[rank]


def queues(snapshot: Snapshot, store: AuditStore | None) -> list[dict[str, Any]]:
    return memo(snapshot, "queues", lambda: _queues(snapshot, store))


def _queues(snapshot: Snapshot, store: AuditStore | None) -> list[dict[str, Any]]:
    s = snapshot.state
    used: dict[tuple[str, str], int] = {}
    for key, p in s.placements.items():
        job = s.jobs.get(key)
        queue = job.queue if job is not None else key.split("/", 1)[0]
        flavor = p.flavor or "none"
        used[(queue, flavor)] = used.get((queue, flavor), 0) + p.gpu_milli
    shares = {
        r["queue"]: r
        for r in fairshare_query.rows_of_state(s, s.clock)
        if r["cohort"] != r["queue"]
    }
    waits = commits_query.wait_seconds_by_queue(store) if store is not None else {}
    rows_by_queue: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(s.queues):
        q = s.queues[name]
        flavors = sorted({fq.flavor for fq in q.quotas} | {f for (qq, f) in used if qq == name})
        for flavor in flavors:
            fq = q.quota(flavor)
            row: dict[str, Any] = {
                "flavor": flavor,
                "nominal": fq.nominal if fq else 0,
                "borrowing_limit": fq.borrowing_limit if fq else None,
                "lending_limit": fq.lending_limit if fq else None,
                "used": used.get((name, flavor), 0),
                "lent": 0.0,
            }
            row["borrowed"] = max(0, row["used"] - row["nominal"])
            # Borrowed and lent as the audit's usage ledger keeps them now
            # (audit/projection/ledger.py): a lender's part of what its cohort borrows,
            # pro rata to what each could lend; `audit usage` integrates the same rate.
            account = snapshot.accounts.get(f"{name}\x1f{flavor}")
            if account is not None:
                row["used"], row["borrowed"] = account.used, account.borrowed
                pool = (
                    snapshot.pools.get(f"{account.cohort}\x1f{flavor}") if account.cohort else None
                )
                row["lent"] = account.lendable * pool.rate if pool is not None else 0.0
            rows_by_queue.setdefault(name, []).append(row)
    out = []
    for name in sorted(s.queues):
        q = s.queues[name]
        share = shares.get(name, {})
        w = waits.get(name, [])
        out.append(
            {
                "name": name,
                "team": q.team,
                "cohort": q.cohort,
                "weight": q.weight,
                "flavors": rows_by_queue.get(name, []),
                "fair_share_pct": share.get("fair_share_pct"),
                "used_share_pct": share.get("used_share_pct"),
                "used_gpu_hours_decayed": share.get("used_gpu_hours_decayed"),
                "idle_jobs": share.get("idle_jobs"),
                "admissions": len(w),
                "wait_p50_s": _percentile(w, 50),
                "wait_p90_s": _percentile(w, 90),
                "wait_p99_s": _percentile(w, 99),
            }
        )
    return out


def queue_history(
    snapshot: Snapshot, store: AuditStore, queue: str, days: float = 7.0, samples: int = 28
) -> list[dict[str, Any]]:
    """One queue's usage against its fair share at `samples` moments over the last `days`
    of the log (fact times): `audit fairshare`'s rows."""
    end = snapshot.state.clock
    if end <= 0:
        return []
    start = end - days * 86_400.0
    times = [start + (end - start) * i / (samples - 1) for i in range(samples)]
    return [r for r in fairshare_query.fair_share_over_time(store, times) if r["queue"] == queue]


def sparkline(values: list[float], top: float, width: int = 280, height: int = 40) -> str:
    """SVG polyline points for `values` scaled into width x height, `top` at the top (one
    scale for the lines drawn together); no data: ''."""
    if len(values) < 2:
        return ""
    top = max(top, 1e-9)
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values)
    )


# -- jobs -------------------------------------------------------------------------------


def job_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    return memo(snapshot, "job_rows", lambda: _job_rows(snapshot))


def _job_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    s = snapshot.state
    out = []
    for key in sorted(s.jobs):
        job = s.jobs[key]
        state = job_state(snapshot, key)
        placed = s.placements.get(key)
        pending = s.pending.get(key)
        out.append(
            {
                "key": key,
                "queue": job.queue,
                "name": job.name,
                "team": team_of(snapshot, job.queue),
                "state": state,
                "idle": key in s.idle,
                "flavor": job_flavor(snapshot, job),
                "gpus": gpus_text(job.resources.gpu_milli * job.replicas),
                "priority": job.priority_class,
                "nodes": ", ".join(placed.nodes) if placed else "",
                "reason": pending.reason if pending else "",
                "since": placed.started_at if placed else "",
            }
        )
    return out


def filter_values(snapshot: Snapshot) -> dict[str, list[str]]:
    def build() -> dict[str, list[str]]:
        rows = job_rows(snapshot)
        return {
            "team": sorted(
                {r["team"] for r in rows} | {q.team for q in snapshot.state.queues.values()}
            ),
            "queue": sorted({r["queue"] for r in rows} | set(snapshot.state.queues.keys())),
            "state": list(JOB_STATES),
            "flavor": sorted({r["flavor"] for r in rows}),
        }

    return memo(snapshot, "filters", build)


def jobs(snapshot: Snapshot, filters: dict[str, str], page: int) -> dict[str, Any]:
    rows = job_rows(snapshot)
    chosen = [r for r in rows if all(r[k] == v for k, v in filters.items())]
    pages = max(1, -(-len(chosen) // PAGE_SIZE))
    return {
        "rows": chosen[(page - 1) * PAGE_SIZE : page * PAGE_SIZE],
        "total": len(chosen),
        "page": page,
        "pages": pages,
    }


def job(snapshot: Snapshot, store: AuditStore | None, key: str) -> dict[str, Any] | None:
    """A job's page; None if neither the state nor the audit view ever knew it."""
    s = snapshot.state
    spec = s.jobs.get(key)
    info = snapshot.jobs.get(key)
    intervals = history_query.query(store, job=key) if store is not None else []
    pending = commits_query.pending_stretches(store, key) if store is not None else []
    if spec is None and info is None and not intervals and not pending:
        return None
    commit = (
        commits_query.commit_that_made(store, info.seq)
        if store is not None and info is not None
        else None
    )
    placement = s.placements.get(key)
    replicas = []
    if placement is not None:
        for i, r in enumerate(placement.replicas):
            replicas.append(
                {
                    "replica": i,
                    "node": r.node,
                    "gpus": ", ".join(str(g) for g in r.gpus) or "-",
                    "share": gpus_text(r.gpu_milli) if r.gpu_milli != GPU_MILLI else "1",
                }
            )
    timeline: list[dict[str, Any]] = []
    if info is not None and commit is not None:
        timeline.append(
            {
                "seq": info.seq,
                "time": commit["merged"],
                "what": "submitted",
                "text": f"{commit['subject']} ({commit['sha'][:12]}, {commit['author']})",
            }
        )
    for p in pending:
        timeline.append(
            {
                "seq": p["from_seq"],
                "time": p["from"],
                "what": "pending",
                "text": p.get("reason") or "",
            }
        )
    for iv in intervals:
        d = iv.to_dict()
        where = f"{gpus_text(round(iv.gpus * GPU_MILLI))} GPU {iv.flavor or ''} on {', '.join(iv.nodes)}"
        why = d["start_reason"] if d["start_reason"] != iv.start_kind.replace("_", " ") else ""
        timeline.append(
            {
                "seq": iv.start_seq,
                "time": iv.start,
                "what": iv.start_kind,
                "text": f"{where} — {why}" if why else where,
            }
        )
        if iv.end_seq is not None:
            timeline.append(
                {
                    "seq": iv.end_seq,
                    "time": iv.end or "",
                    "what": iv.end_kind or "ended",
                    "text": d["end_reason"] or "",
                }
            )
    timeline.sort(key=lambda t: (t["seq"], t["what"] != "submitted"))
    queue = key.split("/", 1)[0]
    return {
        "key": key,
        "queue": queue,
        "team": team_of(snapshot, queue),
        "state": job_state(snapshot, key) if spec is not None else "withdrawn",
        "idle": s.idle.get(key),
        "spec": _spec_rows(spec) if spec is not None else [],
        "file": spec.file if spec is not None else "",
        "user": info.user if info is not None else None,
        "commit": commit,
        "placement": placement,
        "replicas": replicas,
        "pending": s.pending.get(key),
        "timeline": timeline,
    }


def _spec_rows(job: Job) -> list[tuple[str, str]]:
    r = job.resources
    rows = [
        ("replicas", str(job.replicas)),
        ("min replicas", str(job.min_replicas) if job.min_replicas is not None else "-"),
        ("GPUs per replica", gpus_text(r.gpu_milli)),
        ("CPU per replica", f"{r.cpu_milli / 1000:g}"),
        (
            "memory per replica",
            f"{r.memory_mib // 1024} GiB" if r.memory_mib % 1024 == 0 else f"{r.memory_mib} MiB",
        ),
        ("GPU flavors", ", ".join(job.gpu_flavors) or "any"),
        ("priority class", f"{job.priority_class} ({job.priority})"),
        ("preemptible", "yes" if job.preemptible else "no"),
        (
            "checkpoint every",
            f"{job.checkpoint_interval_minutes} min" if job.checkpoint_interval_minutes else "-",
        ),
        ("isolation", str(job.isolation)),
        ("residency", ", ".join(job.residency) or "-"),
    ]
    t = job.topology
    if t is not None:
        text = f"{t.mode} {t.level or ''}".strip()
        if t.slice_size:
            text += f", slices of {t.slice_size} in one {t.slice_level}"
        rows.append(("topology", text))
    return rows


# -- changes and compliance -------------------------------------------------------------


# A commit that moved many jobs lists this many on the changes page (all counted), and
# this many on its own page.
MOVED_SHOWN = 8
MOVED_SHOWN_ON_COMMIT = 500


def changes(store: AuditStore, before_seq: int | None, limit: int = 50) -> dict[str, Any]:
    commits = commits_query.recent_commits(store, before_seq=before_seq, limit=limit)
    moved = commits_query.moved_by(store, [c["sha"] for c in commits], MOVED_SHOWN)
    for c in commits:
        c["changes"] = commits_query.commit_changes(store, c["seq"]) if c["applied"] else []
        c["moved"] = moved[c["sha"]]
        c["moved"]["more"] = c["moved"]["total"] - len(c["moved"]["shown"])
    return {
        "commits": commits,
        "total": commits_query.commit_count(store),
        "older": commits[-1]["seq"] if len(commits) == limit else None,
    }


def commit(store: AuditStore, sha: str) -> dict[str, Any] | None:
    found = commits_query.find_commit(store, sha)
    if found is None:
        return None
    found["changes"] = commits_query.commit_changes(store, found["seq"]) if found["applied"] else []
    found["moved"] = commits_query.moved_by(store, [found["sha"]], MOVED_SHOWN_ON_COMMIT)[
        found["sha"]
    ]
    found["moved"]["more"] = found["moved"]["total"] - len(found["moved"]["shown"])
    return found


def compliance(store: AuditStore, limit: int = 50) -> dict[str, Any]:
    return compliance_query.compliance(store, limit=limit)


# -- services and workspaces ------------------------------------------------------------


def services(snapshot: Snapshot, store: AuditStore | None) -> dict[str, Any]:
    """Each inference service as `gitsched state` shows it (`gitsched.render.services_view`):
    its bounds and counts, each replica with its nodes or why it waits, and its last
    scaling decisions with their inputs (the audit view's `service_counts`); and every
    workspace, running, waiting or suspended (with why, since when, by whom)."""
    s = snapshot.state
    found = services_view(s)
    for row in found:
        for replica in row["replicas"]:
            pending = s.pending.get(replica["job"])
            replica["reason"] = pending.reason if pending is not None else ""
        row["decisions"] = (
            services_query.scaling_decisions(store, row["service"], SCALING_SHOWN)
            if store is not None
            else []
        )
    workspaces = []
    for key in sorted(k for k, job in s.jobs.items() if job.kind == WORKSPACE):
        held = s.suspended.get(key)
        placed = s.placements.get(key)
        pending = s.pending.get(key)
        workspaces.append(
            {
                "job": key,
                "team": team_of(snapshot, s.jobs[key].queue),
                "state": "suspended" if held is not None else job_state(snapshot, key),
                "nodes": list(placed.nodes) if placed is not None else [],
                "cause": held.cause if held is not None else "",
                "since": held.since if held is not None else "",
                "by": held.by if held is not None else "",
                "reason": held.reason if held is not None else pending.reason if pending else "",
            }
        )
    return {"services": found, "workspaces": workspaces}
