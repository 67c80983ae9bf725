"""The cluster's state as a fold over its events: `evolve(state, event) -> state`.

Maps are persistent (immutables' HAMT, in C), so each event costs O(log n) and
a replay of a long log stays linear; a replay folds every event through here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from immutables import Map

from gitsched.engine import events as ev
from gitsched.engine.fairshare import QueueUsage, moment, runs
from gitsched.engine.idle import IdleStreak, observe
from gitsched.engine.model import (
    ClusterSpec,
    CommitInfo,
    IdleAction,
    Job,
    Node,
    Owner,
    Placement,
    Policy,
    Queue,
    Reservation,
)
from gitsched.engine.services import ServiceStatus, apply_step, replica_jobs, replica_key
from gitsched.engine.shapes import remember_shape
from gitsched.engine.suspension import SUSPENDED, Suspension, commit_suspension, idle_suspension
from gitsched.findings import Finding


@dataclass(frozen=True, slots=True)
class Pending:
    reason: str
    constraint: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """A requeued job's last JobRequeued (engine/retries.py): how many times it was
    requeued, the reason of the last failure, and when it may run again."""

    attempt: int
    ready_at: str
    reason: str
    # JobBackoffEnded was recorded for this attempt (serve appends it once).
    due: bool = False


@dataclass(frozen=True, slots=True)
class ClusterState:
    cluster: ClusterSpec | None = None
    policy: Policy = field(default_factory=Policy)
    nodes: Map[str, Node] = field(default_factory=Map)
    queues: Map[str, Queue] = field(default_factory=Map)
    jobs: Map[str, Job] = field(default_factory=Map)
    placements: Map[str, Placement] = field(default_factory=Map)
    pending: Map[str, Pending] = field(default_factory=Map)
    # job -> PlacementDecided.at of the placement the cluster reported running (JobStarted)
    started: Map[str, str] = field(default_factory=Map)
    # job -> "finished" | "failed" | "timed_out": ended; its file no longer submits it
    ended: Map[str, str] = field(default_factory=Map)
    last_commit: CommitInfo | None = None
    last_good_commit: CommitInfo | None = None
    last_rejection: tuple[Finding, ...] = ()
    needs_placement: bool = False
    events_applied: int = 0
    # team -> its OWNERS as the log last recorded them (OwnersChanged)
    owners: Map[str, tuple[Owner, ...]] = field(default_factory=Map)
    # team -> its MEMBERS (e-mails) as the log last recorded them (MembersChanged)
    members: Map[str, tuple[str, ...]] = field(default_factory=Map)
    # queue -> its decayed GPU usage (engine/fairshare.py), and the latest time the events
    # told (seconds since the epoch): when a stop that says no time of its own happened.
    usage: Map[str, QueueUsage] = field(default_factory=Map)
    clock: float = 0.0
    # job -> how long its GPUs have stayed below the idle threshold (engine/idle.py), and
    # job -> the JobIdle that flagged it, until it runs anew, is changed or uses its GPUs.
    idle_streaks: Map[str, IdleStreak] = field(default_factory=Map)
    idle: Map[str, ev.JobIdle] = field(default_factory=Map)
    # The job shapes submitted so far, as engine.shapes summarises them:
    # shape -> weight as published to the solver, the current window's counts, its jobs.
    shapes: Map[str, int] = field(default_factory=Map)
    shapes_window: Map[str, int] = field(default_factory=Map)
    shapes_window_jobs: int = 0
    # job -> its last requeue after a failure (engine/retries.py), while the job is known
    retries: Map[str, Attempt] = field(default_factory=Map)
    # The reservations the last solve that changed them decided (ReservationsDecided).
    reservations: tuple[Reservation, ...] = ()
    # "team/name" -> an inference service, its revision and replicas (engine/services.py);
    # its replicas are jobs in `jobs` (queue/name.<index>).
    services: Map[str, ServiceStatus] = field(default_factory=Map)
    # job -> why it is suspended (engine/suspend.py), until a commit resumes it
    suspended: Map[str, Suspension] = field(default_factory=Map)

    def placement_of(self, job: str) -> Placement | None:
        return self.placements.get(job)


_FIELDS = tuple(f.name for f in dataclasses.fields(ClusterState) if f.name != "events_applied")
V = TypeVar("V")


def _build_replace() -> Callable[..., ClusterState]:
    """`dataclasses.replace`, counting the event: every event of a replay comes
    through here, and the general function costs a few times as much.

    Written out field by field from `_FIELDS` (as dataclasses writes `__init__`),
    each field stored through its slot's own setter: no loop, no lookup by name,
    40% faster than a loop over the fields, and it follows ClusterState's fields.
    """
    scope: dict[str, Any] = {"_new": object.__new__, "ClusterState": ClusterState}
    lines = ["def _replace(state, **changes):", "    new = _new(ClusterState)"]
    for number, name in enumerate(_FIELDS):
        scope[f"_set{number}"] = vars(ClusterState)[name].__set__
        lines.append(
            f"    _set{number}(new, changes[{name!r}] if {name!r} in changes else state.{name})"
        )
    scope["_set_count"] = vars(ClusterState)["events_applied"].__set__
    lines += ["    _set_count(new, state.events_applied + 1)", "    return new"]
    exec("\n".join(lines), scope)  # our own field names, fixed at import
    replace: Callable[..., ClusterState] = scope["_replace"]
    return replace


_replace = _build_replace()


def _without(entries: Map[str, V], key: str) -> Map[str, V]:
    return entries.delete(key) if key in entries else entries


def _later(s: ClusterState, at: str) -> float:
    """The state's clock moved on to `at`, if that is a time and a later one."""
    if not at:
        return s.clock
    told = moment(at)
    return s.clock if told is None or told < s.clock else told


def _queue_of(s: ClusterState, job: str) -> str:
    known = s.jobs.get(job)
    return known.queue if known is not None else job.partition("/")[0]


def _usage_stopped(s: ClusterState, job: str, clock: float) -> Map[str, QueueUsage]:
    """The queue's usage once `job`, if it held GPUs, let them go at `clock`."""
    placement = s.placements.get(job)
    if placement is None or not placement.gpu_milli:
        return s.usage
    queue = _queue_of(s, job)
    old = s.usage.get(queue, QueueUsage())
    return s.usage.set(
        queue, runs(old, -placement.gpu_milli, clock, s.policy.usage_half_life_hours)
    )


def _not_idle(s: ClusterState, job: str, keep_reclaimed: bool = False) -> dict[str, Any]:
    """The job's idle streak ends (its placement does); its flag too, unless it was
    reclaimed and `keep_reclaimed`: a reclaimed job waits until its owner changes it."""
    if job not in s.idle_streaks and job not in s.idle:
        return {}  # the common case, kept cheap: a replay comes through here for every stop
    flag = s.idle.get(job)
    keep = keep_reclaimed and flag is not None and flag.action == IdleAction.RECLAIM
    return {
        "idle_streaks": _without(s.idle_streaks, job),
        "idle": s.idle if keep else _without(s.idle, job),
    }


def _commit_applied(s: ClusterState, e: ev.CommitApplied) -> ClusterState:
    return _replace(
        s,
        last_commit=e.commit,
        last_good_commit=e.commit,
        last_rejection=(),
        clock=_later(s, e.commit.committed_at),
    )


def _commit_rejected(s: ClusterState, e: ev.CommitRejected) -> ClusterState:
    return _replace(
        s, last_commit=e.commit, last_rejection=e.errors, clock=_later(s, e.commit.committed_at)
    )


def _cluster_configured(s: ClusterState, e: ev.ClusterConfigured) -> ClusterState:
    return _replace(s, cluster=e.cluster, needs_placement=True)


def _policy_changed(s: ClusterState, e: ev.PolicyChanged) -> ClusterState:
    return _replace(s, policy=e.policy, needs_placement=True)


def _node_registered(s: ClusterState, e: ev.NodeRegistered) -> ClusterState:
    return _replace(s, nodes=s.nodes.set(e.node.name, e.node), needs_placement=True)


def _node_removed(s: ClusterState, e: ev.NodeRemoved) -> ClusterState:
    return _replace(s, nodes=_without(s.nodes, e.node), needs_placement=True)


def _node_state_changed(s: ClusterState, e: ev.NodeStateChanged) -> ClusterState:
    node = s.nodes.get(e.node)
    if node is None:
        return _replace(s)
    return _replace(
        s, nodes=s.nodes.set(e.node, dataclasses.replace(node, state=e.state)), needs_placement=True
    )


def _queue_configured(s: ClusterState, e: ev.QueueConfigured) -> ClusterState:
    return _replace(s, queues=s.queues.set(e.queue.name, e.queue), needs_placement=True)


def _queue_removed(s: ClusterState, e: ev.QueueRemoved) -> ClusterState:
    return _replace(s, queues=_without(s.queues, e.queue), needs_placement=True)


def _owners_changed(s: ClusterState, e: ev.OwnersChanged) -> ClusterState:
    owners = s.owners.set(e.team, e.owners) if e.owners else _without(s.owners, e.team)
    return _replace(s, owners=owners)


def _members_changed(s: ClusterState, e: ev.MembersChanged) -> ClusterState:
    members = s.members.set(e.team, e.members) if e.members else _without(s.members, e.team)
    return _replace(s, members=members)


def _approval_checked(s: ClusterState, e: ev.ApprovalChecked) -> ClusterState:
    return _replace(s)


def _job_submitted(s: ClusterState, e: ev.JobSubmitted) -> ClusterState:
    shapes, window, window_jobs = remember_shape(
        (s.shapes, s.shapes_window, s.shapes_window_jobs), e.job
    )
    return _replace(
        s,
        jobs=s.jobs.set(e.job.key, e.job),
        needs_placement=True,
        idle=_without(s.idle, e.job.key),
        shapes=shapes,
        shapes_window=window,
        shapes_window_jobs=window_jobs,
    )


def _job_changed(s: ClusterState, e: ev.JobChanged) -> ClusterState:
    return _replace(
        s, jobs=s.jobs.set(e.job.key, e.job), needs_placement=True, idle=_without(s.idle, e.job.key)
    )


def _job_gone(
    s: ClusterState, key: str, ended: Map[str, str] | None = None, at: str = ""
) -> ClusterState:
    """The job leaves the state, and its quota and GPUs with it: waiting jobs are placed."""
    clock = _later(s, at)
    return _replace(
        s,
        usage=_usage_stopped(s, key, clock),
        clock=clock,
        **_not_idle(s, key),
        jobs=_without(s.jobs, key),
        placements=_without(s.placements, key),
        pending=_without(s.pending, key),
        started=_without(s.started, key),
        ended=_without(s.ended, key) if ended is None else ended,
        retries=_without(s.retries, key),
        suspended=_without(s.suspended, key),
        needs_placement=True,
    )


def _job_withdrawn(s: ClusterState, e: ev.JobWithdrawn) -> ClusterState:
    return _job_gone(s, e.job)


def _job_finished(s: ClusterState, e: ev.JobFinished) -> ClusterState:
    return _job_gone(s, e.job, s.ended.set(e.job, "finished"), e.at)


def _job_failed(s: ClusterState, e: ev.JobFailed) -> ClusterState:
    return _job_gone(s, e.job, s.ended.set(e.job, "failed"), e.at)


def _job_started(s: ClusterState, e: ev.JobStarted) -> ClusterState:
    job = s.jobs.get(e.job)
    if job is not None and job.service and _rolling(s, job.service):
        # A new replica runs: the rolling update's next step may be due (engine/services.py).
        return _replace(s, started=s.started.set(e.job, e.placement_at), needs_placement=True)
    return _replace(s, started=s.started.set(e.job, e.placement_at))


def _rolling(s: ClusterState, service: str) -> bool:
    status = s.services.get(service)
    return status is not None and any(r.revision != status.revision for r in status.replicas)


def _job_interrupted(s: ClusterState, e: ev.JobInterrupted) -> ClusterState:
    clock = _later(s, e.at)
    return _replace(
        s,
        usage=_usage_stopped(s, e.job, clock),
        clock=clock,
        **_not_idle(s, e.job, keep_reclaimed=True),
        placements=_without(s.placements, e.job),
        started=_without(s.started, e.job),
        needs_placement=True,
    )


def _placement_decided(s: ClusterState, e: ev.PlacementDecided) -> ClusterState:
    job = e.job
    placement = Placement(job=job, flavor=e.flavor, replicas=e.replicas, started_at=e.at)
    clock = _later(s, e.at)
    usage = _usage_stopped(s, job, clock) if job in s.placements else s.usage
    milli = placement.gpu_milli
    if milli:
        queue = _queue_of(s, job)
        old = usage.get(queue, QueueUsage())
        usage = usage.set(queue, runs(old, milli, clock, s.policy.usage_half_life_hours))
    if job in s.idle_streaks or job in s.idle:
        return _replace(
            s,
            usage=usage,
            clock=clock,
            **_not_idle(s, job),
            placements=s.placements.set(job, placement),
            pending=_without(s.pending, job),
            started=_without(s.started, job),
        )
    return _replace(
        s,
        usage=usage,
        clock=clock,
        placements=s.placements.set(job, placement),
        pending=_without(s.pending, job),
        started=_without(s.started, job),
    )


def _job_preempted(s: ClusterState, e: ev.JobPreempted) -> ClusterState:
    # A suspended job's stop: it waits as suspended (its JobSuspended said why), not preempted.
    held = s.suspended.get(e.job)
    return _replace(
        s,
        usage=_usage_stopped(s, e.job, s.clock),
        **_not_idle(s, e.job, keep_reclaimed=True),
        placements=_without(s.placements, e.job),
        pending=s.pending.set(
            e.job,
            Pending(e.reason, "preempted") if held is None else Pending(held.reason, SUSPENDED),
        ),
        started=_without(s.started, e.job),
    )


def _job_pending(s: ClusterState, e: ev.JobPending) -> ClusterState:
    return _replace(
        s,
        usage=_usage_stopped(s, e.job, s.clock),
        **_not_idle(s, e.job, keep_reclaimed=True),
        placements=_without(s.placements, e.job),
        pending=s.pending.set(e.job, Pending(e.reason, e.constraint)),
        started=_without(s.started, e.job),
    )


def _solve_completed(s: ClusterState, e: ev.SolveCompleted) -> ClusterState:
    return _replace(s, needs_placement=False)


def _gpu_utilization_reported(s: ClusterState, e: ev.GpuUtilizationReported) -> ClusterState:
    clock = _later(s, e.end)
    watched: Map[str, Placement] | dict[str, Placement] = s.placements
    if not s.policy.idle.enabled:
        # Only workspaces that ask to be suspended when idle (engine/idle.py: suspend_rule).
        watched = {
            key: p
            for key, p in s.placements.items()
            if (work := s.jobs.get(key)) is not None and work.idle_suspend_after_minutes is not None
        }
        if not watched:
            return _replace(s, clock=clock)
    streaks = s.idle_streaks
    for job, streak in observe(s.idle_streaks, watched, e, s.policy.idle.threshold_percent).items():
        streaks = _without(streaks, job) if streak is None else streaks.set(job, streak)
    return _replace(s, idle_streaks=streaks, clock=clock)


def _job_idle(s: ClusterState, e: ev.JobIdle) -> ClusterState:
    # A solve follows: the job now ranks lowest, or its GPUs are free (reclaim).
    return _replace(s, idle=s.idle.set(e.job, e), needs_placement=True, clock=_later(s, e.until))


def _job_idle_cleared(s: ClusterState, e: ev.JobIdleCleared) -> ClusterState:
    return _replace(s, idle=_without(s.idle, e.job))


def _job_requeued(s: ClusterState, e: ev.JobRequeued) -> ClusterState:
    """The failed job is back, waiting: not placed before its backoff ends."""
    key = e.job.key
    clock = _later(s, e.failed_at)
    return _replace(
        s,
        usage=_usage_stopped(s, key, clock),
        clock=clock,
        **_not_idle(s, key),
        jobs=s.jobs.set(key, e.job),
        placements=_without(s.placements, key),
        started=_without(s.started, key),
        ended=_without(s.ended, key),
        pending=s.pending.set(
            key,
            Pending(
                requeue_reason(e.attempt, e.max_retries, e.cause, e.reason, e.ready_at), "backoff"
            ),
        ),
        retries=s.retries.set(key, Attempt(e.attempt, e.ready_at, e.reason)),
        needs_placement=True,
    )


def requeue_reason(attempt: int, max_retries: int, cause: str, reason: str, ready_at: str) -> str:
    """A requeued job's pending reason (`state`, `audit at`)."""
    return f"retry {attempt} of {max_retries} after it {cause} ({reason}): waits until {ready_at}"


def _job_backoff_ended(s: ClusterState, e: ev.JobBackoffEnded) -> ClusterState:
    found = s.retries.get(e.job)
    if found is None or found.attempt != e.attempt:
        return _replace(s, clock=_later(s, e.at))
    return _replace(
        s,
        retries=s.retries.set(e.job, dataclasses.replace(found, due=True)),
        clock=_later(s, e.at),
        needs_placement=True,
    )


def _job_timed_out(s: ClusterState, e: ev.JobTimedOut) -> ClusterState:
    return _job_gone(s, e.job, s.ended.set(e.job, "timed_out"), e.at)


def _reservations_decided(s: ClusterState, e: ev.ReservationsDecided) -> ClusterState:
    return _replace(s, reservations=e.reservations)


def _service_metric_observed(s: ClusterState, e: ev.ServiceMetricObserved) -> ClusterState:
    # The autoscaler reads its windows from the log itself (cluster/autoscaler.py).
    return _replace(s, clock=_later(s, e.end))


# -- inference services (engine/services.py) --


def _replicas_synced(
    s: ClusterState, old: ServiceStatus | None, new: ServiceStatus | None
) -> ClusterState:
    """`s` with the service's replica jobs as `new` has them: replicas gone leave like a
    withdrawn job; replicas of the current revision are made from its spec; replicas of an
    older revision keep the job they run, with the rank (min or above) they now have."""
    state = s
    keep = set()
    if new is not None:
        derived = replica_jobs(new)
        jobs = state.jobs
        for replica in new.replicas:
            key = replica_key(new.service, replica.index)
            keep.add(key)
            made = derived[key]
            existing = jobs.get(key)
            if replica.revision != new.revision and existing is not None:
                made = dataclasses.replace(existing, preemptible=made.preemptible)
            if existing != made:
                jobs = jobs.set(key, made)
        state = dataclasses.replace(state, jobs=jobs)
    if old is not None:
        for replica in old.replicas:
            key = replica_key(old.service, replica.index)
            if key not in keep and key in state.jobs:
                state = _job_gone(state, key)
                state = dataclasses.replace(state, events_applied=s.events_applied)
    return state


def _service_submitted(s: ClusterState, e: ev.ServiceSubmitted) -> ClusterState:
    status = ServiceStatus(service=e.service, revision=s.events_applied + 1)
    return _replace(s, services=s.services.set(e.service.key, status), needs_placement=True)


def _service_changed(s: ClusterState, e: ev.ServiceChanged) -> ClusterState:
    old = s.services.get(e.service.key)
    if old is None:
        return _service_submitted(s, ev.ServiceSubmitted(e.service))
    revision = old.revision
    if old.service.revision_fields() != e.service.revision_fields():
        revision = s.events_applied + 1  # a rolling update to the new spec begins
    new = dataclasses.replace(old, service=e.service, revision=revision)
    synced = _replicas_synced(s, old, new)
    return _replace(synced, services=s.services.set(e.service.key, new), needs_placement=True)


def _service_withdrawn(s: ClusterState, e: ev.ServiceWithdrawn) -> ClusterState:
    old = s.services.get(e.service)
    if old is None:
        return _replace(s)
    synced = _replicas_synced(s, old, None)
    return _replace(synced, services=s.services.delete(e.service), needs_placement=True)


def _service_scaled(s: ClusterState, e: ev.ServiceScaled) -> ClusterState:
    old = s.services.get(e.service)
    if old is None:
        return _replace(s, clock=_later(s, e.at))
    new = dataclasses.replace(old, scaled=e.to_replicas)
    return _replace(
        s, services=s.services.set(e.service, new), needs_placement=True, clock=_later(s, e.at)
    )


def _service_replicas_changed(s: ClusterState, e: ev.ServiceReplicasChanged) -> ClusterState:
    old = s.services.get(e.service)
    if old is None:
        return _replace(s)
    new = apply_step(old, e.added, e.removed)
    synced = _replicas_synced(s, old, new)
    return _replace(
        synced,
        services=s.services.set(e.service, new),
        needs_placement=True,
        clock=_later(s, e.at),
    )


def _suspended(s: ClusterState, key: str, held: Suspension) -> ClusterState:
    """Not placed until resumed: it waits, saying why (a running one's JobPreempted follows)."""
    return _replace(
        s,
        suspended=s.suspended.set(key, held),
        pending=s.pending.set(key, Pending(held.reason, SUSPENDED)),
        clock=_later(s, held.since),
        needs_placement=True,
    )


def _job_suspended(s: ClusterState, e: ev.JobSuspended) -> ClusterState:
    return _suspended(s, e.job, commit_suspension(e))


def _workspace_suspended(s: ClusterState, e: ev.WorkspaceSuspended) -> ClusterState:
    return _suspended(s, e.job, idle_suspension(e))


def _job_resumed(s: ClusterState, e: ev.JobResumed) -> ClusterState:
    """Queued again, in its old place (its submission is unchanged): the solve that follows
    places it or says why it waits."""
    return _replace(
        s,
        suspended=_without(s.suspended, e.job),
        pending=_without(s.pending, e.job),
        clock=_later(s, e.at),
        needs_placement=True,
    )


_HANDLERS: dict[type[ev.Event], Callable[[ClusterState, Any], ClusterState]] = {
    ev.CommitApplied: _commit_applied,
    ev.CommitRejected: _commit_rejected,
    ev.ClusterConfigured: _cluster_configured,
    ev.PolicyChanged: _policy_changed,
    ev.NodeRegistered: _node_registered,
    ev.NodeRemoved: _node_removed,
    ev.NodeStateChanged: _node_state_changed,
    ev.QueueConfigured: _queue_configured,
    ev.QueueRemoved: _queue_removed,
    ev.OwnersChanged: _owners_changed,
    ev.MembersChanged: _members_changed,
    ev.ApprovalChecked: _approval_checked,
    ev.JobSubmitted: _job_submitted,
    ev.JobChanged: _job_changed,
    ev.JobWithdrawn: _job_withdrawn,
    ev.JobFinished: _job_finished,
    ev.JobStarted: _job_started,
    ev.JobFailed: _job_failed,
    ev.JobInterrupted: _job_interrupted,
    ev.PlacementDecided: _placement_decided,
    ev.JobPreempted: _job_preempted,
    ev.JobPending: _job_pending,
    ev.SolveCompleted: _solve_completed,
    ev.GpuUtilizationReported: _gpu_utilization_reported,
    ev.JobIdle: _job_idle,
    ev.JobIdleCleared: _job_idle_cleared,
    ev.JobRequeued: _job_requeued,
    ev.JobBackoffEnded: _job_backoff_ended,
    ev.JobTimedOut: _job_timed_out,
    ev.ReservationsDecided: _reservations_decided,
    ev.ServiceMetricObserved: _service_metric_observed,
    ev.ServiceScaled: _service_scaled,
    ev.ServiceSubmitted: _service_submitted,
    ev.ServiceChanged: _service_changed,
    ev.ServiceWithdrawn: _service_withdrawn,
    ev.ServiceReplicasChanged: _service_replicas_changed,
    ev.JobSuspended: _job_suspended,
    ev.WorkspaceSuspended: _workspace_suspended,
    ev.JobResumed: _job_resumed,
}

assert set(_HANDLERS) == set(ev.EVENT_TYPES.values()), "every event type needs a handler"


def evolve(state: ClusterState, event: ev.Event) -> ClusterState:
    return _HANDLERS[type(event)](state, event)


def fold(events: Iterable[ev.Event], state: ClusterState | None = None) -> ClusterState:
    current = state if state is not None else ClusterState()
    for event in events:
        current = evolve(current, event)
    return current
