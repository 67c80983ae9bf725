"""Every Kubernetes API request is bounded: an API server that accepts a connection and never
answers (a connection dropped on the way) costs a pass its read timeout, not the pass."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from gitsched.cluster.api import ClusterUnavailable, KubeApi
from gitsched.cluster.lease import LeaderElector

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: silent
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: nobody
  user: {{token: "t"}}
contexts:
- name: silent
  context: {{cluster: silent, user: nobody}}
current-context: silent
"""


@pytest.fixture
def silent_server(tmp_path: Path) -> object:
    """A kubeconfig for a server that accepts every connection and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(port=listener.getsockname()[1]))
    yield path
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def _within(seconds: float, call: object) -> BaseException | None:
    """What `call()` raised, asserting it returned within `seconds` (run aside, so a
    request that hangs fails the test instead of holding it)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as e:  # handed to the test
            caught.append(e)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the request still hangs after {seconds}s"
    assert time.monotonic() - started < seconds
    return caught[0] if caught else None


def test_a_request_the_server_never_answers_ends_at_the_read_timeout(silent_server: Path) -> None:
    api = KubeApi.connect(str(silent_server), request_timeout_s=(1.0, 1.0))
    started = time.monotonic()
    error = _within(10, lambda: api.list("pods"))
    assert time.monotonic() - started < 1 + 1  # once: a request not answered is not resent
    assert isinstance(error, ClusterUnavailable), error
    assert "list pods" in str(error)


def test_a_lease_round_on_a_silent_server_ends_within_the_renew_deadline(
    silent_server: Path,
) -> None:
    # The round's requests share its renew deadline (2 s), shorter than the default bound,
    # as client-go's round shares one context deadline.
    api = KubeApi.connect(str(silent_server))
    elector = LeaderElector(api, "default", "silent", "me", lease_duration_s=3)
    started = time.monotonic()
    assert _within(10, elector.try_acquire_or_renew) is None
    assert time.monotonic() - started < 2 + 1
    assert not elector.is_leader and not elector.reached_api
