"""Evidence answers verify only the log's tail: the view records how far the hash chain was
verified, with the rows it folded, and a verified catch-up checks from there on.

- a verified catch-up moves the verified offset with the view's offset, in process and
  through a rebuild's writer process;
- a change to an event after the verified offset is found, named by seq;
- a change before it is not (the tail is all a query reads): `verify_log`, behind
  `gitsched log verify`, still finds it;
- a lookup's catch-up leaves the verified offset behind; the next evidence query
  verifies that gap and no more.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from gitsched.audit.catchup import ChainBroken, catch_up, rebuild, verify_view
from gitsched.audit.store import AuditStore, EventList
from gitsched.audit.verify import verify_log
from gitsched.eventlog.envelope import StoredEvent
from gitsched.simulation.history import synthetic_events


@cache
def simulated(events: int, seed: int) -> tuple[StoredEvent, ...]:
    return tuple(synthetic_events(events, seed))


def tampered(events: tuple[StoredEvent, ...], seq: int) -> list[StoredEvent]:
    """The log with event `seq`'s payload changed but its hash kept: content, not links."""
    out = list(events)
    event = out[seq - 1]
    assert event.data, "pick an event with a payload"
    out[seq - 1] = event._replace(data={**event.data, "tampered": True})
    return out


def first_with_data(events: tuple[StoredEvent, ...], after: int) -> int:
    return next(e.seq for e in events[after:] if e.data and e.type != "SolveCompleted")


def test_a_verified_catch_up_records_the_verified_offset_with_the_rows() -> None:
    events = simulated(1500, 2)
    with AuditStore(":memory:") as store:
        catch_up(EventList(events[:900]), store, verify=True, batch_events=250)
        assert store.chain_checked() == (900, events[899].hash) == store.offset()
        catch_up(EventList(events), store, verify=True, batch_events=250)
        assert store.chain_checked() == (1500, events[1499].hash) == store.offset()


@pytest.mark.parametrize("writer_process", [False, True])
def test_a_rebuild_verifies_and_records_the_verified_offset(
    tmp_path: Path, writer_process: bool
) -> None:
    events = simulated(1200, 4)
    view = tmp_path / "audit.db"
    rebuild(EventList(events), view, batch_events=300, writer_process=writer_process)
    with AuditStore(view) as store:
        assert store.chain_checked() == (1200, events[-1].hash)
    rebuild(EventList(events), view, writer_process=writer_process, verify=False)
    with AuditStore(view) as store:
        assert store.chain_checked() == (0, None)  # not asked to verify: it says so


def test_a_change_in_the_tail_is_found_and_named() -> None:
    events = simulated(1500, 2)
    seq = first_with_data(events, 1000)
    log = EventList(tampered(events, seq))
    with AuditStore(":memory:") as store:
        catch_up(EventList(events[:1000]), store, verify=True)
        with pytest.raises(ChainBroken) as broken:
            catch_up(log, store, verify=True, batch_events=100)
        assert broken.value.broken.seq == seq
        assert "content does not match its hash" in broken.value.broken.reason
        # What was folded before the break was verified, and stays.
        checked, _ = store.chain_checked()
        assert 1000 <= checked < seq and checked == store.offset()[0]


def test_a_change_before_the_verified_offset_is_left_to_log_verify() -> None:
    events = simulated(1500, 2)
    with AuditStore(":memory:") as store:
        catch_up(EventList(events[:1000]), store, verify=True)
        seq = first_with_data(events, 100)
        log = EventList(tampered(events, seq))
        assert catch_up(log, store, verify=True).applied == 500
        assert store.chain_checked()[0] == 1500
    full = verify_log(log)  # type: ignore[arg-type]
    assert full.broken is not None and full.broken.seq == seq


def test_an_evidence_query_verifies_the_gap_a_lookup_left() -> None:
    events = simulated(1500, 2)
    with AuditStore(":memory:") as store:
        catch_up(EventList(events[:600]), store, verify=True)
        catch_up(EventList(events), store)  # a lookup: folded, not verified
        assert store.chain_checked()[0] == 600 and store.offset()[0] == 1500
        seq = first_with_data(events, 600)
        with pytest.raises(ChainBroken) as broken:
            verify_view(EventList(tampered(events, seq)), store)
        assert broken.value.broken.seq == seq and store.chain_checked()[0] == 600
        verify_view(EventList(events), store)
        assert store.chain_checked() == (1500, events[-1].hash)
