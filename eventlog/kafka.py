"""The production event log: one Kafka topic per cluster, one partition, kept forever.

A transactional producer makes each batch atomic and fences a second (or zombie)
writer; readers see only committed batches. kafka-python is untyped, so every
`Any` from it stays inside this module.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import kafka.errors as kafka_errors  # type: ignore[import-untyped,unused-ignore]
import orjson
from kafka import (  # type: ignore[import-untyped,unused-ignore]
    KafkaAdminClient,
    KafkaConsumer,
    KafkaProducer,
    TopicPartition,
)
from kafka.admin import ConfigResource, ConfigResourceType  # type: ignore[import-untyped,unused-ignore]
from kafka.codec import has_lz4  # type: ignore[import-untyped,unused-ignore]

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
from eventlog.envelope import (
    GENESIS_HASH,
    NewEvent,
    StoredEvent,
    canonical_json,
    format_time,
    record_hash_holds,
    seal_batch,
    verify_chain,
)

DEFAULT_PORT = 9092
PARTITION = 0
# Topic settings gitsched insists on: the log is the only source of truth.
REQUIRED_TOPIC_CONFIG = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}
# One append's events travel as one record batch (see _writer), LZ4-compressed
# when the lz4 package is there (a log kept forever is mostly repetitive JSON).
BATCH_BYTES = 4 * 1024 * 1024
COMPRESSION: str | None = "lz4" if has_lz4() else None
# kafka-python backs off up to 30 s between reconnects by default; a log that must
# notice a broker coming back within one append's budget retries sooner.
_RECONNECT = {"reconnect_backoff_ms": 100, "reconnect_backoff_max_ms": 1000}
_FENCING_ERRORS: tuple[type[BaseException], ...] = (
    kafka_errors.ProducerFencedError,
    kafka_errors.InvalidProducerEpochError,
    kafka_errors.TransactionCoordinatorFencedError,
)
# Errors that mean "the cluster cannot be reached or did not answer in time".
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    kafka_errors.RetriableError,
    kafka_errors.KafkaTimeoutError,
    kafka_errors.KafkaConnectionError,
    kafka_errors.BrokerNotAvailableError,
    kafka_errors.TransactionAbortedError,
    kafka_errors.TransactionAbortableError,
    OSError,
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
        self._timeout_ms = int(timeout_s * 1000)
        self._partition = TopicPartition(topic, PARTITION)
        self._lock = threading.RLock()
        self._producer: Any = None
        self._consumer: Any = None
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
        self._corruption: LogCorrupted | None = None
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

    def _catch_up(self, deadline: float) -> None:
        """Read every committed record after what we hold, up to the last stable offset."""
        if self._corruption is not None:
            raise self._corruption
        try:
            consumer = self._reader()
            end = int(consumer.end_offsets([self._partition], _ms_left(deadline))[self._partition])
            while int(consumer.position(self._partition, timeout_ms=_ms_left(deadline))) < end:
                if time.monotonic() >= deadline:
                    raise _AppendTimeout(f"reading {self._topic} up to offset {end}")
                batches = consumer.poll(timeout_ms=min(_ms_left(deadline), 1000))
                for record in batches.get(self._partition, ()):
                    self._ingest(int(record.offset), record.value)
        except LogCorrupted as corruption:
            # What follows a break cannot be placed: refuse every later read as well.
            self._corruption = corruption
            raise
        except EventLogError:
            raise
        except Exception as error:
            raise _translate(error, f"reading {self._topic}") from error

    def _ingest(self, offset: int, value: bytes | None) -> None:
        if offset <= self._last_offset:
            return  # our own append, cached when it committed
        try:
            event = StoredEvent.from_record(orjson.loads(value or b""))
        except (ValueError, TypeError, KeyError) as error:
            raise LogCorrupted(
                f"{self._topic} offset {offset} is not a gitsched event: {error}"
            ) from error
        self._accept(
            [event],
            [offset],
            source=f"{self._topic} offset {offset}",
            # Hashing the record's own bytes spares re-encoding it (most of a replay's
            # time); a record that is not byte-canonical is checked the long way.
            content_checked=record_hash_holds(value or b"", event.hash),
        )

    def _accept(
        self,
        events: list[StoredEvent],
        offsets: list[int],
        *,
        source: str,
        content_checked: bool = False,
    ) -> None:
        prev_hash = self._events[-1].hash if self._events else GENESIS_HASH
        broken = verify_chain(
            events,
            expect_first_seq=len(self._events) + 1,
            prev_hash=prev_hash,
            recompute=not content_checked,
        )
        if broken is not None:
            raise LogCorrupted(f"{source}: seq {broken.seq}: {broken.reason}")
        for event, offset in zip(events, offsets, strict=True):
            if event.id in self._seq_by_id:
                raise LogCorrupted(
                    f"{source}: event id {event.id!r} at seq {event.seq} "
                    f"is already at seq {self._seq_by_id[event.id]}"
                )
            self._events.append(event)
            self._offsets.append(offset)
            self._seq_by_id[event.id] = event.seq
            self._last_offset = offset

    def _reader(self) -> Any:
        if self._consumer is None:
            consumer = KafkaConsumer(
                bootstrap_servers=self._bootstrap,
                client_id=f"gitsched-reader-{self._topic}",
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest",
                max_poll_records=5000,
                request_timeout_ms=max(self._timeout_ms, 1000),
                bootstrap_timeout_ms=self._timeout_ms,
                fetch_max_wait_ms=200,
                **_RECONNECT,
            )
            consumer.assign([self._partition])
            consumer.seek_to_beginning(self._partition)
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
            sealed = seal_batch(
                batch,
                first_seq=last + 1,
                time=format_time(self._clock()),
                prev_hash=self._events[-1].hash if self._events else GENESIS_HASH,
            )
            self._write(sealed, deadline)
            return sealed

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
            self._write(batch, deadline)
            return batch

    def _prepare_write(self, deadline: float) -> None:
        """Hold the producer (fencing older writers) and read the log up to its end."""
        if self._fenced:
            raise WriterFenced(self._fenced_message())
        self._writer(deadline)
        self._catch_up(deadline)

    def _check_still_writer(self) -> None:
        last = len(self._events)
        if self._writer_tail is not None and last > self._writer_tail:
            message = (
                f"{self._fenced_message()}: the log reached seq {last} after this "
                f"writer's tail at seq {self._writer_tail}"
            )
            self._fence()
            raise WriterFenced(message)

    def _write(self, sealed: list[StoredEvent], deadline: float) -> None:
        """One transaction holding `sealed`, visible to read_committed readers on return."""
        offsets = self._produce(sealed, deadline)
        # Sealed here, or checked link by link and hash by hash before import: only
        # their place after what the cache holds is left to check.
        self._accept(sealed, offsets, source="the batch just committed", content_checked=True)
        self._writer_tail = len(self._events)
        self._await_visible(offsets[-1], deadline)

    def _await_visible(self, last_offset: int, deadline: float) -> None:
        """Wait until read_committed readers can see the batch.

        A commit returns once the coordinator has logged it; the markers that let
        readers past it are written just after. Waiting for them means a reader
        opened after append() returned sees the batch, as with SQLite (and the
        next transaction does not meet CONCURRENT_TRANSACTIONS and a 20 ms
        back-off). If they are late the batch is still committed, so this gives
        up quietly.
        """
        pause = 0.001
        while time.monotonic() < deadline:
            try:
                reader = self._reader()
                end = int(
                    reader.end_offsets([self._partition], _ms_left(deadline))[self._partition]
                )
            except Exception:
                return
            if end > last_offset:
                if end == last_offset + 2:
                    # Below `end` lie only our batch and its commit marker: the reader
                    # need not fetch back what it already holds.
                    with contextlib.suppress(Exception):
                        reader.seek(self._partition, end)
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _writer(self, deadline: float) -> Any:
        """The transactional producer; creating it fences every older writer."""
        if self._producer is not None:
            return self._producer
        producer = None
        try:
            producer = KafkaProducer(
                bootstrap_servers=self._bootstrap,
                client_id=f"gitsched-writer-{self._topic}",
                transactional_id=self._transactional_id,
                enable_idempotence=True,
                acks="all",
                # A batch is sent by the flush() that ends it, never by a timer: a
                # long linger and a batch size above any append keep one append in
                # one record batch (one request, one CRC, one compression pass).
                linger_ms=1000,
                batch_size=BATCH_BYTES,
                compression_type=COMPRESSION,
                max_block_ms=self._timeout_ms,
                bootstrap_timeout_ms=_ms_left(deadline),
                request_timeout_ms=max(1000, self._timeout_ms // 2),
                delivery_timeout_ms=max(2000, self._timeout_ms),
                # Longer than any append may take, so the coordinator never aborts
                # (and re-epochs) a transaction this writer is still committing.
                transaction_timeout_ms=min(900_000, max(60_000, 2 * self._timeout_ms)),
                max_request_size=8 * 1024 * 1024,
                **_RECONNECT,
            )
            producer.init_transactions()
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

    def _produce(self, sealed: list[StoredEvent], deadline: float) -> list[int]:
        producer = self._producer
        try:
            producer.begin_transaction()
            futures = [
                producer.send(
                    self._topic,
                    value=canonical_json(event.to_record()),
                    key=event.id.encode("utf-8"),
                    partition=PARTITION,
                )
                for event in sealed
            ]
            producer.flush(timeout=_ms_left(deadline) / 1000)
            offsets = [
                int(future.get(timeout=_ms_left(deadline) / 1000).offset) for future in futures
            ]
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

    def _commit(self, producer: Any, deadline: float) -> None:
        # KafkaProducer.commit_transaction() waits without limit while the broker
        # is away; this is the same call with a bound on the wait.
        manager = getattr(producer, "_transaction_manager", None)
        sender = getattr(producer, "_sender", None)
        if manager is None or sender is None:
            producer.commit_transaction()
            return
        result = manager.begin_commit()
        sender.wakeup()
        if not result.wait(timeout_ms=_ms_left(deadline)):
            raise _AppendTimeout(f"committing the transaction on {self._topic}")

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
        admin = None
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=self._bootstrap,
                client_id=f"gitsched-admin-{self._topic}",
                request_timeout_ms=self._timeout_ms,
                bootstrap_timeout_ms=self._timeout_ms,
                **_RECONNECT,
            )
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
        finally:
            if admin is not None:
                _close_quietly(admin)

    def _topic_exists(self, admin: Any) -> bool:
        described = admin.describe_topics([self._topic])
        return bool(described) and int(described[0]["error_code"]) == 0

    def _create_topic(self, admin: Any) -> None:
        brokers = len(admin.describe_cluster()["brokers"])
        replicas = max(1, min(3, brokers))
        config = dict(REQUIRED_TOPIC_CONFIG)
        config["min.insync.replicas"] = "2" if replicas >= 3 else "1"
        # Another process may create it first; its settings are checked next either way.
        with contextlib.suppress(kafka_errors.TopicAlreadyExistsError):
            admin.create_topics(
                {
                    self._topic: {
                        "num_partitions": 1,
                        "replication_factor": replicas,
                        "configs": config,
                    }
                },
                timeout_ms=self._timeout_ms,
                wait_for_metadata=True,
            )

    def _check_topic(self, admin: Any) -> None:
        described = admin.describe_topics([self._topic])[0]
        partitions = len(described["partitions"])
        if partitions != 1:
            raise LogConfigurationError(
                f"topic {self._topic} has {partitions} partitions: a gitsched log needs "
                f"exactly 1 (num.partitions) for a total order"
            )
        resource = ConfigResource(ConfigResourceType.TOPIC, self._topic)
        configs = admin.describe_configs([resource], config_filter="all")["topic"][self._topic]
        for name, wanted in REQUIRED_TOPIC_CONFIG.items():
            actual = str(configs.get(name, {}).get("value"))
            if actual != wanted:
                raise LogConfigurationError(
                    f"topic {self._topic} has {name}={actual}: a gitsched log needs "
                    f"{name}={wanted} (events are kept forever and never compacted)"
                )

    # -- lifecycle -------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_ms / 1000

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
    admin = None
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=log._bootstrap,
            client_id=f"gitsched-admin-{log.topic}",
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
            **_RECONNECT,
        )
        admin.delete_topics([log.topic], timeout_ms=int(timeout_s * 1000))
    except Exception as error:
        raise _translate(error, f"deleting topic {log.topic}") from error
    finally:
        if admin is not None:
            _close_quietly(admin)


def _ms_left(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _translate(error: BaseException, doing: str) -> EventLogError:
    """One of the log's errors for a kafka-python (or socket) error."""
    if isinstance(error, EventLogError):
        return error
    if isinstance(error, _FENCING_ERRORS):
        return WriterFenced(f"{doing}: another writer took over: {error}")
    if isinstance(error, _AppendTimeout):
        return LogUnavailable(f"{doing}: no answer from Kafka in time ({error})")
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return LogUnavailable(f"{doing}: Kafka is unavailable: {error}")
    return EventLogError(f"{doing}: {type(error).__name__}: {error}")


def _close_quietly(client: Any) -> None:
    try:
        if isinstance(client, KafkaProducer):
            client.close(timeout=0)
        elif isinstance(client, KafkaConsumer):
            client.close(autocommit=False, timeout_ms=1000)
        else:
            client.close()
    except Exception:
        pass  # best effort: the error that led here is the one to report
