"""The console's services and workspaces page over a real reconciled repo that runs an
inference service and a workspace: each service's current/desired/min/max replicas, its
replicas with their nodes or why they wait, its last scaling decisions with their inputs,
the workspaces (one suspended when idle, with why); linked from the overview; text that
came from the log stays text."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.testclient import TestClient

from gitsched.console import console_app
from gitsched.engine import events as ev
from tests.support.console import HOSTILE, log_url
from tests.support.serving import (
    SCALED_AT,
    SERVICE_KEY,
    WORKSPACE_KEY,
    append_as_serve,
    service_yaml,
    serving_repo,
)


def client_for(repo: Path) -> TestClient:
    app = console_app(repo, log_url(repo), interval_s=0.2, first_wait_s=300.0, plans=False)
    return TestClient(app)


def cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_the_services_page_shows_counts_replicas_decisions_and_workspaces(
    tmp_path: Path,
) -> None:
    # a second service that asks for more than the cluster has: its replicas wait, saying why
    big = service_yaml("big", 4, 4).replace("gpu: 1,", "gpu: 8,") + "  priorityClass: low\n"
    repo = serving_repo(tmp_path / "cluster", extra_services={"teams/ml/services/big.yaml": big})
    with client_for(repo.path) as client:
        overview = client.get("/").text
        assert '<a href="/services">2 inference service(s) and 1 workspace(s)</a>' in overview
        page = client.get("/services")
        assert page.status_code == 200
        text = page.text
        chat = text[text.index(f"<h3>{SERVICE_KEY}</h3>") :]
        chat = chat[: chat.index("</article>")]
        counts = re.search(r'<table class="grid counts">.*?<tbody>(.*?)</tbody>', chat, re.S)
        assert counts
        # queue, current, desired, min, max, running, pending
        assert cells(counts.group(1)) == ["ml", "2", "2", "1", "3", "1", "0"]
        replicas = re.search(r'<table class="grid replicas">.*?<tbody>(.*?)</tbody>', chat, re.S)
        assert replicas
        rows = [cells(r) for r in re.findall(r"<tr>(.*?)</tr>", replicas.group(1), re.S)]
        assert [r[:2] for r in rows] == [["ml/chat.0", "running"], ["ml/chat.1", "placed"]]
        assert all(r[2].startswith("h100-") for r in rows)  # the node each replica is on
        assert 'href="/jobs/ml/chat.0"' in chat
        decisions = re.search(r'<table class="grid decisions">.*?<tbody>(.*?)</tbody>', chat, re.S)
        assert decisions
        (decision,) = [cells(r) for r in re.findall(r"<tr>(.*?)</tr>", decisions.group(1), re.S)]
        assert decision[1:] == [
            SCALED_AT,
            "scaled 1 -&gt; 2 (metric 12, target 5; bound by hpa)",
            "12",
            "5",
            "hpa",
        ]
        big_part = text[text.index("<h3>ml/big</h3>") :]
        big_part = big_part[: big_part.index("</article>")]
        waiting = re.findall(
            r"<tr><td><a [^>]*>ml/big\.\d</a></td><td>pending</td><td>(.*?)</td>", big_part
        )
        assert len(waiting) >= 1 and all("h100-80g" in why or "GPU" in why for why in waiting)
        assert "no scaling decision yet" in big_part

        workspaces = text[text.index('<section id="workspaces">') :]
        (row,) = re.findall(r"<tr><td><a [^>]*>ml/nb</a>.*?</tr>", workspaces, re.S)
        ws = cells(row)
        assert ws[0] == WORKSPACE_KEY and ws[1] == "ml" and ws[2] == "suspended (idle)"
        assert "idle" in ws[3] and "spec.resume" in ws[3]
        assert ws[4] >= "2025-11-16T10:30:00"


def test_text_from_the_log_stays_text_on_the_services_page(tmp_path: Path) -> None:
    repo = serving_repo(tmp_path / "cluster")
    hostile = ev.ServiceScaled(SERVICE_KEY, 2, 3, 30.0, 5.0, HOSTILE, "2025-11-16T10:10:00.000000Z")
    append_as_serve(repo, [hostile], "autoscaler/ml/chat/2")
    with client_for(repo.path) as client:
        text = client.get("/services").text
        assert "<script>window.__pwned" not in text and "<img src=x" not in text
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in text
        # the newest decision first
        assert text.index("scaled 2 -&gt; 3") < text.index("scaled 1 -&gt; 2")
