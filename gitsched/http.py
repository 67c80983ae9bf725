"""`gitsched serve`'s HTTP surface: /healthz, /readyz, /metrics and POST /webhook as a
Starlette app (`http_app`; the console's routes mount beside them), served by uvicorn
in a thread of the daemon (`HttpServer`).

The webhook is the one door open to the network, so nothing is read before the
signature is checked without a bound: the request head (uvicorn's h11 limit, and a
deadline for it here), the body (a Content-Length that must be given, be digits and be
at most MAX_WEBHOOK_BYTES, read under a deadline and never past the length), the
connections (uvicorn's limit_concurrency), and idle keep-alive connections.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from gitsched.webhook import MAX_WEBHOOK_BYTES, Webhook

log = logging.getLogger("gitsched.serve")

# A client has this long to send a request's line and headers, and again this long for a
# webhook's body: the git hosts send both in well under a second.
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's default)
# Connections and requests at once; past it uvicorn answers 503 (a scrape, a probe and a
# push need three; a hundred leaves room for the console's pages).
MAX_CONNECTIONS = 100
MAX_HEAD_BYTES = 16 * 1024  # request line and headers (h11's default, stated)
SHUTDOWN_GRACE_S = 3

_DIGITS = re.compile(r"[0-9]{1,12}")


class ServedDaemon(Protocol):
    """What the HTTP surface reads of the daemon (gitsched.serve.Daemon)."""

    webhook: Webhook | None
    ready: bool

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def webhook_deliveries(self) -> Counter: ...

    def alive(self) -> bool: ...

    def pushed(self, sha: str) -> None: ...


def _text(status: int, text: str, *, close: bool = False) -> Response:
    headers = {"Connection": "close"} if close else None
    return PlainTextResponse(text + "\n", status_code=status, headers=headers)


def http_app(
    daemon: ServedDaemon,
    extra_routes: Sequence[BaseRoute] = (),
    *,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> Starlette:
    """serve's routes, then `extra_routes` (Route or Mount objects, e.g. the console's)."""

    async def healthz(request: Request) -> Response:
        alive = daemon.alive()
        return _text(200 if alive else 503, "ok" if alive else "stalled")

    async def readyz(request: Request) -> Response:
        return _text(200 if daemon.ready else 503, "ok" if daemon.ready else "not ready")

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(daemon.registry), media_type=CONTENT_TYPE_LATEST)

    async def webhook(request: Request) -> Response:
        hook = daemon.webhook
        if hook is None:
            return _text(404, "no webhook: start gitsched serve with a webhook secret", close=True)
        outcome, response, body = await _bounded_body(request, body_timeout_s)
        if body is None:
            daemon.webhook_deliveries.labels(outcome).inc()
            client = request.client.host if request.client else "?"
            log.warning("webhook: %s from %s: %s", outcome, client, bytes(response.body).strip())
            return response
        headers = request.headers
        signature = hook.signature(body, headers)
        if signature is None:
            daemon.webhook_deliveries.labels("rejected").inc()
            client = request.client.host if request.client else "?"
            log.warning("webhook: a delivery without a valid signature, from %s", client)
            return _text(401, "missing or invalid signature", close=True)
        delivery = headers.get("X-GitHub-Delivery") or headers.get("X-Gitea-Delivery") or ""
        if not hook.deliveries.first_time(delivery, signature):
            daemon.webhook_deliveries.labels("replayed").inc()
            log.warning("webhook: delivery %s was delivered before; refused", delivery or "?")
            return _text(409, "already delivered")
        event = headers.get("X-GitHub-Event") or headers.get("X-Gitea-Event") or ""
        status, message, sha = hook.push(
            event, body, headers.get("Content-Type") or "application/json"
        )
        if sha is not None:
            log.info("webhook: push of %s to %s: passing now", sha or "?", hook.ref)
            daemon.pushed(sha)
        daemon.webhook_deliveries.labels(
            "accepted" if sha is not None else "ignored" if status < 300 else "invalid"
        ).inc()
        return _text(status, message)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/webhook", webhook, methods=["POST"]),
        *extra_routes,
    ]
    return Starlette(routes=routes)


async def _bounded_body(request: Request, timeout_s: float) -> tuple[str, Response, bytes | None]:
    """The body, read within every bound, or why not: (metric label, reply, None). A reply
    sent before the whole body was read closes the connection, so what is left unread is
    never read."""
    if "transfer-encoding" in request.headers:
        return "malformed", _text(411, "Content-Length required, not chunked", close=True), None
    lengths = request.headers.getlist("content-length")
    if not lengths:
        return "malformed", _text(411, "Content-Length required", close=True), None
    if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0]):
        return "malformed", _text(400, "Content-Length must be digits", close=True), None
    length = int(lengths[0])
    if length > MAX_WEBHOOK_BYTES:
        return "too_large", _text(413, "payload too large", close=True), None
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > length:
                    return "malformed", _text(400, "more body than its length", close=True), None
    except TimeoutError:
        return "timeout", _text(408, "the body came too slowly", close=True), None
    except ClientDisconnect:
        return "malformed", _text(400, "the client went away", close=True), None
    if len(body) != length:
        return "malformed", _text(400, "less body than its length", close=True), None
    return "", _text(200, ""), bytes(body)


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head: uvicorn's keep-alive
    timer restarts at every byte received, so a client trickling a header a byte at a time
    (slowloris) would hold its connection for ever."""

    head_timeout_s = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head arrived whole
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # the next request's head, on a kept-alive connection
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
                )
            self.transport.close()


class HttpServer:
    """uvicorn serving `app` from a thread of its own, on a socket bound at construction
    (so a port in use is the caller's error, not a thread's)."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        keep_alive_s: int = KEEP_ALIVE_S,
    ) -> None:
        host = host.strip("[]") or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=256)
        protocol = type("BoundedH11", (_BoundedH11,), {"head_timeout_s": head_timeout_s})
        config = uvicorn.Config(
            app,
            http=protocol,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            limit_concurrency=max_connections,
            timeout_keep_alive=keep_alive_s,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    @property
    def port(self) -> int:
        port: int = self.socket.getsockname()[1]
        return port

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        except BaseException:  # a thread's end is otherwise silent
            log.exception("the HTTP server stopped")
            raise

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(SHUTDOWN_GRACE_S + 1.0)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(timeout_s)
        self.socket.close()
