"""The console in process (Starlette's TestClient) over the demo repo: every page answers,
what it shows comes from the log, bad input gets 400/404/413, access is guarded when
asked, every response carries the Content-Security-Policy, hostile text stays text."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gitsched.audit.projection.vocabulary import CHECKS
from gitsched.console import ConsoleSource, console_app
from gitsched.console.app import CSP, MAX_BODY_BYTES, MAX_TARGET_BYTES
from tests.support.cluster_repo import gitsched
from tests.support.console import HOSTILE, HOSTILE_NAME, hostile_commit, log_url

PAGES = ["/", "/queues", "/queues/nlp", "/jobs", "/jobs/nlp/moe-gang", "/changes", "/pulls"]


def client_for(repo: Path, **options: object) -> TestClient:
    # A busy CI machine may take long to read the log the first time: wait for it.
    options.setdefault("first_wait_s", 300.0)
    app = console_app(repo, log_url(repo), interval_s=0.2, **options)  # type: ignore[arg-type]
    return TestClient(app)


def test_every_page_answers_with_the_csp_and_shows_the_log(demo: Path) -> None:
    with client_for(demo, plans=False) as client:
        for path in PAGES:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text[:500])
            assert response.headers["content-security-policy"] == CSP
            assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
            assert response.headers["x-content-type-options"] == "nosniff"
            # no inline script: every <script> has a src of the console's own
            for tag in re.findall(r"<script[^>]*>", response.text):
                assert 'src="/static/console.js"' in tag, tag
        static = client.get("/static/console.js")
        assert static.status_code == 200 and static.headers["content-security-policy"] == CSP
        overview = client.get("/").text
        # the demo's cluster as `gitsched state` folds it: 20 nodes, 144 GPUs, 8 jobs
        assert "20 nodes, 85 of 144 GPUs allocated; 8 jobs, 7 running, 1 pending" in overview
        assert 'title="GPU 0: nlp/llama-pretrain"' in overview
        queues = client.get("/queues").text
        # nlp borrows 16 H100 above its nominal 32; vision's unused 16 is what it lends
        nlp = '<td>h100-80g</td><td class="n">32</td><td class="n">16</td><td class="n">-</td>'
        assert nlp + '<td class="n">48</td><td class="n">16</td><td class="n">0.0</td>' in queues
        vision = '<td>h100-80g</td><td class="n">24</td><td class="n">16</td><td class="n">-</td>'
        assert vision + '<td class="n">8</td><td class="n">0</td><td class="n">16.0</td>' in queues
        jobs = client.get("/jobs?queue=vision&state=pending").text
        assert "vision/video-gen" in jobs and "vision/notebook" not in jobs
        assert "1 job(s)" in jobs


def test_a_job_page_has_its_spec_commit_reason_and_history(demo: Path) -> None:
    with client_for(demo, plans=False) as client:
        pending = client.get("/jobs/vision/video-gen").text
        assert "Why it waits" in pending and "cohort research shares 56 h100-80g GPUs" in pending
        assert "vision: video generation, 3x8 H100 on one NVLink domain" in pending
        assert "Ana Souza &lt;ana@vision.example&gt;" in pending
        assert "required nvlink" in pending
        moved = client.get("/jobs/nlp/moe-gang").text
        # pending for its quota, then admitted by the commit that raised the borrowing limit
        history = moved[moved.index('id="history"') :]
        assert history.index("pending") < history.index("admitted")
        assert "nominal 32 + borrowing limit 8 allows 40" in history
        assert "h100-a-07" in moved and "<th>replica</th>" in moved


def test_changes_list_commits_what_they_moved_and_compliance(demo: Path) -> None:
    with client_for(demo, plans=False) as client:
        page = client.get("/changes").text
        assert "Raise nlp&#39;s H100 borrowing limit to 16" in page
        assert "queue nlp: h100-80g borrowing limit 8 -&gt; 16" in page
        assert 'admitted <a href="/jobs/nlp/moe-gang">nlp/moe-gang</a>' in page
        assert "Li Wei &lt;li@nlp.example&gt;" in page  # the approver
        assert page.count("<b>PASS</b>") == len(CHECKS)  # every control passes
        sha = re.search(r'href="/commits/([0-9a-f]{40})">[0-9a-f]{12}</a><br><b>rejected', page)
        assert sha is not None, "the demo's rejected commit is listed as rejected"
        rejected = client.get(f"/commits/{sha.group(1)[:10]}").text
        assert "REJECTED" in rejected and "vision: add ViT hyper-parameter sweep" in rejected


def test_open_pull_requests_show_the_plan_of_merging(demo: Path) -> None:
    source = ConsoleSource(demo, log_url(demo), interval_s=60.0, first_wait_s=300.0)
    with TestClient(console_app(demo, log_url(demo), source=source)) as client:
        source.refresh_plans()  # what the plan thread does, here at once
        page = client.get("/pulls").text
        assert "pr/vision-quota" in page
        assert "1 admitted, 1 preempted" in page
        assert "nlp/moe-gang" in page and "preempted" in page
        expected = gitsched("plan", "--repo", demo, "..pr/vision-quota", expect=1).stdout
        # the page's whole plan is `gitsched plan`'s text, escaped
        assert expected.splitlines()[3].replace("'", "&#39;") in page


def test_missing_things_are_404_pages_and_bad_parameters_400(demo: Path) -> None:
    with client_for(demo, plans=False) as client:
        for path in (
            "/jobs/vision/no-such-job",
            "/queues/no-such-queue",
            "/commits/0123456789abcdef",
            "/commits/not-a-sha",
            "/no/such/page",
        ):
            response = client.get(path)
            assert response.status_code == 404, path
            assert "<h1>404" in response.text and "Traceback" not in response.text
            assert response.headers["content-security-policy"] == CSP
        for query in (
            "state=bogus",
            "page=0",
            "page=abc",
            "page=99",
            "colour=red",
            "team=a&team=b",
        ):
            response = client.get(f"/jobs?{query}")
            assert response.status_code == 400, query
            assert "<h1>400" in response.text
        assert client.get("/changes?before=-1").status_code == 400
        assert client.get("/?x=1").status_code == 400
        # read-only: nothing but GET (and HEAD) on a page
        response = client.post("/jobs")
        assert response.status_code == 405 and "GET" in response.headers["allow"]
        assert response.headers["content-security-policy"] == CSP


def test_oversized_requests_get_413(demo: Path) -> None:
    with client_for(demo, plans=False) as client:
        long_query = "/jobs?team=" + "a" * (MAX_TARGET_BYTES + 10)
        assert client.get(long_query).status_code == 413
        body = b"token=" + b"a" * (MAX_BODY_BYTES + 1)
        response = client.post("/login", content=body)
        assert response.status_code == 413
        assert response.headers["content-security-policy"] == CSP
        # chunked, no Content-Length: still cut at the limit
        chunks = (b"a" * 4096 for _ in range(MAX_BODY_BYTES // 4096 + 2))
        response = client.post(
            "/login", content=chunks, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert response.status_code == 413
        assert client.get("/").status_code == 200  # and the console goes on answering


def test_a_token_guards_every_page(demo: Path) -> None:
    token = "s3cret-token-0123456789"
    with client_for(demo, plans=False, token=token) as client:
        for path in PAGES:
            response = client.get(path)
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.headers["content-security-policy"] == CSP
            assert "nlp/moe-gang" not in response.text
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"X-Forwarded-User": "eve"}).status_code == 401
        ok = client.get("/jobs/nlp/moe-gang", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        # the sign-in form sets an HttpOnly, SameSite=Strict cookie holding the token
        signed = client.post("/login", data={"token": token}, follow_redirects=False)
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert client.get("/queues").status_code == 200


def test_behind_oauth2_proxy_the_forwarded_user_is_let_in(demo: Path) -> None:
    with client_for(demo, plans=False, trust_forwarded_user=True) as client:
        assert client.get("/").status_code == 401
        page = client.get("/", headers={"X-Forwarded-User": "<b>kai</b>@vision.example"})
        assert page.status_code == 200
        assert "&lt;b&gt;kai&lt;/b&gt;@vision.example" in page.text


def test_hostile_text_is_escaped(demo: Path) -> None:
    sha = hostile_commit(demo)
    with client_for(demo, plans=False) as client:
        for path in ("/changes", f"/commits/{sha}", "/"):
            page = client.get(path).text
            assert "<script>window.__pwned" not in page, path
            assert "<img src=x" not in page, path
        commit = client.get(f"/commits/{sha}").text
        assert (
            "&lt;script&gt;window.__pwned=1&lt;/script&gt; &#34;double&#34; &#39;single&#39;"
            in commit
        )
        assert "Mallory O&#39;Brien &amp; &#34;co" in commit
        # the findings name the hostile job, as text
        assert "&lt;script&gt;window.__pwned=2&lt;/script&gt;" in commit
        # a URL naming it is a 404 page that says the name as text
        response = client.get("/jobs/vision/" + HOSTILE_NAME[:200].replace("/", "%2F"))
        assert response.status_code == 404
        assert "<script>window.__pwned" not in response.text
        assert HOSTILE[:8] not in response.text


def test_an_unreachable_log_is_said_on_the_page(tmp_path: Path, demo: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'gone' / 'log.db'}"
    with client_for(demo, plans=False) as client:
        assert client.get("/jobs/nlp/moe-gang").status_code == 200
    app = console_app(demo, missing, plans=False, interval_s=0.2, first_wait_s=300.0)
    with TestClient(app) as client:
        for path in ("/", "/jobs", "/changes", "/queues"):
            response = client.get(path)
            assert response.status_code == 200, path
            assert "cannot be read" in response.text and "no event log at" in response.text
        # never read: whether the job exists cannot be said
        response = client.get("/jobs/nlp/moe-gang")
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert "has not read the log yet" in response.text


def test_a_log_slow_to_answer_does_not_hold_the_pages(demo: Path) -> None:
    """A first read that takes longer than the console waits (a broker that does not
    answer): pages answer at once and say so, then follow once it is read."""
    source = ConsoleSource(demo, log_url(demo), plans=False, interval_s=0.2, first_wait_s=0.0)
    gate = threading.Event()
    read = source.refresh

    def slow_refresh() -> None:
        gate.wait(120)
        read()

    source.refresh = slow_refresh  # type: ignore[method-assign]
    with TestClient(console_app(demo, log_url(demo), source=source)) as client:
        page = client.get("/")
        assert page.status_code == 200 and "for the first time" in page.text
        assert client.get("/jobs/nlp/moe-gang").status_code == 503
        gate.set()
        deadline = time.monotonic() + 120
        while not source.loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "20 nodes, 85 of 144 GPUs" in client.get("/").text
        assert client.get("/jobs/nlp/moe-gang").status_code == 200


def test_mounted_under_a_prefix_in_another_app(demo: Path) -> None:
    """As serve mounts it: its links, its script and its guard follow the prefix."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    console = console_app(
        demo, log_url(demo), plans=False, token="t0ken-0123456789abcdef", first_wait_s=300.0
    )
    host = Starlette(
        routes=[
            Route("/healthz", lambda request: PlainTextResponse("ok")),
            Mount("/console", app=console),
        ]
    )
    try:
        with TestClient(host) as client:
            assert client.get("/healthz").text == "ok"  # the host's own routes: no guard
            assert client.get("/console/").status_code == 401
            auth = {"Authorization": "Bearer t0ken-0123456789abcdef"}
            page = client.get("/console/jobs", headers=auth)
            assert page.status_code == 200
            assert page.headers["content-security-policy"] == CSP
            assert 'src="/console/static/console.js"' in page.text
            assert 'href="/console/jobs/nlp/moe-gang"' in page.text
            assert client.get("/console/static/console.js").status_code == 200
            assert client.get("/console/jobs/nlp/nothing", headers=auth).status_code == 404
            assert client.get("/console/login").status_code == 401  # the sign-in form
    finally:
        assert console.source is not None
        console.source.stop()


@pytest.mark.slow
def test_a_broker_that_is_not_there_is_said_on_the_page(demo: Path) -> None:
    """No broker listens on port 9 here: each read of the log fails after the Kafka client's
    timeout. Pages answer meanwhile, then say the log cannot be read."""
    app = console_app(demo, "kafka://127.0.0.1:9/nothing", plans=False, first_wait_s=0.0)
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200 and "kafka://127.0.0.1:9/nothing" in page.text
        assert client.get("/jobs/vision/video-gen").status_code == 503
        deadline = time.monotonic() + 300
        while "cannot be read" not in page.text and time.monotonic() < deadline:
            time.sleep(0.5)
            page = client.get("/")
            assert page.status_code == 200
        assert "cannot be read" in page.text and "Kafka" in page.text


def test_an_open_console_answers_only_to_its_loopback_names(demo: Path) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends
    Host: evil.example; the open console (what `gitsched console` serves) refuses it."""
    from gitsched.console.app import LOOPBACK_HOSTS

    with client_for(demo, plans=False, allowed_hosts=LOOPBACK_HOSTS) as client:
        for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example"):
            response = client.get("/", headers={"host": host})
            assert response.status_code == 400, host
            assert response.headers["content-security-policy"] == CSP
            assert "nlp/" not in response.text
        for host in ("127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"):
            assert client.get("/", headers={"host": host}).status_code == 200, host
