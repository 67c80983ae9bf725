"""Backends for the EventLog contract: every test runs once per backend.

`log_backend` is one fresh, empty log per test; `backend.open()` opens another
instance on that same log (a second writer, a reader, a restarted process).
Kafka runs against the real broker named by GITSCHED_TEST_KAFKA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from eventlog.base import (
    ConcurrencyConflict,
    EventLog,
    EventLogError,
    WriterFenced,
)
from tests.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic


class TickingClock:
    """A clock that moves one second per reading, so times are known and distinct."""

    def __init__(self, start: datetime = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        moment = self.now
        self.now += timedelta(seconds=1)
        return moment


class LogBackend:
    """One test's log in one backend, and the instances opened on it."""

    def __init__(
        self,
        name: str,
        opener: Callable[[TickingClock], EventLog],
        *,
        second_writer_error: type[EventLogError],
    ) -> None:
        self.name = name
        self.clock = TickingClock()
        self.second_writer_error = second_writer_error
        self._opener = opener
        self._opened: list[EventLog] = []

    def open(self) -> EventLog:
        log = self._opener(self.clock)
        self._opened.append(log)
        return log

    def close_all(self) -> None:
        for log in self._opened:
            log.close()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The test broker's address; the test fails (never skips) without one."""
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    return bootstrap


def _sqlite_backend(tmp_path: Path) -> LogBackend:
    from eventlog.sqlite import SQLiteEventLog

    path = tmp_path / "log.db"
    return LogBackend(
        "sqlite",
        lambda clock: SQLiteEventLog(path, clock=clock),
        # Two SQLite writers are not fenced: the second append finds a newer seq.
        second_writer_error=ConcurrencyConflict,
    )


def _kafka_backend(bootstrap: str, topics: list[str]) -> LogBackend:
    from eventlog.kafka import KafkaEventLog

    topic = unique_topic()
    topics.append(topic)
    return LogBackend(
        "kafka",
        lambda clock: KafkaEventLog(bootstrap.split(","), topic, clock=clock, timeout_s=20),
        second_writer_error=WriterFenced,
    )


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogBackend]:
    topics: list[str] = []
    bootstrap = ""
    if request.param == "sqlite":
        backend = _sqlite_backend(tmp_path)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        backend = _kafka_backend(bootstrap, topics)
    try:
        yield backend
    finally:
        backend.close_all()
        delete_topics(bootstrap, topics)


@pytest.fixture
def event_log(log_backend: LogBackend) -> EventLog:
    """A fresh, empty log in the backend under test."""
    return log_backend.open()
