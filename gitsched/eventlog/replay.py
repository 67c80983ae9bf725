"""Folding a log into the cluster state, up to now or to a point in its past."""

from __future__ import annotations

from dataclasses import dataclass

from gitsched.engine.state import ClusterState, evolve
from gitsched.eventlog.base import EventLog, LogCorrupted
from gitsched.eventlog.codec import decode
from gitsched.eventlog.collector import collector_paused
from gitsched.eventlog.envelope import GENESIS_HASH, ChainChecker, StoredEvent
from gitsched.eventlog.snapshot import load_snapshot, write_snapshot
from gitsched.eventlog.timeline import Timeline


@dataclass(frozen=True, slots=True)
class Replayed:
    state: ClusterState
    last_seq: int
    last_time: str | None
    last_hash: str = GENESIS_HASH
    # The seq of the snapshot the fold started from (0: the log's first event), and
    # why newer snapshots were not used.
    from_snapshot: int = 0
    snapshot_problems: tuple[str, ...] = ()


def replay(
    log: EventLog,
    *,
    since: Replayed | None = None,
    until_seq: int | None = None,
    until_time: str | None = None,
    verify: bool = False,
    use_snapshots: bool = True,
) -> Replayed:
    """The state after every event with seq <= until_seq and fact time <= until_time.

    `until_time` reads the log's fact timeline (`gitsched.eventlog.timeline`): when things
    happened (a commit merged, a placement decided), not when they were appended, so
    `state --at` answers as `audit at` does.

    `since`, an earlier result of this function on the same log, is carried on
    from rather than read again: a long-running reader folds only what is new.
    Without it, the fold starts from the newest snapshot the log keeps that passes
    its checks (see eventlog.snapshot), unless `use_snapshots` is off or the read
    stops at a time (a snapshot does not hold the fact timeline `until_time` reads).
    With `verify`, the hash chain is checked on the way (a writer must never build
    on a log that was altered; content hashes are recomputed unless the log checked
    them as it read); a break raises LogCorrupted naming its seq. From a snapshot,
    the chain is checked from the snapshot's head on.
    """
    # One pause for the snapshot's load, the tail's read and the fold: each time the
    # collector comes back on it may walk the whole new state once.
    with collector_paused():
        return _fold(log, since, until_seq, until_time, verify, use_snapshots)


def _fold(
    log: EventLog,
    since: Replayed | None,
    until_seq: int | None,
    until_time: str | None,
    verify: bool,
    use_snapshots: bool,
) -> Replayed:
    problems: list[str] = []
    start = since
    if (
        start is None
        and use_snapshots
        and until_time is None
        and (store := log.snapshots()) is not None
    ):
        loaded = load_snapshot(log, store, until_seq=until_seq, problems=problems)
        if loaded is not None:
            info = loaded.info
            start = Replayed(
                loaded.state,
                info.seq,
                info.last_time,
                info.head_hash,
                from_snapshot=info.seq,
            )
    start = start or Replayed(ClusterState(), 0, None)
    state, last_seq, last_time, last_hash = (
        start.state,
        start.last_seq,
        start.last_time,
        start.last_hash,
    )
    checker = (
        ChainChecker(
            expect_first_seq=last_seq + 1, prev_hash=last_hash, recompute=not log.reads_checked
        )
        if verify
        else None
    )
    timeline: Timeline[StoredEvent] | None = Timeline() if until_time is not None else None
    folded: StoredEvent | None = None  # the last event folded in
    for stored in log.read(last_seq, until_seq=until_seq, check_content=verify):
        if checker is not None:
            broken = checker.check(stored)
            if broken is not None:
                raise LogCorrupted(
                    f"the log was altered at seq {broken.seq}: {broken.reason}; "
                    "run `gitsched log verify`",
                    seq=broken.seq,
                )
            if log.reads_checked:
                # The first event links to what the fold started from; the log
                # checks every later one against the one before it as it reads.
                checker = None
        if timeline is None:
            state = evolve(state, decode(stored))
            folded = stored
            continue
        released = timeline.add(
            stored, stored.type, stored.data, stored.time, stored.cause, stored.actor
        )
        past = False
        for event, fact_time in released:
            if fact_time > str(until_time):
                past = True  # fact times never go back: nothing later is before it
                break
            state = evolve(state, decode(event))
            folded = event
        if past:
            break
    if folded is not None:
        last_seq, last_time, last_hash = folded.seq, folded.time, folded.hash
    return Replayed(
        state,
        last_seq,
        last_time,
        last_hash,
        from_snapshot=start.from_snapshot,
        snapshot_problems=tuple(problems) or start.snapshot_problems,
    )


def snapshot(log: EventLog, replayed: Replayed) -> bool:
    """Keep `replayed` (a fold of `log`) as a snapshot; False when the log keeps none."""
    store = log.snapshots()
    if store is None or replayed.last_seq == 0 or replayed.last_time is None:
        return False
    write_snapshot(
        store,
        replayed.state,
        seq=replayed.last_seq,
        head_hash=replayed.last_hash,
        last_time=replayed.last_time,
    )
    return True
