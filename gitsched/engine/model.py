"""The domain: cluster, nodes, queues, jobs, policy and placements.

Frozen dataclasses only. Resource amounts are integers in the smallest unit
used anywhere (milli-GPU, milli-CPU, MiB), so capacity sums are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from gitsched.engine.units import GPU_MILLI

NODE_LEVEL = "node"
WORKSPACE = "Workspace"  # Job.kind of an interactive session (docs/workspaces.md)


class NodeState(StrEnum):
    READY = "Ready"
    DRAINED = "Drained"
    FAILED = "Failed"


class Isolation(StrEnum):
    SHARED = "shared"
    DEDICATED = "dedicated"


class TopologyMode(StrEnum):
    REQUIRED = "required"
    PREFERRED = "preferred"
    UNCONSTRAINED = "unconstrained"  # no level, and not even kept compact


@dataclass(frozen=True, slots=True)
class GpuFlavor:
    name: str
    model: str
    memory_gib: int


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    # preemption.minRuntimeMinutes (engine/placement/preemption.py: min_runtime_protection)
    min_runtime_minutes: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    topology_levels: tuple[str, ...]
    gpu_flavors: tuple[GpuFlavor, ...]
    priority_classes: tuple[PriorityClass, ...]
    default_priority_class: str

    def priority_value(self, class_name: str) -> int:
        for pc in self.priority_classes:
            if pc.name == class_name:
                return pc.value
        raise KeyError(class_name)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    flavor: str | None
    gpus: int
    cpu_milli: int
    memory_mib: int
    topology: dict[str, str] = field(default_factory=dict)
    region: str | None = None
    isolation: Isolation = Isolation.SHARED
    state: NodeState = NodeState.READY
    labels: dict[str, str] = field(default_factory=dict)

    def domain(self, level: str) -> str:
        """The node's domain at `level`; a node unlabelled at a level is a domain of its own."""
        if level == NODE_LEVEL:
            return self.name
        return self.topology.get(level, f"{level}:{self.name}")

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.READY


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """A queue's quota of one GPU flavor, in milli-GPU; None means no limit of that kind."""

    flavor: str
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def guaranteed(self) -> int:
        """What the queue keeps for itself: the part of nominal it never lends."""
        if self.lending_limit is None:
            return 0
        return max(0, self.nominal - self.lending_limit)

    @property
    def ceiling(self) -> int | None:
        if self.borrowing_limit is None:
            return None
        return self.nominal + self.borrowing_limit


class QueueingStrategy(StrEnum):
    """How a queue's waiting jobs are admitted (Kueue's ClusterQueue queueingStrategy);
    either way they are ordered by priority, then submission time."""

    # A head that cannot start does not block the jobs behind it that can (Kueue's default).
    BEST_EFFORT_FIFO = "BestEffortFIFO"
    # A head that cannot start blocks every job behind it in the same queue, even one that
    # would fit (engine/placement/strict_fifo.py).
    STRICT_FIFO = "StrictFIFO"


@dataclass(frozen=True, slots=True)
class QueueTimeLimits:
    """A queue's time limits (Queue.spec.timeLimits): the limit a job that names none gets,
    and the most a job may ask for; None: no default, no maximum (Kueue's ClusterQueue
    default and maximum execution time)."""

    default_minutes: int | None = None
    max_minutes: int | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    team: str
    cohort: str | None = None
    weight: float = 1.0
    max_priority_class: str | None = None
    quotas: tuple[FlavorQuota, ...] = ()
    owners: tuple[str, ...] = ()
    # -- retries and minimum run time (engine/retries.py, engine/placement/preemption.py) --
    retry: RetryPolicy | None = None  # spec.retry: the default of its jobs
    min_runtime_minutes: int | None = None  # spec.preemption.minRuntimeMinutes
    # Kueue's ClusterQueue spec.preemption.reclaimWithinCohort: whose borrowed capacity this
    # queue's jobs may take back; None: the Policy's (engine/placement/preemption.py).
    reclaim_within_cohort: PreemptionScope | None = None
    # -- time limits (docs/time.md) --
    time_limits: QueueTimeLimits = field(default_factory=lambda: QueueTimeLimits())
    # spec.queueingStrategy (docs/time.md, Queueing strategy)
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO

    def quota(self, flavor: str) -> FlavorQuota | None:
        for q in self.quotas:
            if q.flavor == flavor:
                return q
        return None


@dataclass(frozen=True, slots=True)
class Resources:
    """Per replica. gpu_milli below 1000 is a share of one physical GPU."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def fractional(self) -> bool:
        return 0 < self.gpu_milli < GPU_MILLI

    @property
    def whole_gpus(self) -> int:
        return self.gpu_milli // GPU_MILLI


@dataclass(frozen=True, slots=True)
class TopologyRequirement:
    """Where a gang's replicas go in the network tree (engine/placement/topology.py).

    `level` is None only with mode unconstrained. With `slice_size`, each consecutive
    group of that many replicas sits in one domain of `slice_level` (below `level`).
    """

    level: str | None
    mode: TopologyMode = TopologyMode.REQUIRED
    slice_size: int | None = None
    slice_level: str | None = None


@dataclass(frozen=True, slots=True)
class Spread:
    """At most `max_per_domain` replicas of one service in one domain of `level` ('node' or
    a topology level): one constraint in every solver (engine/placement/spread.py)."""

    level: str
    max_per_domain: int


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    queue: str
    replicas: int
    resources: Resources
    priority_class: str
    priority: int
    min_replicas: int | None = None
    gpu_flavors: tuple[str, ...] = ()
    topology: TopologyRequirement | None = None
    preemptible: bool = True
    checkpoint_interval_minutes: int | None = None
    isolation: Isolation = Isolation.SHARED
    residency: tuple[str, ...] = ()
    file: str = ""
    submitted_at: str = ""
    # Submission order beside the commit's time (whole seconds: commits pushed together
    # share it): the log position of the commit that submitted the job (the state's
    # events_applied then). Jobs of one commit share it and go by key; 0 in older events.
    submission: int = 0
    # The pod template (spec.template, a Kubernetes PodTemplateSpec as in Kueue and
    # JobSet) the cluster actuator makes each replica's pod from; opaque to placement.
    template: dict[str, object] | None = None
    # -- retries (engine/retries.py): spec.retry; None takes the queue's, then the policy's --
    retry: RetryPolicy | None = None
    # -- time limits (docs/time.md) --
    # The most the job may run, in minutes, once its queue's default applied (spec.timeLimitMinutes,
    # else Queue.spec.timeLimits.defaultMinutes); None: it runs until it ends. A running job
    # reaches it at its placement's start + this (engine/timelimits.py).
    time_limit_minutes: int | None = None
    # -- inference services (engine/services.py): a replica of a service is a one-replica job --
    # "team/name" of the InferenceService this job is a replica of; "" for a job of its own.
    service: str = ""
    # The service's spread: with `service`, at most so many of its replicas per domain.
    spread: tuple[Spread, ...] = ()
    # -- kinds of work and pausing (docs/workspaces.md) --
    # The document's kind: "Job", or "Workspace" (an interactive session: one replica,
    # placed like a one-replica job, suspended when idle).
    kind: str = "Job"
    # spec.suspend (Kueue's): a suspended job is not placed, and a running one stops like a
    # preemption (engine/suspend.py); false queues it again in its place in line.
    suspend: bool = False
    # Workspace spec.idle.suspendAfterMinutes: GPUs idle this long suspend it (engine/idle.py).
    idle_suspend_after_minutes: int | None = None
    # Workspace spec.resume: a commit that changes it resumes a workspace the idle rule
    # suspended (its file still says suspend: false); "" when not set.
    resume: str = ""
    # "queue/name", worked out once when the job is made (a commit on 50,000 jobs reads
    # keys ~700,000 times). Derived, not data: no constructor argument, no part of
    # equality, and engine.codec leaves it out of events (init=False).
    key: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", job_key(self.queue, self.name))

    @property
    def smallest_gang(self) -> int:
        return self.min_replicas if self.min_replicas is not None else self.replicas

    @property
    def gpu_milli_total(self) -> int:
        return self.replicas * self.resources.gpu_milli

    @property
    def is_workspace(self) -> bool:
        return self.kind == WORKSPACE

    def placement_fields(self) -> tuple[object, ...]:
        """The fields a running placement depends on: change one and the job must be placed anew."""
        return (
            self.replicas,
            self.min_replicas,
            self.resources,
            self.gpu_flavors,
            self.topology,
            self.isolation,
            self.residency,
            self.spread,
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """spec.retry: how often a failed job is requeued, and how long it waits before each
    attempt: backoff_seconds x 2^(attempt-1), at most max_backoff_seconds (engine/retries.py)."""

    max_retries: int = 0
    backoff_seconds: int = 10
    max_backoff_seconds: int = 3600


class RequeueTimestamp(StrEnum):
    """Where a requeued job goes in its queue (Kueue's requeuingStrategy.timestamp)."""

    CREATION = "Creation"  # keeps its first submission time: ahead of jobs submitted after it
    EVICTION = "Eviction"  # the time it failed: behind every job already waiting


def job_key(queue: str, name: str) -> str:
    return f"{queue}/{name}"


class PreemptionScope(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


@dataclass(frozen=True, slots=True)
class Policy:
    """The merged Policy documents: what the solver optimises and what it may do."""

    solver: str = "greedy"
    # The wall clock is a backstop only: a solve it stops is reported as not reproducible.
    time_limit_s: float = 10.0
    gap_tolerance: float = 0.01
    # Branch-and-bound nodes each MILP solve may explore: the deterministic stop, so a
    # decision is a function of the log and the commit (docs/placement.md).
    node_limit: int = 100
    # How the lexicographic objective is solved (engine/placement/levels.py): "weighted",
    # one weighted sum; "sequential", level 1 first, then the rest with level 1 held.
    levels: str = "weighted"
    priority_weight: float = 1.0
    move_cost: float = 1.0
    preemption_cost: float = 1.0
    fragmentation_weight: float = 0.1
    fairness_weight: float = 0.0
    compactness_weight: float = 1.0  # scales each gang's cost per extra domain (topology.py)
    preemption_enabled: bool = True
    # Running jobs one solve may move of its own accord (engine/placement/moves.py): a job
    # whose place is gone may always move. None: no cap, so a policy logged before it
    # existed reads as it acted; the built-in policy sets 8. 0: never migrate a running job.
    max_moves_per_solve: int | None = None
    preempt_within_queue: PreemptionScope = PreemptionScope.LOWER_PRIORITY
    reclaim_within_cohort: PreemptionScope = PreemptionScope.ANY
    require_owner_approval: bool = False
    require_signed_approval: bool = False
    # A job file under teams/<team>/ only from a member or owner of that team, or approved
    # by one of its owners (policies/approval.py, docs/approvals.md).
    require_member_for_jobs: bool = False
    # The namespaces teams may take (their folder names); None: any but the reserved ones.
    team_namespaces: tuple[str, ...] | None = None
    # Fair share over time (engine/fairshare.py): a queue's past usage halves every this long.
    usage_half_life_hours: float = 24.0
    # Idle GPU reclamation (engine/idle.py). Off by default here, so a policy logged before
    # it existed reads as it acted; the built-in policy turns it on.
    idle: IdlePolicy = field(default_factory=lambda: IdlePolicy())
    # -- retries (engine/retries.py): the default of queues that set none, and the order --
    retry: RetryPolicy | None = None
    requeue_timestamp: RequeueTimestamp = RequeueTimestamp.CREATION
    # Backfill with reservations (engine/placement/reservations.py). Off here (0), so a
    # policy logged before it existed reads as it acted; the built-in policy sets 1 (EASY).
    backfill: BackfillPolicy = field(default_factory=lambda: BackfillPolicy())
    # What a job's pod template may ask of the node (policies/pod_security.py). Its default
    # is the built-in policy's, so a policy logged before it existed reads as baseline: the
    # actuator's second wall then holds old jobs to the same rule as new ones.
    pod_security: PodSecurityPolicy = field(default_factory=lambda: PodSecurityPolicy())


@dataclass(frozen=True, slots=True)
class BackfillPolicy:
    """How many of the highest waiting jobs that cannot start hold a reservation: 1 is EASY
    backfill (Slurm's default), more comes closer to conservative backfill, 0 is off."""

    reservations: int = 0
    # Whether a reservation that rests on borrowed quota yields to a queue reclaiming its
    # nominal quota (preemption.reservation_yields); False: every reservation is kept.
    yield_to_reclaim: bool = False


@dataclass(frozen=True, slots=True)
class PodSecurityPolicy:
    """The Pod Security Standard level each team's pod templates are held to, and the
    service accounts a template may name (Policy `podSecurity`)."""

    level: str = "baseline"  # privileged | baseline | restricted (Kubernetes' own names)
    teams: tuple[tuple[str, str], ...] = ()  # (team, level), sorted by team
    service_accounts: tuple[str, ...] = ("default",)

    def level_of(self, team: str) -> str:
        for name, level in self.teams:
            if name == team:
                return level
        return self.level


class IdleAction(StrEnum):
    PREEMPTIBLE = "preemptible"  # the idle job ranks lowest: the first to stop for a waiting job
    RECLAIM = "reclaim"  # the idle job stops, and waits until its owner changes it


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """When a running job counts as idle, and what then happens to it."""

    enabled: bool = False
    threshold_percent: float = 5.0
    window_minutes: float = 60.0
    grace_minutes: float = 30.0
    exempt_priority_classes: tuple[str, ...] = ()
    exempt_queues: tuple[str, ...] = ()
    action: IdleAction = IdleAction.PREEMPTIBLE


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """One replica on one node: the GPU indices it holds and the milli-GPU it takes on each."""

    node: str
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    job: str
    flavor: str | None
    replicas: tuple[ReplicaPlacement, ...]
    started_at: str = ""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({r.node for r in self.replicas}))

    @property
    def gpu_milli(self) -> int:
        return sum(r.gpu_milli * len(r.gpus) for r in self.replicas)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A fact of a plan (engine/placement/reservations.py): `job`, which cannot start now,
    will start at `start` on `nodes` (`gpu_milli` of `flavor` from its queue's quota), when
    the jobs in `waits_for` reach their time limits. Later jobs that would delay it wait,
    but a queue below its nominal quota that may reclaim from the reserved job's queue does
    not wait for the `borrowed_milli` of it that is beyond that queue's nominal quota
    (engine.placement.preemption.reservation_yields)."""

    job: str
    start: str
    nodes: tuple[str, ...]
    flavor: str | None
    gpu_milli: int
    waits_for: tuple[str, ...] = ()
    # milli-GPU of the reservation beyond its queue's nominal quota at `start` (0: none)
    borrowed_milli: int = 0


def utc_time(text: str) -> str:
    """An ISO-8601 time with any offset as the log writes times (UTC, microseconds, `Z`),
    so it sorts as text; "" when `text` is not a time with an offset."""
    if len(text) == 27 and text[-1] == "Z" and text[19] == ".":
        return text  # already in the log's format (a decision time, an append time)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return ""
    if moment.tzinfo is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Owner:
    """One line of teams/<team>/OWNERS: an e-mail and, for signed approvals, the owner's
    public key in git's allowed-signers form ("ssh-ed25519 AAAA...", no comment)."""

    email: str
    key: str = ""


@dataclass(frozen=True, slots=True)
class Approval:
    """The evidence that an owner approved a change, as the approval rule accepted it.

    `via` is "trailer" (an Approved-by/Reviewed-by trailer), "signed-trailer" (that
    trailer on a commit the owner signed) or "signed-merge" (the owner's signed merge
    commit); `commit` is the commit carrying it, `fingerprint` the signing key's
    SHA256 fingerprint ("" when unsigned).
    """

    approver: str
    via: str
    commit: str
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A commit as git records it: who wrote it and when (author), who merged it and when
    (committer, `committed_at`). Times are ISO-8601 as git gives them, with their offset."""

    sha: str
    author: str
    author_email: str
    committed_at: str
    subject: str
    approvers: tuple[str, ...] = ()
    authored_at: str = ""
    committer: str = ""
    committer_email: str = ""

    @property
    def actor(self) -> str:
        who = f"{self.author} <{self.author_email}>"
        if self.approvers:
            return f"{who} (approved by {', '.join(self.approvers)})"
        return who
