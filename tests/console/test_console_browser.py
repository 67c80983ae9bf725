"""The console in a real browser: Debian's headless Chromium driven by Playwright, against
`gitsched console` serving the demo repo. Pages load with no console errors (a CSP
violation is one), a commit appears live while the page is open, a job's page shows its
reason and history, hostile names render as text.

Chromium is installed by scripts/chromium; without it these tests fail, never skip.
With GITSCHED_CONSOLE_SCREENSHOTS=DIR they also save a PNG of each page there
(docs/console/ holds the ones docs/console.md shows).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import WAIT_MS, Page, chromium
from tests.support.cluster_repo import git, start_gitsched
from tests.support.console import HOSTILE_NAME, hostile_commit, probe_job

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# A busy 2-core CI machine: generous deadlines, always waiting on a condition.
START_TIMEOUT_S = 120.0
SCREENSHOT_MAX_BYTES = 190_000  # docs/console/ keeps each PNG small


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            _, err = server.communicate()
            pytest.fail(f"gitsched console exited {server.returncode}: {err[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                # up, and done with its first read of the log
                if response.status == 200 and b"for the first time" not in response.read():
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"gitsched console did not answer {url} within {START_TIMEOUT_S:.0f} s")


def _wait_for(url: str) -> None:
    """Until `url` answers 200 (the console has read what was just appended)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if e.code not in (404, 503):
                raise
        time.sleep(0.2)
    pytest.fail(f"{url} did not appear within {WAIT_MS / 1000:.0f} s")


@pytest.fixture
def console(demo: Path) -> Iterator[str]:
    port = _free_port()
    server = start_gitsched(
        "console", "--repo", demo, "--listen", f"127.0.0.1:{port}", "--interval", "0.3"
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base + "/", server)
        yield base
    finally:
        server.terminate()
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: object) -> Iterator[Page]:
    opened = Page(browser)
    yield opened
    opened.close()


def _shoot(page: Page, name: str) -> None:
    folder = os.environ.get("GITSCHED_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        target = Path(folder) / f"{name}.png"
        page.page.screenshot(path=str(target), full_page=True)
        if target.stat().st_size > SCREENSHOT_MAX_BYTES:  # a long page: its first screen
            page.page.screenshot(path=str(target), full_page=False)


PAGES = [
    ("/", "overview"),
    ("/queues", "queues"),
    ("/queues/vision", "queue"),
    ("/jobs", "jobs"),
    ("/jobs/nlp/moe-gang", "job"),
    ("/services", "services"),
    ("/changes", "changes"),
    ("/pulls", "pulls"),
]


def test_every_page_loads_without_console_errors(console: str, page: Page) -> None:
    for path, name in PAGES:
        page.goto(console + path)
        assert page.page.locator("main h1").count() == 1, path
        if name == "pulls":
            # the plan thread finishes the branch's plan; the page follows without a reload
            page.page.wait_for_selector("p.summary", timeout=WAIT_MS)
            assert "1 admitted, 1 preempted" in page.page.inner_text("p.summary")
        _shoot(page, name)
    assert page.problems == []


def test_a_commit_appears_live(console: str, page: Page, demo: Path) -> None:
    page.goto(console + "/changes")
    seq_before = int(page.page.inner_text("#seq"))
    # a mark on the window: a full reload would clear it
    page.page.evaluate("window.__stillTheSamePage = true")
    probe_job(demo, "live-probe")
    reconciling = start_gitsched("reconcile", "--once", "--repo", demo)
    # the console answers while the reconciler works (it reads the audit view, not the log)
    while True:
        running = reconciling.poll() is None
        with urllib.request.urlopen(console + "/jobs?queue=fraud", timeout=60) as response:
            assert response.status == 200
        if not running:
            break
    assert reconciling.wait() == 0, reconciling.communicate()
    page.page.wait_for_selector("text=fraud: live-probe, one H100", timeout=WAIT_MS)
    assert page.page.evaluate("window.__stillTheSamePage") is True
    assert int(page.page.inner_text("#seq")) > seq_before
    # and the overview, opened now, counts the new job
    page.goto(console + "/jobs?queue=fraud")
    assert page.page.locator("a", has_text="fraud/live-probe").count() == 1
    assert page.problems == []


def test_a_job_page_shows_its_reason_and_history(console: str, page: Page) -> None:
    page.goto(console + "/jobs/vision/video-gen")
    reason = page.page.inner_text("#reason")
    assert "cohort research shares 56 h100-80g GPUs" in reason
    history = page.page.inner_text("#history")
    assert "submitted" in history and "pending" in history
    page.goto(console + "/jobs/nlp/moe-gang")
    history = page.page.inner_text("#history")
    assert history.index("pending") < history.index("admitted")
    assert page.page.locator("table.grid td", has_text="h100-a-07").count() >= 1
    assert page.problems == []


def test_hostile_names_render_as_text(console: str, page: Page, demo: Path) -> None:
    sha = hostile_commit(demo)
    _wait_for(console + f"/commits/{sha}")  # the console follows the log within a moment
    page.goto(console + f"/commits/{sha}")
    text = page.page.inner_text("main")
    assert "<script>window.__pwned=1</script>" in text
    assert "<script>window.__pwned=2</script>" in text  # the job's name, in the findings
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    # the only scripts are the console's own
    sources = page.page.eval_on_selector_all("script", "els => els.map(e => e.src)")
    assert sources == [console + "/static/console.js"]
    assert page.page.locator("img").count() == 0
    _shoot(page, "commit-hostile")
    page.goto(console + "/changes")
    assert "<script>window.__pwned=1</script>" in page.page.inner_text("main")
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    # a job URL naming it: a 404 page that says it as text
    response = page.page.goto(console + "/jobs/vision/" + HOSTILE_NAME[:300])
    assert response is not None and response.status == 404
    assert "<script>window.__pwned=2</script>" in page.page.inner_text("main")
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    problems = [p for p in page.problems if "404" not in p]
    assert problems == []


def test_a_new_branch_appears_with_its_plan(console: str, page: Page, demo: Path) -> None:
    page.goto(console + "/pulls")
    page.page.evaluate("window.__stillTheSamePage = true")
    git(demo, "checkout", "-q", "-b", "pr/fraud-probe")
    probe_job(demo, "branch-probe")
    git(demo, "checkout", "-q", "main")
    section = page.page.locator("section.pr", has_text="pr/fraud-probe")
    section.locator("p.summary").wait_for(timeout=WAIT_MS)
    assert "admitted" in section.inner_text() or "pending" in section.inner_text()
    assert "fraud/branch-probe" in section.inner_text()
    assert page.page.evaluate("window.__stillTheSamePage") is True
    assert page.problems == []
