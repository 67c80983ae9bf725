"""`audit usage`: GPU-hours used against quota, borrowed and lent, and idle, per team, user or flavor.

Like `sreport cluster utilization` and `sreport cluster AccountUtilizationByUser`.
The fold keeps, per queue and flavor, segments of time over which use and quota
were constant, so every figure is one SQL aggregate over the segments that
overlap the period, clipped to it. Lent GPU-hours are what a queue's unused
(lendable) quota served of its cohort's borrowing, shared pro rata among lenders.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gitsched.audit.projection.vocabulary import DAY, KIND_WORK
from gitsched.audit.store import AuditStore, rows
from gitsched.audit.window import VERSIONS, first_id_from, interval_window, placement_window
from gitsched.engine.units import GPU_MILLI

MILLI_HOURS = GPU_MILLI * 3600.0  # milli-GPU-seconds in a GPU-hour
# GPUs -> milli-GPU inside SQL, a float literal (1000.0) so SQLite multiplies in floating point.
_GPU_MILLI_SQL = repr(float(GPU_MILLI))
BY = ("team", "user", "flavor", "kind")

HEADERS = {
    "team": [
        "team",
        "flavor",
        "used_gpu_h",
        "quota_gpu_h",
        "used_pct",
        "borrowed_gpu_h",
        "lent_gpu_h",
        "idle_quota_gpu_h",
    ],
    "user": ["user", "team", "flavor", "placements", "used_gpu_h", "team_pct"],
    "kind": ["team", "kind", "used_gpu_h", "team_pct"],
    "flavor": [
        "flavor",
        "capacity_gpu_h",
        "down_gpu_h",
        "used_gpu_h",
        "idle_gpu_h",
        "used_pct",
        "quota_gpu_h",
        "borrowed_gpu_h",
    ],
}


def _h(value: float | None) -> float:
    return round((value or 0.0) / MILLI_HOURS, 3)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole > 0 else None


_OVERLAP = "(min(coalesce({end}, :until), :until) - max({start}, :since))"

# Sums per (team, flavor), in milli-GPU-seconds: used, quota, borrowed, idle quota, lent.
Sums = dict[tuple[str, str], list[float]]


def _r_at(store: AuditStore, moment: float) -> dict[tuple[str, str], float]:
    """R, the integral of each cohort's lending rate, at `moment`.

    One index look-up per cohort and flavor (the pairs found by skipping along the
    primary key), so the cost does not grow with the log."""
    out: dict[tuple[str, str], float] = {}
    for cohort, flavor in _pools(store):
        r = store.db.execute(
            "SELECT from_ts, r_from, rate FROM cohort_rates WHERE cohort = ? AND flavor = ? "
            "AND from_ts <= ? ORDER BY from_ts DESC LIMIT 1",
            (cohort, flavor, moment),
        ).fetchone()
        if r is not None:
            out[(cohort, flavor)] = r[1] + r[2] * (moment - r[0])
    return out


def _pools(store: AuditStore) -> list[tuple[str, str]]:
    """Every (cohort, flavor) that ever had a lending rate: a skip along the primary key,
    one seek per pair (a row-value comparison would step through every rate of a pair)."""
    found: list[tuple[str, str]] = []
    db = store.db
    cohort = db.execute("SELECT cohort FROM cohort_rates ORDER BY cohort LIMIT 1").fetchone()
    while cohort is not None:
        flavor = db.execute(
            "SELECT flavor FROM cohort_rates WHERE cohort = ? ORDER BY flavor LIMIT 1", cohort
        ).fetchone()
        while flavor is not None:
            found.append((cohort[0], flavor[0]))
            flavor = db.execute(
                "SELECT flavor FROM cohort_rates WHERE cohort = ? AND flavor > ? "
                "ORDER BY flavor LIMIT 1",
                (cohort[0], flavor[0]),
            ).fetchone()
        cohort = db.execute(
            "SELECT cohort FROM cohort_rates WHERE cohort > ? ORDER BY cohort LIMIT 1", cohort
        ).fetchone()
    return found


def _sums(store: AuditStore, since: float, until: float) -> Sums:
    """Every account's sums over [since, until): whole UTC days from the daily roll-up of
    ended segments plus the open segments, and the partial days at each end from segments."""
    first_day, stop_day = math.ceil(since / DAY), math.floor(until / DAY)
    if stop_day <= first_day:
        return _segment_sums(store, since, until)
    whole_from, whole_to = first_day * DAY, stop_day * DAY
    sums: Sums = {}

    def add(part: Sums) -> None:
        for key, values in part.items():
            total = sums.setdefault(key, [0.0] * 5)
            for i, v in enumerate(values):
                total[i] += v

    if since < whole_from:
        add(_segment_sums(store, since, whole_from))
    if whole_to < until:
        add(_segment_sums(store, whole_to, until))
    days: Sums = {}
    for r in store.db.execute(
        "SELECT team, flavor, SUM(used), SUM(quota), SUM(borrowed), SUM(idle), SUM(lent) "
        "FROM usage_days WHERE day >= ? AND day < ? GROUP BY team, flavor",
        (first_day, stop_day),
    ):
        days[(r[0], r[1])] = [float(v or 0) / 1e6 for v in r[2:]]
    add(days)
    add(_open_sums(store, whole_from, whole_to))
    return sums


def _open_sums(store: AuditStore, since: float, until: float) -> Sums:
    """The open segments' part of [since, until)."""
    sums: Sums = {}
    r_since, r_until = _r_at(store, since), _r_at(store, until)
    for seg in rows(store, "SELECT * FROM open_segments WHERE from_ts < ?", (until,)):
        _add_overlap(sums, seg, max(seg["from_ts"], since), until, r_since, r_until, since)
    return sums


def _add_overlap(
    sums: Sums,
    seg: Any,
    a: float,
    b: float,
    r_since: dict[tuple[str, str], float],
    r_until: dict[tuple[str, str], float],
    since: float,
) -> None:
    """Add one segment's part of [a, b) to its account: used, nominal, borrowed, idle, lent."""
    ov = b - a
    used, nominal = seg["used"], seg["nominal"]
    total = sums.setdefault((seg["team"], seg["flavor"]), [0.0] * 5)
    total[0] += used * ov
    total[1] += nominal * ov
    total[2] += max(used - nominal, 0) * ov
    total[3] += max(nominal - used, 0) * ov
    total[4] += _lent_part(seg, a, b, r_since, r_until, since)


def _segment_sums(store: AuditStore, since: float, until: float) -> Sums:
    """Every account's sums over [since, until), exactly, reading only that period's segments.

    Segments that start in the period are summed in SQL over an id range (ids follow
    starts); the few that straddle `since` or `until`, and the open ones, in Python.
    """
    sums: Sums = {}
    first = first_id_from(store, "segments", "from_ts", since)
    stop = first_id_from(store, "segments", "from_ts", until)
    for r in store.db.execute(
        "SELECT team, flavor, SUM(used * ov), SUM(nominal * ov), "
        "SUM(max(used - nominal, 0) * ov), SUM(max(nominal - used, 0) * ov), "
        "SUM(CASE WHEN to_ts <= :until THEN lent ELSE 0 END) "
        "FROM (SELECT team, flavor, used, nominal, lent, to_ts, "
        "min(to_ts, :until) - from_ts AS ov FROM segments WHERE id >= :first AND id < :stop) "
        "GROUP BY team, flavor",
        {"until": until, "first": first, "stop": stop},
    ):
        sums[(r[0], r[1])] = [float(v or 0.0) for v in r[2:]]
    r_since, r_until = _r_at(store, since), _r_at(store, until)
    edges: list[Any] = []
    accounts = rows(store, "SELECT * FROM open_segments")
    for account in accounts:
        key = (account["queue"], account["flavor"])
        for moment in (since, until):
            # The account's last ended segment that started before `moment`.
            edges += rows(
                store,
                "SELECT * FROM segments WHERE queue = ? AND flavor = ? AND from_ts < ? "
                "ORDER BY from_ts DESC LIMIT 1",
                (*key, moment),
            )
    seen: set[int] = set()
    for seg in [*edges, *accounts]:
        if seg["id"] in seen:
            continue
        seen.add(seg["id"])
        open_ = seg["to_ts"] is None
        start, end = seg["from_ts"], until if open_ else seg["to_ts"]
        if start >= since and not open_ and end <= until:
            continue  # summed in SQL
        if start >= since and not open_:
            # Started in the period, ended after it: SQL has all but its lent.
            part_lent = _lent_part(seg, start, until, r_since, r_until, since)
            sums.setdefault((seg["team"], seg["flavor"]), [0.0] * 5)[4] += part_lent
            continue
        a, b = max(start, since), min(end, until)
        if b <= a:
            continue
        _add_overlap(sums, seg, a, b, r_since, r_until, since)
    return sums


def _lent_part(
    seg: Any,
    a: float,
    b: float,
    r_since: dict[tuple[str, str], float],
    r_until: dict[tuple[str, str], float],
    since: float,
) -> float:
    """lendable x (R(b) - R(a)) for a segment clipped to [a, b], a and b its ends or the period's."""
    if not seg["lendable"] or seg["cohort"] is None:
        return 0.0
    pool = (seg["cohort"], seg["flavor"])
    r_a = seg["r_from"] if a == seg["from_ts"] else r_since.get(pool, 0.0)
    r_b = seg["r_to"] if seg["to_ts"] is not None and b == seg["to_ts"] else r_until.get(pool, 0.0)
    return max(0.0, float(seg["lendable"] * (r_b - r_a)))


def by_team(store: AuditStore, since: float, until: float) -> list[dict[str, Any]]:
    out = []
    for (team, flavor), (used, quota, borrowed, idle, lent) in sorted(
        _sums(store, since, until).items()
    ):
        if used <= 0 and quota <= 0:
            continue
        out.append(
            {
                "team": team,
                "flavor": flavor,
                "used_gpu_h": _h(used),
                "quota_gpu_h": _h(quota),
                "used_pct": _pct(used, quota),
                "borrowed_gpu_h": _h(borrowed),
                "lent_gpu_h": _h(lent),
                "idle_quota_gpu_h": _h(idle),
            }
        )
    return out


UserSums = dict[tuple[str, str, str], list[float]]


def _user_direct(store: AuditStore, since: float, until: float) -> UserSums:
    """Per (user, team, flavor): milli-GPU-seconds in [since, until) and placements started
    in it, from the placements that overlap it (read by id window)."""
    window = placement_window(store, since, until)
    ov = _OVERLAP.format(start="start_ts", end="end_ts")
    started = "CASE WHEN start_ts >= :since THEN 1 ELSE 0 END"
    bounds: dict[str, Any] = {
        "since": since,
        "until": until,
        "first": window.first,
        "stop": window.stop,
    }
    parts = [
        f"SELECT user, team, flavor, gpu_milli * {ov} AS used, {started} AS started "
        "FROM placements WHERE id >= :first AND id < :stop AND gpu_milli > 0 "
        "AND end_ts > :since AND start_ts < :until",
        f"SELECT user, team, flavor, gpu_milli * {ov} AS used, {started} AS started "
        "FROM open_placements WHERE gpu_milli > 0 AND start_ts < :until",
    ]
    if window.checkpoint_seq:
        bounds["checkpoint"] = window.checkpoint_seq
        parts.append(
            f"SELECT user, team, flavor, gpu_milli * {ov} AS used, {started} AS started "
            "FROM placements WHERE id IN (SELECT id FROM checkpoints WHERE seq = :checkpoint "
            "AND tbl = 0 AND id < :first) AND gpu_milli > 0 AND end_ts > :since"
        )
    out: UserSums = {}
    for r in store.db.execute(
        "SELECT user, team, coalesce(flavor, ''), SUM(used), SUM(started) FROM ("
        + " UNION ALL ".join(parts)
        + ") GROUP BY user, team, flavor",
        bounds,
    ):
        out[(r[0], r[1], r[2])] = [float(r[3] or 0.0), float(r[4] or 0)]
    return out


def _user_sums(store: AuditStore, since: float, until: float) -> UserSums:
    """Like `_sums`: whole days from the daily roll-up (plus open placements), ends directly."""
    first_day, stop_day = math.ceil(since / DAY), math.floor(until / DAY)
    if stop_day <= first_day:
        return _user_direct(store, since, until)
    whole_from, whole_to = first_day * DAY, stop_day * DAY
    sums: UserSums = {}

    def add(part: UserSums) -> None:
        for key, (used, started) in part.items():
            total = sums.setdefault(key, [0.0, 0.0])
            total[0] += used
            total[1] += started

    if since < whole_from:
        add(_user_direct(store, since, whole_from))
    if whole_to < until:
        add(_user_direct(store, whole_to, until))
    add(
        {
            (r[0], r[1], r[2]): [float(r[3] or 0) / 1e6, float(r[4] or 0)]
            for r in store.db.execute(
                "SELECT user, team, flavor, SUM(used), SUM(started) FROM user_days "
                "WHERE day >= ? AND day < ? GROUP BY user, team, flavor",
                (first_day, stop_day),
            )
        }
    )
    # Open placements are not in the roll-up yet (their GPU-time is added when they end).
    opened: UserSums = {}
    for r in store.db.execute(
        "SELECT user, team, coalesce(flavor, ''), gpu_milli, start_ts FROM open_placements "
        "WHERE gpu_milli > 0 AND start_ts < ?",
        (whole_to,),
    ):
        used = r[3] * (whole_to - max(r[4], whole_from))
        if used > 0:
            total = opened.setdefault((r[0], r[1], r[2]), [0.0, 0.0])
            total[0] += used
    add(opened)
    return sums


def by_user(store: AuditStore, since: float, until: float) -> list[dict[str, Any]]:
    """GPU-hours per user (who submitted the job), team and flavor, and placements started."""
    found = sorted(
        ((k, v) for k, v in _user_sums(store, since, until).items() if v[0] > 0 or v[1] > 0),
        key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]),
    )
    team_total: dict[tuple[str, str], float] = {}
    for (_, team, flavor), (used, _) in found:
        team_total[(team, flavor)] = team_total.get((team, flavor), 0.0) + used
    return [
        {
            "user": user or "(unknown)",
            "team": team,
            "flavor": flavor or None,
            "placements": int(started),
            "used_gpu_h": _h(used),
            "team_pct": _pct(used, team_total[(team, flavor)]),
        }
        for (user, team, flavor), (used, started) in found
    ]


def by_kind(store: AuditStore, since: float, until: float) -> list[dict[str, Any]]:
    """GPU-hours per team and kind of work (Job, Workspace, InferenceService;
    docs/workspaces.md, docs/services.md).

    A team's total is `by_user`'s (the daily roll-up); the few jobs the log knows as
    another kind (their `work` versions) are summed from their own intervals, clipped to
    the period, and the rest of the total is batch jobs'."""
    totals: dict[str, float] = {}
    for (_, team, _), (used, _) in _user_sums(store, since, until).items():
        totals[team] = totals.get(team, 0.0) + used
    spans: dict[str, list[tuple[float, float | None, str]]] = {}
    for v in rows(
        store,
        "SELECT key, from_ts, to_ts, data FROM versions WHERE kind = ? UNION ALL "
        "SELECT key, from_ts, to_ts, data FROM open_versions WHERE kind = ?",
        (KIND_WORK, KIND_WORK),
    ):
        spans.setdefault(v["key"], []).append(
            (v["from_ts"], v["to_ts"], json.loads(v["data"])["kind"])
        )
    other: dict[tuple[str, str], float] = {}
    keys = sorted(spans)
    overlap = _OVERLAP.format(start="start_ts", end="end_ts")
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        marks = ",".join(f":k{n}" for n in range(len(chunk)))
        for r in rows(
            store,
            f"SELECT job, team, start_ts, gpu_milli * {overlap} AS used FROM all_placements "
            f"WHERE job IN ({marks}) AND start_ts < :until AND "
            "(end_ts IS NULL OR end_ts > :since)",
            {**{f"k{n}": k for n, k in enumerate(chunk)}, "since": since, "until": until},
        ):
            kind = next(
                (
                    k
                    for a, b, k in spans[r["job"]]
                    if a <= r["start_ts"] and (b is None or b >= r["start_ts"])
                ),
                None,
            )
            if kind is not None and r["used"] > 0:
                other[(r["team"], kind)] = other.get((r["team"], kind), 0.0) + r["used"]
    out: list[dict[str, Any]] = []
    for team in sorted(set(totals) | {t for t, _ in other}):
        total = totals.get(team, 0.0)
        kinds = {k: v for (t, k), v in other.items() if t == team}
        kinds["Job"] = max(0.0, total - sum(kinds.values()))
        for kind in sorted(kinds):
            if kinds[kind] > 0 or kind == "Job":
                out.append(
                    {
                        "team": team,
                        "kind": kind,
                        "used_gpu_h": _h(kinds[kind]),
                        "team_pct": _pct(kinds[kind], total),
                    }
                )
    return out


def by_flavor(store: AuditStore, since: float, until: float) -> list[dict[str, Any]]:
    window = interval_window(store, VERSIONS, since, until)
    node_ov = _OVERLAP.format(start="from_ts", end="to_ts")
    overlapping = "kind = 'node' AND from_ts < :until AND (to_ts IS NULL OR to_ts > :since)"
    bounds: dict[str, Any] = {
        "since": since,
        "until": until,
        "first": window.first,
        "stop": window.stop,
        "checkpoint": window.checkpoint_seq,
    }
    # The node versions that may overlap the period, read by id window (as `at` does):
    # those opened since the checkpoint before it, those open at that checkpoint, the open.
    sources = [
        f"SELECT data, {node_ov} AS ov FROM versions WHERE id >= :first AND id < :stop "
        f"AND {overlapping}",
        f"SELECT data, {node_ov} AS ov FROM open_versions WHERE {overlapping}",
    ]
    if window.checkpoint_seq:
        sources.append(
            f"SELECT data, {node_ov} AS ov FROM versions WHERE id IN (SELECT id FROM "
            "checkpoints WHERE seq = :checkpoint AND tbl = 1 AND id < :first) "
            f"AND {overlapping}"
        )
    out: dict[str, dict[str, float]] = {}
    for r in rows(
        store,
        "SELECT json_extract(data, '$.flavor') AS flavor, "
        f"SUM(json_extract(data, '$.gpus') * {_GPU_MILLI_SQL} * ov) AS total, "
        "SUM(CASE WHEN json_extract(data, '$.state') = 'Ready' THEN 0 "
        f"ELSE json_extract(data, '$.gpus') * {_GPU_MILLI_SQL} * ov END) AS down "
        f"FROM ({' UNION ALL '.join(sources)}) GROUP BY flavor",
        bounds,
    ):
        if r["flavor"] is None:
            continue
        out[r["flavor"]] = {"capacity": r["total"] or 0.0, "down": r["down"] or 0.0}
    for (_, flavor), (used, quota, borrowed, _, _) in _sums(store, since, until).items():
        entry = out.setdefault(flavor, {"capacity": 0.0, "down": 0.0})
        entry["used"] = entry.get("used", 0.0) + used
        entry["quota"] = entry.get("quota", 0.0) + quota
        entry["borrowed"] = entry.get("borrowed", 0.0) + borrowed
    result = []
    for flavor in sorted(out):
        e = out[flavor]
        up = e["capacity"] - e["down"]
        u = e.get("used", 0.0)
        result.append(
            {
                "flavor": flavor,
                "capacity_gpu_h": _h(e["capacity"]),
                "down_gpu_h": _h(e["down"]),
                "used_gpu_h": _h(u),
                "idle_gpu_h": _h(max(0.0, up - u)),
                "used_pct": _pct(u, up),
                "quota_gpu_h": _h(e.get("quota", 0.0)),
                "borrowed_gpu_h": _h(e.get("borrowed", 0.0)),
            }
        )
    return result


def usage(store: AuditStore, *, by: str, since: float, until: float) -> list[dict[str, Any]]:
    if by == "team":
        return by_team(store, since, until)
    if by == "user":
        return by_user(store, since, until)
    if by == "flavor":
        return by_flavor(store, since, until)
    if by == "kind":
        return by_kind(store, since, until)
    raise ValueError(f"usage by {by!r}: choose one of {', '.join(BY)}")


def over_time(
    store: AuditStore, since: float, until: float, buckets: int = 120
) -> tuple[list[float], dict[str, list[float]]]:
    """Average GPUs in use per team in each of `buckets` equal slices of the period (for charts)."""
    if until <= since:
        return [], {}
    width = (until - since) / buckets
    starts = [since + i * width for i in range(buckets)]
    series: dict[str, list[float]] = {}
    for r in rows(
        store,
        "SELECT team, from_ts, coalesce(to_ts, :until) AS to_ts, used FROM all_segments "
        "WHERE used > 0 AND from_ts < :until AND (to_ts IS NULL OR to_ts > :since)",
        {"since": since, "until": until},
    ):
        line = series.setdefault(r["team"], [0.0] * buckets)
        a, b = max(r["from_ts"], since), min(r["to_ts"], until)
        first, last = int((a - since) // width), min(buckets - 1, int((b - since) // width))
        for i in range(max(0, first), last + 1):
            lo, hi = starts[i], starts[i] + width
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                line[i] += r["used"] * overlap
    scale = GPU_MILLI * width  # milli-GPU-seconds per bucket -> GPUs
    return starts, {team: [v / scale for v in line] for team, line in sorted(series.items())}
