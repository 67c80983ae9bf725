"""The real Prometheus the autoscaling tests talk to (started by scripts/prometheus, as
scripts/test does), and a small exporter each test controls: a `/metrics` page whose
text the test sets, which Prometheus scrapes every second once the test lists it in
the file_sd folder. A test without a Prometheus fails saying how to start one; it is
never skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

ENV_VAR = "GITSCHED_TEST_PROMETHEUS"
TARGETS_ENV_VAR = "GITSCHED_TEST_PROMETHEUS_TARGETS"
REPO_ROOT = Path(__file__).resolve().parents[2]
HOW_TO_START = (
    f"start the test server with `scripts/prometheus start` and run the tests with "
    f"{ENV_VAR}=http://127.0.0.1:29090 (the URL it prints) and "
    f"{TARGETS_ENV_VAR}=$(scripts/prometheus targets)"
)
# A busy 2-core CI machine: a scrape every second, but Prometheus may take a while to
# read a new target file and to scrape it.
DEADLINE_S = 60.0

T = TypeVar("T")


def prometheus_from_env() -> tuple[str, Path]:
    """The server's URL and its file_sd folder, or a failed test saying how to get them."""
    url = os.environ.get(ENV_VAR, "").strip().rstrip("/")
    if not url:
        pytest.fail(f"{ENV_VAR} is not set: this test needs a real Prometheus; {HOW_TO_START}")
    targets = os.environ.get(TARGETS_ENV_VAR, "").strip()
    folder = Path(targets) if targets else REPO_ROOT / ".cache" / "prometheus" / "targets"
    if not folder.is_dir():
        pytest.fail(
            f"{folder}: no file_sd folder for test targets ({TARGETS_ENV_VAR}); {HOW_TO_START}"
        )
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=10) as answer:
            if answer.status != 200:
                raise OSError(f"HTTP {answer.status}")
    except OSError as e:
        pytest.fail(f"no Prometheus answers at {url} ({ENV_VAR}): {e}; {HOW_TO_START}")
    return url, folder


class Exporter:
    """A `/metrics` page with the text the test sets (Prometheus' text format)."""

    def __init__(self) -> None:
        self._text = ""
        self._lock = threading.Lock()
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with exporter._lock:
                    body = exporter._text.encode()
                    exporter.scrapes += 1
                self.send_response(200 if self.path.startswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def set(self, text: str) -> None:
        with self._lock:
            self._text = text if text.endswith("\n") else text + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def scraped_exporter(targets: Path) -> Iterator[tuple[Exporter, str]]:
    """An exporter Prometheus scrapes, and a label value unique to this test (`test=`),
    so tests sharing the server never read each other's series."""
    exporter = Exporter()
    name = f"t{uuid.uuid4().hex[:12]}"
    file = targets / f"{name}.json"
    tmp = targets / f".{name}.tmp"
    tmp.write_text(json.dumps([{"targets": [exporter.address], "labels": {"test": name}}]))
    tmp.rename(file)  # file_sd must never read half a file
    try:
        yield exporter, name
    finally:
        file.unlink(missing_ok=True)
        exporter.close()


def query(url: str, promql: str) -> dict[str, Any]:
    """Prometheus' raw answer (the tests' own look, independent of the client under test)."""
    body = urllib.parse.urlencode({"query": promql}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=10) as answer:
        result: dict[str, Any] = json.load(answer)
    return result


def wait_for(what: str, check: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """The first non-None result of `check`, polled until the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while True:
        try:
            got = check()
        except Exception as e:  # the server may still be scraping: try again
            got, last = None, e
        if got is not None:
            return got
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline_s:.0f}s (last error: {last})")
        time.sleep(0.2)


def wait_for_series(url: str, promql: str, value: str, deadline_s: float = DEADLINE_S) -> None:
    """Wait until Prometheus answers `promql` with `value` (as its API writes it)."""

    def seen() -> bool | None:
        data = query(url, promql)["data"]
        result = data["result"]
        if data["resultType"] == "vector" and result and result[0]["value"][1] == value:
            return True
        return None

    wait_for(f"Prometheus answering {promql} = {value}", seen, deadline_s)
