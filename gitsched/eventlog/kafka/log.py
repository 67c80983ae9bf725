"""The production event log: one Kafka topic per cluster, one partition, kept forever.

A transactional producer makes each batch atomic and fences a second (or zombie)
writer; readers see only committed batches. The client is confluent-kafka
(librdkafka): a transaction costs its broker round trips and little else, where
a pure-Python client spends as long again building and parsing records. This
module is the EventLog interface over the topic; reading (eventlog.kafka.reader),
writing (eventlog.kafka.writer) and the topic's settings (eventlog.kafka.topic)
each live in their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from gitsched.eventlog.base import (
    Clock,
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    SnapshotStore,
    already_imported,
    check_import,
    utc_now,
)
from gitsched.eventlog.envelope import (
    NewEvent,
    StoredEvent,
    canonical_json,
    format_time,
    seal_batch_records,
)
from gitsched.eventlog.kafka.clients import client_config
from gitsched.eventlog.kafka.reader import KafkaReader
from gitsched.eventlog.kafka.topic import delete_topic, ensure_topic
from gitsched.eventlog.kafka.writer import KafkaWriter

DEFAULT_PORT = 9092


class KafkaEventLog(EventLog):
    """A cluster's event log in a single-partition Kafka topic.

    `seq` is the envelope's own gap-free counter, not the Kafka offset (commit
    markers take offsets too, and aborted batches leave holes). Every writer of a
    topic must use the same `transactional_id` (the default derives it from the
    topic): that is what fences a second writer. Opening the log and reading never
    fences anyone; the producer is created on the first append. Once fenced, an
    instance stays fenced: a process that wants to write again opens a new one.

    An instance never reads more of the topic than it is asked for. Opening finds
    the tail by reading back from the end (`KafkaReader._locate`); from there a follower keeps
    up with new records and holds the newest RECENT_EVENTS of them. An older range
    is read on demand from its own offset, found by a search over the topic
    (`KafkaReader.offset_of`), so a restart from a snapshot reads only the snapshot's event
    and the tail after it, however long the log.
    """

    # Every record is checked as it is read: seq and link to the record before it
    # (read too, for a range that starts mid-log); with check_content, or at the
    # tail, its content hash on the record's bytes too.
    reads_checked = True
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
        self._timeout_s = float(timeout_s)
        self._lock = threading.RLock()
        self._reading = KafkaReader(self._bootstrap, topic, self._timeout_s, self._lock)
        self._writing = KafkaWriter(
            self._bootstrap,
            topic,
            self._timeout_s,
            transactional_id or f"gitsched-{topic}",
            self._reading,
        )
        # Snapshots live outside the topic (see eventlog.snapshot); open_log sets the folder.
        self.snapshot_store: SnapshotStore | None = None
        ensure_topic(self._client_config("admin"), topic, self._timeout_s, create=create_topic)

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
        return client_config(self._bootstrap, self._topic, self._timeout_s, role)

    # -- reading ---------------------------------------------------------

    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),  # parsed once on fetch: nothing to skip
        check_content: bool = False,
    ) -> Iterator[StoredEvent]:
        return self._reading.read(after_seq, until_seq, check_content)

    def last_seq(self) -> int:
        with self._lock:
            self._reading.catch_up(self._deadline())
            return self._reading.tail_seq

    def last_event(self) -> StoredEvent | None:
        with self._lock:
            self._reading.catch_up(self._deadline())
            newest = self._reading.newest()
            if newest is not None:
                return newest
        return super().last_event()

    def find(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        with self._lock:
            self._reading.catch_up(self._deadline())
            return self._reading.known(event_ids)

    def offset_of(self, seq: int) -> int:
        """The Kafka offset of the record holding event `seq` (they differ: commit
        markers take offsets too), for pointing tools at the raw topic."""
        with self._lock:
            deadline = self._deadline()
            self._reading.catch_up(deadline)
            if not 1 <= seq <= self._reading.tail_seq:
                raise KeyError(f"no event with seq {seq} in {self._topic}")
            return self._reading.offset_of(seq, deadline)

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
            self._writing.prepare(deadline)
            present = self._reading.present(ids, expected_last_seq)
            if len(present) == len(batch):
                return [present[i] for i in ids]
            self._writing.check_still_writer()
            last = self._reading.tail_seq
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
                prev_hash=self._reading.tail_hash,
            )
            self._writing.write(sealed, deadline)
            return [event for event, _ in sealed]

    def import_events(
        self, stored: Sequence[StoredEvent], *, expected_last_seq: int
    ) -> list[StoredEvent]:
        batch = list(stored)
        if not batch:
            return []
        with self._lock:
            deadline = self._deadline()
            self._writing.prepare(deadline)
            done = already_imported(
                batch, self._reading.present([e.id for e in batch], expected_last_seq)
            )
            if done is not None:
                return done
            self._writing.check_still_writer()
            check_import(
                batch,
                last_seq=self._reading.tail_seq,
                last_hash=self._reading.tail_hash,
                expected_last_seq=expected_last_seq,
            )
            self._writing.write([(e, canonical_json(e.to_record())) for e in batch], deadline)
            return batch

    # -- lifecycle -------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_s

    def close(self) -> None:
        with self._lock:
            self._writing.discard_producer()
            self._reading.close()

    def __repr__(self) -> str:
        return f"KafkaEventLog({','.join(self._bootstrap)}/{self._topic})"


def delete_log_topic(url: str, *, timeout_s: float = 15) -> None:
    """Delete the topic of `kafka://.../TOPIC`: for throwaway logs (benchmarks), never a cluster's."""
    log = KafkaEventLog.from_url(url, create_topic=False, timeout_s=timeout_s)
    log.close()
    delete_topic(log._client_config("admin"), log.topic, timeout_s)
