"""The production event log: one Kafka topic per cluster, one partition, kept forever.

A transactional producer makes each batch atomic and fences a second (or zombie)
writer; readers see only committed batches. The client is confluent-kafka
(librdkafka): a transaction costs its broker round trips and little else, where
a pure-Python client spends as long again building and parsing records.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
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
    markers take offsets too). Every writer of a topic must use the same
    `transactional_id` (the default derives it from the topic): that is what
    fences a second writer. Opening the log and reading never fences anyone;
    the producer is created on the first append. Once fenced, an instance stays
    fenced: a process that wants to write again opens a new one.
    """

    # Every record is checked as it is read (`_ingest`): seq, link and hash.
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
        self._consumer: Consumer | None = None
        self._fenced = False
        # The tail as this writer last knew it to be its own: anything after it
        # was written by another producer with our transactional id, which
        # fenced us when it initialised.
        self._writer_tail: int | None = None
        # What has been read: events[seq - 1], offsets[seq - 1], id -> seq.
        self._events: list[StoredEvent] = []
        self._offsets: list[int] = []
        self._seq_by_id: dict[str, int] = {}
        self._last_offset = -1
        self._sought = 0  # where the reader was last sent (see _await_visible)
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
    ) -> Iterator[StoredEvent]:
        with self._lock:
            self._catch_up(self._deadline())
            last = len(self._events)
            stop = last if until_seq is None else max(0, min(until_seq, last))
            # A snapshot of the range: later appends do not change what this yields.
            selected = self._events[max(0, after_seq) : stop]
        return iter(selected)

    def last_seq(self) -> int:
        with self._lock:
            self._catch_up(self._deadline())
            return len(self._events)

    def find(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        with self._lock:
            self._catch_up(self._deadline())
            return self._known(event_ids)

    def offset_of(self, seq: int) -> int:
        """The Kafka offset of the record holding event `seq` (they differ: commit
        markers take offsets too), for pointing tools at the raw topic."""
        with self._lock:
            self._catch_up(self._deadline())
            if not 1 <= seq <= len(self._offsets):
                raise KeyError(f"no event with seq {seq} in {self._topic}")
            return self._offsets[seq - 1]

    def _known(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        found: dict[str, StoredEvent] = {}
        for event_id in event_ids:
            seq = self._seq_by_id.get(event_id)
            if seq is not None:
                found[event_id] = self._events[seq - 1]
        return found

    def _end_offset(self, deadline: float) -> int:
        """The last stable offset: below it, every transaction has committed or aborted."""
        _, end = self._reader().get_watermark_offsets(
            self._partition, timeout=_s_left(deadline), cached=False
        )
        return int(end)

    def _catch_up(self, deadline: float) -> None:
        """Read every committed record after what we hold, up to the last stable offset."""
        if self._corruption is not None:
            raise self._corruption
        try:
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

    def _position(self, consumer: Consumer) -> int:
        """The next offset the reader will hand out: past what we hold, past commit
        markers it has skipped, past where we sent it."""
        offset = consumer.position([self._partition])[0].offset
        return max(int(offset), self._last_offset + 1, self._sought)

    def _ingest(self, messages: list[Message]) -> None:
        """Check and keep fetched records: the replay's inner loop, so written flat.

        Each record must be the next seq, link to the hash before it, and hash to
        its own `hash` (checked on the record's bytes, which spares re-encoding
        it; a record that is not byte-canonical is checked the long way).
        """
        events = self._events
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
                continue  # our own append, cached when it committed
            value = message.value()
            raw = value if isinstance(value, bytes) else b""
            try:
                event = from_record(loads(raw))
            except (ValueError, TypeError, KeyError) as error:
                raise LogCorrupted(
                    f"{self._topic} offset {offset} is not a gitsched event: {error}"
                ) from error
            prev_hash = events[-1].hash if events else GENESIS_HASH
            if (
                event.seq != len(events) + 1
                or event.prev_hash != prev_hash
                or not record_hash_holds(raw, event.hash)
            ):
                broken = verify_chain(
                    [event], expect_first_seq=len(events) + 1, prev_hash=prev_hash
                )
                if broken is not None:
                    raise LogCorrupted(
                        f"{self._topic} offset {offset}: seq {broken.seq}: {broken.reason}"
                    )
            keep(event, offset)

    def _accept(self, events: list[StoredEvent], offsets: list[int]) -> None:
        """Keep the batch this writer just committed: sealed here, or checked hash by
        hash before import, so only its links to what the cache holds are checked."""
        broken = verify_chain(
            events,
            expect_first_seq=len(self._events) + 1,
            prev_hash=self._events[-1].hash if self._events else GENESIS_HASH,
            recompute=False,
        )
        if broken is not None:
            raise LogCorrupted(f"the batch just committed: seq {broken.seq}: {broken.reason}")
        for event, offset in zip(events, offsets, strict=True):
            self._keep(event, offset)

    def _keep(self, event: StoredEvent, offset: int) -> None:
        """Add a checked event, read from `offset`, to what this instance holds."""
        known = self._seq_by_id.get(event.id)
        if known is not None:
            raise LogCorrupted(
                f"{self._topic} offset {offset}: event id {event.id!r} at seq {event.seq} "
                f"is already at seq {known}"
            )
        self._events.append(event)
        self._offsets.append(offset)
        self._seq_by_id[event.id] = event.seq
        self._last_offset = offset

    def _reader(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(
                {
                    **self._client_config("reader"),
                    # Assigned, never subscribed: the group is never joined, no
                    # offset is ever committed.
                    "group.id": f"gitsched-reader-{self._topic}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": False,
                    "fetch.wait.max.ms": 50,
                    "fetch.max.bytes": 64 * 1024 * 1024,
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                }
            )
            start = self._last_offset + 1 if self._last_offset >= 0 else OFFSET_BEGINNING
            consumer.assign([TopicPartition(self._topic, PARTITION, start)])
            consumer.pause([self._partition])
            self._consumer = consumer
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
            present = self._known(ids)
            if len(present) == len(batch):
                return [present[i] for i in ids]
            self._check_still_writer()
            last = len(self._events)
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
                prev_hash=self._events[-1].hash if self._events else GENESIS_HASH,
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
            done = already_imported(batch, self._known([e.id for e in batch]))
            if done is not None:
                return done
            self._check_still_writer()
            check_import(
                batch,
                last_seq=len(self._events),
                last_hash=self._events[-1].hash if self._events else GENESIS_HASH,
                expected_last_seq=expected_last_seq,
            )
            self._write([(e, canonical_json(e.to_record())) for e in batch], deadline)
            return batch

    def _prepare_write(self, deadline: float) -> None:
        """Hold the producer (fencing older writers) and know the log up to its end.

        A new producer reads the whole tail once it has fenced everyone older.
        After that, this writer's own commits are the only ones that can land
        while its producer lives (the broker fences it the moment another
        initialises), so its cache is the tail and no round trip is spent on it.
        """
        if self._fenced:
            raise WriterFenced(self._fenced_message())
        if self._producer is None:
            self._writer(deadline)

    def _check_still_writer(self) -> None:
        last = len(self._events)
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
        self._writer_tail = len(self._events)
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
        self._writer_tail = len(self._events)
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
            if self._consumer is not None:
                _close_quietly(self._consumer)
                self._consumer = None

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
