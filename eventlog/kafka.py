"""The production event log: one Kafka topic per cluster, one partition, kept forever.

A transactional producer makes each batch atomic and fences a second (or zombie)
writer; readers see only committed batches. The client is confluent-kafka
(librdkafka): a transaction costs its broker round trips and little else, where
a pure-Python client spends as long again building and parsing records.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import operator
import threading
import time
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import orjson
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from eventlog.base import (
    Clock,
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    EventLogError,
    LogConfigurationError,
    LogCorrupted,
    LogUnavailable,
    WriterFenced,
    already_imported,
    check_import,
    utc_now,
)
from eventlog.collector import collector_paused
from eventlog.envelope import (
    GENESIS_HASH,
    NewEvent,
    StoredEvent,
    canonical_json,
    format_time,
    record_hash_holds,
    seal_batch_records,
    verify_chain,
)
from eventlog.snapshot import SnapshotStore

DEFAULT_PORT = 9092
PARTITION = 0
# Topic settings gitsched insists on: the log is the only source of truth.
REQUIRED_TOPIC_CONFIG = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}
# One append's events travel as one record batch, LZ4-compressed (a log kept
# forever is mostly repetitive JSON).
BATCH_BYTES = 4 * 1024 * 1024
MAX_REQUEST_BYTES = 8 * 1024 * 1024
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


class _ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """librdkafka's own log lines, at DEBUG: it logs every failed connection
    attempt as an error, while the log reports what it could not do itself."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        self.logger.log(logging.DEBUG, msg, *args, **kwargs)


_LOG = _ClientLog(logging.getLogger("gitsched.kafka"), {})
# librdkafka backs off up to 10 s between reconnects by default; a log that must
# notice a broker coming back within one append's budget retries sooner.
_RECONNECT = {"reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000}
# Errors that mean another producer with our transactional.id took over.
_FENCING_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
    }
)
# Errors that mean "the cluster cannot be reached or did not answer in time".
_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError._STATE,
    }
)


class _AppendTimeout(Exception):
    """An append ran out of its time budget at some step (named in the message)."""


class KafkaEventLog(EventLog):
    """A cluster's event log in a single-partition Kafka topic.

    `seq` is the envelope's own gap-free counter, not the Kafka offset (commit
    markers take offsets too, and aborted batches leave holes). Every writer of a
    topic must use the same `transactional_id` (the default derives it from the
    topic): that is what fences a second writer. Opening the log and reading never
    fences anyone; the producer is created on the first append. Once fenced, an
    instance stays fenced: a process that wants to write again opens a new one.

    An instance never reads more of the topic than it is asked for. Opening finds
    the tail by reading back from the end (`_locate`); from there a follower keeps
    up with new records and holds the newest RECENT_EVENTS of them. An older range
    is read on demand from its own offset, found by a search over the topic
    (`_offset_of`), so a restart from a snapshot reads only the snapshot's event
    and the tail after it, however long the log.
    """

    # Every record is checked as it is read: seq and link to the record before it
    # (read too, for a range that starts mid-log); with check_content, or at the
    # tail, its content hash on the record's bytes too.
    reads_checked = True

    def __init__(
        self,
        bootstrap_servers: list[str],
        topic: str,
        *,
        clock: Clock = utc_now,
        transactional_id: str | None = None,
        create_topic: bool = True,
        timeout_s: float = 30,
    ) -> None:
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one broker")
        if not topic:
            raise ValueError("topic must not be empty")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._bootstrap = list(bootstrap_servers)
        self._topic = topic
        self._clock = clock
        self._transactional_id = transactional_id or f"gitsched-{topic}"
        self._timeout_s = float(timeout_s)
        self._partition = TopicPartition(topic, PARTITION)
        self._lock = threading.RLock()
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None  # the follower: new records at the tail
        self._ranger: Consumer | None = None  # ranges read on demand
        self._prober: Consumer | None = None  # single batches, to find a seq's offset
        # The read whose position the ranger (the prober) holds.
        self._range_owner: object = None
        self._probe_owner: object = None
        self._fenced = False
        # The tail as this writer last knew it to be its own: anything after it
        # was written by another producer with our transactional id, which
        # fenced us when it initialised.
        self._writer_tail: int | None = None
        # The tail: the newest event read or written, and where it lies.
        self._located = False
        self._tail_seq = 0
        self._tail_hash = GENESIS_HASH
        self._last_offset = -1
        self._low = 0  # the topic's first offset
        self._sought = 0  # where the follower was last sent (see _await_visible)
        # The newest events, contiguous up to the tail, with their offsets.
        self._recent: list[StoredEvent] = []
        self._recent_offsets: list[int] = []
        # Facts learnt on the way: event id -> seq (the newest KNOWN_IDS read or
        # written), and seq -> offset points (sorted) that bound every search.
        self._seq_by_id: dict[str, int] = {}
        self._index_seqs: list[int] = []
        self._index_offsets: list[int] = []
        self._corruption: LogCorrupted | None = None
        # Snapshots live outside the topic (see eventlog.snapshot); open_log sets the folder.
        self.snapshot_store: SnapshotStore | None = None
        self._ensure_topic(create=create_topic)

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> KafkaEventLog:
        """Open `kafka://host:port[,host:port]/TOPIC`."""
        parts = urlsplit(url)
        if parts.scheme != "kafka":
            raise ValueError(f"not a kafka:// URL: {url!r}")
        topic = parts.path.lstrip("/")
        if not parts.netloc or not topic or "/" in topic:
            raise ValueError(f"expected kafka://host:port[,host:port]/TOPIC, got {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"kafka:// URLs take no query or fragment: {url!r}")
        servers = []
        for server in parts.netloc.split(","):
            server = server.strip()
            if not server:
                raise ValueError(f"empty broker address in {url!r}")
            servers.append(server if ":" in server else f"{server}:{DEFAULT_PORT}")
        return cls(servers, topic, **kw)

    @property
    def topic(self) -> str:
        return self._topic

    def snapshots(self) -> SnapshotStore | None:
        return self.snapshot_store

    def _client_config(self, role: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": ",".join(self._bootstrap),
            "client.id": f"gitsched-{role}-{self._topic}",
            "socket.timeout.ms": max(1000, int(self._timeout_s * 1000)),
            "logger": _LOG,
            **_RECONNECT,
        }

    # -- reading ---------------------------------------------------------

    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),  # parsed once on fetch: nothing to skip
        check_content: bool = False,
    ) -> Iterator[StoredEvent]:
        with self._lock:
            self._catch_up(self._deadline())
            last = self._tail_seq
            stop = last if until_seq is None else max(0, min(until_seq, last))
            after = max(0, after_seq)
            if after >= stop:
                return iter(())
            first = last - len(self._recent) + 1
            if after + 1 >= first:
                # A copy of the range: later appends do not change what this yields.
                return iter(self._recent[after + 1 - first : stop + 1 - first])
        # Older than what is held: read from the topic, up to the tail as it is now.
        return self._read_range(after, stop, check_content)

    def last_seq(self) -> int:
        with self._lock:
            self._catch_up(self._deadline())
            return self._tail_seq

    def last_event(self) -> StoredEvent | None:
        with self._lock:
            self._catch_up(self._deadline())
            if self._recent:
                return self._recent[-1]
        return super().last_event()

    def find(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        with self._lock:
            self._catch_up(self._deadline())
            return self._known(event_ids)

    def offset_of(self, seq: int) -> int:
        """The Kafka offset of the record holding event `seq` (they differ: commit
        markers take offsets too), for pointing tools at the raw topic."""
        with self._lock:
            deadline = self._deadline()
            self._catch_up(deadline)
            if not 1 <= seq <= self._tail_seq:
                raise KeyError(f"no event with seq {seq} in {self._topic}")
            return self._offset_of(seq, deadline)

    def _known(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        """The events among `event_ids` that this instance has read or written.

        It remembers the newest KNOWN_IDS ids it has met, not every id of the topic
        (that would mean reading all of it on open): an id older than that is not
        found here. A retried append is found all the same (`_present`).
        """
        found: dict[str, StoredEvent] = {}
        for event_id in event_ids:
            seq = self._seq_by_id.get(event_id)
            if seq is not None:
                event = self._event_at(seq)
                if event is not None and event.id == event_id:
                    found[event_id] = event
        return found

    def _present(self, ids: list[str], expected_last_seq: int) -> dict[str, StoredEvent]:
        """The events of a batch (`ids`) the log holds: those this instance knows, and
        those right after `expected_last_seq`, where an append that committed lies when
        its writer, never told it did, retries it with the seq it expected then."""
        present = self._known(ids)
        if len(present) < len(ids) and 0 <= expected_last_seq < self._tail_seq:
            wanted = set(ids)
            until = expected_last_seq + len(ids)
            for event in self.read(expected_last_seq, until_seq=until):
                if event.id in wanted:
                    present[event.id] = event
        return present

    def _event_at(self, seq: int) -> StoredEvent | None:
        first = self._tail_seq - len(self._recent) + 1
        if first <= seq <= self._tail_seq:
            return self._recent[seq - first]
        return next(self._read_range(seq - 1, seq, check_content=True), None)

    def _watermarks(self, deadline: float) -> tuple[int, int]:
        """The topic's first offset, and its last stable offset: below it, every
        transaction has committed or aborted."""
        low, end = self._reader().get_watermark_offsets(
            self._partition, timeout=_s_left(deadline), cached=False
        )
        return int(low), int(end)

    def _end_offset(self, deadline: float) -> int:
        return self._watermarks(deadline)[1]

    def _catch_up(self, deadline: float) -> None:
        """Read every committed record after the tail, up to the last stable offset."""
        if self._corruption is not None:
            raise self._corruption
        try:
            if not self._located:
                self._locate(deadline)
            consumer = self._reader()
            end = self._end_offset(deadline)
            if self._position(consumer) >= end:
                return
            consumer.resume([self._partition])
            try:
                # The events read are kept, so the collector would only walk them.
                with collector_paused():
                    while (position := self._position(consumer)) < end:
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
            self._tail_seq = first.seq - 1
            # The first event of the log links to the genesis hash, whatever it claims.
            self._tail_hash = GENESIS_HASH if first.seq == 1 else first.prev_hash
            with collector_paused():
                self._ingest(messages)
        consumer = self._reader()
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

    def _read_range(self, after: int, stop: int, check_content: bool) -> Iterator[StoredEvent]:
        """Events after < seq <= stop, read from the topic.

        The read starts at the record of event `after` (found by `_offset_of`), so
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
                    position = self._offset_of(after, deadline)
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
        recent = self._tail_seq - KNOWN_IDS
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

    def _offset_of(self, seq: int, deadline: float) -> int:
        """The offset of the record holding event `seq`, 1 <= seq <= the tail.

        Known points (the recent events, points met by earlier reads) bound it:
        between two records, every event takes at least one offset. Each probe
        reads the first committed records at a guessed offset. The guess
        interpolates between the bounds, since offsets grow with seq at a nearly
        steady rate (one commit marker per append), and bisects when that did not
        halve the range: a few probes find any seq of a ten-million-event log.
        """
        first = self._tail_seq - len(self._recent) + 1
        if self._recent and first <= seq <= self._tail_seq:
            return self._recent_offsets[seq - first]
        seqs, offsets = self._index_seqs, self._index_offsets
        at = bisect.bisect_left(seqs, seq)
        if at < len(seqs) and seqs[at] == seq:
            return offsets[at]
        lo_seq, lo_offset = (seqs[at - 1], offsets[at - 1]) if at else (0, self._low - 1)
        hi_seq, hi_offset = self._tail_seq, self._last_offset
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
                event.seq != self._tail_seq + 1
                or event.prev_hash != self._tail_hash
                or not record_hash_holds(raw, event.hash)
            ):
                broken = verify_chain(
                    [event], expect_first_seq=self._tail_seq + 1, prev_hash=self._tail_hash
                )
                if broken is not None:
                    raise LogCorrupted(
                        f"{self._topic} offset {offset}: seq {broken.seq}: {broken.reason}",
                        seq=broken.seq,
                    )
            keep(event, offset)

    def _accept(self, events: list[StoredEvent], offsets: list[int]) -> None:
        """Keep the batch this writer just committed: sealed here, or checked hash by
        hash before import, so only its links to the tail are checked."""
        broken = verify_chain(
            events,
            expect_first_seq=self._tail_seq + 1,
            prev_hash=self._tail_hash,
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
        self._tail_seq, self._tail_hash, self._last_offset = event.seq, event.hash, offset
        if len(self._recent) > 2 * RECENT_EVENTS:
            drop = len(self._recent) - RECENT_EVENTS
            for at in range(0, drop, INDEX_EVERY):
                self._learn_point(self._recent[at].seq, self._recent_offsets[at])
            del self._recent[:drop]
            del self._recent_offsets[:drop]
            self._forget_old_ids()

    def _consumer_config(self, role: str, fetch: dict[str, Any]) -> dict[str, Any]:
        return {
            **self._client_config(role),
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

    def _reader(self) -> Consumer:
        """The follower: assigned at the tail once `_locate` has found it."""
        if self._consumer is None:
            self._consumer = Consumer(self._consumer_config("reader", RANGE_FETCH))
        return self._consumer

    # -- writing ---------------------------------------------------------

    def append(self, events: Sequence[NewEvent], *, expected_last_seq: int) -> list[StoredEvent]:
        batch = list(events)
        ids = [event.id for event in batch]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise DuplicateEvent(f"the batch holds event ids more than once: {twice}")
        if not batch:
            return []
        with self._lock:
            deadline = self._deadline()
            self._prepare_write(deadline)
            present = self._present(ids, expected_last_seq)
            if len(present) == len(batch):
                return [present[i] for i in ids]
            self._check_still_writer()
            last = self._tail_seq
            if present:
                raise DuplicateEvent(
                    f"{len(present)} of {len(batch)} events are in {self._topic} already "
                    f"(e.g. {sorted(present)[0]!r}): the log and the writer disagree"
                )
            if last != expected_last_seq:
                raise ConcurrencyConflict(expected_last_seq, last)
            sealed = seal_batch_records(
                batch,
                first_seq=last + 1,
                time=format_time(self._clock()),
                prev_hash=self._tail_hash,
            )
            self._write(sealed, deadline)
            return [event for event, _ in sealed]

    def import_events(
        self, stored: Sequence[StoredEvent], *, expected_last_seq: int
    ) -> list[StoredEvent]:
        batch = list(stored)
        if not batch:
            return []
        with self._lock:
            deadline = self._deadline()
            self._prepare_write(deadline)
            done = already_imported(batch, self._present([e.id for e in batch], expected_last_seq))
            if done is not None:
                return done
            self._check_still_writer()
            check_import(
                batch,
                last_seq=self._tail_seq,
                last_hash=self._tail_hash,
                expected_last_seq=expected_last_seq,
            )
            self._write([(e, canonical_json(e.to_record())) for e in batch], deadline)
            return batch

    def _prepare_write(self, deadline: float) -> None:
        """Hold the producer (fencing older writers) and know the log up to its end.

        A new producer reads the tail once it has fenced everyone older.
        After that, this writer's own commits are the only ones that can land
        while its producer lives (the broker fences it the moment another
        initialises), so its cache is the tail and no round trip is spent on it.
        """
        if self._fenced:
            raise WriterFenced(self._fenced_message())
        if self._producer is None:
            self._writer(deadline)

    def _check_still_writer(self) -> None:
        last = self._tail_seq
        if self._writer_tail is not None and last > self._writer_tail:
            message = (
                f"{self._fenced_message()}: the log reached seq {last} after this "
                f"writer's tail at seq {self._writer_tail}"
            )
            self._fence()
            raise WriterFenced(message)

    def _write(self, sealed: list[tuple[StoredEvent, bytes]], deadline: float) -> None:
        """One transaction holding `sealed` (events with their records' bytes), visible
        to read_committed readers on return."""
        offsets = self._produce(sealed, deadline)
        self._accept([event for event, _ in sealed], offsets)
        self._writer_tail = self._tail_seq
        self._await_visible(offsets[-1], deadline)

    def _await_visible(self, last_offset: int, deadline: float) -> None:
        """Wait until read_committed readers can see the batch.

        A commit returns once the coordinator has logged it; the markers that let
        readers past it are written just after. Waiting for them means a reader
        opened after append() returned sees the batch, as with SQLite (and the
        next transaction does not meet CONCURRENT_TRANSACTIONS and a back-off).
        If they are late the batch is still committed, so this gives up quietly.
        """
        pause = 0.0005
        while time.monotonic() < deadline:
            try:
                end = self._end_offset(deadline)
            except Exception:
                return
            if end > last_offset:
                if end == last_offset + 2:
                    # Below `end` lie only our batch and its commit marker: the reader
                    # need not fetch back what it already holds.
                    with contextlib.suppress(Exception):
                        self._reader().seek(TopicPartition(self._topic, PARTITION, end))
                        self._sought = end
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _writer(self, deadline: float) -> Producer:
        """The transactional producer; creating it fences every older writer."""
        if self._producer is not None:
            return self._producer
        producer = None
        timeout_ms = int(self._timeout_s * 1000)
        try:
            producer = Producer(
                {
                    **self._client_config("writer"),
                    "transactional.id": self._transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    # A batch is sent by the flush that ends it, never by a timer: a
                    # long linger and a batch size above any append keep one append in
                    # one record batch (one request, one CRC, one compression pass).
                    "linger.ms": 1000,
                    "batch.size": BATCH_BYTES,
                    "batch.num.messages": 1_000_000,
                    "queue.buffering.max.messages": 2_000_000,
                    "queue.buffering.max.kbytes": 2 * 1024 * 1024,
                    "message.max.bytes": MAX_REQUEST_BYTES,
                    "compression.type": "lz4",
                    "request.timeout.ms": max(1000, timeout_ms // 2),
                    # Longer than any append may take, so the coordinator never aborts
                    # (and re-epochs) a transaction this writer is still committing;
                    # a record's delivery timeout must fit inside it.
                    "transaction.timeout.ms": min(900_000, max(60_000, 2 * timeout_ms)),
                    "message.timeout.ms": min(900_000, max(2000, timeout_ms)),
                }
            )
            producer.init_transactions(_s_left(deadline))
        except Exception as error:
            if producer is not None:
                _close_quietly(producer)
            raise _translate(error, f"starting the writer for {self._topic}") from error
        self._producer = producer
        # Nobody older can commit any more: what is in the log now is the tail we own.
        try:
            self._catch_up(deadline)
        except EventLogError:
            self._discard_producer()
            raise
        self._writer_tail = self._tail_seq
        return producer

    def _produce(self, sealed: list[tuple[StoredEvent, bytes]], deadline: float) -> list[int]:
        producer = self._writer(deadline)
        offsets: list[int] = []
        failures: list[KafkaError] = []

        def delivered(error: KafkaError | None, message: Message) -> None:
            # One partition, an idempotent producer: reports come in produce order.
            if error is not None:
                failures.append(error)
            else:
                offsets.append(int(message.offset() or 0))

        try:
            producer.begin_transaction()
            messages = [
                {"value": record, "key": event.id.encode("utf-8")} for event, record in sealed
            ]
            queued = producer.produce_batch(
                self._topic, messages, partition=PARTITION, on_delivery=delivered
            )
            if queued != len(messages):
                refused = next(m["_error"] for m in messages if "_error" in m)
                raise KafkaException(refused)
            if producer.flush(_s_left(deadline)) > 0:
                raise _AppendTimeout(f"delivering the batch to {self._topic}")
            if failures:
                raise KafkaException(failures[0])
            if len(offsets) != len(sealed) or offsets != sorted(set(offsets)):
                raise EventLogError(
                    f"appending to {self._topic}: the broker acknowledged {len(offsets)} of "
                    f"{len(sealed)} records, or out of order"
                )
            self._commit(producer, deadline)
            return offsets
        except Exception as error:
            # Whatever state the transaction is in, this producer is done: a new one
            # (init_transactions) finishes or aborts it before anything else is written,
            # and a retried append then finds the batch if it did commit.
            self._discard_producer()
            translated = _translate(error, f"appending to {self._topic}")
            if isinstance(translated, WriterFenced):
                self._fenced = True
            raise translated from error

    def _commit(self, producer: Producer, deadline: float) -> None:
        producer.commit_transaction(_s_left(deadline))

    def _fence(self) -> None:
        self._fenced = True
        self._discard_producer()

    def _fenced_message(self) -> str:
        return (
            f"another writer with transactional.id {self._transactional_id!r} "
            f"took over {self._topic}"
        )

    def _discard_producer(self) -> None:
        if self._producer is not None:
            _close_quietly(self._producer)
            self._producer = None
            self._writer_tail = None

    # -- the topic -------------------------------------------------------

    def _ensure_topic(self, *, create: bool) -> None:
        try:
            admin = AdminClient(self._client_config("admin"))
            if not self._topic_exists(admin):
                if not create:
                    raise LogConfigurationError(
                        f"topic {self._topic} does not exist (and create_topic is off)"
                    )
                self._create_topic(admin)
            self._check_topic(admin)
        except EventLogError:
            raise
        except Exception as error:
            raise _translate(error, f"checking topic {self._topic}") from error

    def _metadata(self, admin: AdminClient) -> Any:
        return admin.list_topics(topic=self._topic, timeout=self._timeout_s)

    def _topic_exists(self, admin: AdminClient) -> bool:
        described = self._metadata(admin).topics.get(self._topic)
        if described is None or described.error is None:
            return described is not None
        if described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        raise KafkaException(described.error)

    def _create_topic(self, admin: AdminClient) -> None:
        brokers = len(self._metadata(admin).brokers)
        replicas = max(1, min(3, brokers))
        config = dict(REQUIRED_TOPIC_CONFIG)
        config["min.insync.replicas"] = "2" if replicas >= 3 else "1"
        created = admin.create_topics(
            [NewTopic(self._topic, num_partitions=1, replication_factor=replicas, config=config)],
            operation_timeout=self._timeout_s,
            request_timeout=self._timeout_s,
        )
        try:
            created[self._topic].result(timeout=self._timeout_s)
        except KafkaException as error:
            # Another process may create it first; its settings are checked next either way.
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        # Metadata reaches every broker shortly after the create returns.
        deadline = self._deadline()
        while not self._topic_exists(admin) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _check_topic(self, admin: AdminClient) -> None:
        partitions = len(self._metadata(admin).topics[self._topic].partitions)
        if partitions != 1:
            raise LogConfigurationError(
                f"topic {self._topic} has {partitions} partitions: a gitsched log needs "
                f"exactly 1 (num.partitions) for a total order"
            )
        resource = ConfigResource(ResourceType.TOPIC, self._topic)
        described = admin.describe_configs([resource], request_timeout=self._timeout_s)
        configs = described[resource].result(timeout=self._timeout_s)
        for name, wanted in REQUIRED_TOPIC_CONFIG.items():
            entry = configs.get(name)
            actual = str(entry.value if entry is not None else None)
            if actual != wanted:
                raise LogConfigurationError(
                    f"topic {self._topic} has {name}={actual}: a gitsched log needs "
                    f"{name}={wanted} (events are kept forever and never compacted)"
                )

    # -- lifecycle -------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_s

    def close(self) -> None:
        with self._lock:
            self._discard_producer()
            for consumer in (self._consumer, self._ranger, self._prober):
                if consumer is not None:
                    _close_quietly(consumer)
            self._consumer = self._ranger = self._prober = None
            self._range_owner = self._probe_owner = None

    def __repr__(self) -> str:
        return f"KafkaEventLog({','.join(self._bootstrap)}/{self._topic})"


def delete_log_topic(url: str, *, timeout_s: float = 15) -> None:
    """Delete the topic of `kafka://.../TOPIC`: for throwaway logs (benchmarks), never a cluster's."""
    log = KafkaEventLog.from_url(url, create_topic=False, timeout_s=timeout_s)
    log.close()
    try:
        admin = AdminClient(log._client_config("admin"))
        deleted = admin.delete_topics(
            [log.topic], operation_timeout=timeout_s, request_timeout=timeout_s
        )
        deleted[log.topic].result(timeout=timeout_s)
    except Exception as error:
        raise _translate(error, f"deleting topic {log.topic}") from error


_loads = orjson.loads
_from_record = StoredEvent.from_record
_ID = operator.attrgetter("id")
_SEQ = operator.attrgetter("seq")


def _raise_error(message: Message) -> None:
    """Raise the log's error for a message that carries a client error."""
    error = message.error()
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        raise _translate(KafkaException(error), "reading")


def _s_left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def _translate(error: BaseException, doing: str) -> EventLogError:
    """One of the log's errors for a Kafka client (or socket) error."""
    if isinstance(error, EventLogError):
        return error
    underlying = error.__cause__ or error.__context__
    if isinstance(error, SystemError) and underlying is not None:
        # confluent-kafka can leave a client error pending while it calls back into
        # Python (a delivery report after the producer was fenced): the next C call
        # there fails with a SystemError chained to it (confluent-kafka-python#865).
        return _translate(underlying, doing)
    if isinstance(error, _AppendTimeout):
        return LogUnavailable(f"{doing}: no answer from Kafka in time ({error})")
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        kafka_error: KafkaError = error.args[0]
        if kafka_error.code() in _FENCING_CODES:
            return WriterFenced(f"{doing}: another writer took over: {kafka_error.str()}")
        if (
            kafka_error.code() in _UNAVAILABLE_CODES
            or kafka_error.retriable()
            or kafka_error.txn_requires_abort()
        ):
            return LogUnavailable(f"{doing}: Kafka is unavailable: {kafka_error.str()}")
        return EventLogError(f"{doing}: {kafka_error.name()}: {kafka_error.str()}")
    if isinstance(error, OSError):
        return LogUnavailable(f"{doing}: Kafka is unavailable: {error}")
    return EventLogError(f"{doing}: {type(error).__name__}: {error}")


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
