"""The event log backends the contract tests run against: SQLite files and real Kafka topics."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gitsched.eventlog.base import (
    ConcurrencyConflict,
    EventLog,
    EventLogError,
    WriterFenced,
)
from gitsched.eventlog.envelope import (
    NewEvent,
)
from tests.support.kafka_broker import unique_topic


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


def sqlite_backend(tmp_path: Path) -> LogBackend:
    from gitsched.eventlog.sqlite import SQLiteEventLog

    path = tmp_path / "log.db"
    return LogBackend(
        "sqlite",
        lambda clock: SQLiteEventLog(path, clock=clock),
        # Two SQLite writers are not fenced: the second append finds a newer seq.
        second_writer_error=ConcurrencyConflict,
    )


def kafka_backend(bootstrap: str, topics: list[str]) -> LogBackend:
    from gitsched.eventlog.kafka import KafkaEventLog

    topic = unique_topic()
    topics.append(topic)
    return LogBackend(
        "kafka",
        lambda clock: KafkaEventLog(bootstrap.split(","), topic, clock=clock, timeout_s=20),
        second_writer_error=WriterFenced,
    )


def batch(*keys: str) -> list[NewEvent]:
    return [new_event(key) for key in keys]


def new_event(key: str, **data: Any) -> NewEvent:
    return NewEvent(
        id=f"commit-{key}",
        type="JobSubmitted",
        schema_version=1,
        data={"job": f"job-{key}", "replicas": 2, **data},
        actor="alice@example.com",
        cause=f"sha-{key}",
    )
