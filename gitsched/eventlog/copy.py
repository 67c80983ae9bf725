"""Moving a whole log from one backend to another, byte for byte.

Migrating a cluster from the embedded SQLite log to Kafka (or back, or to a new
topic) must keep every envelope as it is, or `audit verify` and every id and
hash quoted in a report would stop meaning anything. The source's chain is
verified as it is read; nothing after a break is copied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gitsched.eventlog.base import EventLog, EventLogError, LogCorrupted
from gitsched.eventlog.envelope import GENESIS_HASH, StoredEvent, verify_chain

# Events per target transaction. The source's own append batches (events sealed
# with one `time`) are never split across two, so a copy interrupted half-way
# leaves whole commits behind it, as the source had them (unless one append of
# the source is more than _MAX_SPLIT chunks long: then memory wins).
DEFAULT_CHUNK = 2000
_MAX_SPLIT = 8


class CopyRefused(EventLogError):
    """The target holds events that are not the start of the source: copying would mix two logs."""


@dataclass(frozen=True, slots=True)
class CopyProgress:
    copied: int
    resumed_from: int
    source_last_seq: int

    @property
    def at_seq(self) -> int:
        return self.resumed_from + self.copied


@dataclass(frozen=True, slots=True)
class CopyResult:
    copied: int
    resumed_from: int
    last_seq: int
    head_hash: str | None


def copy_log(
    source: EventLog,
    target: EventLog,
    *,
    chunk: int = DEFAULT_CHUNK,
    progress: Callable[[CopyProgress], None] | None = None,
) -> CopyResult:
    """Copy every event of `source` that `target` lacks; `target` must be empty or a prefix.

    Raises CopyRefused when the target is not a prefix of the source, and
    LogCorrupted (naming the seq) when the source's chain is broken.
    """
    if chunk < 1:
        raise ValueError("chunk must be at least 1")
    source_last = source.last_seq()
    resumed_from, prev_hash = _common_prefix(source, target, source_last)
    checked = _verified(source.read(resumed_from), first_seq=resumed_from + 1, prev_hash=prev_hash)
    copied = 0
    last_seq, head_hash = resumed_from, (prev_hash if resumed_from else None)
    for batch in _chunks(checked, chunk):
        target.import_events(batch, expected_last_seq=last_seq)
        copied += len(batch)
        last_seq, head_hash = batch[-1].seq, batch[-1].hash
        if progress is not None:
            progress(CopyProgress(copied, resumed_from, max(source_last, last_seq)))
    return CopyResult(copied, resumed_from, last_seq, head_hash)


def _common_prefix(source: EventLog, target: EventLog, source_last: int) -> tuple[int, str]:
    """How far the target already is, after checking it holds exactly the source's first events."""
    target_last = target.last_seq()
    if target_last == 0:
        return 0, GENESIS_HASH
    if target_last > source_last:
        raise CopyRefused(
            f"the target holds {target_last} events, more than the source's {source_last}: "
            "it is not a copy of this source"
        )
    prev_hash = GENESIS_HASH
    theirs = _verified(source.read(0, until_seq=target_last), first_seq=1, prev_hash=GENESIS_HASH)
    ours = _readable(target.read(0, until_seq=target_last), "the target")
    for expected, found in zip(theirs, ours, strict=False):
        if found.to_record() != expected.to_record():
            raise CopyRefused(
                f"the target is not empty and differs from the source at seq {expected.seq} "
                f"(target id {found.id!r}, source id {expected.id!r}): copy into an empty log"
            )
        prev_hash = expected.hash
    return target_last, prev_hash


def _verified(
    events: Iterable[StoredEvent], *, first_seq: int, prev_hash: str
) -> Iterator[StoredEvent]:
    """The source's events, each checked against the chain before it is handed on."""
    expected = first_seq
    for event in _readable(events, "the source"):
        broken = verify_chain([event], expect_first_seq=expected, prev_hash=prev_hash)
        if broken is not None:
            raise LogCorrupted(
                f"the source's chain is broken at seq {broken.seq}: {broken.reason}; "
                f"nothing from seq {broken.seq} on was copied"
            )
        prev_hash = event.hash
        expected += 1
        yield event


def _readable(events: Iterable[StoredEvent], which: str) -> Iterator[StoredEvent]:
    """Events as read, with a row that does not even parse reported as corruption, not a crash."""
    iterator = iter(events)
    last = 0
    while True:
        try:
            event = next(iterator)
        except StopIteration:
            return
        except (ValueError, TypeError, KeyError) as error:
            raise LogCorrupted(
                f"{which}'s event after seq {last} cannot be read: {error}; "
                f"nothing from seq {last + 1} on was copied"
            ) from error
        last = event.seq
        yield event


def _chunks(events: Iterable[StoredEvent], size: int) -> Iterator[list[StoredEvent]]:
    """Batches of about `size` events that never split one of the source's own appends."""
    batch: list[StoredEvent] = []
    for event in events:
        if len(batch) >= size and (event.time != batch[-1].time or len(batch) >= _MAX_SPLIT * size):
            yield batch
            batch = []
        batch.append(event)
    if batch:
        yield batch
