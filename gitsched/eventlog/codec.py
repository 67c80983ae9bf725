"""Domain events <-> log envelopes, with upcasting of old payload versions on read.

Upcasters are one function per version step, keyed by (type, from_version);
each takes the old payload dict and returns the next version's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gitsched.engine.codec import from_data, to_data
from gitsched.engine.events import EVENT_TYPES, Event
from gitsched.eventlog.base import LogCorrupted
from gitsched.eventlog.envelope import NewEvent, StoredEvent

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _job_preempted_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record what allowed the preemption."""
    return {**data, "rule": "unrecorded"}


def _job_preempted_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 did not record the time of the decision that stopped the job: unknown ("")."""
    return {**data, "at": ""}


# (type, from_version) -> function producing version from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("JobPreempted", 1): _job_preempted_v1,
    ("JobPreempted", 2): _job_preempted_v2,
}


def _commit_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 commits did not record the author date or the committer: they are unknown ("")."""
    commit = {"authored_at": "", "committer": "", "committer_email": "", **data["commit"]}
    return {**data, "commit": commit}


def _solve_completed_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record whose plan was applied, nor why greedy's was."""
    return {**data, "plan_source": "unrecorded", "fallback": ""}


def _solve_completed_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 did not record how the objective's levels were solved: every MILP of v2 took them
    as one weighted sum ("weighted"); greedy has none ("")."""
    milp = str(data.get("solver", "")).split("/")[0] in ("highs", "cbc", "cpsat")
    return {**data, "levels": "weighted" if milp else ""}


UPCASTERS[("SolveCompleted", 1)] = _solve_completed_v1
UPCASTERS[("SolveCompleted", 2)] = _solve_completed_v2


def _placement_decided_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record why a move was made, nor the work it lost: a move reads as
    "unrecorded" (an admission as ""), its lost work as 0."""
    rule = "unrecorded" if data.get("action") == "moved" else ""
    return {**data, "rule": rule, "lost_gpu_seconds": 0.0}


UPCASTERS[("PlacementDecided", 1)] = _placement_decided_v1


def _job_ended_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record when the cluster said the job ended: unknown ("")."""
    return {**data, "at": ""}


for _ended in ("JobFinished", "JobFailed", "JobInterrupted"):
    UPCASTERS[(_ended, 1)] = _job_ended_v1
UPCASTERS[("CommitApplied", 1)] = _commit_v1_to_v2


def _reservations_decided_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 did not record what a reservation borrowed: none (it held against every later job,
    as it did then)."""
    held = [{**r, "borrowed_milli": 0} for r in data.get("reservations", ())]
    return {**data, "reservations": held}


UPCASTERS[("ReservationsDecided", 1)] = _reservations_decided_v1
UPCASTERS[("CommitRejected", 1)] = _commit_v1_to_v2


def encode(event: Event, *, id: str, actor: str, cause: str) -> NewEvent:
    return NewEvent(
        id=id,
        type=event.type,
        schema_version=event.schema_version,
        data=to_data(event),
        actor=actor,
        cause=cause,
    )


def upcast(type_name: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    cls = EVENT_TYPES[type_name]
    while version < cls.schema_version:
        step = UPCASTERS.get((type_name, version))
        if step is None:
            raise LogCorrupted(f"no upcaster for {type_name} v{version} -> v{version + 1}")
        data = step(data)
        version += 1
    if version > cls.schema_version:
        raise LogCorrupted(
            f"{type_name} v{version} is newer than this gitsched knows (v{cls.schema_version}): upgrade gitsched"
        )
    return data


def decode(stored: StoredEvent) -> Event:
    cls = EVENT_TYPES.get(stored.type)
    if cls is None:
        raise LogCorrupted(f"event {stored.seq} has unknown type {stored.type!r}")
    data = stored.data
    if stored.schema_version != cls.schema_version:
        data = upcast(stored.type, stored.schema_version, data)
    try:
        return from_data(cls, data)
    except (KeyError, TypeError, ValueError) as e:
        raise LogCorrupted(f"event {stored.seq} ({stored.type}) cannot be decoded: {e}") from e


def decode_all(stored: Iterable[StoredEvent]) -> Iterator[tuple[StoredEvent, Event]]:
    for s in stored:
        yield s, decode(s)
