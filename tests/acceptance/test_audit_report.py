"""`gitsched audit report` rendered by a real browser: Debian's headless Chromium.

The page must open offline (plotly.js inlined) and show what an auditor needs:
the charts drawn (plotly's SVG in the DOM), a bar per placement in the Gantt
chart, an area per team, the changes and the compliance results.
Chromium is installed by scripts/chromium; without it this test fails, never skips.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.audit_fixtures import build_audit_log, gitsched_cli

RENDER_TIMEOUT_S = 180


def chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if found is None:
        pytest.fail(
            "Debian's chromium is not installed, and this test renders the audit report in it: "
            "run scripts/chromium (apt-get install -y chromium), then rerun the tests"
        )
    return found


def render(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
        env={"HOME": str(profile), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_audit_log(tmp_path_factory.mktemp("report") / "cluster")


@pytest.fixture(scope="module")
def report_page(audited: Path) -> Path:
    page = audited.parent / "report.html"
    gitsched_cli("audit", "report", "--repo", audited, "--output", page)
    return page


def test_the_report_opens_offline(report_page: Path) -> None:
    html = report_page.read_text()
    # No script, style or font comes from the network: everything is in the page.
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link[^>]+href=\"https?:", html)
    assert "Plotly.newPlot" in html and len(html) > 1_000_000  # plotly.js itself is inlined
    # Once, and gzipped: plotly.min.js alone is 4.8 MB, the whole page is well under half.
    assert html.count('id="plotly-js-gz"') == 1 and len(html) < 2_200_000


def test_chromium_draws_the_charts_and_tables(
    audited: Path, report_page: Path, tmp_path: Path
) -> None:
    done = render(report_page, tmp_path / "profile", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # plotly marks a div it has drawn into and gives every plot two SVG layers.
    for chart in ("utilisation-chart", "gpu-utilisation-chart", "wait-chart", "placements-gantt"):
        match = re.search(rf'<div id="{chart}"[^>]*class="([^"]*)"', dom)
        assert match and "js-plotly-plot" in match.group(1), f"{chart} was not drawn"
    assert dom.count('class="main-svg"') >= 4
    # The Gantt chart: one bar per placement interval and node it held.
    intervals = gitsched_cli(
        "audit", "history", "--gpu-flavor", "h100-80g", "--repo", audited, "--format", "json"
    ).json()
    bars = re.findall(r'<g class="point"><path d="M[^"]+"', dom)
    assert len(bars) == sum(len(i["nodes"]) for i in intervals) > 0
    # The utilisation chart: one filled area per team with placements.
    assert dom.count('class="trace scatter') >= 3
    for team in ("ml", "cv", "risk"):
        assert f'data-unformatted="{team}"' in dom, f"no legend entry for {team}"
    # The wait table: the same figures as `audit waits` over the report's period.
    waits = gitsched_cli("audit", "waits", "--repo", audited, "--format", "json").json()
    assert waits["all"]["count"] > 0
    for row in waits["rows"]:
        assert f'<td>{row["group"]}</td><td class="num">{row["count"]}</td>' in dom
    for text in (
        "Audit report: cluster audit-test",
        "Changes with provenance",
        "GPU utilisation over time",
        "Waits per queue",
        "quota-approval",
        "FAIL",
    ):
        assert text in dom


def test_chromium_takes_a_screenshot_of_the_whole_report(report_page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    done = render(
        report_page,
        tmp_path / "profile",
        "--hide-scrollbars",
        "--window-size=1280,2400",
        f"--screenshot={shot}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 50_000  # a drawn page, not a blank one
