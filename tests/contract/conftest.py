"""Backends for the EventLog contract: every test runs once per backend.

`log_backend` is one fresh, empty log per test; `backend.open()` opens another
instance on that same log (a second writer, a reader, a restarted process).
Kafka runs against the real broker named by GITSCHED_TEST_KAFKA.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gitsched.eventlog.base import (
    EventLog,
)
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics
from tests.support.logs import LogBackend, kafka_backend, sqlite_backend


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The test broker's address; the test fails (never skips) without one."""
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    return bootstrap


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogBackend]:
    topics: list[str] = []
    bootstrap = ""
    if request.param == "sqlite":
        backend = sqlite_backend(tmp_path)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        backend = kafka_backend(bootstrap, topics)
    try:
        yield backend
    finally:
        backend.close_all()
        delete_topics(bootstrap, topics)


@pytest.fixture
def event_log(log_backend: LogBackend) -> EventLog:
    """A fresh, empty log in the backend under test."""
    return log_backend.open()
