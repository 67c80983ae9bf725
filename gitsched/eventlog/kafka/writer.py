"""The log's writing side: one transactional producer per writer.

A transaction makes each append atomic, and creating the producer fences every
older writer with the same transactional id (a second or zombie process): the
broker refuses its commits from then on. The writer learns the tail through the
log's reader, and keeps each batch it commits there.
"""

from __future__ import annotations

import contextlib
import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from gitsched.eventlog.base import EventLogError, WriterFenced
from gitsched.eventlog.envelope import StoredEvent
from gitsched.eventlog.kafka.clients import _close_quietly, client_config
from gitsched.eventlog.kafka.errors import _AppendTimeout, _s_left, _translate
from gitsched.eventlog.kafka.reader import KafkaReader
from gitsched.eventlog.kafka.topic import PARTITION

# One append's events travel as one record batch, LZ4-compressed (a log kept
# forever is mostly repetitive JSON).
BATCH_BYTES = 4 * 1024 * 1024
MAX_REQUEST_BYTES = 8 * 1024 * 1024


class KafkaWriter:
    """The producer of one log instance, created on its first append.

    Once fenced, it stays fenced: a process that wants to write again opens a new
    log. Every method runs under the log's lock.
    """

    def __init__(
        self,
        bootstrap: list[str],
        topic: str,
        timeout_s: float,
        transactional_id: str,
        reading: KafkaReader,
    ) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._timeout_s = timeout_s
        self._transactional_id = transactional_id
        self._reading = reading
        self._producer: Producer | None = None
        self._fenced = False
        # The tail as this writer last knew it to be its own: anything after it
        # was written by another producer with our transactional id, which
        # fenced us when it initialised.
        self._writer_tail: int | None = None

    def prepare(self, deadline: float) -> None:
        """Hold the producer (fencing older writers) and know the log up to its end.

        A new producer reads the tail once it has fenced everyone older.
        After that, this writer's own commits are the only ones that can land
        while its producer lives (the broker fences it the moment another
        initialises), so its cache is the tail and no round trip is spent on it.
        """
        if self._fenced:
            raise WriterFenced(self._fenced_message())
        if self._producer is None:
            self._start(deadline)

    def check_still_writer(self) -> None:
        last = self._reading.tail_seq
        if self._writer_tail is not None and last > self._writer_tail:
            message = (
                f"{self._fenced_message()}: the log reached seq {last} after this "
                f"writer's tail at seq {self._writer_tail}"
            )
            self._fence()
            raise WriterFenced(message)

    def write(self, sealed: list[tuple[StoredEvent, bytes]], deadline: float) -> None:
        """One transaction holding `sealed` (events with their records' bytes), visible
        to read_committed readers on return."""
        offsets = self._produce(sealed, deadline)
        self._reading.accept([event for event, _ in sealed], offsets)
        self._writer_tail = self._reading.tail_seq
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
                end = self._reading.end_offset(deadline)
            except Exception:
                return
            if end > last_offset:
                if end == last_offset + 2:
                    # Below `end` lie only our batch and its commit marker: the reader
                    # need not fetch back what it already holds.
                    with contextlib.suppress(Exception):
                        self._reading.skip_to(end)
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _start(self, deadline: float) -> Producer:
        """The transactional producer; creating it fences every older writer."""
        if self._producer is not None:
            return self._producer
        producer = None
        timeout_ms = int(self._timeout_s * 1000)
        try:
            producer = Producer(
                {
                    **client_config(self._bootstrap, self._topic, self._timeout_s, "writer"),
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
            self._reading.catch_up(deadline)
        except EventLogError:
            self.discard_producer()
            raise
        self._writer_tail = self._reading.tail_seq
        return producer

    def _produce(self, sealed: list[tuple[StoredEvent, bytes]], deadline: float) -> list[int]:
        producer = self._start(deadline)
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
            self.discard_producer()
            translated = _translate(error, f"appending to {self._topic}")
            if isinstance(translated, WriterFenced):
                self._fenced = True
            raise translated from error

    def _commit(self, producer: Producer, deadline: float) -> None:
        producer.commit_transaction(_s_left(deadline))

    def _fence(self) -> None:
        self._fenced = True
        self.discard_producer()

    def _fenced_message(self) -> str:
        return (
            f"another writer with transactional.id {self._transactional_id!r} "
            f"took over {self._topic}"
        )

    def discard_producer(self) -> None:
        if self._producer is not None:
            _close_quietly(self._producer)
            self._producer = None
            self._writer_tail = None
