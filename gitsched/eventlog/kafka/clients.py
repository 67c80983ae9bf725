"""The settings every Kafka client of the log shares, and how one is closed.

Reader, writer and topic admin each open their own librdkafka client; they must
agree on brokers, socket timeout, reconnect back-off and where the client logs,
and a client must be closed without blocking an append past its budget.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from typing import Any

from confluent_kafka import Consumer, Producer


class _ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """librdkafka's own log lines, at DEBUG: it logs every failed connection
    attempt as an error, while the log reports what it could not do itself."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        self.logger.log(logging.DEBUG, msg, *args, **kwargs)


_LOG = _ClientLog(logging.getLogger("gitsched.kafka"), {})
# librdkafka backs off up to 10 s between reconnects by default; a log that must
# notice a broker coming back within one append's budget retries sooner.
_RECONNECT = {"reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000}


def client_config(bootstrap: list[str], topic: str, timeout_s: float, role: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": ",".join(bootstrap),
        "client.id": f"gitsched-{role}-{topic}",
        "socket.timeout.ms": max(1000, int(timeout_s * 1000)),
        "logger": _LOG,
        **_RECONNECT,
    }


def _close_quietly(client: Producer | Consumer) -> None:
    """Close a client without waiting on it.

    A producer's close() aborts its open transaction first, and waits for that
    without limit while the broker is away; an append must fail within its budget.
    So a producer drops what it still holds and is closed on a thread of its own,
    which ends when the broker answers, or when a newer writer's start fences it.
    """
    if isinstance(client, Producer):
        with contextlib.suppress(Exception):
            client.purge(in_queue=True, in_flight=True, blocking=False)
        threading.Thread(
            target=_close_now, args=(client,), name="gitsched-kafka-close", daemon=True
        ).start()
    else:
        _close_now(client)


def _close_now(client: Producer | Consumer) -> None:
    with warnings.catch_warnings():
        # "abort_transaction failed during close": the reason it was discarded.
        warnings.simplefilter("ignore", RuntimeWarning)
        with contextlib.suppress(Exception):  # best effort: the error that led here counts
            client.close()
