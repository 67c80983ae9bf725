"""The log's reading side: the tail, and any older range, read only as asked.

Opening a log finds its tail by reading back from the end (a year of a busy
cluster is tens of millions of records); a follower keeps up from there and
holds the newest events. An older range is read from its own offset, found by a
search over the topic, and every record read is checked against the chain. Kept
apart from the writer because it is what every reader runs, writer or not.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from gitsched.eventlog.base import EventLogError, LogCorrupted, LogUnavailable
from gitsched.eventlog.collector import collector_paused
from gitsched.eventlog.envelope import GENESIS_HASH, StoredEvent, record_hash_holds, verify_chain
from gitsched.eventlog.kafka.clients import _close_quietly, client_config
from gitsched.eventlog.kafka.errors import _AppendTimeout, _raise_error, _s_left, _translate
from gitsched.eventlog.kafka.topic import PARTITION

# What an instance holds of the topic: the newest events, decoded (a reconciler
# reads back its own appends from them), and the ids it has met, for duplicate
# checks. Everything older is read from the topic when asked for.
RECENT_EVENTS = 20_000
KNOWN_IDS = 250_000
# Points seq -> offset kept to bound searches, one per INDEX_EVERY events let go.
INDEX_POINTS = 100_000
INDEX_EVERY = 1024
# Offsets read back from the end of the topic to find its tail (grown 8-fold
# until a committed record is among them).
LOCATE_WINDOW = 4096
# Records asked of the client per call while reading a range.
RANGE_BATCH = 10_000
PROBE_BATCH = 100_000
# A range this short is read through the prober's small fetches.
SMALL_RANGE = 1000
# Reading ranges: large fetches. Probing for a seq's offset: one small fetch, no
# read-ahead (the next probe goes elsewhere).
RANGE_FETCH = {"fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024}
PROBE_FETCH = {
    "fetch.max.bytes": 1024 * 1024,
    "max.partition.fetch.bytes": 256 * 1024,
    "queued.max.messages.kbytes": 1024,
}

_loads = orjson.loads
_from_record = StoredEvent.from_record
_ID = operator.attrgetter("id")
_SEQ = operator.attrgetter("seq")


class KafkaReader:
    """What a log instance knows of its topic, and the consumers that learn it.

    It holds the tail (`tail_seq`, `tail_hash`), the newest RECENT_EVENTS events
    with their offsets, the ids of the newest KNOWN_IDS events, and seq -> offset
    points that bound every search. Every method runs under the log's `lock`.
    """

    def __init__(
        self, bootstrap: list[str], topic: str, timeout_s: float, lock: threading.RLock
    ) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._timeout_s = timeout_s
        self._lock = lock
        self._partition = TopicPartition(topic, PARTITION)
        self._consumer: Consumer | None = None  # the follower: new records at the tail
        self._ranger: Consumer | None = None  # ranges read on demand
        self._prober: Consumer | None = None  # single batches, to find a seq's offset
        # The read whose position the ranger (the prober) holds.
        self._range_owner: object = None
        self._probe_owner: object = None
        # The tail: the newest event read or written, and where it lies.
        self._located = False
        self.tail_seq = 0
        self.tail_hash = GENESIS_HASH
        self._last_offset = -1
        self._low = 0  # the topic's first offset
        self._sought = 0  # where the follower was last sent (see skip_to)
        # The newest events, contiguous up to the tail, with their offsets.
        self._recent: list[StoredEvent] = []
        self._recent_offsets: list[int] = []
        # Facts learnt on the way: event id -> seq (the newest KNOWN_IDS read or
        # written), and seq -> offset points (sorted) that bound every search.
        self._seq_by_id: dict[str, int] = {}
        self._index_seqs: list[int] = []
        self._index_offsets: list[int] = []
        self._corruption: LogCorrupted | None = None

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_s

    def read(
        self, after_seq: int, until_seq: int | None, check_content: bool
    ) -> Iterator[StoredEvent]:
        """Events after_seq < seq <= until_seq (the tail if None), caught up first."""
        with self._lock:
            self.catch_up(self._deadline())
            last = self.tail_seq
            stop = last if until_seq is None else max(0, min(until_seq, last))
            after = max(0, after_seq)
            if after >= stop:
                return iter(())
            first = last - len(self._recent) + 1
            if after + 1 >= first:
                # A copy of the range: later appends do not change what this yields.
                return iter(self._recent[after + 1 - first : stop + 1 - first])
        # Older than what is held: read from the topic, up to the tail as it is now.
        return self.read_range(after, stop, check_content)

    def newest(self) -> StoredEvent | None:
        """The tail's event, if this instance holds it."""
        return self._recent[-1] if self._recent else None

    def skip_to(self, end: int) -> None:
        """Send the follower to `end`: below it lies only what it already holds."""
        self._follower().seek(TopicPartition(self._topic, PARTITION, end))
        self._sought = end

    def close(self) -> None:
        for consumer in (self._consumer, self._ranger, self._prober):
            if consumer is not None:
                _close_quietly(consumer)
        self._consumer = self._ranger = self._prober = None
        self._range_owner = self._probe_owner = None

    def known(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        """The events among `event_ids` that this instance has read or written.

        It remembers the newest KNOWN_IDS ids it has met, not every id of the topic
        (that would mean reading all of it on open): an id older than that is not
        found here. A retried append is found all the same (`present`).
        """
        found: dict[str, StoredEvent] = {}
        for event_id in event_ids:
            seq = self._seq_by_id.get(event_id)
            if seq is not None:
                event = self._event_at(seq)
                if event is not None and event.id == event_id:
                    found[event_id] = event
        return found

    def present(self, ids: list[str], expected_last_seq: int) -> dict[str, StoredEvent]:
        """The events of a batch (`ids`) the log holds: those this instance knows, and
        those right after `expected_last_seq`, where an append that committed lies when
        its writer, never told it did, retries it with the seq it expected then."""
        present = self.known(ids)
        if len(present) < len(ids) and 0 <= expected_last_seq < self.tail_seq:
            wanted = set(ids)
            until = expected_last_seq + len(ids)
            for event in self.read(expected_last_seq, until, False):
                if event.id in wanted:
                    present[event.id] = event
        return present

    def _event_at(self, seq: int) -> StoredEvent | None:
        first = self.tail_seq - len(self._recent) + 1
        if first <= seq <= self.tail_seq:
            return self._recent[seq - first]
        return next(self.read_range(seq - 1, seq, check_content=True), None)

    def _watermarks(self, deadline: float) -> tuple[int, int]:
        """The topic's first offset, and its last stable offset: below it, every
        transaction has committed or aborted."""
        low, end = self._follower().get_watermark_offsets(
            self._partition, timeout=_s_left(deadline), cached=False
        )
        return int(low), int(end)

    def end_offset(self, deadline: float) -> int:
        return self._watermarks(deadline)[1]

    def catch_up(self, deadline: float) -> None:
        """Read every committed record after the tail, up to the last stable offset."""
        if self._corruption is not None:
            raise self._corruption
        try:
            if not self._located:
                self._locate(deadline)
            consumer = self._follower()
            end = self.end_offset(deadline)
            if self._position(consumer) >= end:
                return
            consumer.resume([self._partition])
            try:
                # The events read are kept, so the collector would only walk them.
                with collector_paused():
                    while True:
                        position = self._position(consumer)
                        if position >= end:
                            if self._last_offset < end:
                                break
                            # A fetch went past `end`: into a transaction committed since
                            # `end` was asked, and `wanted` may have cut it after its first
                            # records. A tail there would be half an append (a state no
                            # writer left). The broker hands a read_committed reader only
                            # records below the stable offset, so that offset now lies past
                            # the whole of it: read on to it.
                            end = self.end_offset(deadline)
                            continue
                        if time.monotonic() >= deadline:
                            raise _AppendTimeout(f"reading {self._topic} up to offset {end}")
                        # consume() waits until it has `wanted` records or its timeout
                        # ends; commit markers take offsets but give no record, so the
                        # short timeout is what ends the last call of a catch-up.
                        wanted = min(10_000, end - position)
                        self._ingest(consumer.consume(wanted, timeout=min(_s_left(deadline), 0.02)))
            finally:
                # Idle, the reader fetches nothing: a long-polling fetch would hold up
                # the offset queries queued behind it on the same connection.
                consumer.pause([self._partition])
        except LogCorrupted as corruption:
            # What follows a break cannot be placed: refuse every later read as well.
            self._corruption = corruption
            raise
        except EventLogError:
            raise
        except Exception as error:
            raise _translate(error, f"reading {self._topic}") from error

    def _locate(self, deadline: float) -> None:
        """Find the tail by reading back from the end of the topic, not from its start.

        The records in [end - window, end) are read, the window growing until it
        holds a committed record (aborted batches and commit markers hold none) or
        reaches the topic's start. They are checked against one another (seq, link,
        content) and are what the follower goes on from. The first one's link to the
        event before it is not checked here: a replay checks it from its snapshot's
        head, and `audit verify` from the first event.
        """
        low, end = self._watermarks(deadline)
        window = LOCATE_WINDOW
        while True:
            start = max(low, end - window)
            messages = self._read_offsets(start, end, deadline)
            if messages or start == low:
                break
            window *= 8
        if messages:
            first = self._parse(messages[0])
            self.tail_seq = first.seq - 1
            # The first event of the log links to the genesis hash, whatever it claims.
            self.tail_hash = GENESIS_HASH if first.seq == 1 else first.prev_hash
            with collector_paused():
                self._ingest(messages)
        consumer = self._follower()
        consumer.assign([TopicPartition(self._topic, PARTITION, end)])
        consumer.pause([self._partition])
        self._sought = max(self._sought, end)
        self._low = low
        self._located = True

    def _read_offsets(self, start: int, end: int, deadline: float) -> list[Message]:
        """Every committed record with start <= offset < end, through the range reader."""
        token = object()
        found: list[Message] = []
        position = start
        try:
            while position < end:
                if time.monotonic() >= deadline:
                    raise _AppendTimeout(f"reading {self._topic} from offset {start} to {end}")
                batch = self._range_batch(token, position, min(10_000, end - position))
                for message in batch:
                    _raise_error(message)
                    offset = int(message.offset() or 0)
                    if offset < end:
                        found.append(message)
                    position = offset + 1
                if self._ranger is not None:
                    at = self._ranger.position([self._partition])[0].offset
                    position = max(position, int(at))
        finally:
            self._release_range(token)
        return found

    def _range_batch(
        self, token: object, position: int, wanted: int, *, small: bool = False
    ) -> list[Message]:
        """The next records for the read `token`, which continues at `position`.

        A `small` read (a few events: a snapshot's head, a retried batch) goes
        through the prober, whose fetches are small: the range reader would fetch
        megabytes ahead for it.
        """
        if small:
            consumer = self._probe_reader()
            if self._probe_owner is not token:
                consumer.assign([TopicPartition(self._topic, PARTITION, position)])
                self._probe_owner = token
        else:
            if self._ranger is None:
                self._ranger = Consumer(self._consumer_config("range", RANGE_FETCH))
            consumer = self._ranger
            if self._range_owner is not token:
                # Another read moved the range reader: send it back where this one is.
                consumer.assign([TopicPartition(self._topic, PARTITION, position)])
                self._range_owner = token
        return consumer.consume(wanted, timeout=0.02)

    def _release_range(self, token: object) -> None:
        """Stop the reader a read used prefetching, once the read has ended."""
        with self._lock:
            for consumer, owner in ((self._ranger, "_range_owner"), (self._prober, "_probe_owner")):
                if consumer is not None and getattr(self, owner) is token:
                    setattr(self, owner, None)
                    with contextlib.suppress(Exception):
                        consumer.unassign()

    def _probe_reader(self) -> Consumer:
        if self._prober is None:
            self._prober = Consumer(self._consumer_config("probe", PROBE_FETCH))
        return self._prober

    def read_range(self, after: int, stop: int, check_content: bool) -> Iterator[StoredEvent]:
        """Events after < seq <= stop, read from the topic.

        The read starts at the record of event `after` (found by `offset_of`), so
        the first event's link is checked as every other's; from the log's start,
        the first links to the genesis hash. Each fetch is checked whole (seq and
        links always, content hashes with `check_content`), then yielded: a reader
        that stops early leaves the range reader to the next.
        """
        token = object()
        small = stop - after <= SMALL_RANGE
        try:
            with self._lock:
                deadline = self._deadline()
                if after == 0:
                    position = self._low
                    prev_hash: str | None = GENESIS_HASH
                    expected = 1
                else:
                    position = self.offset_of(after, deadline)
                    prev_hash = None  # the anchor, event `after`, is read first
                    expected = after
            while expected <= stop:
                with self._lock:
                    try:
                        # Every record handed over is an event (markers and aborted
                        # batches are not): ask for no more than the range holds.
                        wanted = min(RANGE_BATCH, stop - expected + 1)
                        messages = self._range_batch(token, position, wanted, small=small)
                    except Exception as error:
                        raise _translate(error, f"reading {self._topic}") from error
                if not messages:
                    if time.monotonic() >= deadline:
                        raise LogUnavailable(
                            f"reading {self._topic}: no record from offset {position} "
                            f"within {self._timeout_s:g} s"
                        )
                    continue
                deadline = self._deadline()
                events = self._check_fetch(messages, expected, prev_hash, check_content)
                position = int(messages[-1].offset() or 0) + 1
                prev_hash = events[-1].hash
                expected += len(events)
                if events[0].seq == after:
                    del events[0]  # the anchor: checked, not asked for
                if events:
                    with self._lock:
                        self._learn_range(events, position - 1)
                    yield from events
        finally:
            self._release_range(token)

    def _check_fetch(
        self, messages: list[Message], expected: int, prev_hash: str | None, check_content: bool
    ) -> list[StoredEvent]:
        """The events of one fetch, checked against one another and the one before.

        The replay's inner loop, so the common case is a few passes in C over the
        whole fetch (parse, seqs, links, content hashes on the records' bytes); only
        a fetch that fails them is walked event by event, to name the first break.
        `prev_hash` None: the first record is a range's anchor, whose link is not
        checked.
        """
        # A message that carries a client error holds no record: parsing it fails.
        values = cast("list[bytes]", [message.value() for message in messages])
        try:
            events = [_from_record(_loads(value)) for value in values]
        except (ValueError, TypeError, KeyError):
            self._first_unreadable(messages)
            raise
        hashes = [event.hash for event in events]
        prevs = [event.prev_hash for event in events]
        count = len(events)
        if (
            [event.seq for event in events] == list(range(expected, expected + count))
            and (prev_hash is None or prevs[0] == prev_hash)
            and prevs[1:] == hashes[:-1]
            and (not check_content or all(map(record_hash_holds, values, hashes)))
        ):
            return events
        link = prev_hash or prevs[0]
        for event, value, message in zip(events, values, messages, strict=True):
            if (
                event.seq != expected
                or event.prev_hash != link
                or (check_content and not record_hash_holds(value, event.hash))
            ):
                broken = verify_chain(
                    [event], expect_first_seq=expected, prev_hash=link, recompute=check_content
                )
                if broken is not None:
                    raise LogCorrupted(
                        f"{self._topic} offset {message.offset()}: seq {broken.seq}: "
                        f"{broken.reason}",
                        seq=broken.seq,
                    )
            link, expected = event.hash, expected + 1
        return events

    def _first_unreadable(self, messages: list[Message]) -> None:
        """Raise the error of the first message that holds no event."""
        for message in messages:
            _raise_error(message)
            self._parse(message)

    def _learn_range(self, events: list[StoredEvent], last_offset: int) -> None:
        """Remember what a range read met: one point of seq -> offset, and the ids of
        events among the newest KNOWN_IDS (an older one is not asked for)."""
        self._learn_point(events[-1].seq, last_offset)
        recent = self.tail_seq - KNOWN_IDS
        if events[-1].seq > recent:
            kept = events if events[0].seq > recent else [e for e in events if e.seq > recent]
            self._seq_by_id.update(zip(map(_ID, kept), map(_SEQ, kept), strict=True))
            self._forget_old_ids()

    def _forget_old_ids(self) -> None:
        excess = len(self._seq_by_id) - KNOWN_IDS
        if excess > KNOWN_IDS // 4:
            for event_id in list(itertools.islice(self._seq_by_id, excess)):
                del self._seq_by_id[event_id]

    def _learn_point(self, seq: int, offset: int) -> None:
        at = bisect.bisect_left(self._index_seqs, seq)
        if at < len(self._index_seqs) and self._index_seqs[at] == seq:
            return
        self._index_seqs.insert(at, seq)
        self._index_offsets.insert(at, offset)
        if len(self._index_seqs) > INDEX_POINTS:
            del self._index_seqs[::2]
            del self._index_offsets[::2]

    def offset_of(self, seq: int, deadline: float) -> int:
        """The offset of the record holding event `seq`, 1 <= seq <= the tail.

        Known points (the recent events, points met by earlier reads) bound it:
        between two records, every event takes at least one offset. Each probe
        reads the first committed records at a guessed offset. The guess
        interpolates between the bounds, since offsets grow with seq at a nearly
        steady rate (one commit marker per append), and bisects when that did not
        halve the range: a few probes find any seq of a ten-million-event log.
        """
        first = self.tail_seq - len(self._recent) + 1
        if self._recent and first <= seq <= self.tail_seq:
            return self._recent_offsets[seq - first]
        seqs, offsets = self._index_seqs, self._index_offsets
        at = bisect.bisect_left(seqs, seq)
        if at < len(seqs) and seqs[at] == seq:
            return offsets[at]
        lo_seq, lo_offset = (seqs[at - 1], offsets[at - 1]) if at else (0, self._low - 1)
        hi_seq, hi_offset = self.tail_seq, self._last_offset
        if self._recent:
            hi_seq, hi_offset = first, self._recent_offsets[0]
        if at < len(seqs) and seqs[at] < hi_seq:
            hi_seq, hi_offset = seqs[at], offsets[at]
        floor = lo_offset + (seq - lo_seq)
        ceiling = hi_offset - (hi_seq - seq)
        halve = False
        while floor <= ceiling:
            if halve:
                guess = (floor + ceiling) // 2
            else:
                step = (seq - lo_seq) * (hi_offset - lo_offset) // (hi_seq - lo_seq)
                guess = min(max(lo_offset + step, floor), ceiling)
            found = self._probe(guess, deadline)
            width = ceiling - floor
            first_seq, first_offset = found[0]
            last_seq, last_offset = found[-1]
            if first_seq <= seq <= last_seq:
                for probed_seq, probed_offset in found:
                    if probed_seq == seq:
                        return probed_offset
                break
            if first_seq > seq:
                hi_seq, hi_offset = first_seq, first_offset
                ceiling = min(guess - 1, hi_offset - (hi_seq - seq))
            else:
                lo_seq, lo_offset = last_seq, last_offset
                floor = max(floor, lo_offset + (seq - lo_seq))
            halve = ceiling - floor > width // 2
        raise LogCorrupted(f"{self._topic} holds no record of event {seq}", seq=seq)

    def _probe(self, offset: int, deadline: float) -> list[tuple[int, int]]:
        """(seq, offset) of the committed records the first fetch at `offset` returns
        (at least one: there is always a record at or after a search's guess)."""
        try:
            prober = self._probe_reader()
            prober.assign([TopicPartition(self._topic, PARTITION, offset)])
            self._probe_owner = None  # a small read that held it starts again
            try:
                first = None
                while first is None:
                    if time.monotonic() >= deadline:
                        raise _AppendTimeout(f"reading {self._topic} at offset {offset}")
                    first = prober.poll(min(_s_left(deadline), 0.1))
                messages = [first, *prober.consume(PROBE_BATCH, timeout=0)]
            finally:
                prober.unassign()
            found = []
            for message in messages:
                _raise_error(message)
                at = int(message.offset() or 0)
                try:
                    seq = orjson.loads(message.value() or b"")["seq"]
                except (ValueError, TypeError, KeyError) as error:
                    raise LogCorrupted(
                        f"{self._topic} offset {at} is not a gitsched event: {error}"
                    ) from error
                if type(seq) is not int:
                    raise LogCorrupted(f"{self._topic} offset {at} is not a gitsched event")
                found.append((seq, at))
        except EventLogError:
            raise
        except Exception as error:
            raise _translate(error, f"reading {self._topic}") from error
        self._learn_point(*found[0])
        self._learn_point(*found[-1])
        return found

    def _position(self, consumer: Consumer) -> int:
        """The next offset the follower will hand out: past what we hold, past commit
        markers it has skipped, past where we sent it."""
        offset = consumer.position([self._partition])[0].offset
        return max(int(offset), self._last_offset + 1, self._sought)

    def _parse(self, message: Message) -> StoredEvent:
        offset = int(message.offset() or 0)
        value = message.value()
        try:
            return StoredEvent.from_record(orjson.loads(value if isinstance(value, bytes) else b""))
        except (ValueError, TypeError, KeyError) as error:
            raise LogCorrupted(
                f"{self._topic} offset {offset} is not a gitsched event: {error}"
            ) from error

    def _ingest(self, messages: list[Message]) -> None:
        """Check fetched records against the tail and keep them.

        Each record must be the next seq, link to the hash before it, and hash to
        its own `hash` (checked on the record's bytes, which spares re-encoding
        it; a record that is not byte-canonical is checked the long way).
        """
        keep = self._keep
        loads = orjson.loads
        from_record = StoredEvent.from_record
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            offset = int(message.offset() or 0)
            if offset <= self._last_offset:
                continue  # our own append, kept when it committed
            value = message.value()
            raw = value if isinstance(value, bytes) else b""
            try:
                event = from_record(loads(raw))
            except (ValueError, TypeError, KeyError) as error:
                raise LogCorrupted(
                    f"{self._topic} offset {offset} is not a gitsched event: {error}"
                ) from error
            if (
                event.seq != self.tail_seq + 1
                or event.prev_hash != self.tail_hash
                or not record_hash_holds(raw, event.hash)
            ):
                broken = verify_chain(
                    [event], expect_first_seq=self.tail_seq + 1, prev_hash=self.tail_hash
                )
                if broken is not None:
                    raise LogCorrupted(
                        f"{self._topic} offset {offset}: seq {broken.seq}: {broken.reason}",
                        seq=broken.seq,
                    )
            keep(event, offset)

    def accept(self, events: list[StoredEvent], offsets: list[int]) -> None:
        """Keep the batch this writer just committed: sealed here, or checked hash by
        hash before import, so only its links to the tail are checked."""
        broken = verify_chain(
            events,
            expect_first_seq=self.tail_seq + 1,
            prev_hash=self.tail_hash,
            recompute=False,
        )
        if broken is not None:
            raise LogCorrupted(f"the batch just committed: seq {broken.seq}: {broken.reason}")
        for event, offset in zip(events, offsets, strict=True):
            self._keep(event, offset)

    def _keep(self, event: StoredEvent, offset: int) -> None:
        """Make a checked event, read from `offset`, the new tail."""
        known = self._seq_by_id.get(event.id)
        if known is not None and known != event.seq:
            raise LogCorrupted(
                f"{self._topic} offset {offset}: event id {event.id!r} at seq {event.seq} "
                f"is already at seq {known}",
                seq=event.seq,
            )
        self._recent.append(event)
        self._recent_offsets.append(offset)
        self._seq_by_id[event.id] = event.seq
        self.tail_seq, self.tail_hash, self._last_offset = event.seq, event.hash, offset
        if len(self._recent) > 2 * RECENT_EVENTS:
            drop = len(self._recent) - RECENT_EVENTS
            for at in range(0, drop, INDEX_EVERY):
                self._learn_point(self._recent[at].seq, self._recent_offsets[at])
            del self._recent[:drop]
            del self._recent_offsets[:drop]
            self._forget_old_ids()

    def _consumer_config(self, role: str, fetch: dict[str, Any]) -> dict[str, Any]:
        return {
            **client_config(self._bootstrap, self._topic, self._timeout_s, role),
            # Assigned, never subscribed: the group is never joined, no
            # offset is ever committed.
            "group.id": f"gitsched-reader-{self._topic}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 50,
            **fetch,
        }

    def _follower(self) -> Consumer:
        """The follower: assigned at the tail once `_locate` has found it."""
        if self._consumer is None:
            self._consumer = Consumer(self._consumer_config("reader", RANGE_FETCH))
        return self._consumer
