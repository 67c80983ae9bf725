"""Retries: a job that fails is requeued after an exponential backoff, up to a limit.

Pure rules over the folded state (docs/time.md, "Retries"), as Kueue's requeuing with
backoff and JobSet's maxRestarts: every time is the failure event's own, never the
clock's, so the daemon, a replay and `audit` meet the same decision points.
- `after_failure`: what follows a JobFailed or a JobInterrupted (node or pod lost):
  a JobRequeued with the attempt and the time it may run again, or nothing more (the
  job fails for good with the last reason).
- `due_retries`: the backoffs that have ended by a time, as the events `serve` records
  at that moment.
- `held_back`: the requeued jobs no decision at a time may place yet.
A preempted job is requeued by the solver as before and uses up no retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from gitsched.engine import events as ev
from gitsched.engine.model import Job, RequeueTimestamp, RetryPolicy, utc_time
from gitsched.engine.state import ClusterState, evolve


def retry_policy(state: ClusterState, job: Job) -> RetryPolicy | None:
    """The job's spec.retry, else its queue's, else the policy's; None: no retries."""
    if job.retry is not None:
        return job.retry
    queue = state.queues.get(job.queue)
    if queue is not None and queue.retry is not None:
        return queue.retry
    return state.policy.retry


def backoff_seconds(retry: RetryPolicy, attempt: int) -> float:
    """backoffSeconds x 2^(attempt-1), at most maxBackoffSeconds (attempt counts from 1)."""
    if attempt < 1:
        return 0.0
    # Capped before the power can grow past any float: 2^64 s is far above any maximum.
    exponent = min(attempt - 1, 64)
    return float(min(retry.backoff_seconds * 2**exponent, retry.max_backoff_seconds))


def _plus(at: str, seconds: float) -> str:
    moment = datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return (moment + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _clock_time(state: ClusterState) -> str:
    """The latest time the log told, in the log's format: when a failure that says no
    time of its own happened (a pod deleted behind gitsched's back)."""
    return datetime.fromtimestamp(state.clock, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def after_failure(
    state: ClusterState, failure: ev.JobFailed | ev.JobInterrupted
) -> tuple[ev.Event, ...]:
    """What follows `failure`, judged on the state before it is folded.

    A job with retries left: a JobRequeued (attempt n, ready at the failure's time +
    the backoff of attempt n). A job out of retries: nothing after a JobFailed (it
    fails for good, with its reason); after a JobInterrupted, a JobFailed with the
    interruption's reason, since an interrupted gang would otherwise be placed again.
    A job with no retry policy (or maxRetries 0) behaves as it always did: a failure
    ends it, an interrupted gang is placed again at once.
    """
    job = state.jobs.get(failure.job)
    if job is None:
        return ()
    retry = retry_policy(state, job)
    if retry is None or retry.max_retries <= 0:
        return ()
    at = utc_time(failure.at) if failure.at else ""
    at = at or _clock_time(state)
    known = state.retries.get(job.key)
    done = known.attempt if known is not None else 0
    cause = "failed" if isinstance(failure, ev.JobFailed) else "was interrupted"
    if done >= retry.max_retries:
        if isinstance(failure, ev.JobFailed):
            return ()
        return (
            ev.JobFailed(
                job=job.key,
                reason=f"{failure.reason} (gave up after {done} retries)",
                exit_code=None,
                replica=None,
                at=at,
            ),
        )
    attempt = done + 1
    wait = backoff_seconds(retry, attempt)
    queued = job
    if state.policy.requeue_timestamp is RequeueTimestamp.EVICTION:
        # Behind every job waiting now: its time and its place in the log's wait order
        # (Job.submission, the position its commit had) are the failure's.
        queued = dataclasses.replace(job, submitted_at=at, submission=state.events_applied + 1)
    return (
        ev.JobRequeued(
            job=queued,
            attempt=attempt,
            max_retries=retry.max_retries,
            reason=failure.reason,
            cause=cause,
            failed_at=at,
            ready_at=_plus(at, wait),
            backoff_seconds=wait,
        ),
    )


def with_requeues(state: ClusterState, events: Iterable[ev.Event]) -> list[ev.Event]:
    """`events` (the cluster's, in order), each failure followed by what `after_failure`
    says of it on the state the events before it leave."""
    out: list[ev.Event] = []
    for event in events:
        follow: tuple[ev.Event, ...] = ()
        if isinstance(event, ev.JobFailed | ev.JobInterrupted):
            follow = after_failure(state, event)
        for e in (event, *follow):
            out.append(e)
            state = evolve(state, e)
    return out


def due_retries(state: ClusterState, t: str) -> tuple[ev.JobBackoffEnded, ...]:
    """The requeued jobs whose backoff has ended by `t` and that still wait, each as the
    JobBackoffEnded recorded at the moment it ended (its ready_at, not `t`)."""
    out = []
    for key in sorted(state.retries):
        found = state.retries[key]
        if found.due or found.ready_at > t:
            continue
        if key not in state.jobs or key in state.placements:
            continue
        out.append(ev.JobBackoffEnded(job=key, attempt=found.attempt, at=found.ready_at))
    return tuple(sorted(out, key=lambda e: (e.at, e.job)))


def held_back(state: ClusterState, now: str) -> frozenset[str]:
    """The requeued jobs a decision at `now` may not place: their backoff has not ended."""
    return frozenset(
        key
        for key, found in state.retries.items()
        if found.ready_at > now and key not in state.placements
    )


def next_due(state: ClusterState) -> str | None:
    """When the next backoff ends (None: none waits): how long the daemon may sleep."""
    times = [
        a.ready_at
        for key, a in state.retries.items()
        if not a.due and key in state.jobs and key not in state.placements
    ]
    return min(times, default=None)
