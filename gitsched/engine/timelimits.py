"""Time limits: when a running job reaches its limit, and what is due at a given time.

A limit is reached at the running placement's start (its PlacementDecided.at) plus the
job's `time_limit_minutes`. "Now" is always an event's time, never the clock's: the
daemon asks `due_events(state, at)` and appends what is due, each event carrying the time
its limit was reached, so a replay meets the same decision points (docs/time.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gitsched.engine.events import JobTimedOut
from gitsched.engine.model import Job, Placement, utc_time
from gitsched.engine.state import ClusterState


def parse_time(text: str) -> datetime | None:
    """An ISO-8601 time with an offset; None when `text` is not one."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def format_time(moment: datetime) -> str:
    """A time as the log writes it (UTC, microseconds, `Z`)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def plus_minutes(text: str, minutes: float) -> str:
    """`text` + `minutes`, in the log's form; "" when `text` is not a time."""
    moment = parse_time(text)
    return "" if moment is None else format_time(moment + timedelta(minutes=minutes))


def limit_reached_at(job: Job, placement: Placement) -> str | None:
    """When the running `placement` of `job` reaches the job's time limit; None without one."""
    if job.time_limit_minutes is None or not placement.started_at:
        return None
    return plus_minutes(placement.started_at, job.time_limit_minutes) or None


def due_events(state: ClusterState, at: str) -> tuple[JobTimedOut, ...]:
    """What is due at `at`: every running job whose limit was reached by then, oldest limit
    first (then by key), each stopped at the time its limit was reached."""
    now = utc_time(at)
    if not now:
        return ()
    due: list[tuple[str, str, JobTimedOut]] = []
    for key in sorted(state.placements):
        job = state.jobs.get(key)
        placement = state.placements[key]
        if job is None:
            continue
        reached = limit_reached_at(job, placement)
        if reached is None or reached > now:
            continue
        assert job.time_limit_minutes is not None
        event = JobTimedOut(
            job=key,
            at=reached,
            started_at=utc_time(placement.started_at),
            limit_minutes=job.time_limit_minutes,
        )
        due.append((reached, key, event))
    return tuple(e for _, _, e in sorted(due, key=lambda d: (d[0], d[1])))


def next_due(state: ClusterState) -> str | None:
    """The earliest time a running job reaches its limit (the daemon's next wake-up); None
    when no running job has a limit."""
    times = [
        reached
        for key, placement in state.placements.items()
        if (job := state.jobs.get(key)) is not None
        and (reached := limit_reached_at(job, placement)) is not None
    ]
    return min(times, default=None)


def timed_out_reason(event: JobTimedOut) -> str:
    return (
        f"reached its time limit of {event.limit_minutes} min at {event.at}"
        f" (started {event.started_at})"
    )
