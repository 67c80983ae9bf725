"""What only the Kafka log has to get right: topic settings it refuses, fencing of
zombie writers, records as they lie on the topic, and a broker that goes away
in the middle of a stream of appends.

These talk to the real broker (GITSCHED_TEST_KAFKA); the outage test stops and
restarts it through scripts/kafka and always leaves it running.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gitsched.eventlog.base import LogConfigurationError, LogCorrupted, LogUnavailable, WriterFenced
from gitsched.eventlog.envelope import GENESIS_HASH, NewEvent, canonical_json, verify_chain
from gitsched.eventlog.kafka import KafkaEventLog, KafkaReader, KafkaWriter
from tests.support.kafka_broker import (
    broker_is_managed,
    check_broker,
    create_topic,
    delete_topics,
    run_script,
    unique_topic,
)


def new_event(key: str) -> NewEvent:
    return NewEvent(
        id=f"commit-{key}",
        type="NodeStateChanged",
        schema_version=1,
        data={"node": f"gpu-{key}", "state": "drained"},
        actor="inventory:static",
        cause=f"sha-{key}",
    )


def batch(*keys: str) -> list[NewEvent]:
    return [new_event(key) for key in keys]


class Topics:
    """Fresh topic names for one test, deleted afterwards, and logs opened on them."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.names: list[str] = []
        self.logs: list[KafkaEventLog] = []

    def new(self) -> str:
        name = unique_topic("gitsched-fault")
        self.names.append(name)
        return name

    def open(self, topic: str, **kw: Any) -> KafkaEventLog:
        log = KafkaEventLog(self.bootstrap.split(","), topic, **kw)
        self.logs.append(log)
        return log


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[Topics]:
    made = Topics(kafka_bootstrap)
    try:
        yield made
    finally:
        for log in made.logs:
            log.close()
        delete_topics(kafka_bootstrap, made.names)


def raw_records(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record on the topic, as kafka-python hands it over."""
    from kafka import KafkaConsumer, TopicPartition  # type: ignore[import-untyped,unused-ignore]

    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap.split(","),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        records: list[Any] = []
        deadline = time.monotonic() + 20
        while consumer.position(partition) < end and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=1000).get(partition, []))
        return records
    finally:
        consumer.close()


# -- topic settings -------------------------------------------------------------


@pytest.mark.kafka
def test_a_created_topic_has_one_partition_and_keeps_everything(
    topics: Topics, kafka_bootstrap: str
) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType  # type: ignore[import-untyped,unused-ignore]

    from tests.support.kafka_broker import admin_client

    topic = topics.new()
    topics.open(topic)

    admin = admin_client(kafka_bootstrap)
    try:
        [described] = admin.describe_topics([topic])
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
        )["topic"][topic]
    finally:
        admin.close()
    assert len(described["partitions"]) == 1
    values = {name: configs[name]["value"] for name in configs}
    assert values["retention.ms"] == "-1"
    assert values["retention.bytes"] == "-1"
    assert values["cleanup.policy"] == "delete"
    assert values["min.insync.replicas"] == "1"  # one broker, one replica


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("partitions", "configs", "named"),
    [
        (3, {}, "partitions"),
        (1, {"retention.ms": str(7 * 24 * 3600 * 1000)}, "retention.ms"),
        (1, {"retention.bytes": str(1 << 30)}, "retention.bytes"),
        (1, {"cleanup.policy": "compact"}, "cleanup.policy"),
        (1, {"cleanup.policy": "compact,delete"}, "cleanup.policy"),
    ],
    ids=["3-partitions", "retention-7-days", "retention-1-GiB", "compacted", "compact-delete"],
)
def test_a_topic_with_other_settings_is_refused(
    topics: Topics, kafka_bootstrap: str, partitions: int, configs: dict[str, str], named: str
) -> None:
    topic = topics.new()
    create_topic(kafka_bootstrap, topic, partitions=partitions, configs=configs)

    with pytest.raises(LogConfigurationError, match=named):
        topics.open(topic)


@pytest.mark.kafka
def test_a_missing_topic_is_refused_when_creating_is_off(topics: Topics) -> None:
    with pytest.raises(LogConfigurationError, match="does not exist"):
        topics.open(topics.new(), create_topic=False)


@pytest.mark.kafka
def test_from_url_opens_the_topic(topics: Topics, kafka_bootstrap: str) -> None:
    topic = topics.new()
    log = KafkaEventLog.from_url(f"kafka://{kafka_bootstrap}/{topic}")
    topics.logs.append(log)
    log.append(batch("a"), expected_last_seq=0)
    assert topics.open(topic).last_seq() == 1


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///x.db",
        "kafka:///topic",
        "kafka://host:9092/",
        "kafka://host:9092/a/b",
        "kafka://h/t?x=1",
    ],
)
def test_from_url_rejects_malformed_urls(url: str) -> None:
    with pytest.raises(ValueError):
        KafkaEventLog.from_url(url)


def test_an_unreachable_broker_is_log_unavailable_in_bounded_time() -> None:
    started = time.monotonic()
    with pytest.raises(LogUnavailable):
        KafkaEventLog(["127.0.0.1:9"], "gitsched-nowhere", timeout_s=2)
    assert time.monotonic() - started < 10


# -- what lies on the topic -----------------------------------------------------


@pytest.mark.kafka
def test_each_event_is_one_record_keyed_by_id_holding_its_canonical_json(
    topics: Topics, kafka_bootstrap: str
) -> None:
    topic = topics.new()
    log = topics.open(topic)
    stored = log.append(batch("ä", "b"), expected_last_seq=0)
    stored += log.append(batch("c"), expected_last_seq=2)

    records = raw_records(kafka_bootstrap, topic)
    # seq is not the offset: the first batch's commit marker sits between 2 and 3.
    assert [log.offset_of(e.seq) for e in stored] == [0, 1, 3]
    assert [record.offset for record in records] == [0, 1, 3]
    assert [record.key for record in records] == [e.id.encode("utf-8") for e in stored]
    assert [record.value for record in records] == [canonical_json(e.to_record()) for e in stored]


@pytest.mark.kafka
def test_a_gap_in_seq_on_the_topic_is_log_corrupted(topics: Topics, kafka_bootstrap: str) -> None:
    from kafka import KafkaProducer  # type: ignore[import-untyped,unused-ignore]

    topic = topics.new()
    [first] = topics.open(topic).append(batch("a"), expected_last_seq=0)
    # Someone writes behind gitsched's back: an event that claims seq 3.
    forged = dict(first.to_record(), seq=3, id="commit-forged", prev_hash=first.hash)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap.split(","))
    try:
        producer.send(topic, value=json.dumps(forged).encode(), partition=0).get(timeout=20)
    finally:
        producer.close()

    reader = topics.open(topic)
    with pytest.raises(LogCorrupted, match="seq 2"):
        reader.last_seq()
    with pytest.raises(LogCorrupted):
        list(reader.read())


# -- fencing --------------------------------------------------------------------


@pytest.mark.kafka
def test_readers_do_not_fence_the_writer(topics: Topics) -> None:
    topic = topics.new()
    writer = topics.open(topic)
    writer.append(batch("a"), expected_last_seq=0)
    for _ in range(2):
        reader = topics.open(topic)
        assert reader.last_seq() == 1
        assert reader.find(["commit-a"])
    assert [e.seq for e in writer.append(batch("b"), expected_last_seq=1)] == [2]


@pytest.mark.kafka
def test_a_zombie_writer_is_fenced_even_with_the_current_seq(topics: Topics) -> None:
    topic = topics.new()
    zombie = topics.open(topic)
    zombie.append(batch("a"), expected_last_seq=0)
    successor = topics.open(topic)
    successor.append(batch("b"), expected_last_seq=1)

    assert zombie.last_seq() == 2  # it can still read...
    with pytest.raises(WriterFenced):  # ...but never write again, whatever seq it names
        zombie.append(batch("c"), expected_last_seq=2)
    with pytest.raises(WriterFenced):
        zombie.append(batch("c"), expected_last_seq=2)

    successor.append(batch("d"), expected_last_seq=2)
    events = list(topics.open(topic).read())
    assert [e.id for e in events] == ["commit-a", "commit-b", "commit-d"]
    assert verify_chain(events) is None


@pytest.mark.kafka
def test_the_broker_fences_a_zombie_before_anything_new_is_written(topics: Topics) -> None:
    topic = topics.new()
    zombie = topics.open(topic)
    [first] = zombie.append(batch("a"), expected_last_seq=0)
    # The successor starts (its producer's init_transactions fences the zombie's
    # epoch) but has nothing new to write: the log's tail does not move.
    successor = topics.open(topic)
    assert successor.append(batch("a"), expected_last_seq=0) == [first]

    with pytest.raises(WriterFenced):
        zombie.append(batch("b"), expected_last_seq=1)

    assert [e.id for e in topics.open(topic).read()] == ["commit-a"]
    successor.append(batch("c"), expected_last_seq=1)
    assert verify_chain(topics.open(topic).read()) is None


@pytest.mark.kafka
def test_a_reader_never_stops_inside_an_append_committed_while_it_reads(
    topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race CI met: a reader asks where the committed records end, and an append
    # commits before its fetch. A fetch asks for as many records as lie below that end
    # (markers hold none), so it got the first records of the new append as well, and
    # the tail was left inside it: a state no writer left (a reconciler then owed that
    # commit's solve again, and called the log altered). Here the append commits at that
    # very moment.
    topic = topics.new()
    writer, reader = topics.open(topic), topics.open(topic)
    assert reader.last_seq() == 0
    writer.append(batch("a0", "a1", "a2"), expected_last_seq=0)
    end_offset = KafkaReader.end_offset
    second: list[int] = []

    def end_then_commit(self: KafkaReader, deadline: float) -> int:
        end = end_offset(self, deadline)
        if self is reader._reading and not second:
            appended = writer.append(batch("b0", "b1", "b2", "b3"), expected_last_seq=3)
            second.extend(e.seq for e in appended)
        return end

    monkeypatch.setattr(KafkaReader, "end_offset", end_then_commit)
    tail = reader.last_seq()
    assert second == [4, 5, 6, 7]
    assert tail in (3, 7), f"the reader stopped at seq {tail}, inside the append of seqs 4-7"
    assert reader.last_seq() == 7


@pytest.mark.kafka
def test_first_event_of_a_topic_chains_from_genesis(topics: Topics) -> None:
    [first] = topics.open(topics.new()).append(batch("a"), expected_last_seq=0)
    assert first.prev_hash == GENESIS_HASH


# -- reading only what is asked for ---------------------------------------------------


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that holds a dozen events and finds the tail in eight offsets, so that
    a log of a few hundred events is read the way a log of millions is."""
    import gitsched.eventlog.kafka.reader

    eventlog = gitsched.eventlog

    monkeypatch.setattr(eventlog.kafka.reader, "LOCATE_WINDOW", 8)
    monkeypatch.setattr(eventlog.kafka.reader, "RECENT_EVENTS", 12)
    monkeypatch.setattr(eventlog.kafka.reader, "KNOWN_IDS", 40)


def records_handed_over(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count every record a range read or the tail's location takes from the client."""
    counted: list[int] = []
    real = KafkaReader._range_batch

    def counting(self: KafkaReader, *args: Any, **kw: Any) -> Any:
        messages = real(self, *args, **kw)
        counted.append(len(messages))
        return messages

    monkeypatch.setattr(KafkaReader, "_range_batch", counting)
    return counted


def abort_a_transaction(bootstrap: str, topic: str, records: int) -> None:
    """Records that take offsets on the topic but were never committed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"aborter-{topic}"})
    producer.init_transactions(20)
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, value=b'{"seq": 999999}', key=f"aborted-{i}".encode(), partition=0)
    producer.flush(20)
    producer.abort_transaction(20)


def fill_commits(log: KafkaEventLog, events: int) -> list[Any]:
    """Commits of three jobs and their placements, as the reconciler appends them."""
    from gitsched.bench.log import synthetic_commits

    stored: list[Any] = []
    for commit in synthetic_commits(events, jobs=3, run="restart", live=30):
        stored += log.append(commit, expected_last_seq=stored[-1].seq if stored else 0)
    return stored


def fill(log: KafkaEventLog, batches: int, first: int = 0) -> list[Any]:
    stored: list[Any] = []
    for number in range(first, first + batches):
        events = batch(*(f"{number}-{i}" for i in range(1 + number % 7)))
        stored += log.append(events, expected_last_seq=stored[-1].seq if stored else log.last_seq())
    return stored


@pytest.mark.kafka
def test_any_range_is_read_from_its_own_offset_past_markers_and_aborted_batches(
    topics: Topics, kafka_bootstrap: str, small_windows: None
) -> None:
    topic = topics.new()
    writer = topics.open(topic)
    written = fill(writer, 20)
    abort_a_transaction(kafka_bootstrap, topic, 5)
    written += fill(topics.open(topic), 20, first=20)  # a new writer after the aborted batch

    reader = topics.open(topic)
    assert reader.last_seq() == len(written)
    assert list(reader.read()) == written
    for after, until in [(0, 1), (1, 2), (17, 40), (59, 60), (60, 95), (79, 200), (3, None)]:
        assert list(reader.read(after, until_seq=until)) == written[after:until], (after, until)
    # Every seq is found at the offset it has on the topic, aborted records and
    # commit markers between them.
    offsets = [r.offset for r in raw_records(kafka_bootstrap, topic)]
    fresh = topics.open(topic)
    assert [fresh.offset_of(e.seq) for e in reversed(written)] == offsets[::-1]
    # The writer finds its own batches, and a retried one, wherever they lie.
    again = batch(*(f"3-{i}" for i in range(4)))
    assert writer.append(again, expected_last_seq=written[5].seq) == written[6:10]


@pytest.mark.kafka
def test_a_restart_from_a_snapshot_reads_the_tail_not_the_topic(
    topics: Topics, tmp_path: Any, small_windows: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gitsched.eventlog.replay import replay, snapshot
    from gitsched.eventlog.snapshot import FileSnapshotStore

    topic = topics.new()
    writer = topics.open(topic)
    written = fill_commits(writer, 600)
    full = replay(writer, use_snapshots=False)
    at = written[-40].seq
    writer.snapshot_store = FileSnapshotStore(tmp_path)
    assert snapshot(writer, replay(writer, until_seq=at, use_snapshots=False))

    counted = records_handed_over(monkeypatch)
    restarted = topics.open(topic)
    restarted.snapshot_store = FileSnapshotStore(tmp_path)
    resumed = replay(restarted, verify=True)
    assert resumed.from_snapshot == at and resumed.snapshot_problems == ()
    assert (resumed.state, resumed.last_seq, resumed.last_hash) == (
        full.state,
        full.last_seq,
        full.last_hash,
    )
    # The last few offsets to find the tail, the snapshot's event (and the one before
    # it, to check its hash), the 39 after it: nothing like the whole topic.
    assert 40 <= sum(counted) < 60

    # Without the snapshot, the same reader folds from the first event, to the same state.
    again = replay(restarted, verify=True, use_snapshots=False)
    assert again.state == full.state and sum(counted) > len(written)


@pytest.mark.kafka
def test_a_forged_tail_is_caught_by_a_verified_restart_from_a_snapshot(
    topics: Topics, kafka_bootstrap: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafka import KafkaProducer  # type: ignore[import-untyped,unused-ignore]

    import gitsched.eventlog.kafka.reader

    eventlog = gitsched.eventlog
    from gitsched.eventlog.envelope import event_hash
    from gitsched.eventlog.replay import replay, snapshot
    from gitsched.eventlog.snapshot import FileSnapshotStore

    topic = topics.new()
    writer = topics.open(topic)
    written = fill_commits(writer, 200)
    writer.snapshot_store = FileSnapshotStore(tmp_path)
    snapshot(writer, replay(writer, until_seq=written[-20].seq))
    # The next seq, a hash that matches its content, but linked to the wrong event.
    forged = written[-1]._replace(
        seq=written[-1].seq + 1, id="commit-forged", prev_hash=written[-3].hash
    )
    forged = forged._replace(hash=event_hash(forged))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap.split(","))
    try:
        producer.send(topic, value=canonical_json(forged.to_record()), partition=0).get(timeout=20)
    finally:
        producer.close()

    # Found from the end, the forged record alone is the tail it finds...
    monkeypatch.setattr(eventlog.kafka.reader, "LOCATE_WINDOW", 1)
    reader = topics.open(topic)
    reader.snapshot_store = FileSnapshotStore(tmp_path)
    assert reader.last_seq() == forged.seq
    # ...and the restart from the snapshot checks every link up to it.
    with pytest.raises(LogCorrupted, match=f"seq {forged.seq}"):
        replay(reader, verify=True)


# -- the broker goes away ---------------------------------------------------------


@pytest.fixture
def restartable_broker(kafka_bootstrap: str) -> Iterator[str]:
    """The shared test broker, which this test may stop; it is running again afterwards."""
    if not broker_is_managed(kafka_bootstrap):
        pytest.fail(
            f"the broker at {kafka_bootstrap} was not started by scripts/kafka in this "
            "checkout, and this test must stop and restart it: run `scripts/kafka start`"
        )
    try:
        yield kafka_bootstrap
    finally:
        run_script(kafka_bootstrap, "start")
        check_broker(kafka_bootstrap, timeout_s=30)


class AppendStream(threading.Thread):
    """One writer appending batch after batch, retrying each on LogUnavailable as the
    reconciler would (same ids, same expected seq) until it lands."""

    def __init__(self, log: KafkaEventLog, batches: int, *, give_up_after_s: float) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.batches = batches
        self.give_up_after_s = give_up_after_s
        self.appended: list[list[str]] = []
        self.failures: list[float] = []  # seconds each failed attempt took
        self.other_errors: list[BaseException] = []
        self.progress = threading.Condition()

    def events_of(self, number: int) -> list[NewEvent]:
        return batch(*(f"{number}-{i}" for i in range(1 + number % 3)))

    def run(self) -> None:
        last = 0
        deadline = time.monotonic() + self.give_up_after_s
        try:
            for number in range(self.batches):
                events = self.events_of(number)
                while True:
                    started = time.monotonic()
                    try:
                        stored = self.log.append(events, expected_last_seq=last)
                        break
                    except LogUnavailable:
                        with self.progress:
                            self.failures.append(time.monotonic() - started)
                            self.progress.notify_all()
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                last = stored[-1].seq
                with self.progress:
                    self.appended.append([e.id for e in stored])
                    self.progress.notify_all()
                time.sleep(0.05)
        except BaseException as error:
            self.other_errors.append(error)
        finally:
            with self.progress:
                self.progress.notify_all()

    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        with self.progress:
            return bool(self.progress.wait_for(predicate, timeout=timeout_s))


@pytest.mark.kafka
@pytest.mark.slow
def test_a_broker_restart_mid_stream_loses_and_doubles_nothing(
    restartable_broker: str, topics: Topics
) -> None:
    bootstrap = restartable_broker
    topic = topics.new()
    timeout_s = 4
    writer = topics.open(topic, timeout_s=timeout_s)
    stream = AppendStream(writer, batches=40, give_up_after_s=150)
    stream.start()
    try:
        assert stream.wait_for(lambda: len(stream.appended) >= 5, 60), (
            "no appends before the outage"
        )
        run_script(bootstrap, "stop")
        # Appends keep failing, each within its time budget, while the broker is away.
        assert stream.wait_for(lambda: len(stream.failures) >= 2 or stream.other_errors, 60)
        done_during_outage = len(stream.appended)
        time.sleep(1)
        assert len(stream.appended) == done_during_outage
    finally:
        run_script(bootstrap, "start")
    stream.join(timeout=180)
    assert not stream.is_alive(), "the stream did not finish after the broker came back"
    assert stream.other_errors == []

    # Bounded: an attempt gives up after about its timeout, never hangs.
    assert stream.failures and max(stream.failures) < 3 * timeout_s + 5
    expected = [[e.id for e in stream.events_of(n)] for n in range(40)]
    assert stream.appended == expected
    events = list(topics.open(topic).read())
    assert [e.id for e in events] == [i for ids in expected for i in ids]  # nothing lost or doubled
    assert verify_chain(events) is None
    assert writer.last_seq() == len(events)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_broker_lost_between_produce_and_commit_leaves_the_batch_out_until_retried(
    restartable_broker: str, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = restartable_broker
    topic = topics.new()
    writer = topics.open(topic, timeout_s=4)
    writer.append(batch("a"), expected_last_seq=0)

    # The records of the next batch reach the broker, then it stops before the commit.
    real_commit = KafkaWriter._commit

    def stop_then_commit(self: KafkaWriter, producer: Any, deadline: float) -> None:
        run_script(bootstrap, "stop")
        real_commit(self, producer, deadline)

    monkeypatch.setattr(KafkaWriter, "_commit", stop_then_commit)
    try:
        started = time.monotonic()
        with pytest.raises(LogUnavailable):
            writer.append(batch("b", "c"), expected_last_seq=1)
        assert time.monotonic() - started < 60
    finally:
        monkeypatch.undo()
        run_script(bootstrap, "start")

    # The open transaction is aborted by the next writer's start, never half-read.
    deadline = time.monotonic() + 60
    while True:
        try:
            stored = writer.append(batch("b", "c"), expected_last_seq=1)
            break
        except LogUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert [e.seq for e in stored] == [2, 3]
    events = list(topics.open(topic).read())
    assert [e.id for e in events] == ["commit-a", "commit-b", "commit-c"]
    assert verify_chain(events) is None
    assert writer.append(batch("d"), expected_last_seq=3)[0].seq == 4
