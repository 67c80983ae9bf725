"""serve's HTTP door under attack (issue 32 item 8): the real server (gitsched.http on
uvicorn, in a process of its own) and raw sockets sending what a hostile client sends —
malformed and missing lengths, a gigabyte announced or streamed, a body longer than its
length, a slowloris, a flood of connections, a replayed signed delivery. Each is answered
with its status before any unbounded read, and the server's memory stays bounded."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitsched.webhook import MAX_WEBHOOK_BYTES
from tests.support.kube import wait_for

SECRET = b"hook-secret"
TIMEOUT_S = 2.0  # the target's head and body deadlines (10 s in the product)
GENEROUS_S = 30.0  # how long a busy 2-core machine may take to do anything


@dataclass
class Target:
    process: subprocess.Popen[str]
    port: int

    def rss_kib(self) -> int:
        return self._status("VmRSS")

    def threads(self) -> int:
        return self._status("Threads")

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.process.pid}/status")


def _start(tmp_path: Path, max_connections: int = 100) -> Iterator[Target]:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.http_target",
            str(secret_file),
            str(max_connections),
            str(TIMEOUT_S),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "server.log").open("w"),  # a pipe nobody drains would block it
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    first = process.stdout.readline()
    assert first.startswith("port "), (tmp_path / "server.log").read_text()
    try:
        yield Target(process, int(first.split()[1]))
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=GENEROUS_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail("the HTTP server did not stop within 30 s of being told")


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    yield from _start(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    yield from _start(tmp_path_factory.mktemp("http"))


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)
    s.settimeout(GENEROUS_S)
    return s


def _read_reply(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection, which it must."""
    chunks = []
    deadline = time.monotonic() + GENEROUS_S
    s.settimeout(1.0)
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                pytest.fail(f"the server held the connection open for {GENEROUS_S}s: {chunks}")
            continue
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _status(reply: bytes) -> int:
    line = reply.split(b"\r\n", 1)[0]
    assert line.startswith(b"HTTP/1.1 "), reply[:200]
    return int(line.split()[1])


def _head(length: str | None, extra: str = "") -> bytes:
    lines = ["POST /webhook HTTP/1.1", "Host: gitsched", "X-GitHub-Event: push"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def _signed(body: bytes, delivery: str) -> bytes:
    signature = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    extra = (
        f"X-Hub-Signature-256: {signature}\r\nX-GitHub-Delivery: {delivery}\r\n"
        "Connection: close\r\n"
    )
    return _head(str(len(body)), extra) + body


def _exchange(port: int, data: bytes) -> bytes:
    with _connect(port) as s:
        s.sendall(data)
        return _read_reply(s)


def _metric(port: int, name: str) -> float | None:
    reply = _exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _status(reply) == 200
    for line in reply.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _settled_rss(target: Target) -> int:
    """RSS once the server has warmed up (every route served once)."""
    for _ in range(3):
        _exchange(target.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _exchange(target.port, _head("2") + b"{}")
    return target.rss_kib()


@pytest.mark.parametrize(
    ("length", "status"),
    [
        ("-1", 400),
        ("abc", 400),
        ("1_000", 400),
        ("+10", 400),
        ("1e3", 400),
        ("0x10", 400),
        (None, 411),
        (str(MAX_WEBHOOK_BYTES + 1), 413),
        (str(1024**3), 413),
        ("9" * 40, 400),
    ],
)
def test_a_bad_length_is_answered_before_any_body_is_read(
    shared: Target, length: str | None, status: int
) -> None:
    # Only the head is sent: the answer must not wait for a body.
    with _connect(shared.port) as s:
        s.sendall(_head(length))
        reply = _read_reply(s)
    assert _status(reply) == status  # and the connection closed (_read_reply waits for it)


def test_a_chunked_body_without_length_is_refused(target: Target) -> None:
    reply = _exchange(
        target.port, _head(None, "Transfer-Encoding: chunked\r\n") + b"5\r\nhello\r\n0\r\n\r\n"
    )
    assert _status(reply) == 411


def test_a_gigabyte_stream_costs_the_server_nothing(target: Target) -> None:
    before = _settled_rss(target)
    chunk = b"x" * 65536
    # Announced as 1 GiB: refused at once; the stream behind it is cut with the connection.
    for _ in range(3):
        with _connect(target.port) as s:
            s.sendall(_head(str(1024**3)))
            sent = 0
            try:
                while sent < 64 * 1024**2:
                    s.sendall(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            reply = _read_reply(s)
        assert _status(reply) == 413
        assert sent < 64 * 1024**2, "the server kept reading a body it had refused"
    # Announced as -1 (read "until the client closes" by the server this replaced).
    with _connect(target.port) as s:
        s.sendall(_head("-1"))
        try:
            for _ in range(256):
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _status(_read_reply(s)) == 400
    # The largest body allowed, three at once, unsigned: read (it is within the bound), refused.
    body = b"y" * MAX_WEBHOOK_BYTES
    sockets = [_connect(target.port) for _ in range(3)]
    for s in sockets:
        s.sendall(_head(str(len(body))) + body)
    for s in sockets:
        assert _status(_read_reply(s)) == 401
        s.close()
    after = target.rss_kib()
    # Three 5 MiB bodies were held at once at most; a gigabyte would show.
    assert after - before < 48 * 1024, f"RSS grew from {before} KiB to {after} KiB"
    assert _metric(target.port, 'gitsched_webhook_deliveries_total{result="too_large"}') == 3


def test_a_body_longer_than_its_length_is_cut_at_the_length(target: Target) -> None:
    ping = b'{"zen": "Keep it logically awesome."}'
    signature = "sha256=" + hmac.new(SECRET, ping, hashlib.sha256).hexdigest()
    head = (
        "POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\n"
        f"X-Hub-Signature-256: {signature}\r\nX-GitHub-Delivery: long-1\r\n"
        f"Content-Length: {len(ping)}\r\n\r\n"
    ).encode()
    before = _settled_rss(target)
    with _connect(target.port) as s:
        s.sendall(head + ping)
        try:  # what follows the declared length is not the body: never read as one
            for _ in range(64):
                s.sendall(b"z" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = _read_reply(s)
    # The signed body of the declared length was judged alone: its signature held.
    assert _status(reply) == 200 and b"pong" in reply
    # The rest was taken for a next request and refused as one (no headers end in 4 MB).
    assert reply.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 400" in reply
    assert target.rss_kib() - before < 16 * 1024


def test_a_slow_client_is_cut_off(target: Target) -> None:
    # Slowloris: a head trickled a byte at a time never ends; the head has a deadline.
    started = time.monotonic()
    with _connect(target.port) as s:
        s.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.settimeout(0.5)
        closed = False
        while not closed and time.monotonic() - started < GENEROUS_S:
            try:
                s.sendall(b"X")
                s.recv(4096)  # the 408, or b"" at the close
                closed = True
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
    elapsed = time.monotonic() - started
    assert closed, "a trickled head held the connection for 30 s"
    assert elapsed >= TIMEOUT_S * 0.9

    # A body trickled after a whole head: 408 at the body's deadline.
    started = time.monotonic()
    with _connect(target.port) as s:
        s.sendall(_head("100") + b"{")
        reply = _read_reply(s)
    assert _status(reply) == 408
    assert TIMEOUT_S * 0.9 <= time.monotonic() - started < GENEROUS_S


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Target]:
    yield from _start(tmp_path, max_connections=20)


def test_many_connections_are_capped_and_cost_no_thread_each(capped: Target) -> None:
    threads = capped.threads()
    held = [_connect(capped.port) for _ in range(200)]
    try:
        for s in held[:100]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # heads never finished
        # Past the cap a request is answered 503 at once, not queued behind the others.
        reply = _exchange(
            capped.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert _status(reply) == 503
        # An event loop, not a thread per connection (the old server: 3,002 for 3,000).
        assert capped.threads() <= threads + 2
        # Each held connection, idle or with half a head, is cut at the head's deadline.
        for s in held:
            reply = _read_reply(s)
            assert reply == b"" or _status(reply) == 408
    finally:
        for s in held:
            s.close()
    # With them gone the server answers again.
    wait_for(
        "the server to answer once the held connections are gone",
        lambda: (
            _status(
                _exchange(
                    capped.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
            )
            == 200
        ),
        timeout_s=GENEROUS_S,
    )


def test_a_replayed_signed_delivery_is_refused(target: Target) -> None:
    push = json.dumps({"ref": "refs/heads/main", "after": "a" * 40}).encode()
    first = _exchange(target.port, _signed(push, "delivery-1"))
    assert _status(first) == 202 and b"reconciling" in first
    # The same delivery again, the same body under a new id (the id is not signed), and
    # another body under the used id: each refused with 409, and no second pass asked.
    for data in (
        _signed(push, "delivery-1"),
        _signed(push, "delivery-2"),
        _signed(push.replace(b"a" * 40, b"b" * 40), "delivery-1"),
    ):
        reply = _exchange(target.port, data)
        assert _status(reply) == 409, reply
    fresh = _exchange(target.port, _signed(push.replace(b"a" * 40, b"c" * 40), "delivery-3"))
    assert _status(fresh) == 202
    assert _metric(target.port, 'gitsched_webhook_deliveries_total{result="replayed"}') == 3
    assert _metric(target.port, 'gitsched_webhook_deliveries_total{result="accepted"}') == 2
    out, _ = target.process.communicate(input="", timeout=GENEROUS_S)
    assert [line for line in out.splitlines() if line.startswith("pushed")] == [
        f"pushed {'a' * 40}",
        f"pushed {'c' * 40}",
    ]


def test_other_routes_mount_beside_serves_own(tmp_path: Path) -> None:
    """The console (or anything else) mounts on serve's app and server: one port."""
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from gitsched.http import HttpServer, http_app
    from gitsched.webhook import Webhook
    from tests.support.http_target import StandInDaemon

    async def hello(request: Request) -> Response:
        return PlainTextResponse("console\n")

    daemon = StandInDaemon(Webhook(SECRET, "main"))
    daemon.ready = False
    server = HttpServer(http_app(daemon, [Route("/console", hello)]), "127.0.0.1", 0)
    server.start()
    try:
        get = b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert _exchange(server.port, get % b"/console").endswith(b"\r\n\r\nconsole\n")
        assert _status(_exchange(server.port, get % b"/readyz")) == 503
        assert _status(_exchange(server.port, get % b"/healthz")) == 200
        assert _status(_exchange(server.port, get % b"/nowhere")) == 404
    finally:
        server.stop()
    # Stopped: the port is given back.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
