"""`EventLog.import_events` and `copy_log`, on every backend: sealed events kept as they are.

Events are sealed in one log (a SQLite file with its own clock) and imported
into the backend under test, which must store them byte for byte and refuse
anything that does not continue its chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gitsched.eventlog.base import ConcurrencyConflict, DuplicateEvent, EventLog, LogCorrupted
from gitsched.eventlog.copy import CopyRefused, copy_log
from gitsched.eventlog.envelope import StoredEvent, verify_chain
from gitsched.eventlog.sqlite import SQLiteEventLog
from tests.support.logs import batch

if TYPE_CHECKING:
    from tests.support.logs import LogBackend


@pytest.fixture
def sealed(tmp_path: Path) -> list[StoredEvent]:
    """Seven events in three batches, sealed by another log."""
    with SQLiteEventLog(tmp_path / "elsewhere.db") as other:
        other.append(batch("a", "b"), expected_last_seq=0)
        other.append(batch("c", "d", "e"), expected_last_seq=2)
        other.append(batch("f", "g"), expected_last_seq=5)
        return list(other.read(0))


def records(log: EventLog) -> list[dict[str, object]]:
    return [event.to_record() for event in log.read(0)]


def test_imported_events_keep_seq_id_time_and_hashes(
    log_backend: LogBackend, event_log: EventLog, sealed: list[StoredEvent]
) -> None:
    event_log.import_events(sealed[:2], expected_last_seq=0)
    event_log.import_events(sealed[2:], expected_last_seq=2)

    assert records(event_log) == [event.to_record() for event in sealed]
    assert records(log_backend.open()) == [event.to_record() for event in sealed]
    assert verify_chain(log_backend.open().read(0)) is None


def test_an_import_that_does_not_continue_the_chain_names_the_seq(
    event_log: EventLog, sealed: list[StoredEvent]
) -> None:
    event_log.import_events(sealed[:2], expected_last_seq=0)
    with pytest.raises(LogCorrupted, match="expected seq 3, found 4"):
        event_log.import_events(sealed[3:], expected_last_seq=2)  # seq 3 is missing
    changed = [sealed[2], sealed[3]._replace(actor="mallory"), *sealed[4:]]
    with pytest.raises(LogCorrupted, match="seq 4: content does not match its hash"):
        event_log.import_events(changed, expected_last_seq=2)
    assert event_log.last_seq() == 2


def test_an_import_after_the_wrong_seq_is_a_conflict(
    event_log: EventLog, sealed: list[StoredEvent]
) -> None:
    event_log.import_events(sealed[:2], expected_last_seq=0)
    with pytest.raises(ConcurrencyConflict):
        event_log.import_events(sealed[2:], expected_last_seq=1)


def test_a_retried_import_writes_nothing(event_log: EventLog, sealed: list[StoredEvent]) -> None:
    event_log.import_events(sealed[:5], expected_last_seq=0)
    again = event_log.import_events(sealed[2:5], expected_last_seq=2)
    assert [e.to_record() for e in again] == [e.to_record() for e in sealed[2:5]]
    assert event_log.last_seq() == 5
    with pytest.raises(DuplicateEvent):
        event_log.import_events(sealed[4:], expected_last_seq=5)


def test_copy_log_resumes_a_prefix_and_refuses_another_log(
    event_log: EventLog, sealed: list[StoredEvent], tmp_path: Path
) -> None:
    with SQLiteEventLog(tmp_path / "source.db") as source:
        source.import_events(sealed, expected_last_seq=0)
        event_log.import_events(sealed[:2], expected_last_seq=0)
        result = copy_log(source, event_log, chunk=2)
        assert (result.resumed_from, result.copied, result.last_seq) == (2, 5, 7)
        assert records(event_log) == records(source)

        with SQLiteEventLog(tmp_path / "other.db") as other:
            other.append(batch("x"), expected_last_seq=0)
            with pytest.raises(CopyRefused, match="at seq 1"):
                copy_log(source, other)
