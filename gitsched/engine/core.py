"""`decide(state, intent) -> events`: what a commit or a solve means for the log.

Intents come from the edges (a parsed commit, a rejected commit, a placement
plan); the events returned are all the log needs to fold into the new state.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from immutables import Map

from gitsched.engine import events as ev
from gitsched.engine.fairshare import capacity_gpus, moment, usage_at, usage_shares
from gitsched.engine.idle import idle_reason, is_idle, job_utilization, suspend_rule
from gitsched.engine.model import (
    ClusterSpec,
    CommitInfo,
    IdleAction,
    Job,
    Node,
    Owner,
    Policy,
    Queue,
    utc_time,
)
from gitsched.engine.placement.objective import lost_gpu_seconds
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.preemption import Rule
from gitsched.engine.placement.reservations import HELD, RESERVED
from gitsched.engine.retries import held_back
from gitsched.engine.services import InferenceService, is_replica_key, next_step, replica_key
from gitsched.engine.services import desired_replicas as desired_count
from gitsched.engine.shapes import learned_shapes
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.suspend import commit_transitions, stop
from gitsched.engine.suspension import idle_suspension
from gitsched.findings import Finding


@dataclass(frozen=True, slots=True)
class DesiredState:
    """Everything one valid commit declares."""

    cluster: ClusterSpec
    policy: Policy
    nodes: Mapping[str, Node]
    queues: Mapping[str, Queue]
    jobs: Mapping[str, Job]
    # team -> its OWNERS file (teams/<team>/OWNERS), for teams that have one
    owners: Mapping[str, tuple[Owner, ...]] = field(default_factory=dict)
    # team -> its MEMBERS file (teams/<team>/MEMBERS): who may submit its jobs
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # "team/name" -> its InferenceService (teams/<team>/services/)
    services: Mapping[str, InferenceService] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApplyCommit:
    commit: CommitInfo
    desired: DesiredState
    # the approval rule's inputs for each team whose queue or OWNERS the commit changes
    approvals: tuple[ev.ApprovalChecked, ...] = ()


@dataclass(frozen=True, slots=True)
class RejectCommit:
    commit: CommitInfo
    errors: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    plan: PlacementPlan
    solve_id: str
    at: str


@dataclass(frozen=True, slots=True)
class ApplyTelemetry:
    """GPU utilisation reports from the edge (reconciler/telemetry.py), aggregated."""

    reports: tuple[ev.GpuUtilizationReported, ...]


Intent = ApplyCommit | RejectCommit | ApplyPlan | ApplyTelemetry


def decision_time(commit: CommitInfo) -> str:
    """'Now' for every decision made for `commit`: its committer date, when it was merged.

    Never the clock: a commit reconciled a week late, planned before merge or replayed
    is decided at the same moment, so `plan` and the reconciler agree and every time in
    the log that follows from the commit is the commit's.
    """
    return utc_time(commit.committed_at)


def decide(state: ClusterState, intent: Intent) -> tuple[ev.Event, ...]:
    if isinstance(intent, ApplyCommit):
        return _apply_commit(state, intent)
    if isinstance(intent, RejectCommit):
        return (ev.CommitRejected(commit=intent.commit, errors=intent.errors),)
    if isinstance(intent, ApplyTelemetry):
        return _apply_telemetry(state, intent)
    return _apply_plan(state, intent)


def _apply_telemetry(state: ClusterState, intent: ApplyTelemetry) -> tuple[ev.Event, ...]:
    """The reports, then the jobs they show idle (and, to reclaim, stopped) or busy again."""
    reports = tuple(sorted(intent.reports, key=lambda r: (r.end, r.node, r.start, r.source)))
    out: list[ev.Event] = list(reports)
    after = fold(reports, state)
    policy = after.policy.idle
    for key in sorted(after.idle_streaks):
        job, placement = after.jobs.get(key), after.placements.get(key)
        streak = after.idle_streaks[key]
        if job is None or placement is None:
            continue
        rule = suspend_rule(job, policy)
        if (
            rule is not None
            and key not in after.suspended
            and is_idle(job, placement, streak, rule)
        ):
            # A workspace idle for its own window: suspended (engine/suspend.py), its GPUs freed.
            suspended = ev.WorkspaceSuspended(
                job=key,
                since=streak.since,
                until=streak.until,
                utilization_percent=streak.percent,
                threshold_percent=policy.threshold_percent,
                after_minutes=job.idle_suspend_after_minutes or 0,
            )
            reason = idle_suspension(suspended).reason
            out += (suspended, stop(job, placement, reason, streak.until, f"idle/{streak.until}"))
            continue
        if key in after.idle:
            continue
        if not is_idle(job, placement, streak, policy):
            continue
        flag = ev.JobIdle(
            job=key,
            since=streak.since,
            until=streak.until,
            utilization_percent=streak.percent,
            threshold_percent=policy.threshold_percent,
            action=policy.action.value,
        )
        out.append(flag)
        if policy.action is IdleAction.RECLAIM:
            out.append(
                ev.JobPreempted(
                    job=key,
                    reason=idle_reason(flag),
                    preempted_by=None,
                    lost_gpu_seconds=lost_gpu_seconds(job, placement, streak.until),
                    solve_id=f"idle/{streak.until}",
                    rule=Rule.IDLE.value,
                    at=streak.until,
                )
            )
    for key in sorted(after.idle):
        placement = after.placements.get(key)
        if placement is None or key in after.idle_streaks:
            continue
        seen = [(r.end, u) for r in reports if (u := job_utilization(placement, r)) is not None]
        if seen:
            at, percent = max(seen)
            out.append(ev.JobIdleCleared(job=key, at=at, utilization_percent=percent))
    return tuple(out)


def _apply_commit(state: ClusterState, intent: ApplyCommit) -> tuple[ev.Event, ...]:
    desired = intent.desired
    out: list[ev.Event] = []
    if state.cluster != desired.cluster:
        out.append(ev.ClusterConfigured(cluster=desired.cluster))
    if state.policy != desired.policy:
        out.append(ev.PolicyChanged(policy=desired.policy))

    # A repo without inventory leaves the nodes to the live inventory (cluster/):
    # the Kubernetes API registers them, and a commit must not remove them again.
    if desired.nodes:
        for name in sorted(set(state.nodes) - set(desired.nodes)):
            out.append(ev.NodeRemoved(node=name))
    for name in sorted(desired.nodes):
        node = desired.nodes[name]
        old = state.nodes.get(name)
        if old == node:
            continue
        if old is not None and dataclasses.replace(old, state=node.state) == node:
            out.append(
                ev.NodeStateChanged(
                    node=name, state=node.state, reason=f"set to {node.state} in the cluster repo"
                )
            )
        else:
            out.append(ev.NodeRegistered(node=node))

    for name in sorted(desired.queues):
        if state.queues.get(name) != desired.queues[name]:
            out.append(ev.QueueConfigured(queue=desired.queues[name]))

    for key in sorted((set(state.jobs) | set(state.ended)) - set(desired.jobs)):
        if is_replica_key(key):
            continue  # a service's replica: its service's events add and remove it
        out.append(ev.JobWithdrawn(job=key))
    for key in sorted(desired.jobs):
        if key in state.ended:
            continue  # it finished or failed in the cluster: its file stays a record, not a rerun
        job = desired.jobs[key]
        old_job = state.jobs.get(key)
        if old_job is None:
            out.append(
                ev.JobSubmitted(
                    job=dataclasses.replace(
                        job,
                        submitted_at=intent.commit.committed_at,
                        submission=state.events_applied + 1,
                    )
                )
            )
            continue
        if _job_spec(job) == _job_spec(old_job):
            continue  # (what `job != old_job` with old_job's submitted_at says, without a copy)
        job = dataclasses.replace(
            job, submitted_at=old_job.submitted_at, submission=old_job.submission
        )
        out.append(ev.JobChanged(job=job, fields=_changed_fields(old_job, job)))

    out.extend(_service_changes(state, desired.services, intent.commit))
    # Suspended and resumed (spec.suspend, a workspace's spec.resume), decided at the
    # commit's time: after the job changes that carry the new spec.
    out.extend(
        commit_transitions(
            {k: j for k, j in desired.jobs.items() if k not in state.ended},
            state.jobs,
            state.suspended,
            state.placements,
            intent.commit,
            decision_time(intent.commit),
        )
        if state.suspended or any(j.suspend for j in desired.jobs.values())
        else ()
    )

    # Queues go after their jobs are withdrawn, so no job is ever left without its queue.
    for name in sorted(set(state.queues) - set(desired.queues)):
        out.append(ev.QueueRemoved(queue=name))

    for team in sorted(set(state.owners) | set(desired.owners)):
        owners = tuple(desired.owners.get(team, ()))
        if state.owners.get(team, ()) != owners:
            out.append(ev.OwnersChanged(team=team, owners=owners))
    for team in sorted(set(state.members) | set(desired.members)):
        members = tuple(desired.members.get(team, ()))
        if state.members.get(team, ()) != members:
            out.append(ev.MembersChanged(team=team, members=members))

    changes = len(out)
    out.extend(intent.approvals)
    out.append(ev.CommitApplied(commit=intent.commit, changes=changes))
    return tuple(out)


# Every field a Job compares but the time it was submitted: a commit compares 50,000 jobs
# with the state's, nearly all unchanged.
_job_spec = operator.attrgetter(
    *(
        f.name
        for f in dataclasses.fields(Job)
        if f.compare and f.name not in ("submitted_at", "submission")
    )
)


def _changed_fields(old: Job, new: Job) -> tuple[str, ...]:
    return tuple(
        f.name
        for f in dataclasses.fields(Job)
        if f.init and getattr(old, f.name) != getattr(new, f.name)
    )


def _service_changes(
    state: ClusterState, desired: Mapping[str, InferenceService], commit: CommitInfo
) -> list[ev.Event]:
    """Services added, changed and withdrawn by a commit (their replicas follow in the solve
    step: `service_steps`)."""
    out: list[ev.Event] = []
    for key in sorted(set(state.services) - set(desired)):
        out.append(ev.ServiceWithdrawn(service=key))
    for key in sorted(desired):
        service = desired[key]
        known = state.services.get(key)
        if known is None:
            placed = dataclasses.replace(
                service, submitted_at=commit.committed_at, submission=state.events_applied + 1
            )
            out.append(ev.ServiceSubmitted(service=placed))
            continue
        service = dataclasses.replace(
            service, submitted_at=known.service.submitted_at, submission=known.service.submission
        )
        if service != known.service:
            fields = tuple(
                f.name
                for f in dataclasses.fields(InferenceService)
                if getattr(service, f.name) != getattr(known.service, f.name)
            )
            out.append(ev.ServiceChanged(service=service, fields=fields))
    return out


MAX_SERVICE_STEPS = 4  # per service and decision: a removal, then what replaces it


def service_steps(state: ClusterState, now: str) -> tuple[ev.Event, ...]:
    """The replica changes due at `now` for every service (engine.services.next_step): a
    scale to the desired count, or the next step of a rolling update once the cluster
    reported the new replicas running. Part of every solve step, so `plan`, `reconcile`
    and a replay take the same steps at the same events."""
    out: list[ev.Event] = []
    for key in sorted(state.services):
        for _ in range(MAX_SERVICE_STEPS):
            status = state.services[key]
            keys = {r.index: replica_key(status.service, r.index) for r in status.replicas}
            ended = tuple(sorted(i for i, k in keys.items() if k not in state.jobs))
            running = frozenset(i for i, k in keys.items() if k in state.started)
            if ended:
                event = ev.ServiceReplicasChanged(
                    service=key,
                    revision=status.revision,
                    added=(),
                    removed=ended,
                    desired=desired_count(status),
                    running=len(running),
                    reason="ended in the cluster: replaced",
                    at=now,
                )
            else:
                placed = frozenset(i for i, k in keys.items() if k in state.placements)
                step = next_step(status, running, placed)
                if step is None:
                    break
                event = ev.ServiceReplicasChanged(
                    service=key,
                    revision=status.revision,
                    added=step.added,
                    removed=step.removed,
                    desired=desired_count(status),
                    running=len(running),
                    reason=step.reason,
                    at=now,
                )
            out.append(event)
            state = fold((event,), state)
    return tuple(out)


def _apply_plan(state: ClusterState, intent: ApplyPlan) -> tuple[ev.Event, ...]:
    plan = intent.plan
    out: list[ev.Event] = []
    if plan.reservations != state.reservations:
        # First, so the placements that follow are judged against the solve's own reservations.
        out.append(
            ev.ReservationsDecided(
                solve_id=intent.solve_id, at=intent.at, reservations=plan.reservations
            )
        )
    for outcome in plan.outcomes:
        if outcome.job not in state.jobs:
            continue
        if outcome.status in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
            out.append(
                ev.PlacementDecided(
                    job=outcome.job,
                    flavor=outcome.flavor,
                    replicas=outcome.replicas,
                    action="admitted" if outcome.status is OutcomeStatus.PLACED else "moved",
                    reason=outcome.reason,
                    solve_id=intent.solve_id,
                    at=intent.at,
                    rule=outcome.rule if outcome.status is OutcomeStatus.MOVED else "",
                    lost_gpu_seconds=(
                        outcome.lost_gpu_seconds if outcome.status is OutcomeStatus.MOVED else 0.0
                    ),
                )
            )
        elif outcome.status is OutcomeStatus.PREEMPTED:
            out.append(
                ev.JobPreempted(
                    job=outcome.job,
                    reason=outcome.reason,
                    preempted_by=outcome.preempted_by,
                    lost_gpu_seconds=outcome.lost_gpu_seconds,
                    solve_id=intent.solve_id,
                    rule=outcome.rule,
                    at=intent.at,
                )
            )
        elif outcome.status is OutcomeStatus.PENDING:
            known = state.pending.get(outcome.job)
            running = outcome.job in state.placements
            if running or known is None or known.reason != outcome.reason:
                out.append(
                    ev.JobPending(
                        job=outcome.job,
                        reason=outcome.reason,
                        constraint=outcome.constraint,
                        solve_id=intent.solve_id,
                    )
                )
    stats = plan.stats
    counts = plan.counts()
    out.append(
        ev.SolveCompleted(
            solve_id=intent.solve_id,
            solver=stats.solver,
            status=stats.status,
            objective=stats.objective,
            bound=stats.bound,
            gap=stats.gap,
            seconds=stats.seconds,
            variables=stats.variables,
            constraints=stats.constraints,
            placed=counts[OutcomeStatus.PLACED],
            kept=counts[OutcomeStatus.KEPT],
            moved=counts[OutcomeStatus.MOVED],
            preempted=counts[OutcomeStatus.PREEMPTED],
            pending=counts[OutcomeStatus.PENDING],
            broken_soft=plan.broken_soft,
            plan_source=stats.plan_source,
            fallback=stats.fallback,
            levels=stats.levels,
        )
    )
    return tuple(out)


def keep_waiting_reasons(
    plan: PlacementPlan, state: ClusterState, changed: frozenset[str]
) -> PlacementPlan:
    """An incremental plan, which decided only the `changed` jobs, leaves the other
    waiting jobs waiting: they keep the reason the last full solve gave them, so
    `decide` appends no JobPending for them again."""
    outcomes = []
    pending = state.pending
    for outcome in plan.outcomes:
        if (
            outcome.status is OutcomeStatus.PENDING
            and outcome.job not in changed
            # a reservation's reason says when: it moves with every decision
            and outcome.constraint not in (RESERVED, HELD)
        ):
            known = pending.get(outcome.job)
            if (
                known
                and known.constraint not in (RESERVED, HELD)  # a reservation's word is not kept
                and (outcome.reason, outcome.constraint) != (known.reason, known.constraint)
            ):
                outcome = dataclasses.replace(
                    outcome, reason=known.reason, constraint=known.constraint
                )
        outcomes.append(outcome)
    return dataclasses.replace(plan, outcomes=tuple(outcomes))


def placement_instance(state: ClusterState, now: str) -> PlacementInstance:
    """What the solver sees of the state: every job, node, queue, and what runs where.

    A job flagged idle (engine/idle.py) ranks below every priority class while it runs
    ("preemptible"), or is left out, waiting, until its owner changes it ("reclaim"). A
    requeued job is left out until its backoff ends (engine/retries.py)."""
    lowest = min((j.priority for j in state.jobs.values()), default=0) - 1
    jobs = []
    # A requeued job waits out its backoff (engine/retries.py): no decision before it ends.
    backoff = held_back(state, now) if state.retries else frozenset()
    for key in sorted(state.jobs):
        if key in backoff or key in state.suspended:
            continue
        job = state.jobs[key]
        flag = state.idle.get(key)
        if flag is not None and flag.action == IdleAction.RECLAIM:
            continue
        if flag is not None and key in state.placements:
            job = dataclasses.replace(job, priority=lowest, preemptible=True)
        jobs.append(job)
    return PlacementInstance(
        cluster=state.cluster,
        nodes=_in_key_order("nodes", state.nodes),
        queues=_in_key_order("queues", state.queues),
        jobs=tuple(jobs),
        # Sorted: a Map's order follows its keys' hashes, which change with PYTHONHASHSEED.
        current={key: state.placements[key] for key in sorted(state.placements)},
        policy=state.policy,
        now=now,
        usage=fair_usage(state, now),
        shapes=learned_shapes(state.shapes),
    )


V = TypeVar("V")
# The last state's nodes and queues as the solver sees them, by the identity of the state's
# maps (immutable: the same map is the same content). A commit of jobs leaves both maps as
# they were, so the solver gets the very same tuples again, and every cache keyed on a node
# list (topology trees, the decomposed cut's domains) finds its entry.
_IN_KEY_ORDER: dict[str, tuple[Map[str, Any], tuple[Any, ...]]] = {}


def _in_key_order(kind: str, items: Map[str, V]) -> tuple[V, ...]:
    """The values of `items` sorted by key (a Map's own order follows its keys' hashes)."""
    found = _IN_KEY_ORDER.get(kind)
    if found is not None and found[0] is items:
        return found[1]
    ordered = tuple(items[k] for k in sorted(items))
    _IN_KEY_ORDER[kind] = (items, ordered)
    return ordered


def fair_usage(state: ClusterState, now: str) -> dict[str, float]:
    """Each queue's decayed usage at `now` as a share of the cluster (engine/fairshare.py)."""
    at = max(moment(now) or 0.0, state.clock)
    half_life = state.policy.usage_half_life_hours
    return usage_shares(usage_at(state.usage, at, half_life), capacity_gpus(state.nodes), half_life)
