"""What cluster/prometheus.py makes of answers a real Prometheus does not give: garbage,
an error status, a body too large, a server too slow, a 5xx. Each is a typed failure,
never a value. (tests/prometheus/ runs the client against a real server.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gitsched.cluster.prometheus import (
    MetricMissing,
    PrometheusAnswerInvalid,
    PrometheusClient,
    PrometheusUnavailable,
    parse_answer,
)


def vector(*values: str, at: float = 1764324000.5) -> bytes:
    result = [{"metric": {"pod": str(i)}, "value": [at, v]} for i, v in enumerate(values)]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


def test_a_vector_is_summed_at_its_evaluation_time() -> None:
    got = parse_answer("q", vector("12", "3.5"))
    assert (got.value, got.at, got.series, got.warning) == (15.5, 1764324000.5, 2, "")


def test_a_scalar_is_its_value() -> None:
    raw = json.dumps(
        {"status": "success", "data": {"resultType": "scalar", "result": [17.0, "4"]}}
    ).encode()
    got = parse_answer("q", raw)
    assert (got.value, got.at, got.series) == (4.0, 17.0, 1)


@pytest.mark.parametrize("bad", ["NaN", "-0.5", "+Inf", "-Inf"])
def test_one_bad_series_makes_the_whole_answer_ignored(bad: str) -> None:
    # A sum with a series left out would understate the load: the answer is ignored.
    got = parse_answer("q", vector("12", bad))
    assert got.value is None and "ignored" in got.warning and got.series == 2


def test_an_empty_vector_is_a_missing_value() -> None:
    with pytest.raises(MetricMissing):
        parse_answer("q", vector())


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"status": "error", "errorType": "bad_data", "error": "parse error"}', "bad_data"),
        (b'{"status": "success"}', "no data"),
        (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "'matrix'"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": {}}}', "list"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": [7]}}', "object"),
        (
            b'{"status": "success", "data": {"resultType": "vector", "result": [{"value": [1]}]}}',
            "expected",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"many"]}]}}',
            "not a number",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1,5]}]}}',
            "expected",
        ),
        (b'{"status":"success","data":{"resultType":"scalar","result":["x","1"]}}', "expected"),
    ],
)
def test_garbage_is_an_invalid_answer(raw: bytes, match: str) -> None:
    with pytest.raises(PrometheusAnswerInvalid, match=match):
        parse_answer("q", raw)


class FakeServer:
    """Not Prometheus: a server answering what a test tells it, the way broken proxies,
    overloaded servers and wrong URLs do."""

    def __init__(self, status: int, body: bytes, delay_s: float = 0.0, trickle: bool = False):
        self.requests = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if trickle:
                        for i in range(len(body)):
                            self.wfile.write(body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(0.05)
                    else:
                        self.wfile.write(body)
                except OSError:
                    pass  # the client gave up, as it should

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[FakeServer] = []

    def start(status: int, body: bytes, **kw: Any) -> FakeServer:
        servers.append(FakeServer(status, body, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_an_html_page_is_an_invalid_answer_and_not_retried(serve: Any) -> None:
    server = serve(200, b"<html>login</html>")
    sleeps: list[float] = []
    with pytest.raises(PrometheusAnswerInvalid, match="not JSON"):
        PrometheusClient(server.url, sleep=sleeps.append).query("up")
    assert server.requests == 1 and sleeps == []


def test_a_5xx_is_an_outage_retried_with_backoff(serve: Any) -> None:
    server = serve(503, b"overloaded")
    sleeps: list[float] = []
    with pytest.raises(PrometheusUnavailable, match="HTTP 503"):
        PrometheusClient(server.url, retries=2, backoff_s=0.1, sleep=sleeps.append).query("up")
    assert server.requests == 3 and sleeps == [0.1, 0.2]


def test_a_refusal_says_what_prometheus_said(serve: Any) -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"1:5: parse error"}'
    server = serve(400, body)
    with pytest.raises(PrometheusAnswerInvalid, match=r"HTTP 400.*parse error"):
        PrometheusClient(server.url).query("sum(")


def test_an_answer_larger_than_the_bound_is_refused(serve: Any) -> None:
    server = serve(200, vector(*["1"] * 5000))
    with pytest.raises(PrometheusAnswerInvalid, match="more than 4096 bytes"):
        PrometheusClient(server.url, max_bytes=4096).query("up")


def test_a_server_slower_than_the_timeout_is_unavailable(serve: Any) -> None:
    server = serve(200, vector("1"), delay_s=3.0)
    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable):
        PrometheusClient(server.url, timeout_s=0.5, retries=0).query("up")
    assert time.monotonic() - started < 2.5


def test_a_server_trickling_bytes_is_cut_off_at_the_deadline(serve: Any) -> None:
    # Each byte comes well within the per-read timeout; the whole answer does not.
    server = serve(200, vector("1"), trickle=True)
    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable, match="too slowly"):
        PrometheusClient(server.url, timeout_s=1.0, retries=0).query("up")
    assert time.monotonic() - started < 3.0


def test_only_an_http_url_is_a_prometheus_server() -> None:
    with pytest.raises(ValueError, match="not an http"):
        PrometheusClient("file:///etc/passwd")
