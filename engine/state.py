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

from engine import events as ev
from engine.model import (
    ClusterSpec,
    CommitInfo,
    Finding,
    Job,
    Node,
    Owner,
    Placement,
    Policy,
    Queue,
)
from engine.placement.fragmentation import remember_shape


@dataclass(frozen=True, slots=True)
class Pending:
    reason: str
    constraint: str


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
    # job -> "finished" | "failed": ended in the cluster; its file no longer submits it
    ended: Map[str, str] = field(default_factory=Map)
    last_commit: CommitInfo | None = None
    last_good_commit: CommitInfo | None = None
    last_rejection: tuple[Finding, ...] = ()
    needs_placement: bool = False
    events_applied: int = 0
    # team -> its OWNERS as the log last recorded them (OwnersChanged)
    owners: Map[str, tuple[Owner, ...]] = field(default_factory=Map)
    # The job shapes submitted so far, as engine.placement.fragmentation summarises them:
    # shape -> weight as published to the solver, the current window's counts, its jobs.
    shapes: Map[str, int] = field(default_factory=Map)
    shapes_window: Map[str, int] = field(default_factory=Map)
    shapes_window_jobs: int = 0

    def placement_of(self, job: str) -> Placement | None:
        return self.placements.get(job)


_FIELDS = tuple(f.name for f in dataclasses.fields(ClusterState) if f.name != "events_applied")
_new = object.__new__
_set = object.__setattr__
V = TypeVar("V")


def _replace(state: ClusterState, **changes: Any) -> ClusterState:
    """`dataclasses.replace`, counting the event: every event of a replay comes
    through here, and the general function costs a few times as much."""
    new = _new(ClusterState)
    for name in _FIELDS:
        _set(new, name, changes[name] if name in changes else getattr(state, name))
    _set(new, "events_applied", state.events_applied + 1)
    return new


def _without(entries: Map[str, V], key: str) -> Map[str, V]:
    return entries.delete(key) if key in entries else entries


def _commit_applied(s: ClusterState, e: ev.CommitApplied) -> ClusterState:
    return _replace(s, last_commit=e.commit, last_good_commit=e.commit, last_rejection=())


def _commit_rejected(s: ClusterState, e: ev.CommitRejected) -> ClusterState:
    return _replace(s, last_commit=e.commit, last_rejection=e.errors)


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
        shapes=shapes,
        shapes_window=window,
        shapes_window_jobs=window_jobs,
    )


def _job_changed(s: ClusterState, e: ev.JobChanged) -> ClusterState:
    return _replace(s, jobs=s.jobs.set(e.job.key, e.job), needs_placement=True)


def _job_gone(s: ClusterState, key: str, ended: Map[str, str] | None = None) -> ClusterState:
    """The job leaves the state, and its quota and GPUs with it: waiting jobs are placed."""
    return _replace(
        s,
        jobs=_without(s.jobs, key),
        placements=_without(s.placements, key),
        pending=_without(s.pending, key),
        started=_without(s.started, key),
        ended=_without(s.ended, key) if ended is None else ended,
        needs_placement=True,
    )


def _job_withdrawn(s: ClusterState, e: ev.JobWithdrawn) -> ClusterState:
    return _job_gone(s, e.job)


def _job_finished(s: ClusterState, e: ev.JobFinished) -> ClusterState:
    return _job_gone(s, e.job, s.ended.set(e.job, "finished"))


def _job_failed(s: ClusterState, e: ev.JobFailed) -> ClusterState:
    return _job_gone(s, e.job, s.ended.set(e.job, "failed"))


def _job_started(s: ClusterState, e: ev.JobStarted) -> ClusterState:
    return _replace(s, started=s.started.set(e.job, e.placement_at))


def _job_interrupted(s: ClusterState, e: ev.JobInterrupted) -> ClusterState:
    return _replace(
        s,
        placements=_without(s.placements, e.job),
        started=_without(s.started, e.job),
        needs_placement=True,
    )


def _placement_decided(s: ClusterState, e: ev.PlacementDecided) -> ClusterState:
    placement = Placement(job=e.job, flavor=e.flavor, replicas=e.replicas, started_at=e.at)
    return _replace(
        s,
        placements=s.placements.set(e.job, placement),
        pending=_without(s.pending, e.job),
        started=_without(s.started, e.job),
    )


def _job_preempted(s: ClusterState, e: ev.JobPreempted) -> ClusterState:
    return _replace(
        s,
        placements=_without(s.placements, e.job),
        pending=s.pending.set(e.job, Pending(e.reason, "preempted")),
        started=_without(s.started, e.job),
    )


def _job_pending(s: ClusterState, e: ev.JobPending) -> ClusterState:
    return _replace(
        s,
        placements=_without(s.placements, e.job),
        pending=s.pending.set(e.job, Pending(e.reason, e.constraint)),
        started=_without(s.started, e.job),
    )


def _solve_completed(s: ClusterState, e: ev.SolveCompleted) -> ClusterState:
    return _replace(s, needs_placement=False)


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
}

assert set(_HANDLERS) == set(ev.EVENT_TYPES.values()), "every event type needs a handler"


def evolve(state: ClusterState, event: ev.Event) -> ClusterState:
    return _HANDLERS[type(event)](state, event)


def fold(events: Iterable[ev.Event], state: ClusterState | None = None) -> ClusterState:
    current = state if state is not None else ClusterState()
    for event in events:
        current = evolve(current, event)
    return current
