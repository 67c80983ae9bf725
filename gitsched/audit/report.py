"""`audit report`: one self-contained HTML page for an auditor, from the audit view.

Summary, utilisation per team and of the whole cluster over time, GPU-hours per team
by kind of work, inference services' replica counts over time, suspended workspaces,
waits per queue over time, a Gantt chart of placements per node, changes with
provenance and compliance results. Charts are plotly figures with
plotly.js inlined once, so the page opens offline; nothing in it depends on the
clock or on chance (fixed element ids, sorted rows), so the same log and period
always give the same bytes (the caller fixes the period: `gitsched.audit.window.period`).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from gitsched.audit import changes as changes_query
from gitsched.audit import compliance as compliance_query
from gitsched.audit import history, usage
from gitsched.audit import services as services_query
from gitsched.audit import waits as waits_query
from gitsched.audit.projection.vocabulary import KIND_IDLE_SUSPENDED, SERVICE_KIND
from gitsched.audit.store import AuditStore, LogReader, rows
from gitsched.audit.verify import Verification
from gitsched.audit.window import seq_before
from gitsched.eventlog.envelope import format_time

# A Gantt chart of more bars than this is unreadable and slow to open: the
# intervals with the most GPU-hours in the period are shown, and the page says so.
MAX_GANTT_BARS = 2500
BUCKETS = 120
# One chart per service, for this many services (the busiest by scaling decisions).
MAX_SERVICE_CHARTS = 12
# The report's names of the kinds of work `audit usage --by kind` counts.
KIND_NAMES = {"Job": "training jobs", SERVICE_KIND: "services", "Workspace": "workspaces"}
# The share of a node's row its bars fill (the rest is the gap between rows).
GANTT_ROW = 0.8

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1200px; color: #1d2430; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; margin-top: 2.2rem; }
p.meta { color: #57606a; margin-top: 0; }
table { border-collapse: collapse; width: 100%; font-size: .85rem; margin: .6rem 0; }
th, td { border: 1px solid #d0d7de; padding: .3rem .5rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #1a7f37; font-weight: 600; }
.fail { color: #cf222e; font-weight: 600; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: .6rem; }
.figure { border: 1px solid #d0d7de; border-radius: 6px; padding: .6rem .8rem; }
.figure .value { font-size: 1.4rem; font-weight: 600; }
.figure .label { color: #57606a; font-size: .8rem; }
.note { color: #57606a; font-size: .85rem; }
code { background: #f6f8fa; padding: 0 .2rem; border-radius: 3px; }
"""


def _iso(ts: float) -> str:
    return format_time(datetime.fromtimestamp(ts, UTC))


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plot_time(ts: float) -> str:
    """Plotly's date format: no zone suffix (the axis is labelled UTC)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _e(value: object) -> str:
    return html.escape("-" if value is None else str(value))


def _table(
    headers: Sequence[str], body: Sequence[Sequence[object]], numeric: Sequence[int] = ()
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    out = [f"<table><thead><tr>{head}</tr></thead><tbody>"]
    for row in body:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            if isinstance(cell, tuple) and len(cell) == 2 and cell[0] == "html":
                cells.append(f"<td{cls}>{cell[1]}</td>")
            else:
                cells.append(f"<td{cls}>{_e(cell)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _plotly_loader() -> str:
    """plotly.js, once, gzipped (4.8 MB -> 2 MB in the page): the browser unpacks it with
    DecompressionStream and every chart waits for `plotlyReady`. Deterministic: gzip
    without a timestamp."""
    packed = base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode()
    return (
        f'<script id="plotly-js-gz" type="application/octet-stream">{packed}</script>'
        "<script>const plotlyReady = (async () => {"
        'const packed = atob(document.getElementById("plotly-js-gz").textContent);'
        "const bytes = Uint8Array.from(packed, (c) => c.charCodeAt(0));"
        "const stream = new Blob([bytes]).stream()"
        '.pipeThrough(new DecompressionStream("gzip"));'
        'const script = document.createElement("script");'
        "script.textContent = await new Response(stream).text();"
        "document.head.appendChild(script);"
        "})();</script>"
    )


def _script_safe(text: str) -> str:
    """JSON inside <script>: a '</' in a job name must not end the script. A '/' only
    occurs inside JSON strings, where \\u002f means the same (as plotly's own HTML has it)."""
    return text.replace("/", "\\u002f")


def _figure_html(fig: go.Figure, div_id: str, height: int) -> str:
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 30, "b": 40})
    config = json.dumps({"displaylogo": False, "responsive": True})
    return (
        f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px; width:100%;">'
        f"</div><script>plotlyReady.then(() => {{ const figure = {_script_safe(fig.to_json())};"
        f' Plotly.newPlot("{div_id}", figure.data, figure.layout, {config}); }});</script>'
    )


def utilisation_figure(store: AuditStore, since: float, until: float) -> go.Figure:
    starts, series = usage.over_time(store, since, until, BUCKETS)
    x = [_plot_time(t) for t in starts]
    fig = go.Figure()
    for team, values in series.items():
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[round(v, 3) for v in values],
                name=team,
                stackgroup="teams",
                mode="lines",
                line={"width": 0.5},
                hovertemplate=f"{html.escape(team)}: %{{y:.1f}} GPUs<extra></extra>",
            )
        )
    capacity = _capacity_over_time(store, starts, since, until)
    if capacity:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[round(v, 3) for v in capacity],
                name="capacity (Ready GPUs)",
                mode="lines",
                line={"color": "#1d2430", "dash": "dash", "width": 1.5},
            )
        )
    fig.update_layout(
        xaxis_title="time (UTC)",
        yaxis_title="GPUs in use (average per slice)",
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def gpu_utilisation_figure(store: AuditStore, since: float, until: float) -> go.Figure:
    """GPUs in use as a share of the Ready GPUs, per slice of the period."""
    starts, series = usage.over_time(store, since, until, BUCKETS)
    capacity = _capacity_over_time(store, starts, since, until)
    used = [sum(values[i] for values in series.values()) for i in range(len(starts))]
    fig = go.Figure()
    if capacity:
        fig.add_trace(
            go.Scatter(
                x=[_plot_time(t) for t in starts],
                y=[
                    round(100.0 * u / c, 2) if c > 0 else None
                    for u, c in zip(used, capacity, strict=True)
                ],
                name="GPU utilisation",
                mode="lines",
                line={"color": "#0969da", "width": 1.5},
                hovertemplate="%{y:.1f}% of Ready GPUs<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="time (UTC)",
        yaxis_title="GPUs in use, % of Ready GPUs",
        yaxis={"range": [0, 105]},
        template="plotly_white",
        showlegend=False,
    )
    return fig


def wait_figure(store: AuditStore, since: float, until: float) -> go.Figure:
    """Per queue, the mean wait of the jobs admitted in each slice of the period."""
    fig = go.Figure()
    for queue, points in sorted(
        waits_query.waits_over_time(store, since, until, BUCKETS // 2).items()
    ):
        fig.add_trace(
            go.Scatter(
                x=[_plot_time(t) for t, _, _ in points],
                y=[round(w / 60.0, 3) for _, w, _ in points],
                customdata=[n for _, _, n in points],
                name=queue,
                mode="lines+markers",
                hovertemplate=(
                    f"{html.escape(queue)}: %{{y:.1f}} min mean wait, %{{customdata}} admitted"
                    "<extra></extra>"
                ),
            )
        )
    fig.update_layout(
        xaxis_title="time (UTC, when admitted)",
        yaxis_title="mean wait (minutes)",
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def _capacity_over_time(
    store: AuditStore, starts: list[float], since: float, until: float
) -> list[float]:
    if not starts:
        return []
    width = (until - since) / len(starts)
    line = [0.0] * len(starts)
    for r in rows(
        store,
        "SELECT from_ts, coalesce(to_ts, :until) AS to_ts, "
        "json_extract(data, '$.gpus') AS gpus FROM all_versions "
        "WHERE kind = 'node' AND json_extract(data, '$.state') = 'Ready' "
        "AND from_ts < :until AND (to_ts IS NULL OR to_ts > :since) ORDER BY id",
        {"since": since, "until": until},
    ):
        a, b = max(r["from_ts"], since), min(r["to_ts"], until)
        first = max(0, int((a - since) // width))
        last = min(len(starts) - 1, int((b - since) // width))
        for i in range(first, last + 1):
            overlap = min(b, starts[i] + width) - max(a, starts[i])
            if overlap > 0:
                line[i] += (r["gpus"] or 0) * overlap / width
    return line


def gantt_figure(
    intervals: list[history.Interval], since: float, until: float
) -> tuple[go.Figure, int, int]:
    """Bars of placement intervals per node, coloured by team; returns (figure, shown, total)."""
    bars = []
    for i in intervals:
        start = max(_ts(i.start), since)
        end = min(_ts(i.end) if i.end else until, until)
        if end <= start:
            continue
        for node in i.nodes:
            bars.append((i, node, start, end))
    total = len(bars)
    if total > MAX_GANTT_BARS:
        bars.sort(key=lambda b: (-(b[3] - b[2]) * b[0].gpus, b[0].start_seq, b[1]))
        bars = bars[:MAX_GANTT_BARS]
    bars.sort(key=lambda b: (b[0].team, b[0].start_seq, b[1]))
    lane, lanes = gantt_lanes([(b[1], b[2], b[3]) for b in bars])
    by_team: dict[str, list[int]] = {}
    for index, bar in enumerate(bars):
        by_team.setdefault(bar[0].team, []).append(index)
    fig = go.Figure()
    for team in sorted(by_team):
        chosen = [bars[i] for i in by_team[team]]
        # Jobs that share a node at once split its row into lanes, one above the other.
        widths = [GANTT_ROW / lanes[bars[i][1]] for i in by_team[team]]
        fig.add_trace(
            go.Bar(
                name=team,
                orientation="h",
                y=[b[1] for b in chosen],
                base=[_plot_time(b[2]) for b in chosen],
                x=[round((b[3] - b[2]) * 1000.0, 3) for b in chosen],
                width=widths,
                offset=[
                    -GANTT_ROW / 2 + lane[i] * w for i, w in zip(by_team[team], widths, strict=True)
                ],
                text=[b[0].job for b in chosen],
                textposition="inside",
                insidetextanchor="start",
                textfont={"size": 10},
                customdata=[
                    [b[0].job, b[0].start, b[0].end or "running", b[0].state, f"{b[0].gpus:g}"]
                    for b in chosen
                ],
                hovertemplate=(
                    "%{customdata[0]} on %{y}<br>%{customdata[1]} .. %{customdata[2]}"
                    "<br>%{customdata[4]} GPUs, %{customdata[3]}<extra></extra>"
                ),
            )
        )
    nodes = sorted({b[1] for b in bars})
    fig.update_layout(
        barmode="overlay",
        xaxis={
            "type": "date",
            "title": "time (UTC)",
            "range": [_plot_time(since), _plot_time(until)],
        },
        yaxis={
            "type": "category",
            "categoryorder": "array",
            "categoryarray": list(reversed(nodes)),
            "title": "node",
        },
        legend={"orientation": "h", "y": -0.15},
        template="plotly_white",
    )
    return fig, len(bars), total


def gantt_lanes(
    bars: Sequence[tuple[str, float, float]],
) -> tuple[list[int], dict[str, int]]:
    """For bars (node, start, end): each bar's lane within its node's row, so bars that
    overlap in time never cover each other, and how many lanes each node needs."""
    lane = [0] * len(bars)
    ends: dict[str, list[float]] = {}  # per node, when each lane is free again
    for index in sorted(range(len(bars)), key=lambda i: (bars[i][1], bars[i][2], i)):
        node, start, end = bars[index]
        free = ends.setdefault(node, [])
        chosen = next((k for k, busy_until in enumerate(free) if busy_until <= start), len(free))
        if chosen == len(free):
            free.append(end)
        else:
            free[chosen] = end
        lane[index] = chosen
    return lane, {node: len(free) for node, free in ends.items()}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def service_series(
    found: Sequence[dict[str, object]], since: float, until: float
) -> dict[str, list[tuple[float, dict[str, object]]]]:
    """Per service, its rows in the period as (time, row): the last row before `since`
    moved to `since` (the counts it started the period with), then each row in it."""
    out: dict[str, list[tuple[float, dict[str, object]]]] = {}
    for r in found:
        if not r["time"]:
            continue  # (a view read mid-append: its time comes with the rest)
        at = _ts(str(r["time"]))
        if at > until:
            continue
        points = out.setdefault(str(r["service"]), [])
        if at < since:
            points[:] = [(since, r)]
        else:
            points.append((at, r))
    # a service gone before the period has nothing to show
    return {
        k: v
        for k, v in out.items()
        if v and not (len(v) == 1 and v[0][0] == since and v[0][1]["event"] == "ServiceWithdrawn")
    }


def service_figure(points: Sequence[tuple[float, dict[str, object]]], until: float) -> go.Figure:
    """One service's desired, running, min and max replicas as steps over the period."""
    x = [_plot_time(t) for t, _ in points] + [_plot_time(until)]
    fig = go.Figure()
    for column, colour, dash in (
        ("desired", "#0969da", "solid"),
        ("running", "#1a7f37", "solid"),
        ("min", "#57606a", "dot"),
        ("max", "#57606a", "dash"),
    ):
        values = [r[column] for _, r in points]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[*values, values[-1]],
                name=column,
                mode="lines",
                line={"shape": "hv", "color": colour, "dash": dash, "width": 1.5},
                hovertemplate=f"{column}: %{{y}} replicas<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="time (UTC)",
        yaxis_title="replicas",
        yaxis={"rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.3},
        template="plotly_white",
    )
    return fig


def idle_suspensions(store: AuditStore, since: float, until: float) -> list[dict[str, object]]:
    """Workspaces the idle rule suspended, while suspended in [since, until], with the
    WorkspaceSuspended evidence and when a commit resumed them (None: still suspended)."""
    out: list[dict[str, object]] = []
    for r in rows(
        store,
        "SELECT key, from_seq, from_time, to_time, data FROM all_versions WHERE kind = :kind "
        "AND from_ts <= :until AND (to_ts IS NULL OR to_ts >= :since) ORDER BY from_seq, key",
        {"kind": KIND_IDLE_SUSPENDED, "since": since, "until": until},
    ):
        evidence = json.loads(r["data"])
        out.append(
            {
                "workspace": r["key"],
                "seq": r["from_seq"],
                "idle_since": evidence["since"],
                "suspended_at": evidence["until"],
                "max_utilization_percent": evidence["utilization_percent"],
                "threshold_percent": evidence["threshold_percent"],
                "after_minutes": evidence["after_minutes"],
                "resumed_at": r["to_time"],
            }
        )
    return out


def _services_section(store: AuditStore, since: float, until: float) -> str:
    series = service_series(services_query.view_rows(store), since, until)
    parts = ['<section id="services"><h2>Inference services</h2>']
    if not series:
        parts.append('<p class="note">No inference service in the period.</p></section>')
        return "".join(parts)
    decisions = {
        key: [r for t, r in points if r["event"] == "ServiceScaled" and t >= since]
        for key, points in series.items()
    }
    body = []
    for key in sorted(series):
        last = series[key][-1][1]
        latest = decisions[key][-1] if decisions[key] else None
        body.append(
            [
                key,
                last["min"],
                last["max"],
                last["desired"],
                last["running"],
                len(decisions[key]),
                latest["why"] if latest is not None else "-",
            ]
        )
    parts.append(
        _table(
            [
                "service",
                "min",
                "max",
                "desired (end)",
                "running (end)",
                "scaling decisions",
                "last decision",
            ],
            body,
            numeric=range(1, 6),
        )
    )
    chosen = sorted(series, key=lambda k: (-len(decisions[k]), k))[:MAX_SERVICE_CHARTS]
    if len(series) > len(chosen):
        parts.append(
            f'<p class="note">Charts of the {len(chosen)} services with the most scaling '
            f"decisions of {len(series)}; <code>gitsched audit history --service TEAM/NAME</code>"
            " gives any service's counts.</p>"
        )
    for index, key in enumerate(sorted(chosen)):
        parts.append(f'<h3 class="service-name">{_e(key)}</h3>')
        parts.append(
            _figure_html(service_figure(series[key], until), f"service-chart-{index}", 260)
        )
    parts.append(
        '<p class="note">Desired is what the service wants (its minimum, or the last scaling '
        "decision within min and max), running what the cluster reported running, after "
        "every event that moved them (the audit view's <code>service_counts</code>, the "
        "counts <code>gitsched audit history --service</code> prints).</p></section>"
    )
    return "".join(parts)


def _kinds_section(store: AuditStore, since: float, until: float) -> str:
    by_kind = usage.by_kind(store, since, until)
    parts = ['<section id="work-kinds"><h2>GPU-hours by kind of work</h2>']
    parts.append(
        _table(
            ["team", "kind of work", "used_gpu_h", "team_pct"],
            [
                [r["team"], KIND_NAMES.get(r["kind"], r["kind"]), r["used_gpu_h"], r["team_pct"]]
                for r in by_kind
            ],
            numeric=(2, 3),
        )
    )
    parts.append(
        '<p class="note">Per team, the GPU-hours of its training jobs, its services\' '
        "replicas and its workspaces; <code>gitsched audit usage --by kind</code> gives the "
        "same figures.</p></section>"
    )
    return "".join(parts)


def _suspended_section(store: AuditStore, since: float, until: float) -> str:
    found = idle_suspensions(store, since, until)
    parts = ['<section id="suspended"><h2>Workspaces suspended when idle</h2>']
    if not found:
        parts.append('<p class="note">No workspace was suspended in the period.</p></section>')
        return "".join(parts)
    parts.append(
        _table(
            [
                "workspace",
                "seq",
                "idle from",
                "suspended at",
                "max GPU utilisation (%)",
                "threshold (%)",
                "idle.suspendAfterMinutes",
                "resumed at",
            ],
            [
                [
                    r["workspace"],
                    r["seq"],
                    r["idle_since"],
                    r["suspended_at"],
                    f"{float(str(r['max_utilization_percent'])):.1f}",
                    f"{float(str(r['threshold_percent'])):g}",
                    r["after_minutes"],
                    r["resumed_at"] or "still suspended",
                ]
                for r in found
            ],
            numeric=(1, 4, 5, 6),
        )
    )
    parts.append(
        '<p class="note">The evidence of each <code>WorkspaceSuspended</code>: its GPUs stayed '
        "below the threshold from <em>idle from</em> to <em>suspended at</em>; a commit that "
        "changes its <code>spec.resume</code> queues it again.</p></section>"
    )
    return "".join(parts)


def render_report(
    store: AuditStore,
    *,
    since: float,
    until: float,
    verification: Verification,
    log: LogReader,
) -> str:
    """The report's HTML for [since, until]."""
    state = rows(
        store,
        "SELECT data FROM all_versions WHERE kind = 'cluster' AND from_ts <= ? "
        "ORDER BY from_seq DESC LIMIT 1",
        (until,),
    )
    cluster = "cluster"
    if state:
        cluster = json.loads(state[0]["data"]).get("name", "cluster")
    lo, hi = _iso(since), _iso(until)
    # The period's events, as `at` reads times: those after the last one before `since`.
    row = store.db.execute(
        "SELECT seq FROM marks WHERE time >= ? ORDER BY time LIMIT 1", (lo,)
    ).fetchone()
    first_in = row[0] if row else None
    before = (first_in or store.offset()[0] + 1) - 1
    seq_range = (before + 1, seq_before(store, until))
    commits = store.db.execute(
        "SELECT SUM(applied), SUM(1 - applied) FROM commits WHERE committed_at >= ? AND committed_at <= ?",
        (lo, hi),
    ).fetchone()
    intervals = history.query(store, since=since, until=until)
    team_usage = usage.by_team(store, since, until)
    flavor_usage = usage.by_flavor(store, since, until)
    used = sum(r["used_gpu_h"] for r in flavor_usage)
    capacity = sum(r["capacity_gpu_h"] - r["down_gpu_h"] for r in flavor_usage)
    preemptions = sum(
        1 for i in intervals if i.end_kind == "preempted" and i.end and lo <= i.end <= hi
    )
    all_changes = [c for c in changes_query.changes(store) if lo <= c["merged"] <= hi]
    result = compliance_query.compliance(store)
    violations = [v for v in result["violations"] if lo <= v["time"] <= hi]
    compliance_query.describe(log, violations, limit=200)
    failed = sorted({v["check"] for v in violations})

    figures = [
        (f"{used:,.1f}", "GPU-hours used"),
        (f"{100.0 * used / capacity:.1f}%" if capacity > 0 else "-", "of Ready GPU-hours"),
        (f"{len({i.job for i in intervals}):,}", "jobs that ran"),
        (f"{len(intervals):,}", "placement intervals"),
        (f"{preemptions:,}", "preemptions"),
        (f"{commits[0] or 0:,} / {commits[1] or 0:,}", "commits applied / rejected"),
        (f"{len(all_changes):,}", "queue, priority and policy changes"),
        (
            "all pass" if not failed else f"{len(failed)} of {len(result['checks'])} fail",
            "compliance checks",
        ),
    ]
    chain = (
        f"hash chain intact over {verification.events:,} events (head {verification.last_hash})"
        if verification.ok
        else f"HASH CHAIN BROKEN at seq {verification.broken.seq}: {verification.broken.reason}"
        if verification.broken
        else "hash chain broken"
    )

    parts: list[str] = []
    parts.append(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gitsched audit report: {_e(cluster)}, {_e(_day(since))} to {_e(_day(until))}</title>"
        f"<style>{_STYLE}</style>"
        f"{_plotly_loader()}</head><body>"
    )
    parts.append(f"<h1>Audit report: cluster {_e(cluster)}</h1>")
    parts.append(
        f'<p class="meta">Period {_e(_day(since))} to {_e(_day(until))}: events {seq_range[0]:,} '
        f"to {seq_range[1]:,} of the log. "
        f'<span class="{"pass" if verification.ok else "fail"}">{_e(chain)}</span>.</p>'
    )

    parts.append('<section id="summary"><h2>Summary</h2><div class="figures">')
    for value, label in figures:
        parts.append(
            f'<div class="figure"><div class="value">{_e(value)}</div>'
            f'<div class="label">{_e(label)}</div></div>'
        )
    parts.append("</div>")
    parts.append(
        _table(
            usage.HEADERS["flavor"],
            [[r[h] for h in usage.HEADERS["flavor"]] for r in flavor_usage],
            numeric=range(1, 8),
        )
    )
    parts.append("</section>")

    parts.append('<section id="utilisation"><h2>Utilisation per team</h2>')
    parts.append(_figure_html(utilisation_figure(store, since, until), "utilisation-chart", 420))
    parts.append(
        _table(
            usage.HEADERS["team"],
            [[r[h] for h in usage.HEADERS["team"]] for r in team_usage],
            numeric=range(2, 8),
        )
    )
    parts.append(
        "<p class=\"note\">Lent GPU-hours: what a queue's unused quota served of its cohort's "
        "borrowing, shared among lenders in proportion to what each could lend.</p></section>"
    )

    parts.append('<section id="gpu-utilisation"><h2>GPU utilisation over time</h2>')
    parts.append(
        _figure_html(gpu_utilisation_figure(store, since, until), "gpu-utilisation-chart", 320)
    )
    parts.append("</section>")

    waits = waits_query.waits(store, by="queue", since=since, until=until)
    parts.append('<section id="waits"><h2>Waits per queue</h2>')
    parts.append(_figure_html(wait_figure(store, since, until), "wait-chart", 360))
    parts.append(
        _table(
            waits_query.HEADERS,
            [[r[h] for h in waits_query.HEADERS] for r in [*waits["rows"], waits["all"]]],
            numeric=range(1, 7),
        )
    )
    parts.append(
        '<p class="note">A wait runs from when a job began waiting (its commit, the end of '
        "its last interval or of its retry backoff) to the start of the interval it was "
        "admitted to; <code>gitsched audit waits</code> gives the same figures.</p></section>"
    )

    parts.append(_kinds_section(store, since, until))
    parts.append(_services_section(store, since, until))
    parts.append(_suspended_section(store, since, until))

    gantt, shown, total = gantt_figure(intervals, since, until)
    node_count = len({b for i in intervals for b in i.nodes}) or 1
    parts.append('<section id="placements"><h2>Placements per node</h2>')
    if shown < total:
        parts.append(
            f'<p class="note">Showing the {shown:,} placements with the most GPU-hours of '
            f"{total:,} in the period; <code>gitsched audit history --node NODE</code> lists all.</p>"
        )
    parts.append(_figure_html(gantt, "placements-gantt", max(360, min(4000, 60 + 16 * node_count))))
    parts.append("</section>")

    parts.append('<section id="changes"><h2>Changes with provenance</h2>')
    if all_changes:
        parts.append(
            _table(
                ["applied", "commit", "change", "author", "approved by", "merged", "caused"],
                [
                    [
                        c["applied"],
                        c["commit"][:12],
                        f"{c['kind']} {c['target']}: {c['change']}",
                        c["author"],
                        ", ".join(c["approvers"]) or "nobody",
                        c["merged"],
                        c["caused"],
                    ]
                    for c in all_changes
                ],
            )
        )
    else:
        parts.append('<p class="note">No queue, priority or policy changed in the period.</p>')
    parts.append("</section>")

    parts.append('<section id="compliance"><h2>Compliance</h2>')
    parts.append(
        _table(
            ["check", "result", "rule", "checked (whole log)", "violations in period"],
            [
                [
                    c["check"],
                    (
                        "html",
                        '<span class="fail">FAIL</span>'
                        if c["check"] in failed
                        else '<span class="pass">PASS</span>',
                    ),
                    c["description"],
                    f"{c['checked']:,} {c['checked_what']}",
                    sum(1 for v in violations if v["check"] == c["check"]),
                ]
                for c in result["checks"]
            ],
            numeric=(4,),
        )
    )
    if violations:
        parts.append(
            _table(
                ["seq", "time", "check", "violation", "evidence (seq: event)"],
                [
                    [
                        v["seq"],
                        v["time"],
                        v["check"],
                        v["message"]
                        + (f" (until seq {v['until_seq']})" if v.get("until_seq") else ""),
                        "; ".join(
                            f"{e['seq']}: {e['type']} {e['id']}" if isinstance(e, dict) else str(e)
                            for e in v["evidence"]
                        ),
                    ]
                    for v in violations[:500]
                ],
            )
        )
        if len(violations) > 500:
            parts.append(
                f'<p class="note">{len(violations) - 500:,} more violations: '
                "<code>gitsched audit compliance --format csv</code> lists all.</p>"
            )
    parts.append("</section>")
    parts.append(
        '<footer class="note"><p>Made by <code>gitsched audit report</code> from the event log; '
        "every figure can be checked with <code>gitsched audit history | usage | changes | "
        "compliance | verify</code> and each event with <code>gitsched state --seq N</code>.</p>"
        "</footer></body></html>\n"
    )
    return "".join(parts)
