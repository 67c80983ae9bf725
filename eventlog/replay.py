"""Folding a log into the cluster state, up to now or to a point in its past."""

from __future__ import annotations

from dataclasses import dataclass

from engine.state import ClusterState, evolve
from eventlog.base import EventLog, LogCorrupted
from eventlog.codec import decode
from eventlog.envelope import ChainChecker


@dataclass(frozen=True, slots=True)
class Replayed:
    state: ClusterState
    last_seq: int
    last_time: str | None


def replay(
    log: EventLog,
    *,
    until_seq: int | None = None,
    until_time: str | None = None,
    verify: bool = False,
) -> Replayed:
    """The state after every event with seq <= until_seq and time <= until_time.

    With `verify`, the hash chain is checked on the way (a writer must never build
    on a log that was altered); a break raises LogCorrupted naming its seq.
    """
    state = ClusterState()
    last_seq = 0
    last_time: str | None = None
    checker = ChainChecker() if verify else None
    for stored in log.read(0, until_seq=until_seq):
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
        last_seq = stored.seq
        last_time = stored.time
    return Replayed(state, last_seq, last_time)
