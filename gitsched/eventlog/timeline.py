"""When each event's fact happened, beside when the log recorded it: one rule for every reader.

The envelope's `time` says when an event was appended: the log's order. The fact an
event records happened at its *fact time*: a commit's committer date (when it was
merged) for `CommitApplied`/`CommitRejected` and for the commit's changes written
before it in the same append; a placement's decision time (`at`, its commit's
committer date) for `PlacementDecided`; for any other event, the time stated before
it in its append (the solve after a commit takes the commit's), else its append time
(a node agent's report). Fact times never go back: one dated before the fact logged
ahead of it takes that fact's time, so the timeline is monotone in seq and "the
cluster at time T" is always a prefix of the log. `state --at`, `audit at`, `audit
history` and `audit usage` all read this timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from gitsched.engine.model import utc_time

T = TypeVar("T")

COMMIT_EVENTS = frozenset({"CommitApplied", "CommitRejected"})
SOLVER = "solver"
_HEX = frozenset("0123456789abcdef")


def _is_commit(cause: str) -> bool:
    """Whether `cause` is a commit's sha (SHA-1 or SHA-256): its changes precede it."""
    return len(cause) in (40, 64) and not set(cause) - _HEX


def stated_time(type_name: str, data: Mapping[str, Any]) -> str:
    """The fact time an event's payload states, in the log's format; "" when it states none."""
    if type_name in COMMIT_EVENTS:
        commit = data.get("commit") or {}
        return utc_time(str(commit.get("committed_at") or ""))
    if type_name in ("PlacementDecided", "JobTimedOut"):
        return utc_time(str(data.get("at") or ""))
    return ""


class Timeline(Generic[T]):
    """Gives events, fed in log order, their fact times.

    A commit's change (caused by a commit, not by the solver) read before its append
    has stated a time is held until the commit does (changes come before the commit),
    or until its append ends (a log read up to the middle of an append keeps it held:
    appends are atomic); `add` returns the events it releases, in order, each
    with its fact time. `time` is the last fact time given;
    `unit` is (append time, cause, the append's stated time) of the append being read.
    """

    __slots__ = ("held", "time", "unit")

    def __init__(
        self, time: str = "", unit: list[str] | None = None, held: list[T] | None = None
    ) -> None:
        self.time = time
        self.unit = unit if unit is not None else ["", "", ""]
        self.held: list[T] = held if held is not None else []

    def add(
        self,
        item: T,
        type_name: str,
        data: Mapping[str, Any],
        appended: str,
        cause: str,
        actor: str,
    ) -> list[tuple[T, str]]:
        unit = self.unit
        out: list[tuple[T, str]] = []
        if unit[0] != appended or unit[1] != cause:
            if self.held:
                out = self._release(unit[2] or unit[0])
            unit[0], unit[1], unit[2] = appended, cause, ""
        stated = stated_time(type_name, data)
        if stated and not unit[2]:
            unit[2] = stated
        if unit[2]:
            if self.held:
                out += self._release(unit[2])
            out.append((item, self._clamp(stated or unit[2])))
            return out
        if actor == SOLVER or not _is_commit(cause):
            # Not a commit's change waiting for its commit: the append's own time.
            if self.held:
                out += self._release(appended)
            out.append((item, self._clamp(appended)))
            return out
        self.held.append(item)
        return out

    def _clamp(self, moment: str) -> str:
        if moment > self.time:
            self.time = moment
        return self.time

    def _release(self, moment: str) -> list[tuple[T, str]]:
        at = self._clamp(moment)
        held, self.held = self.held, []
        return [(item, at) for item in held]
