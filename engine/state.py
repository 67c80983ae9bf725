"""The cluster's state as a fold over its events: `evolve(state, event) -> state`.

Maps are persistent (pyrsistent), so each event costs O(log n) and a
replay of a long log stays linear.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyrsistent import PMap, pmap

from engine import events as ev
from engine.model import ClusterSpec, CommitInfo, Finding, Job, Node, Placement, Policy, Queue


@dataclass(frozen=True, slots=True)
class Pending:
    reason: str
    constraint: str


@dataclass(frozen=True, slots=True)
class ClusterState:
    cluster: ClusterSpec | None = None
    policy: Policy = field(default_factory=Policy)
    nodes: PMap[str, Node] = field(default_factory=pmap)
    queues: PMap[str, Queue] = field(default_factory=pmap)
    jobs: PMap[str, Job] = field(default_factory=pmap)
    placements: PMap[str, Placement] = field(default_factory=pmap)
    pending: PMap[str, Pending] = field(default_factory=pmap)
    last_commit: CommitInfo | None = None
    last_good_commit: CommitInfo | None = None
    last_rejection: tuple[Finding, ...] = ()
    needs_placement: bool = False
    events_applied: int = 0

    def placement_of(self, job: str) -> Placement | None:
        return self.placements.get(job)


def _replace(state: ClusterState, **changes: Any) -> ClusterState:
    return dataclasses.replace(state, events_applied=state.events_applied + 1, **changes)


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
    return _replace(s, nodes=s.nodes.discard(e.node), needs_placement=True)


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
    return _replace(s, queues=s.queues.discard(e.queue), needs_placement=True)


def _job_submitted(s: ClusterState, e: ev.JobSubmitted) -> ClusterState:
    return _replace(s, jobs=s.jobs.set(e.job.key, e.job), needs_placement=True)


def _job_changed(s: ClusterState, e: ev.JobChanged) -> ClusterState:
    return _replace(s, jobs=s.jobs.set(e.job.key, e.job), needs_placement=True)


def _job_gone(s: ClusterState, key: str) -> ClusterState:
    return _replace(
        s,
        jobs=s.jobs.discard(key),
        placements=s.placements.discard(key),
        pending=s.pending.discard(key),
        needs_placement=True,
    )


def _job_withdrawn(s: ClusterState, e: ev.JobWithdrawn) -> ClusterState:
    return _job_gone(s, e.job)


def _job_finished(s: ClusterState, e: ev.JobFinished) -> ClusterState:
    return _job_gone(s, e.job)


def _placement_decided(s: ClusterState, e: ev.PlacementDecided) -> ClusterState:
    placement = Placement(job=e.job, flavor=e.flavor, replicas=e.replicas, started_at=e.at)
    return _replace(
        s, placements=s.placements.set(e.job, placement), pending=s.pending.discard(e.job)
    )


def _job_preempted(s: ClusterState, e: ev.JobPreempted) -> ClusterState:
    return _replace(
        s,
        placements=s.placements.discard(e.job),
        pending=s.pending.set(e.job, Pending(e.reason, "preempted")),
    )


def _job_pending(s: ClusterState, e: ev.JobPending) -> ClusterState:
    return _replace(
        s,
        placements=s.placements.discard(e.job),
        pending=s.pending.set(e.job, Pending(e.reason, e.constraint)),
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
    ev.JobSubmitted: _job_submitted,
    ev.JobChanged: _job_changed,
    ev.JobWithdrawn: _job_withdrawn,
    ev.JobFinished: _job_finished,
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
