"""Text and JSON renderings of state, validation errors and history for the terminal."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from gitsched.engine.services import desired_replicas, replica_key
from gitsched.engine.state import ClusterState
from gitsched.engine.timelimits import limit_reached_at
from gitsched.engine.units import gpus_from_milli, gpus_or_none, gpus_text, milli_from_gpus


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


TEXT_WIDTH = 120

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """What a committer wrote, safe on a terminal: control characters (escape sequences,
    record separators, carriage returns) shown as \\xNN, never acted on. JSON output keeps
    the text as it is."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def fit_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    width: int = TEXT_WIDTH,
    floor: int | Sequence[int] = 8,
) -> str:
    """`table`, its widest columns cut (with "...") until each line fits `width`
    characters; no column is cut below its `floor` (one for all, or one each) or its
    header."""
    body = [[" ".join(str(c).split("\n")) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    floors = [floor] * len(headers) if isinstance(floor, int) else list(floor)
    least = [max(len(h), f) for h, f in zip(headers, floors, strict=True)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        cut = max(range(len(widths)), key=lambda i: widths[i] - least[i])
        if widths[cut] <= least[cut]:
            break
        widths[cut] -= 1
    fitted = [
        [c if len(c) <= w else c[: max(w - 3, 0)] + "..." for c, w in zip(row, widths, strict=True)]
        for row in body
    ]
    return table(headers, fitted)


def state_to_dict(state: ClusterState, last_seq: int) -> dict[str, Any]:
    starts = {r.job: r.start for r in state.reservations}
    return {
        "seq": last_seq,
        "cluster": state.cluster.name if state.cluster else None,
        "last_commit": state.last_commit.sha if state.last_commit else None,
        "last_good_commit": state.last_good_commit.sha if state.last_good_commit else None,
        "last_rejection": [f.format() for f in state.last_rejection],
        "nodes": {
            n.name: {
                "flavor": n.flavor,
                "gpus": n.gpus,
                "state": str(n.state),
                "topology": n.topology,
            }
            for n in (state.nodes[k] for k in sorted(state.nodes))
        },
        "queues": {
            q.name: {
                "cohort": q.cohort,
                "quotas": {
                    fq.flavor: {
                        "nominal": gpus_from_milli(fq.nominal),
                        "borrowingLimit": gpus_or_none(fq.borrowing_limit),
                        "lendingLimit": gpus_or_none(fq.lending_limit),
                    }
                    for fq in q.quotas
                },
            }
            for q in (state.queues[k] for k in sorted(state.queues))
        },
        "placements": {
            key: {
                "flavor": p.flavor,
                "replicas": [
                    {"node": r.node, "gpus": list(r.gpus), "gpu_milli": r.gpu_milli}
                    for r in p.replicas
                ],
                "since": p.started_at,
                # when it reaches its time limit (docs/time.md); None: it has none
                "limit_reached_at": _limit_reached(state, key),
            }
            for key, p in sorted(state.placements.items())
        },
        "pending": {
            key: {
                "reason": p.reason,
                "constraint": p.constraint,
                # when its reservation starts (docs/time.md); None: no reservation holds it
                "expected_start": starts.get(key),
            }
            for key, p in sorted(state.pending.items())
        },
        # suspended jobs and workspaces (docs/workspaces.md); each is in "pending" too
        "suspended": {
            key: {
                "kind": job.kind if (job := state.jobs.get(key)) is not None else None,
                "cause": held.cause,
                "since": held.since,
                "by": held.by or None,
                "reason": held.reason,
            }
            for key, held in sorted(state.suspended.items())
        },
        "reservations": [
            {
                "job": r.job,
                "start": r.start,
                "nodes": list(r.nodes),
                "flavor": r.flavor,
                "gpus": gpus_from_milli(r.gpu_milli),
                "waits_for": list(r.waits_for),
            }
            for r in state.reservations
        ],
        "services": services_view(state),
    }


def services_view(state: ClusterState) -> list[dict[str, Any]]:
    """Each inference service: its bounds, the replicas it wants (desired), has (current),
    and of those the ones the cluster reports running and the ones still waiting."""
    out: list[dict[str, Any]] = []
    for key in sorted(state.services):
        status = state.services[key]
        service = status.service
        replicas = []
        for r in status.replicas:
            job = replica_key(service, r.index)
            placement = state.placements.get(job)
            word = "running" if job in state.started else "placed" if placement else "pending"
            replicas.append(
                {"job": job, "nodes": list(placement.nodes) if placement else [], "state": word}
            )
        out.append(
            {
                "service": key,
                "queue": service.queue,
                "min": service.min_replicas,
                "max": service.max_replicas,
                "desired": desired_replicas(status),
                "current": len(replicas),
                "running": sum(1 for r in replicas if r["state"] == "running"),
                "pending": sum(1 for r in replicas if r["state"] == "pending"),
                "revision": status.revision,
                "suspended": service.suspend,
                "replicas": replicas,
            }
        )
    return out


def used_gpus(state: ClusterState) -> tuple[int, int]:
    used = sum(p.gpu_milli for p in state.placements.values())
    total = sum(milli_from_gpus(n.gpus) for n in state.nodes.values())
    return used, total


def state_text(state: ClusterState, last_seq: int) -> str:
    out: list[str] = []
    cluster = state.cluster.name if state.cluster else "(no cluster yet)"
    used, total = used_gpus(state)
    out.append(
        f"cluster {cluster} at seq {last_seq}: {len(state.nodes)} nodes, "
        f"{gpus_text(used)}/{gpus_text(total)} GPUs allocated, {len(state.jobs)} jobs "
        f"({len(state.placements)} running, {len(state.pending) - len(state.suspended)} pending"
        + (f", {len(state.suspended)} suspended)" if state.suspended else ")")
    )
    if state.last_good_commit:
        out.append(
            f"desired state from commit {state.last_good_commit.sha[:12]} ({state.last_good_commit.subject})"
        )
    if state.last_rejection and state.last_commit:
        out.append(
            f"newest commit {state.last_commit.sha[:12]} was REJECTED with {len(state.last_rejection)} error(s):"
        )
        out.extend(f"  {f.format()}" for f in state.last_rejection)
    if state.placements:
        out.append("")
        out.append("Placements")
        rows = []
        for key in sorted(state.placements):
            p = state.placements[key]
            job = state.jobs.get(key)
            rows.append(
                [
                    key,
                    job.priority_class if job else "",
                    p.flavor or "-",
                    len(p.replicas),
                    gpus_text(p.gpu_milli),
                    ",".join(p.nodes),
                ]
            )
        out.append(table(["JOB", "PRIORITY", "FLAVOR", "REPLICAS", "GPUS", "NODES"], rows))
    if state.services:
        out.append("")
        out.append("Services")
        rows = [
            [
                v["service"],
                v["current"],
                v["desired"],
                v["min"],
                v["max"],
                v["running"],
                v["pending"],
                "suspended" if v["suspended"] else "",
            ]
            for v in services_view(state)
        ]
        out.append(
            table(["SERVICE", "CURRENT", "DESIRED", "MIN", "MAX", "RUNNING", "PENDING", ""], rows)
        )
    waiting = sorted(key for key in state.pending if key not in state.suspended)
    if waiting:
        out.append("")
        out.append("Pending")
        starts = {r.job: r.start for r in state.reservations}
        if starts:
            rows = [[key, starts.get(key, "-"), state.pending[key].reason] for key in waiting]
            out.append(table(["JOB", "EXPECTED START", "WHY"], rows))
        else:
            rows = [[key, state.pending[key].reason] for key in waiting]
            out.append(table(["JOB", "WHY"], rows))
    if state.suspended:
        out.append("")
        out.append("Suspended")
        rows = [
            [key, job.kind if (job := state.jobs.get(key)) else "-", held.since, held.reason]
            for key, held in sorted(state.suspended.items())
        ]
        out.append(table(["JOB", "KIND", "SINCE", "WHY"], rows))
    return "\n".join(out)


def _limit_reached(state: ClusterState, key: str) -> str | None:
    job, placement = state.jobs.get(key), state.placements.get(key)
    if job is None or placement is None:
        return None
    return limit_reached_at(job, placement)
