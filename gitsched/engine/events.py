"""Every kind of event the log holds.

A type name is never renamed or reused; each class carries its schema_version,
and older payloads are upcast on read (eventlog.upcasting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gitsched.engine.model import (
    Approval,
    ClusterSpec,
    CommitInfo,
    Job,
    Node,
    NodeState,
    Owner,
    Policy,
    Queue,
    ReplicaPlacement,
    Reservation,
)
from gitsched.engine.services import InferenceService, Replica
from gitsched.findings import Finding


@dataclass(frozen=True, slots=True)
class Event:
    type: ClassVar[str] = "Event"
    schema_version: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class CommitApplied(Event):
    """v2: the commit carries its author date and its committer (eventlog.codec upcasts v1)."""

    type: ClassVar[str] = "CommitApplied"
    schema_version: ClassVar[int] = 2
    commit: CommitInfo
    changes: int


@dataclass(frozen=True, slots=True)
class CommitRejected(Event):
    """v2: as CommitApplied v2."""

    type: ClassVar[str] = "CommitRejected"
    schema_version: ClassVar[int] = 2
    commit: CommitInfo
    errors: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class ClusterConfigured(Event):
    type: ClassVar[str] = "ClusterConfigured"
    cluster: ClusterSpec


@dataclass(frozen=True, slots=True)
class PolicyChanged(Event):
    type: ClassVar[str] = "PolicyChanged"
    policy: Policy


@dataclass(frozen=True, slots=True)
class NodeRegistered(Event):
    """A node joined, or its spec changed."""

    type: ClassVar[str] = "NodeRegistered"
    node: Node


@dataclass(frozen=True, slots=True)
class NodeRemoved(Event):
    type: ClassVar[str] = "NodeRemoved"
    node: str


@dataclass(frozen=True, slots=True)
class NodeStateChanged(Event):
    """Drain, failure or recovery: only the node's state moved."""

    type: ClassVar[str] = "NodeStateChanged"
    node: str
    state: NodeState
    reason: str


@dataclass(frozen=True, slots=True)
class QueueConfigured(Event):
    type: ClassVar[str] = "QueueConfigured"
    queue: Queue


@dataclass(frozen=True, slots=True)
class QueueRemoved(Event):
    type: ClassVar[str] = "QueueRemoved"
    queue: str


@dataclass(frozen=True, slots=True)
class OwnersChanged(Event):
    """A team's OWNERS (and their keys) as a commit left them; () when the file went away.

    Recorded when they change, so who could approve a team's change at any commit is
    in the log, not only in the repository.
    """

    type: ClassVar[str] = "OwnersChanged"
    team: str
    owners: tuple[Owner, ...]


@dataclass(frozen=True, slots=True)
class MembersChanged(Event):
    """A team's MEMBERS (e-mails) as a commit left them; () when the file went away.

    Who may submit jobs to the team's queue (with `approval.requireMemberForJobs`), kept
    in the log so `audit compliance` judges a job change by the members at its base.
    """

    type: ClassVar[str] = "MembersChanged"
    team: str
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ApprovalChecked(Event):
    """The approval rule's inputs for one team's change in the commit that follows:
    who wrote the change (for a merge, the authors of the commits it brings in) and
    the approvals that counted. Who the owners were comes from OwnersChanged, so
    `audit compliance` re-runs the same rule from the log alone."""

    type: ClassVar[str] = "ApprovalChecked"
    team: str
    authors: tuple[str, ...]
    approvals: tuple[Approval, ...] = ()


@dataclass(frozen=True, slots=True)
class JobSubmitted(Event):
    type: ClassVar[str] = "JobSubmitted"
    job: Job


@dataclass(frozen=True, slots=True)
class JobChanged(Event):
    type: ClassVar[str] = "JobChanged"
    job: Job
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobWithdrawn(Event):
    type: ClassVar[str] = "JobWithdrawn"
    job: str


@dataclass(frozen=True, slots=True)
class JobFinished(Event):
    """v2: `at`, when the cluster says the job ended (its pods' finish time; "" when it did
    not say, and for v1 events): fair share counts the job's GPU-seconds up to it."""

    type: ClassVar[str] = "JobFinished"
    schema_version: ClassVar[int] = 2
    job: str
    at: str = ""


@dataclass(frozen=True, slots=True)
class JobStarted(Event):
    """Every replica of the job's current placement runs (from the cluster)."""

    type: ClassVar[str] = "JobStarted"
    job: str
    # The PlacementDecided.at of the placement that started: a job moved later starts again.
    placement_at: str


@dataclass(frozen=True, slots=True)
class JobFailed(Event):
    """A replica failed in the cluster: the job ends, and its quota is free again.
    v2: `at`, as JobFinished v2."""

    type: ClassVar[str] = "JobFailed"
    schema_version: ClassVar[int] = 2
    job: str
    reason: str
    exit_code: int | None
    replica: int | None
    at: str = ""


@dataclass(frozen=True, slots=True)
class JobInterrupted(Event):
    """The cluster lost part of a running gang without gitsched asking (a pod deleted
    behind its back): the gang is placed again, whole. v2: `at`, as JobFinished v2."""

    type: ClassVar[str] = "JobInterrupted"
    schema_version: ClassVar[int] = 2
    job: str
    reason: str
    at: str = ""


@dataclass(frozen=True, slots=True)
class PlacementDecided(Event):
    """The solver put a job on nodes: admitted for the first time, or moved. v2: a move's
    `rule`, why it moved (engine.placement.moves.MoveReason: place-gone, quota-cut, grows,
    makes-room; "" for an admission; v1 moves read as "unrecorded"), and the work it lost
    since its last checkpoint (`lost_gpu_seconds`; 0 for an admission and for v1 events)."""

    type: ClassVar[str] = "PlacementDecided"
    schema_version: ClassVar[int] = 2
    job: str
    flavor: str | None
    replicas: tuple[ReplicaPlacement, ...]
    action: str
    reason: str
    solve_id: str
    at: str
    rule: str = ""
    lost_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class JobPreempted(Event):
    """A running job stopped. v2: `rule`, what allowed it (engine.placement.preemption.Rule:
    within-queue, reclaim, place-gone; v1 events read as "unrecorded"). v3: `at`, the time
    of the decision that stopped it ("now" of its solve; "" for v1 and v2 events), so
    `audit compliance` re-judges the minimum run time on the decision's own time."""

    type: ClassVar[str] = "JobPreempted"
    schema_version: ClassVar[int] = 3
    job: str
    reason: str
    preempted_by: str | None
    lost_gpu_seconds: float
    solve_id: str
    rule: str = ""
    at: str = ""


@dataclass(frozen=True, slots=True)
class JobPending(Event):
    """The job waits; the reason says what would let it run."""

    type: ClassVar[str] = "JobPending"
    job: str
    reason: str
    constraint: str
    solve_id: str


@dataclass(frozen=True, slots=True)
class SolveCompleted(Event):
    """v2: `plan_source`, whose plan was applied ("milp" | "greedy"), and `fallback`, why
    greedy's plan was taken where the policy asked for the MILP ("" when it was not; v1
    events read as plan_source "unrecorded"). v3: `levels`."""

    type: ClassVar[str] = "SolveCompleted"
    schema_version: ClassVar[int] = 3
    solve_id: str
    solver: str
    status: str
    objective: float
    bound: float | None
    gap: float | None
    seconds: float
    variables: int
    constraints: int
    placed: int
    kept: int
    moved: int
    preempted: int
    pending: int
    broken_soft: tuple[str, ...] = ()
    plan_source: str = ""
    fallback: str = ""
    # v3: how the MILP took the lexicographic objective, "weighted" or "sequential"
    # (Policy solver.levels); "" for greedy (v2 events: "weighted" for a MILP, as they ran).
    levels: str = ""


@dataclass(frozen=True, slots=True)
class GpuUtilization:
    """One GPU's utilisation over a telemetry window (0-100 %), from `samples` samples."""

    index: int
    mean_percent: float
    max_percent: float
    samples: int


@dataclass(frozen=True, slots=True)
class GpuUtilizationReported(Event):
    """Telemetry: one node's GPUs over one window (`start`..`end`), aggregated at the edge
    (reconciler/telemetry.py), never one event per sample. `source`: nvml | dcgm."""

    type: ClassVar[str] = "GpuUtilizationReported"
    node: str
    source: str
    start: str
    end: str
    gpus: tuple[GpuUtilization, ...]


@dataclass(frozen=True, slots=True)
class JobIdle(Event):
    """A running job's GPUs stayed below the policy's threshold from `since` to `until`
    (engine/idle.py). `action` is what follows: "preemptible" (it ranks lowest in the
    solves that follow) or "reclaim" (a JobPreempted with rule "idle" comes with it)."""

    type: ClassVar[str] = "JobIdle"
    job: str
    since: str
    until: str
    utilization_percent: float
    threshold_percent: float
    action: str


@dataclass(frozen=True, slots=True)
class JobIdleCleared(Event):
    """A job flagged idle used its GPUs again (telemetry at `at` above the threshold)."""

    type: ClassVar[str] = "JobIdleCleared"
    job: str
    at: str
    utilization_percent: float


@dataclass(frozen=True, slots=True)
class JobRequeued(Event):
    """A job that failed (`cause` "failed": a pod Failed; "interrupted": its gang lost a
    node or a pod) waits to run again (engine/retries.py): attempt `attempt` of at most
    `max_retries`, not placed before `ready_at` = `failed_at` + the backoff. `job` is the
    job as it waits again: its submitted_at is its place in the queue (the policy's
    requeueTimestamp: its first submission, or `failed_at`). Times are the failure's, as
    the cluster reported it, never the clock's."""

    type: ClassVar[str] = "JobRequeued"
    job: Job
    attempt: int
    max_retries: int
    reason: str
    cause: str
    failed_at: str
    ready_at: str
    backoff_seconds: float


@dataclass(frozen=True, slots=True)
class JobBackoffEnded(Event):
    """The backoff of a requeued job ended at `at` (its JobRequeued.ready_at): recorded
    by `serve` at that moment (engine.retries.due_retries), so a replay meets the same
    decision point as the daemon did."""

    type: ClassVar[str] = "JobBackoffEnded"
    job: str
    attempt: int
    at: str


# -- time limits and reservations (docs/time.md) --


@dataclass(frozen=True, slots=True)
class JobTimedOut(Event):
    """A running job reached its time limit at `at` (its placement's start, `started_at`,
    plus `limit_minutes`): gitsched stops it, its pods are deleted with their grace period
    and its quota is free. Final, like Slurm's TIMEOUT and a Kubernetes Job's
    DeadlineExceeded: the job is not run again (a retry would hit the same limit)."""

    type: ClassVar[str] = "JobTimedOut"
    job: str
    at: str
    started_at: str
    limit_minutes: int


@dataclass(frozen=True, slots=True)
class ReservationsDecided(Event):
    """The reservations a solve holds (engine/placement/reservations.py), all of them:
    they replace the ones before. Appended only when they changed. v2: each reservation
    says how much of it its queue borrows (`borrowed_milli`)."""

    type: ClassVar[str] = "ReservationsDecided"
    schema_version: ClassVar[int] = 2
    solve_id: str
    at: str
    reservations: tuple[Reservation, ...]


# -- inference services' autoscaling (docs/autoscaling.md) --


@dataclass(frozen=True, slots=True)
class ServiceMetricObserved(Event):
    """A service's autoscaling metric over one window (`start`..`end`), aggregated at the
    edge (cluster/autoscaler.py): `value` is the mean of `samples` answers of Prometheus to
    `query` (the service's total, e.g. requests waiting summed over its pods), observed
    while the service had `replicas`. A window is appended only when it could change a
    decision: its recommendation differs from the window before, or a ServiceScaled
    follows it; so a window's recommendation holds until the next window starts."""

    type: ClassVar[str] = "ServiceMetricObserved"
    service: str  # "team/name"
    query: str
    start: str
    end: str
    value: float
    samples: int
    replicas: int


# -- inference services (engine/services.py, docs/services.md) --
# Their own events, not the Job ones with a kind field: a service is not a job (min/max,
# spread, rolling updates), and every reader of JobSubmitted (audit, the actuator, fair
# share's shapes) would have to learn to skip it. Its replicas are jobs, and their
# placements, starts and preemptions are the Job events every reader already knows.


@dataclass(frozen=True, slots=True)
class ServiceSubmitted(Event):
    """A commit added an InferenceService (its replicas follow in ServiceReplicasChanged)."""

    type: ClassVar[str] = "ServiceSubmitted"
    service: InferenceService


@dataclass(frozen=True, slots=True)
class ServiceChanged(Event):
    """A commit changed a service's spec; `fields` name what changed. A change of what a
    replica runs (resources, template, flavors, residency) starts a rolling update."""

    type: ClassVar[str] = "ServiceChanged"
    service: InferenceService
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServiceWithdrawn(Event):
    """A commit deleted the service's file: its replicas go with it."""

    type: ClassVar[str] = "ServiceWithdrawn"
    service: str  # "team/name"


@dataclass(frozen=True, slots=True)
class ServiceScaled(Event):
    """A service's desired replica count changed (engine/autoscaling.py), with the inputs that decided it."""

    type: ClassVar[str] = "ServiceScaled"
    service: str  # "team/name"
    from_replicas: int
    to_replicas: int
    metric_value: float | None  # the windowed metric the rule used; None when not from a metric
    target: float | None
    bound_by: str  # "hpa" | "tolerance" | "stabilization" | "policy:Pods" | "policy:Percent" | "min" | "max"
    at: str  # ISO-8601 UTC time of the event that decided it


@dataclass(frozen=True, slots=True)
class ServiceReplicasChanged(Event):
    """One step of a service's replicas (engine.services.next_step): replicas `added` (each
    a one-replica job `queue/name.<index>` of `revision`) and ordinals `removed` (their pods
    deleted), decided at `at` (the time of the event that made it due). `desired` is the
    count wanted, `running` the replicas the cluster reported running before the step."""

    type: ClassVar[str] = "ServiceReplicasChanged"
    service: str  # "team/name"
    revision: int
    added: tuple[Replica, ...]
    removed: tuple[int, ...]
    desired: int
    running: int
    reason: str
    at: str


# -- suspend and resume (docs/workspaces.md) --


@dataclass(frozen=True, slots=True)
class JobSuspended(Event):
    """A job or workspace suspended through git (spec.suspend: true, Kueue's suspend) by
    `by` (the commit's author) at `at` (the commit's date), in commit `commit`. It is not
    placed while suspended; a running one stops like a preemption (a JobPreempted with rule
    "suspend" follows, its lost work counted as a preemption's). It keeps its submission
    order: resumed, it queues in its old place in line (engine/suspend.py)."""

    type: ClassVar[str] = "JobSuspended"
    job: str
    at: str
    by: str
    commit: str


@dataclass(frozen=True, slots=True)
class WorkspaceSuspended(Event):
    """A running workspace's GPUs stayed below the idle threshold (`threshold_percent`, the
    Policy's idle.thresholdPercent; at most `utilization_percent` seen) from `since` to
    `until`, at least its idle.suspendAfterMinutes (`after_minutes`): suspended at `until`,
    its pods deleted and its quota freed (a JobPreempted with rule "suspend" follows). Its
    spec stays; a commit that changes its spec.resume queues it again."""

    type: ClassVar[str] = "WorkspaceSuspended"
    job: str
    since: str
    until: str
    utilization_percent: float
    threshold_percent: float
    after_minutes: int


@dataclass(frozen=True, slots=True)
class JobResumed(Event):
    """A suspended job or workspace queued again by commit `commit` of `by` at `at` (the
    commit's date): `how` is "suspend" (its spec.suspend went to false) or "resume" (a
    workspace's spec.resume changed after the idle rule suspended it)."""

    type: ClassVar[str] = "JobResumed"
    job: str
    at: str
    by: str
    commit: str
    how: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        CommitApplied,
        CommitRejected,
        ClusterConfigured,
        PolicyChanged,
        NodeRegistered,
        NodeRemoved,
        NodeStateChanged,
        QueueConfigured,
        QueueRemoved,
        OwnersChanged,
        MembersChanged,
        ApprovalChecked,
        JobSubmitted,
        JobChanged,
        JobWithdrawn,
        JobFinished,
        JobStarted,
        JobFailed,
        JobInterrupted,
        PlacementDecided,
        JobPreempted,
        JobPending,
        SolveCompleted,
        GpuUtilizationReported,
        JobIdle,
        JobIdleCleared,
        JobRequeued,
        JobBackoffEnded,
        JobTimedOut,
        ReservationsDecided,
        ServiceMetricObserved,
        ServiceScaled,
        ServiceSubmitted,
        ServiceChanged,
        ServiceWithdrawn,
        ServiceReplicasChanged,
        JobSuspended,
        WorkspaceSuspended,
        JobResumed,
    )
}
