"""deploy/grafana/gitsched.json queries only series gitsched serve exports: every metric
name in every panel's PromQL (and the variables' queries) is one the registry of
gitsched.metrics.Metrics makes, with the suffixes Prometheus gives its type, and every
label a query groups by is one that metric has (or `le`, or a label the scrape adds)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gitsched.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gitsched.json"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}
# Labels Prometheus adds when it scrapes (the ServiceMonitor's target labels).
SCRAPE_LABELS = {"job", "instance", "pod", "namespace", "service", "container", "endpoint"}
FUNCTIONS_AND_WORDS = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right|bool|and|or|unless|offset)\b"
)


def exported() -> dict[str, set[str]]:
    """Each series name /metrics can carry -> the labels it has."""
    series: dict[str, set[str]] = {}
    for family in Metrics().registry.collect():
        collector_labels: set[str] = set()
        for sample in family.samples:
            collector_labels |= set(sample.labels) - {"le"}
        for suffix in SUFFIXES[family.type]:
            series[family.name + suffix] = collector_labels
    return series


def _labels_of(metrics: Metrics) -> dict[str, set[str]]:
    """The label names each family is declared with (a labelled metric has no sample
    until a label value is set, so read the declaration)."""
    out: dict[str, set[str]] = {}
    for collector in metrics.registry._collector_to_names:
        names = getattr(collector, "_labelnames", ())
        for name in metrics.registry._collector_to_names[collector]:
            out[name] = set(names)
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def metric_names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the grouping labels in one PromQL expression (or one
    label_values(metric, label) variable query)."""
    grouped: set[str] = set()
    if m := re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr.strip()):
        return {m.group(1)}, {m.group(2)}
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        grouped |= {label.strip() for label in clause.split(",") if label.strip()}
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", "", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)
    stripped = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", stripped)
    stripped = FUNCTIONS_AND_WORDS.sub("", stripped)
    names = {
        m.group(1)
        for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", stripped)
        if not re.fullmatch(r"[0-9.e+-]+", m.group(1))
    }
    return names, grouped


def test_every_series_the_dashboard_queries_is_one_gitsched_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported()
    metrics = Metrics()
    declared = _labels_of(metrics)
    exprs = queries(dashboard)
    assert len(exprs) >= 10
    used: set[str] = set()
    for expr in exprs:
        names, grouped = metric_names(expr)
        assert names, expr
        for name in names:
            assert name in series, f"{name} (in {expr!r}) is not a series gitsched exports"
            used.add(name)
            labels = declared.get(name, set()) | {"le"} | SCRAPE_LABELS
            assert grouped <= labels, f"{expr!r} groups by {grouped - labels}, not labels of {name}"


def test_every_metric_gitsched_exports_has_a_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for expr in queries(dashboard) for name in metric_names(expr)[0]}
    families = {family.name for family in Metrics().registry.collect()}
    shown = {f for f in families if any(u == f or u.startswith(f + "_") for u in used)}
    assert shown == families, f"no panel for {sorted(families - shown)}"


def test_the_check_finds_a_series_gitsched_does_not_export() -> None:
    names, grouped = metric_names(
        'histogram_quantile(0.9, sum by (le, queue) (rate(gitsched_wait_seconds_bucket{job="x"}[5m])))'
    )
    assert names == {"gitsched_wait_seconds_bucket"} and grouped == {"le", "queue"}
    assert "gitsched_wait_seconds_bucket" not in exported()
    names, _ = metric_names("sum(rate(gitsched_solve_seconds_sum[5m])) / sum(gitsched_pods_total)")
    assert names == {"gitsched_solve_seconds_sum", "gitsched_pods_total"}
