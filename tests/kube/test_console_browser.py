"""The console of the kwok cluster in a real browser (issue 28, item 1): Debian's headless
Chromium, driven by Playwright, against the console that `gitsched serve` mounts at
/console while it runs the cluster. The overview loads with no console errors and shows
the kwok nodes; a job committed to the repo appears live (no reload) once serve places it,
and its page shows the placement and history; a job that cannot fit says why in words; a
hostile job name renders as text.

The tests of the demo repo's console (tests/console/test_console_browser.py) drive
`gitsched console`; these drive `serve`, whose console reads the log the daemon writes.
Chromium is installed by scripts/chromium; without it these tests fail, never skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from gitsched.engine import events as ev
from tests.support.browser import Page, chromium
from tests.support.cluster_repo import H, start_gitsched
from tests.support.console import HOSTILE, HOSTILE_NAME
from tests.support.kube import ENV_VAR, KubeWorld, serve_args, stop_serve, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.browser, pytest.mark.slow]

# A busy 2-core CI machine: generous deadlines, always waiting on a condition.
START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class Serve:
    """`gitsched serve` on the test's world: its own Lease, its nodes, its log; the
    console under /console on the same address."""

    def __init__(self, world: KubeWorld) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.console = self.base + "/console"
        self.process: subprocess.Popen[str] = start_gitsched(
            *serve_args(world, os.environ[ENV_VAR], self.port, identity="console")
        )

    def up(self) -> bool:
        if self.process.poll() is not None:
            _, err = self.process.communicate()
            pytest.fail(f"gitsched serve exited {self.process.returncode}: {err[-2000:]}")
        status, text = _get(self.console + "/")
        # up, and done with its first read of the log
        return status == 200 and "for the first time" not in text

    def stop(self) -> None:
        exited = self.process.poll() is not None
        stderr = stop_serve(self.process, "gitsched serve")
        assert not exited, f"gitsched serve exited {self.process.returncode}: {stderr[-4000:]}"
        assert "Traceback" not in stderr, stderr[-4000:]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: object) -> Iterator[Page]:
    opened = Page(browser)
    yield opened
    opened.close()


@pytest.fixture
def start_serve(world: KubeWorld) -> Iterator[Callable[[], Serve]]:
    """Starts `gitsched serve` on the world (once its repo is bootstrapped); stops it after."""
    started: list[Serve] = []

    def start() -> Serve:
        daemon = Serve(world)
        started.append(daemon)
        wait_for("serve's console answering", daemon.up, timeout_s=START_TIMEOUT_S)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.stop()


def _started(world: KubeWorld, job: str) -> bool:
    return any(isinstance(e, ev.JobStarted) and e.job == world.job_key(job) for e in world.events())


def test_the_overview_shows_the_kwok_nodes_and_a_job_appears_live(
    world: KubeWorld, start_serve: Callable[[], Serve], page: Page
) -> None:
    nodes = [world.add_node("n0"), world.add_node("n1")]
    world.bootstrap(nominal=16)
    serve = start_serve()
    page.goto(serve.console + "/")
    # the daemon's first pass brings the nodes (from Kubernetes) into the log; the page follows
    for node in nodes:
        page.wait_for_text("main", node)
    assert page.page.locator("div.nodename", has_text=nodes[0]).count() == 1
    assert page.page.locator("div.nodename", has_text=nodes[1]).count() == 1
    page.wait_for_text("p.lead", "2 nodes, 0 of 16 GPUs allocated")
    seq_before = int(page.page.inner_text("#seq"))
    # a mark on the window: a full reload would clear it
    page.page.evaluate("window.__stillTheSamePage = true")

    world.submit("trainer", gpu=8)
    wait_for("serve to start trainer", lambda: _started(world, "trainer"), timeout_s=120)
    lead = page.wait_for_text("p.lead", "8 of 16 GPUs allocated")
    assert "1 running" in lead
    assert page.page.locator("main a", has_text=world.team).count() >= 1
    assert page.page.evaluate("window.__stillTheSamePage") is True
    assert int(page.page.inner_text("#seq")) > seq_before

    # the job's page: where each replica runs, and its history
    page.goto(serve.console + f"/jobs/{world.team}/trainer")
    assert page.page.inner_text("b.state") == "running"
    placement = page.page.locator("section:has(h2:text-is('Placement'))")
    node = placement.locator("table.grid tbody td").nth(1).inner_text()
    assert node in nodes
    pods = [
        p
        for p in world.pods().values()
        if p["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.trainer"
    ]
    assert [p["spec"].get("nodeName") for p in pods] == [node]  # the page says where it runs
    history = page.page.inner_text("#history")
    assert history.index("submitted") < history.index("admitted")
    assert page.problems == []


def test_a_job_that_cannot_fit_says_why(
    world: KubeWorld, start_serve: Callable[[], Serve], page: Page
) -> None:
    world.add_node("n0")
    world.bootstrap(nominal=32)
    serve = start_serve()
    world.submit("first", gpu=8)
    wait_for("serve to start first", lambda: _started(world, "first"), timeout_s=120)
    # the one node is full: the next job waits for it
    world.submit("second", gpu=8)
    page.goto(serve.console + f"/jobs?queue={world.team}")
    page.wait_for_text("main", f"{world.team}/second")
    page.goto(serve.console + f"/jobs/{world.team}/second")
    reason = page.wait_for_text("#reason", "GPU")
    assert page.page.inner_text("b.state") == "pending"
    assert "needs 1 replica of 8 × h100-80g GPU; 0 eligible node(s) have room for one now" in (
        reason
    )
    assert "pending" in page.page.inner_text("#history")
    # two full nodes' worth as one gang: the quota allows it, the cluster never will
    world.submit("too-big", replicas=2, gpu=8)
    page.goto(serve.console + f"/jobs?queue={world.team}")
    page.wait_for_text("main", f"{world.team}/too-big")
    page.goto(serve.console + f"/jobs/{world.team}/too-big")
    reason = page.wait_for_text("#reason", "can never run")
    assert page.page.inner_text("b.state") == "pending"
    assert "its smallest gang needs 16 GPUs and the cluster has 8 h100-80g GPUs in all" in reason
    history = page.page.inner_text("#history")
    assert history.index("submitted") < history.index("pending")
    assert "can never run" in history
    assert page.problems == []


def test_a_hostile_job_name_renders_as_text(
    world: KubeWorld, start_serve: Callable[[], Serve], page: Page
) -> None:
    world.add_node("n0")
    world.bootstrap(nominal=8)
    serve = start_serve()
    page.goto(serve.console + "/changes")
    name_yaml = HOSTILE_NAME.replace("'", "''")
    world.repo.write(
        f"teams/{world.team}/jobs/hostile.yaml",
        H + f"kind: Job\nmetadata:\n  name: '{name_yaml}'\n"
        "spec:\n  replicas: 1\n  resources: {gpu: 1, cpu: 1, memoryGiB: 1}\n",
    )
    # the commit's subject is markup too: every page shows it in the rejection's banner
    sha = world.repo.commit(HOSTILE)
    # serve rejects the commit; the open page says so live, and the commit's page lists
    # the findings, the job's name among them
    banner = page.wait_for_text("main", "was rejected")
    assert "<script>window.__pwned=1</script>" in banner
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    page.goto(serve.console + f"/commits/{sha}")
    text = page.page.inner_text("main")
    assert "REJECTED" in text
    assert "<script>window.__pwned=1</script>" in text
    assert "<script>window.__pwned=2</script>" in text
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    sources = page.page.eval_on_selector_all("script", "els => els.map(e => e.src)")
    assert sources == [serve.console + "/static/console.js"]
    # a job URL naming it: a 404 page that says it as text
    response = page.page.goto(serve.console + f"/jobs/{world.team}/" + HOSTILE_NAME[:300])
    assert response is not None and response.status == 404
    assert "<script>window.__pwned=2</script>" in page.page.inner_text("main")
    assert page.page.evaluate("typeof window.__pwned") == "undefined"
    assert [p for p in page.problems if "404" not in p] == []
    # nothing reached the cluster
    assert world.pods() == {}
