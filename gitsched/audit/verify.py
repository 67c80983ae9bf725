"""`log verify` (and a report's chain line): the hash chain and seq continuity of a whole log."""

from __future__ import annotations

from dataclasses import dataclass

from gitsched.eventlog.base import EventLog, LogCorrupted
from gitsched.eventlog.envelope import ChainBreak, ChainChecker


@dataclass(frozen=True, slots=True)
class Verification:
    events: int
    last_hash: str | None
    broken: ChainBreak | None

    @property
    def ok(self) -> bool:
        return self.broken is None


def verify_log(log: EventLog) -> Verification:
    """Walk the whole log; stop at the first event that breaks the chain."""
    checker = ChainChecker()
    count = 0
    last_hash: str | None = None
    try:
        for event in log.read(0):
            broken = checker.check(event)
            if broken is not None:
                return Verification(count, last_hash, broken)
            count += 1
            last_hash = event.hash
    except LogCorrupted as e:
        # A backend that cannot even read a row (not JSON, a gap it noticed) names it.
        return Verification(count, last_hash, ChainBreak(e.seq or checker.expected, str(e)))
    return Verification(count, last_hash, None)
