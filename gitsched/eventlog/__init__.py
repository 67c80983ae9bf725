"""The event log: the only source of truth for a cluster.

`open_log(url)` picks the backend from the URL: `sqlite:///path` (embedded,
the default) or `kafka://host:port[,host:port]/topic` (production).
"""

from __future__ import annotations

from pathlib import Path

from gitsched.eventlog.base import Clock, EventLog, LogConfigurationError, utc_now


def open_log(
    url: str, *, clock: Clock = utc_now, create: bool = True, snapshot_dir: Path | None = None
) -> EventLog:
    """The log at `url`; with `create=False` a log that does not exist yet is an error,
    not a new empty one (for commands that only read, or copy from, a log).

    A SQLite log keeps its snapshots in its own file; a Kafka log keeps them in
    `snapshot_dir` (one folder per topic below it), or nowhere when it is None.
    """
    if url.startswith("sqlite:"):
        from gitsched.eventlog.sqlite import SQLiteEventLog, sqlite_path_from_url

        if not create and not sqlite_path_from_url(url).is_file():
            raise LogConfigurationError(f"no SQLite log at {sqlite_path_from_url(url)} ({url})")
        return SQLiteEventLog.from_url(url, clock=clock)
    if url.startswith("kafka:"):
        from gitsched.eventlog.kafka import KafkaEventLog

        try:
            kafka_log = KafkaEventLog.from_url(url, clock=clock, create_topic=create)
        except ValueError as e:
            raise LogConfigurationError(str(e)) from e
        if snapshot_dir is not None:
            from gitsched.eventlog.snapshot import FileSnapshotStore

            kafka_log.snapshot_store = FileSnapshotStore(snapshot_dir / kafka_log.topic)
        return kafka_log
    raise LogConfigurationError(
        f"unknown log URL {url!r}: use sqlite:///path/to/log.db or kafka://host:port/topic"
    )
