"""serve's real HTTP surface (gitsched.http on uvicorn) in a process of its own, for tests
that attack it over raw sockets and watch its memory: `python -m tests.support.http_target
SECRET_FILE [MAX_CONNECTIONS]` prints `port N` once it listens on 127.0.0.1 and serves until
stdin closes. The daemon behind it is a stand-in: these tests are about the door, not the
house (tests/kube/test_serve.py runs the real daemon)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from gitsched.http import HttpServer, http_app
from gitsched.metrics import Metrics
from gitsched.webhook import Webhook


class StandInDaemon:
    def __init__(self, webhook: Webhook) -> None:
        self.webhook: Webhook | None = webhook
        self.ready = True
        self.metrics = Metrics()
        self.pushes: list[str] = []
        self._lock = threading.Lock()

    @property
    def registry(self):  # type: ignore[no-untyped-def]
        return self.metrics.registry

    @property
    def webhook_deliveries(self):  # type: ignore[no-untyped-def]
        return self.metrics.webhooks

    def alive(self) -> bool:
        return True

    def pushed(self, sha: str) -> None:
        with self._lock:
            self.pushes.append(sha)
        # Seen by the test in the process's output.
        print(f"pushed {sha}", flush=True)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    secret = Path(sys.argv[1]).read_bytes().strip()
    max_connections = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    head_timeout_s = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    daemon = StandInDaemon(Webhook(secret, "main"))
    server = HttpServer(
        http_app(daemon, body_timeout_s=head_timeout_s),
        "127.0.0.1",
        0,
        max_connections=max_connections,
        head_timeout_s=head_timeout_s,
    )
    server.start()
    print(f"port {server.port}", flush=True)
    sys.stdin.read()  # until the test closes it
    server.stop()


if __name__ == "__main__":
    main()
