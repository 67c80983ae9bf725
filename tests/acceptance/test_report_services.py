"""`audit report` on a real reconciled repo that runs an inference service and a workspace:
the services' replica counts over time and their scaling decisions, GPU-hours by kind of
work per team (the same figures as `audit usage --by kind`), and the workspaces the idle
rule suspended with their evidence. The view's service rows say what `audit history
--service` says, from the one function both folds call."""

from __future__ import annotations

import html
import json
import re

import pytest

from gitsched.audit import services
from gitsched.audit.store import AuditStore
from tests.support.cluster_repo import ClusterRepo, gitsched
from tests.support.serving import SCALED_AT, SERVICE_KEY, WORKSPACE_KEY, serving_repo


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> ClusterRepo:
    return serving_repo(tmp_path_factory.mktemp("serving") / "cluster")


@pytest.fixture(scope="module")
def page(serving: ClusterRepo) -> str:
    out = serving.path.parent / "report.html"
    gitsched("audit", "report", "--repo", serving.path, "--output", out, expect=0)
    return out.read_text()


def section(page: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert match, f"no section {name}"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the section's first table, as cell texts."""
    body = re.search(r"<tbody>(.*?)</tbody>", text, re.S)
    assert body
    return [
        [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body.group(1))
    ]


def test_the_services_section_shows_counts_and_the_scaling_decision(page: str) -> None:
    services = section(page, "services")
    ((name, low, high, desired, running, decisions, last),) = table_rows(services)
    assert (name, low, high) == (SERVICE_KEY, "1", "3")
    # scaled to 2; chat.0 started (as serve reported it), chat.1 added and not yet started
    assert (desired, running, decisions) == ("2", "1", "1")
    assert last == "scaled 1 -> 2 (metric 12, target 5; bound by hpa)"
    # its chart: desired, running, min and max as steps, ending at the counts above
    chart = re.search(r'id="service-chart-0".*?const figure = (\{.*?\});', services, re.S)
    assert chart
    figure = json.loads(chart.group(1).replace("\\u002f", "/"))
    lines = {t["name"]: t["y"] for t in figure["data"]}
    assert set(lines) == {"desired", "running", "min", "max"}
    assert lines["desired"][-1] == 2 and lines["running"][-1] == 1
    assert 1 in lines["desired"]  # it was 1 before the decision
    assert set(lines["min"]) == {1} and set(lines["max"]) == {3}
    assert all(t["line"]["shape"] == "hv" for t in figure["data"])


def test_gpu_hours_by_kind_are_audit_usages(serving: ClusterRepo, page: str) -> None:
    usage = gitsched(
        "audit", "usage", "--by", "kind", "--repo", serving.path, "--format", "json", expect=0
    ).json()
    got = {(team, kind): hours for team, kind, hours, _ in table_rows(section(page, "work-kinds"))}
    names = {"Job": "training jobs", "InferenceService": "services", "Workspace": "workspaces"}
    expected = {(r["team"], names[r["kind"]]): str(r["used_gpu_h"]) for r in usage["rows"]}
    assert got == expected
    assert set(got) == {("ml", "training jobs"), ("ml", "services"), ("ml", "workspaces")}
    # the notebook held its GPU from its placement to its suspension (the replicas ran
    # from their starts, appended as serve would, seconds before the period ends)
    assert float(got[("ml", "workspaces")]) > 0


def test_the_suspended_workspace_is_listed_with_its_idle_evidence(page: str) -> None:
    ((workspace, seq, since, until, peak, threshold, after, resumed),) = table_rows(
        section(page, "suspended")
    )
    assert workspace == WORKSPACE_KEY and int(seq) > 0
    assert since == "2025-11-16T10:00:00.000000Z" and until >= "2025-11-16T10:30:00.000000Z"
    assert float(peak) <= float(threshold) and after == "30"
    assert resumed == "still suspended"


def test_the_views_service_rows_are_audit_history_services(serving: ClusterRepo) -> None:
    """One function (`service_rows.counts`) for both folds: the log's and the view's."""
    history = gitsched(
        "audit", "history", "--service", SERVICE_KEY, "--repo", serving.path,
        "--format", "json", expect=0,
    ).json()  # fmt: skip
    with AuditStore(serving.log_path.parent / "audit.db") as store:
        view = services.view_rows(store, service=SERVICE_KEY)
    by_seq = {r["seq"]: r for r in view}
    for h in history:
        row = by_seq[h["seq"]]
        assert (row["event"], row["desired"], row["replicas"], row["running"], row["why"]) == (
            h["event"], h["desired"], h["replicas"], h["running"], h["why"],
        )  # fmt: skip
    assert [r["at"] for r in view if r["event"] == "ServiceScaled"] == [SCALED_AT]
    # ... and a row where only a replica's start moved the counts
    assert any(r["event"] == "JobStarted" and r["running"] == 1 for r in view)
