"""Folding a log into the cluster state, up to now or to a point in its past."""

from __future__ import annotations

from dataclasses import dataclass

from engine.state import ClusterState, evolve
from eventlog.base import EventLog, LogCorrupted
from eventlog.codec import decode
from eventlog.collector import collector_paused
from eventlog.envelope import GENESIS_HASH, ChainChecker, StoredEvent
from eventlog.timeline import Timeline


@dataclass(frozen=True, slots=True)
class Replayed:
    state: ClusterState
    last_seq: int
    last_time: str | None
    last_hash: str = GENESIS_HASH


def replay(
    log: EventLog,
    *,
    since: Replayed | None = None,
    until_seq: int | None = None,
    until_time: str | None = None,
    verify: bool = False,
) -> Replayed:
    """The state after every event with seq <= until_seq and fact time <= until_time.

    `until_time` reads the log's fact timeline (`eventlog.timeline`): when things
    happened (a commit merged, a placement decided), not when they were appended, so
    `state --at` answers as `audit at` does.

    `since`, an earlier result of this function on the same log, is carried on
    from rather than read again: a long-running reader folds only what is new.
    With `verify`, the hash chain is checked on the way (a writer must never build
    on a log that was altered; content hashes are recomputed unless the log checked
    them as it read); a break raises LogCorrupted naming its seq.
    """
    start = since or Replayed(ClusterState(), 0, None)
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
    with collector_paused():
        for stored in log.read(last_seq, until_seq=until_seq):
            if checker is not None:
                broken = checker.check(stored)
                if broken is not None:
                    raise LogCorrupted(
                        f"the log was altered at seq {broken.seq}: {broken.reason}; "
                        "run `gitsched audit verify`",
                        seq=broken.seq,
                    )
            if timeline is None:
                state = evolve(state, decode(stored))
                last_seq, last_time, last_hash = stored.seq, stored.time, stored.hash
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
                last_seq, last_time, last_hash = event.seq, event.time, event.hash
            if past:
                break
    return Replayed(state, last_seq, last_time, last_hash)
