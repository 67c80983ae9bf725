"""Snapshots of the folded state, on every backend: used only when they fit the log.

A replay that starts from a snapshot must give exactly the state of a full replay;
a snapshot that was altered, belongs to another log, lies beyond the log's end or
was written for another state format is reported and never used.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gitsched.bench.log import synthetic_commits
from gitsched.engine.snapshot import STATE_FORMAT, encode_state
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import EventLog, SnapshotStore
from gitsched.eventlog.replay import Replayed, replay, snapshot
from gitsched.eventlog.snapshot import FileSnapshotStore
from tests.support.logs import LogBackend


def _store(event_log: EventLog, tmp_path: Path) -> SnapshotStore:
    """The log's own store; a Kafka log is given a folder, as open_log does."""
    store = event_log.snapshots()
    if store is None:
        store = FileSnapshotStore(tmp_path / "snapshots")
        event_log.snapshot_store = store  # type: ignore[attr-defined]
    return store


def _fill(event_log: EventLog, events: int, run: str = "a", seed: int = 7) -> None:
    last = event_log.last_seq()
    for commit in synthetic_commits(events, jobs=10, run=run, seed=seed):
        last = event_log.append(commit, expected_last_seq=last)[-1].seq


def _same(a: Replayed, b: Replayed) -> None:
    assert (a.last_seq, a.last_hash, a.last_time) == (b.last_seq, b.last_hash, b.last_time)
    assert a.state == b.state
    assert a.state.events_applied == b.state.events_applied


@pytest.fixture
def filled(log_backend: LogBackend, tmp_path: Path) -> tuple[LogBackend, EventLog, Replayed]:
    event_log = log_backend.open()
    _store(event_log, tmp_path)
    _fill(event_log, 600)
    return log_backend, event_log, replay(event_log, use_snapshots=False)


def test_a_replay_from_a_snapshot_equals_the_full_replay(
    filled: tuple[LogBackend, EventLog, Replayed], tmp_path: Path
) -> None:
    backend, event_log, full = filled
    assert snapshot(event_log, replay(event_log, until_seq=400))

    reader = backend.open()
    _store(reader, tmp_path)
    for verify in (False, True):
        resumed = replay(reader, verify=verify)
        assert resumed.from_snapshot == 400 and resumed.snapshot_problems == ()
        _same(resumed, full)
    assert len(full.state.jobs) > 0 and full.state.events_applied == 600


def test_point_in_time_reads_start_only_from_snapshots_before_them(
    filled: tuple[LogBackend, EventLog, Replayed],
) -> None:
    _, event_log, _ = filled
    snapshot(event_log, replay(event_log, until_seq=400))

    early = replay(event_log, until_seq=250)
    assert early.from_snapshot == 0
    _same(early, replay(event_log, until_seq=250, use_snapshots=False))
    later = replay(event_log, until_seq=500)
    assert later.from_snapshot == 400
    _same(later, replay(event_log, until_seq=500, use_snapshots=False))

    # A read up to a time folds from the first event (the snapshot holds no fact timeline).
    time_450 = next(iter(event_log.read(449, until_seq=450))).time
    at_time = replay(event_log, until_time=time_450)
    assert at_time.from_snapshot == 0
    _same(at_time, replay(event_log, until_time=time_450, use_snapshots=False))


def test_an_altered_snapshot_is_reported_and_never_used(
    filled: tuple[LogBackend, EventLog, Replayed], tmp_path: Path
) -> None:
    _, event_log, full = filled
    store = _store(event_log, tmp_path)
    snapshot(event_log, replay(event_log, until_seq=300))
    snapshot(event_log, replay(event_log, until_seq=400))
    newest = store.infos()[0]
    # Another state (an empty cluster) under the newest snapshot's digest.
    store.save(newest, encode_state(ClusterState()))

    resumed = replay(event_log)
    assert resumed.from_snapshot == 300  # the older one still serves
    assert len(resumed.snapshot_problems) == 1
    assert "seq 400" in resumed.snapshot_problems[0]
    assert "altered" in resumed.snapshot_problems[0]
    _same(resumed, full)


def test_a_snapshot_of_another_log_is_never_used(log_backend: LogBackend, tmp_path: Path) -> None:
    ours = log_backend.open()
    store = _store(ours, tmp_path)
    _fill(ours, 300, run="ours", seed=1)
    theirs = replay(ours, use_snapshots=False)
    # The same number of events, other contents: what a restored or replaced log looks like.
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    from gitsched.eventlog.sqlite import SQLiteEventLog

    with SQLiteEventLog(other_dir / "other.db") as other:
        _fill(other, 300, run="theirs", seed=2)
        foreign = replay(other, use_snapshots=False)
        assert foreign.last_hash != theirs.last_hash
    body = encode_state(foreign.state)
    store.save(_info(foreign, body), body)

    resumed = replay(ours)
    assert resumed.from_snapshot == 0
    assert "replaced" in resumed.snapshot_problems[0]
    _same(resumed, theirs)


def test_a_snapshot_beyond_the_log_or_of_another_format_is_never_used(
    filled: tuple[LogBackend, EventLog, Replayed], tmp_path: Path
) -> None:
    _, event_log, full = filled
    store = _store(event_log, tmp_path)
    ahead = _info(dataclasses.replace(full, last_seq=900), encode_state(full.state))
    store.save(ahead, encode_state(full.state))
    resumed = replay(event_log)
    assert resumed.from_snapshot == 0
    assert "no event at seq 900" in resumed.snapshot_problems[0]
    _same(resumed, full)

    snapshot(event_log, replay(event_log, until_seq=400))
    written = next(i for i in store.infos() if i.seq == 400)
    body = store.body(400)
    assert body is not None
    store.save(dataclasses.replace(written, state_format="0123456789abcdef"), body)
    resumed = replay(event_log)
    assert resumed.from_snapshot == 0
    assert any("state format 0123456789abcdef" in p for p in resumed.snapshot_problems)
    _same(resumed, full)


def _info(replayed: Replayed, body: bytes):  # type: ignore[no-untyped-def]
    from gitsched.eventlog.base import SnapshotInfo
    from gitsched.eventlog.snapshot import snapshot_digest

    return SnapshotInfo(
        seq=replayed.last_seq,
        head_hash=replayed.last_hash,
        last_time=replayed.last_time or "",
        state_format=STATE_FORMAT,
        digest=snapshot_digest(replayed.last_hash, STATE_FORMAT, body),
        size_bytes=len(body),
    )


def test_a_verified_restart_checks_every_event_after_the_snapshot(tmp_path: Path) -> None:
    """SQLite checks content on the data's stored bytes; a row rewritten in the tail is
    named by its seq, one rewritten to other bytes of the same JSON still verifies."""
    import sqlite3

    import orjson
    import pytest

    from gitsched.eventlog.base import LogCorrupted
    from gitsched.eventlog.sqlite import SQLiteEventLog

    path = tmp_path / "log.db"
    with SQLiteEventLog(path) as event_log:
        _fill(event_log, 600)
        full = replay(event_log, use_snapshots=False)
        snapshot(event_log, replay(event_log, until_seq=400))

    def rewrite(sql: str, *params: object) -> None:
        with sqlite3.connect(path) as db:
            db.execute(sql, params)

    # The same JSON spelt with spaces: not the bytes that were hashed, the same content.
    with sqlite3.connect(path) as db:
        [data] = db.execute("SELECT data FROM events WHERE seq = 450").fetchone()
    rewrite("UPDATE events SET data = ? WHERE seq = 450", orjson.dumps(orjson.loads(data)).decode())
    rewrite("UPDATE events SET data = replace(data, ',', ', ') WHERE seq = 450")
    with SQLiteEventLog(path) as event_log:
        resumed = replay(event_log, verify=True)
        assert resumed.from_snapshot == 400
        _same(resumed, full)

    for seq, sql, reason in [
        (520, "UPDATE events SET actor = 'mallory' WHERE seq = 520", "content does not match"),
        (510, "UPDATE events SET prev_hash = hash WHERE seq = 510", "prev_hash does not match"),
        (401, "UPDATE events SET data = '{}' WHERE seq = 401", "content does not match"),
    ]:
        rewrite(sql)
        with SQLiteEventLog(path) as event_log, pytest.raises(LogCorrupted) as caught:
            replay(event_log, verify=True)
        assert caught.value.seq == seq and reason in str(caught.value)
        assert f"altered at seq {seq}" in str(caught.value)
