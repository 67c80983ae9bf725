"""The `EventLog` interface every backend implements, and the errors it raises.

One log per cluster, totally ordered, one writer at a time. Appends of one
batch are atomic; a batch whose ids are already in the log is a no-op, so a
writer that crashed before learning its append committed can simply retry.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

from eventlog.envelope import NewEvent, StoredEvent


class EventLogError(Exception):
    """Root of the log's errors. The CLI maps it onto gitsched's error tree."""


class LogUnavailable(EventLogError):
    """The backend cannot be reached now (broker down, file locked): retry later."""


class ConcurrencyConflict(EventLogError):
    """Another writer appended first: the expected last seq did not match."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(
            f"another writer appended to the log: expected last seq {expected}, found {actual}"
        )
        self.expected = expected
        self.actual = actual


class WriterFenced(EventLogError):
    """A newer writer for the same log has taken over; this one must stop."""


class DuplicateEvent(EventLogError):
    """Part of a batch is in the log already and part is not: the log and the writer disagree."""


class LogCorrupted(EventLogError):
    """What was read back breaks the envelope's invariants (seq gap, hash mismatch)."""


class LogConfigurationError(EventLogError):
    """The log exists with settings gitsched refuses (a Kafka topic with 3 partitions, ...)."""


Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventLog(abc.ABC):
    """A cluster's totally ordered, append-only, hash-chained event log."""

    @abc.abstractmethod
    def append(self, events: Sequence[NewEvent], *, expected_last_seq: int) -> list[StoredEvent]:
        """Append `events` atomically after `expected_last_seq`.

        Returns the stored events. If every id of the batch is already in the
        log, nothing is appended and the stored copies are returned (a retried
        append). Raises ConcurrencyConflict when the log's last seq is not
        `expected_last_seq`, WriterFenced when another writer took over, and
        DuplicateEvent when only some of the ids are present.
        """

    @abc.abstractmethod
    def read(self, after_seq: int = 0, *, until_seq: int | None = None) -> Iterator[StoredEvent]:
        """Stored events with after_seq < seq <= until_seq, in order."""

    @abc.abstractmethod
    def last_seq(self) -> int:
        """The seq of the newest event, 0 for an empty log."""

    @abc.abstractmethod
    def find(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        """The stored events among `event_ids` (for duplicate detection and look-ups)."""

    def last_event(self) -> StoredEvent | None:
        last = self.last_seq()
        if last == 0:
            return None
        for event in self.read(last - 1, until_seq=last):
            return event
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has none."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
