"""`audit verify`: the hash chain and seq continuity of a whole log."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from eventlog.base import EventLog
from eventlog.envelope import ChainBreak, StoredEvent, verify_chain


@dataclass(frozen=True, slots=True)
class Verification:
    events: int
    last_hash: str | None
    broken: ChainBreak | None

    @property
    def ok(self) -> bool:
        return self.broken is None


def verify_log(log: EventLog) -> Verification:
    count = 0
    last_hash: str | None = None

    def counted() -> Iterator[StoredEvent]:
        nonlocal count, last_hash
        for event in log.read(0):
            count += 1
            last_hash = event.hash
            yield event

    broken = verify_chain(counted())
    return Verification(count, last_hash, broken)
