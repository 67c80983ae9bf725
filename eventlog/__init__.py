"""The event log: the only source of truth for a cluster.

`open_log(url)` picks the backend from the URL: `sqlite:///path` (embedded,
the default) or `kafka://host:port[,host:port]/topic` (production).
"""

from __future__ import annotations

from eventlog.base import Clock, EventLog, LogConfigurationError, utc_now


def open_log(url: str, *, clock: Clock = utc_now) -> EventLog:
    if url.startswith("sqlite:"):
        from eventlog.sqlite import SQLiteEventLog

        return SQLiteEventLog.from_url(url, clock=clock)
    if url.startswith("kafka:"):
        from eventlog.kafka import KafkaEventLog

        return KafkaEventLog.from_url(url, clock=clock)
    raise LogConfigurationError(
        f"unknown log URL {url!r}: use sqlite:///path/to/log.db or kafka://host:port/topic"
    )
