"""The EventLog contract: what every backend (SQLite, Kafka) must do, one suite for all.

Each test runs once per backend through the `log_backend` / `event_log`
fixtures in conftest.py; Kafka needs the real broker (GITSCHED_TEST_KAFKA).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pytest

from gitsched.eventlog.base import ConcurrencyConflict, DuplicateEvent, EventLog
from gitsched.eventlog.envelope import (
    GENESIS_HASH,
    NewEvent,
    StoredEvent,
    canonical_json,
    format_time,
    verify_chain,
)
from tests.support.logs import batch

if TYPE_CHECKING:
    from tests.support.logs import LogBackend


def seqs(log: EventLog, after: int = 0, until: int | None = None) -> list[int]:
    return [event.seq for event in log.read(after, until_seq=until)]


def test_an_empty_log_has_nothing(event_log: EventLog) -> None:
    assert event_log.last_seq() == 0
    assert list(event_log.read()) == []
    assert event_log.last_event() is None
    assert event_log.find(["commit-a"]) == {}


def test_appended_events_read_back_identical(log_backend: LogBackend, event_log: EventLog) -> None:
    when = format_time(log_backend.clock.now)
    events = batch("a", "b", "c")

    stored = event_log.append(events, expected_last_seq=0)

    assert [event.seq for event in stored] == [1, 2, 3]
    for original, kept in zip(events, stored, strict=True):
        assert (kept.id, kept.type, kept.schema_version) == (original.id, original.type, 1)
        assert (kept.data, kept.actor, kept.cause) == (
            original.data,
            original.actor,
            original.cause,
        )
        assert kept.time == when  # one reading of the clock for the whole batch
    assert list(event_log.read()) == stored
    assert event_log.last_seq() == 3
    assert event_log.last_event() == stored[-1]
    assert list(log_backend.open().read()) == stored


def test_read_returns_the_requested_range(event_log: EventLog) -> None:
    event_log.append(batch("a", "b", "c", "d", "e"), expected_last_seq=0)

    assert seqs(event_log) == [1, 2, 3, 4, 5]
    assert seqs(event_log, 2) == [3, 4, 5]
    assert seqs(event_log, 0, 2) == [1, 2]
    assert seqs(event_log, 1, 3) == [2, 3]
    assert seqs(event_log, 3, 3) == []
    assert seqs(event_log, 5) == []
    assert seqs(event_log, 4, 99) == [5]
    assert seqs(event_log, 99) == []


def test_seq_has_no_gaps_across_batches(event_log: EventLog) -> None:
    sizes = [1, 3, 2, 250, 1]
    last = 0
    for number, size in enumerate(sizes):
        stored = event_log.append(
            batch(*(f"{number}-{i}" for i in range(size))), expected_last_seq=last
        )
        assert [event.seq for event in stored] == list(range(last + 1, last + size + 1))
        last = stored[-1].seq

    assert event_log.last_seq() == sum(sizes)
    assert seqs(event_log) == list(range(1, sum(sizes) + 1))


def test_hash_chain_verifies_from_genesis(event_log: EventLog) -> None:
    event_log.append(batch("a", "b"), expected_last_seq=0)
    event_log.append(batch("c"), expected_last_seq=2)
    event_log.append(batch("d", "e", "f"), expected_last_seq=3)

    events = list(event_log.read())
    assert events[0].prev_hash == GENESIS_HASH
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    assert verify_chain(events) is None
    # The chain also holds from the middle, for readers that start there.
    assert verify_chain(events[3:], expect_first_seq=4, prev_hash=events[2].hash) is None


def test_empty_batch_appends_nothing(event_log: EventLog) -> None:
    assert event_log.append([], expected_last_seq=0) == []
    assert event_log.last_seq() == 0


def test_a_refused_batch_leaves_no_trace(log_backend: LogBackend, event_log: EventLog) -> None:
    event_log.append(batch("a"), expected_last_seq=0)

    with pytest.raises(DuplicateEvent):
        event_log.append(batch("x", "a", "y"), expected_last_seq=1)
    with pytest.raises(ConcurrencyConflict):
        event_log.append(batch("x", "y"), expected_last_seq=0)

    for log in (event_log, log_backend.open()):
        assert log.last_seq() == 1
        assert log.find(["commit-x", "commit-y"]) == {}
    # All or nothing: the batch goes in whole once it is right.
    stored = event_log.append(batch("x", "y"), expected_last_seq=1)
    assert [event.seq for event in stored] == [2, 3]
    assert [event.id for event in log_backend.open().read(1)] == ["commit-x", "commit-y"]


def test_retried_batch_appends_nothing_and_returns_the_stored_events(
    log_backend: LogBackend, event_log: EventLog
) -> None:
    first = event_log.append(batch("a", "b"), expected_last_seq=0)
    event_log.append(batch("c"), expected_last_seq=2)

    # The writer crashed before learning that its append committed, and retries
    # with the expected seq it had then.
    again = event_log.append(batch("a", "b"), expected_last_seq=0)
    assert again == first
    restarted = log_backend.open()
    assert restarted.append(batch("a", "b"), expected_last_seq=0) == first
    assert event_log.last_seq() == 3
    assert [event.id for event in event_log.read()] == ["commit-a", "commit-b", "commit-c"]


def test_partial_duplicate_raises_duplicate_event(event_log: EventLog) -> None:
    event_log.append(batch("a", "b"), expected_last_seq=0)

    with pytest.raises(DuplicateEvent):
        event_log.append(batch("b", "c"), expected_last_seq=2)
    assert event_log.last_seq() == 2


def test_wrong_expected_last_seq_is_a_concurrency_conflict(event_log: EventLog) -> None:
    with pytest.raises(ConcurrencyConflict) as on_empty:
        event_log.append(batch("a"), expected_last_seq=3)
    assert (on_empty.value.expected, on_empty.value.actual) == (3, 0)

    event_log.append(batch("a", "b"), expected_last_seq=0)
    with pytest.raises(ConcurrencyConflict) as behind:
        event_log.append(batch("c"), expected_last_seq=1)
    assert (behind.value.expected, behind.value.actual) == (1, 2)
    assert event_log.last_seq() == 2


def test_a_second_writer_stops_the_first(log_backend: LogBackend, event_log: EventLog) -> None:
    first = event_log
    first.append(batch("a"), expected_last_seq=0)
    second = log_backend.open()
    second.append(batch("b"), expected_last_seq=1)

    # SQLite: the expected seq is stale (ConcurrencyConflict). Kafka: the second
    # writer's transactional producer fenced the first (WriterFenced).
    with pytest.raises(log_backend.second_writer_error):
        first.append(batch("c"), expected_last_seq=1)

    second.append(batch("d"), expected_last_seq=2)
    events = list(log_backend.open().read())
    assert [event.id for event in events] == ["commit-a", "commit-b", "commit-d"]
    assert verify_chain(events) is None


def test_a_new_instance_resumes_an_existing_log(log_backend: LogBackend) -> None:
    before = log_backend.open()
    written = before.append(batch("a", "b"), expected_last_seq=0)
    written += before.append(batch("c"), expected_last_seq=2)
    before.close()

    after = log_backend.open()
    assert list(after.read()) == written
    assert after.last_seq() == 3
    more = after.append(batch("d", "e"), expected_last_seq=3)
    assert [event.seq for event in more] == [4, 5]
    assert more[0].prev_hash == written[-1].hash
    assert verify_chain(after.read()) is None


def test_a_reader_opened_earlier_sees_later_appends(
    log_backend: LogBackend, event_log: EventLog
) -> None:
    reader = log_backend.open()
    assert reader.last_seq() == 0

    event_log.append(batch("a", "b"), expected_last_seq=0)
    assert reader.last_seq() == 2
    event_log.append(batch("c"), expected_last_seq=2)
    assert [event.id for event in reader.read(1)] == ["commit-b", "commit-c"]
    assert set(reader.find(["commit-c"])) == {"commit-c"}


UNICODE_DATA: dict[str, Any] = {
    "team": "Zürich-Forschung",
    "note": "日本語のジョブ — «quotes» and “curly” ones",
    "emoji": "🚀🧪 GPU\u200dburst",
    "combining": "e\u0301 vs \u00e9",  # not normalised: both forms stay as they are
    "rtl": "שלום עולם",
    "escapes": 'tab\tnewline\nquote"backslash\\nul\u0000',
    "astral": "\U0001f600\U00010348",
    "nested": [{"ключ": "значение"}, ["ä", "ö", "ü"], None, True, 1.5, -(2**62)],
}


def test_unicode_round_trips_byte_exactly(log_backend: LogBackend, event_log: EventLog) -> None:
    event = NewEvent(
        id="commit-ünïcødé-🚀",
        type="QueueConfigured",
        schema_version=3,
        data=UNICODE_DATA,
        actor="Zoë Ðörfler <zoe@example.com>",
        cause="Approved-by: 李雷",
    )
    [stored] = event_log.append([event], expected_last_seq=0)

    for log in (event_log, log_backend.open()):
        [read] = list(log.read())
        assert read.data == UNICODE_DATA
        assert canonical_json(read.to_record()) == canonical_json(stored.to_record())
        assert (read.id, read.actor, read.cause) == (event.id, event.actor, event.cause)
        assert verify_chain([read]) is None
        assert log.find([event.id]) == {event.id: stored}


def test_find_returns_only_the_stored_events_asked_for(event_log: EventLog) -> None:
    stored = event_log.append(batch("a", "b", "c"), expected_last_seq=0)
    by_id: dict[str, StoredEvent] = {event.id: event for event in stored}

    found = event_log.find(["commit-c", "commit-a", "commit-missing"])
    assert found == {"commit-a": by_id["commit-a"], "commit-c": by_id["commit-c"]}
    assert event_log.find([]) == {}
