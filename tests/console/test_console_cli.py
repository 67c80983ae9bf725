"""`gitsched console` and `gitsched bench console` from the command line: usage errors are
one line and exit 2; the benchmark serves the console over HTTP and times every page."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from pathlib import Path

from tests.support.cluster_repo import gitsched, start_gitsched


def test_bad_listen_and_token_file_are_usage_errors(tmp_path: Path, demo_template: Path) -> None:
    run = gitsched("console", "--repo", demo_template, "--listen", "nowhere", expect=2)
    assert "--listen wants HOST:PORT" in run.stderr and "Traceback" not in run.stderr
    short = tmp_path / "token"
    short.write_text("tooshort\n")
    run = gitsched(
        "console", "--repo", demo_template, "--token-file", short, "--listen", "127.0.0.1:0",
        expect=2,
    )  # fmt: skip
    assert "at least 16 characters" in run.stderr
    run = gitsched("console", "--repo", demo_template, "--token-file", tmp_path / "none", expect=2)
    assert "cannot read --token-file" in run.stderr


def test_bench_console_times_every_page_over_http(tmp_path: Path) -> None:
    run = gitsched(
        "bench", "console", "--nodes", "12", "--jobs", "40", "--queues", "3", "--requests", "3",
        "--work-dir", tmp_path, "--format", "json", expect=0,
    )  # fmt: skip
    result = json.loads(run.stdout)
    assert result["nodes"] == 12 and result["jobs"] == 40
    assert result["running"] + result["pending"] <= 40 and result["running"] > 0
    pages = result["pages"]
    assert set(pages) >= {"overview", "queues", "queue", "jobs", "job", "changes", "commit"}
    assert all(p["requests"] == 3 and 0 < p["p50_ms"] <= p["p99_ms"] for p in pages.values())
    assert result["p99_ms"] == max(p["p99_ms"] for p in pages.values())
    assert result["goal_p99_ms"] == 200.0


def test_sigterm_with_a_live_page_open_exits_cleanly(demo: Path) -> None:
    port = _free_port()
    server = start_gitsched(
        "console", "--repo", demo, "--listen", f"127.0.0.1:{port}", "--no-plans"
    )
    try:
        deadline = time.monotonic() + 120
        stream = None
        while stream is None and time.monotonic() < deadline:
            assert server.poll() is None, server.communicate()
            try:
                stream = urllib.request.urlopen(f"http://127.0.0.1:{port}/events", timeout=60)
            except OSError:
                time.sleep(0.2)
        assert stream is not None, "the console did not answer"
        assert stream.readline().startswith(b"event: head")  # a live page's stream is open
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
        assert server.returncode == 0, stderr
        assert "Traceback" not in stderr and "ERROR" not in stderr
        stream.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
