"""The `EventLog` interface every backend implements, and the errors it raises.

One log per cluster, totally ordered, one writer at a time. Appends of one
batch are atomic; a batch whose ids are already in the log is a no-op, so a
writer that crashed before learning its append committed can simply retry.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gitsched.engine.errors import GitschedError, PermanentError, TemporaryError
from gitsched.eventlog.envelope import NewEvent, StoredEvent, verify_chain


class EventLogError(GitschedError):
    """Root of the log's errors, inside gitsched's one tree: each is also a TemporaryError
    (retry later) or a PermanentError (retrying will not help), but a conflict, which
    the writer resolves by reading the log again."""


class LogUnavailable(EventLogError, TemporaryError):
    """The backend cannot be reached now (broker down, file locked): retry later."""


class ConcurrencyConflict(EventLogError):
    """Another writer appended first: the expected last seq did not match."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(
            f"another writer appended to the log: expected last seq {expected}, found {actual}"
        )
        self.expected = expected
        self.actual = actual


class WriterFenced(EventLogError, PermanentError):
    """A newer writer for the same log has taken over; this one must stop."""


class DuplicateEvent(EventLogError, PermanentError):
    """Part of a batch is in the log already and part is not: the log and the writer disagree."""


class LogCorrupted(EventLogError, PermanentError):
    """What was read back breaks the envelope's invariants (seq gap, hash mismatch)."""

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


class LogConfigurationError(EventLogError, PermanentError):
    """The log exists with settings gitsched refuses (a Kafka topic with 3 partitions, ...)."""


Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def check_import(
    stored: Sequence[StoredEvent], *, last_seq: int, last_hash: str, expected_last_seq: int
) -> None:
    """Refuse a batch of sealed events that does not continue a log ending at (last_seq, last_hash)."""
    if last_seq != expected_last_seq:
        raise ConcurrencyConflict(expected_last_seq, last_seq)
    ids = [event.id for event in stored]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise DuplicateEvent(f"the batch holds event ids more than once: {twice[:5]}")
    broken = verify_chain(stored, expect_first_seq=last_seq + 1, prev_hash=last_hash)
    if broken is not None:
        raise LogCorrupted(f"seq {broken.seq}: {broken.reason}")


def already_imported(
    stored: Sequence[StoredEvent], present: dict[str, StoredEvent]
) -> list[StoredEvent] | None:
    """The stored copies if the log holds exactly this batch already, None if it holds none of it."""
    if not present:
        return None
    same = [present.get(e.id) for e in stored]
    if all(
        p is not None and p.seq == e.seq and p.hash == e.hash
        for p, e in zip(same, stored, strict=True)
    ):
        return [p for p in same if p is not None]
    raise DuplicateEvent(
        f"{len(present)} of {len(stored)} imported events are in the log already, "
        f"not all of them at the same seq with the same hash (e.g. {sorted(present)[0]!r})"
    )


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a snapshot covers: the state after event `seq`."""

    seq: int
    head_hash: str  # the hash of event `seq`: the chain's head the state was folded to
    last_time: str  # that event's time
    state_format: str
    digest: str
    size_bytes: int


class SnapshotStore(abc.ABC):
    """Where one log's snapshots are kept."""

    @abc.abstractmethod
    def save(self, info: SnapshotInfo, body: bytes) -> None:
        """Store a snapshot (replacing one at the same seq) and drop all but the newest few (eventlog.snapshot.KEEP)."""

    @abc.abstractmethod
    def infos(self) -> list[SnapshotInfo]:
        """Every stored snapshot, newest (highest seq) first."""

    @abc.abstractmethod
    def body(self, seq: int) -> bytes | None:
        """The bytes of the snapshot at `seq`, None if it is gone."""


class EventLog(abc.ABC):
    """A cluster's totally ordered, append-only, hash-chained event log."""

    # Whether `read(check_content=True)` checks every event it yields against its
    # chain (seq and link to the event before it, content hash), all but the first
    # one's link, which only the caller can check: a verifying replay then checks
    # that one link and nothing else.
    reads_checked: bool = False

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
    def import_events(
        self, stored: Sequence[StoredEvent], *, expected_last_seq: int
    ) -> list[StoredEvent]:
        """Append events sealed elsewhere (another log), atomically, exactly as they are.

        Seq, id, time and hashes are kept, so the log holds the same bytes as the
        one they were read from. The batch must continue the chain: its first
        seq is `expected_last_seq + 1`, its first `prev_hash` the hash of the
        log's last event, and every hash must match its content; otherwise
        LogCorrupted names the first event that does not fit. If the log holds
        the batch already (same seqs, same hashes) nothing is written and the
        stored copies are returned. Raises ConcurrencyConflict, WriterFenced and
        DuplicateEvent as `append` does.
        """

    @abc.abstractmethod
    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),
        check_content: bool = False,
    ) -> Iterator[StoredEvent]:
        """Stored events with after_seq < seq <= until_seq, in order.

        Events whose type is in `skip_data_of` come with empty `data` where the
        backend can avoid parsing it: a projection that never reads a type's
        payload should not pay for it. Their hashes cannot be re-checked then.
        `check_content` asks a backend that can check each event's content against
        its hash on the stored bytes (cheaper than re-encoding it) to do so, raising
        LogCorrupted: `reads_checked` says whether it does.
        """

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

    def snapshots(self) -> SnapshotStore | None:
        """Where this log's snapshots of the folded state are kept; None: nowhere."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has none."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
