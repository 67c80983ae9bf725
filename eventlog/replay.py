"""Folding a log into the cluster state, up to now or to a point in its past."""

from __future__ import annotations

from dataclasses import dataclass

from engine.state import ClusterState, evolve
from eventlog.base import EventLog, LogCorrupted
from eventlog.codec import decode
from eventlog.collector import collector_paused
from eventlog.envelope import GENESIS_HASH, ChainChecker


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
    """The state after every event with seq <= until_seq and time <= until_time.

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
    with collector_paused():
        for stored in log.read(last_seq, until_seq=until_seq):
            if until_time is not None and stored.time > until_time:
                break
            if checker is not None:
                broken = checker.check(stored)
                if broken is not None:
                    raise LogCorrupted(
                        f"the log was altered at seq {broken.seq}: {broken.reason}; "
                        "run `gitsched audit verify`",
                        seq=broken.seq,
                    )
            state = evolve(state, decode(stored))
            last_seq, last_time, last_hash = stored.seq, stored.time, stored.hash
    return Replayed(state, last_seq, last_time, last_hash)
