"""Inference services: replicated, long-running work placed one replica at a time.

A service never reaches the solver as itself: each replica is a one-replica job
(`queue/name.3`), so quotas, flavors, preemption, reservations and every solver apply
unchanged. This module says how many replicas a service wants, which replica jobs it
has, and what the next step of a scale or a rolling update is; all from the log alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gitsched.engine.model import Job, Resources, Spread, job_key

# The Deployment defaults of a RollingUpdate: 25% surge, 25% unavailable.
DEFAULT_SURGE = "25%"
DEFAULT_UNAVAILABLE = "25%"


@dataclass(frozen=True, slots=True)
class RollingUpdate:
    """maxSurge / maxUnavailable as a Deployment reads them: a count of replicas, or a
    percentage of the desired count (surge rounds up, unavailable rounds down)."""

    max_surge: int | str = DEFAULT_SURGE
    max_unavailable: int | str = DEFAULT_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class InferenceService:
    """One `kind: InferenceService` document as the engine keeps it (teams/<team>/services/)."""

    name: str
    team: str
    queue: str
    min_replicas: int
    max_replicas: int
    resources: Resources
    priority_class: str
    priority: int
    gpu_flavors: tuple[str, ...] = ()
    residency: tuple[str, ...] = ()
    checkpoint_interval_minutes: int | None = None
    spread: tuple[Spread, ...] = ()
    rolling_update: RollingUpdate = field(default_factory=RollingUpdate)
    suspend: bool = False
    template: dict[str, object] | None = None
    # spec.autoscaling as written (its meaning is engine/autoscaling.py's); None: none.
    autoscaling: dict[str, object] | None = None
    file: str = ""
    submitted_at: str = ""
    submission: int = 0

    @property
    def key(self) -> str:
        """ "team/name": how events and people name the service."""
        return f"{self.team}/{self.name}"

    def revision_fields(self) -> tuple[object, ...]:
        """What a replica runs: change one and the replicas are replaced, a few at a time."""
        return (self.resources, self.template, self.gpu_flavors, self.residency)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a service: its ordinal (never reused, so a new pod never takes an
    old pod's name) and the revision of the service it runs."""

    index: int
    revision: int


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """A service as the log left it: its spec, the latest ServiceScaled count, the revision
    its replicas should run (the log position of the change that set it), its replicas."""

    service: InferenceService
    revision: int
    scaled: int | None = None
    replicas: tuple[Replica, ...] = ()
    next_index: int = 0


def replica_name(service: str, index: int) -> str:
    """A replica's job name: '.' is in no job name (a DNS-1123 label), so a replica never
    takes a job's name, and pod names stay DNS-1123 subdomains."""
    return f"{service}.{index}"


def is_replica_key(key: str) -> bool:
    """Whether a job key names a service's replica (no job's name holds a '.')."""
    return "." in key.partition("/")[2]


def replica_key(service: InferenceService, index: int) -> str:
    return job_key(service.queue, replica_name(service.name, index))


def desired_replicas(status: ServiceStatus) -> int:
    """replicas.min, or the latest ServiceScaled's count clamped to [min, max]; 0 while
    suspended."""
    s = status.service
    if s.suspend:
        return 0
    wanted = s.min_replicas if status.scaled is None else status.scaled
    return max(s.min_replicas, min(s.max_replicas, wanted))


def replica_jobs(status: ServiceStatus) -> dict[str, Job]:
    """The jobs the service's replicas are, by key. The first `min` replicas (by ordinal)
    are non-preemptible, in-quota work (KAI's inference class); the others may borrow and
    are the first victims when a queue reclaims (engine/placement/preemption.py)."""
    s = status.service
    out: dict[str, Job] = {}
    for rank, replica in enumerate(sorted(status.replicas, key=lambda r: r.index)):
        key = replica_key(s, replica.index)
        out[key] = Job(
            name=replica_name(s.name, replica.index),
            queue=s.queue,
            replicas=1,
            resources=s.resources,
            priority_class=s.priority_class,
            priority=s.priority,
            gpu_flavors=s.gpu_flavors,
            preemptible=rank >= s.min_replicas,
            checkpoint_interval_minutes=s.checkpoint_interval_minutes,
            residency=s.residency,
            file=s.file,
            submitted_at=s.submitted_at,
            submission=s.submission,
            template=s.template if replica.revision == status.revision else None,
            service=s.key,
            spread=s.spread,
        )
    return out


def surplus(job: Job) -> bool:
    """A service replica above the service's minimum: it gives capacity back first."""
    return bool(job.service) and job.preemptible


def _count(value: int | str, desired: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = desired * int(value.rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


def rollout_bounds(service: InferenceService, desired: int) -> tuple[int, int]:
    """(surge, floor): how many replicas above `desired` may exist, and how many must stay
    running. The floor is Deployment's desired - maxUnavailable, and never below min; when
    that leaves no room to move and no surge, one replica surges (else the update stalls)."""
    update = service.rolling_update
    surge = _count(update.max_surge, desired, round_up=True)
    unavailable = _count(update.max_unavailable, desired, round_up=False)
    floor = min(desired, max(desired - unavailable, service.min_replicas))
    if surge == 0 and floor >= desired:
        surge = 1
    return surge, floor


@dataclass(frozen=True, slots=True)
class ReplicaStep:
    """What one step adds and removes (ordinals), and why."""

    added: tuple[Replica, ...]
    removed: tuple[int, ...]
    reason: str


def next_step(
    status: ServiceStatus, running: frozenset[int], placed: frozenset[int]
) -> ReplicaStep | None:
    """The next change of the service's replicas, given which ordinals the cluster reports
    running and which are placed; None when it has what it wants.

    Scale: replicas of the current revision added (lowest ordinals next) or removed
    (waiting ones first, then the newest). Rolling update (replicas of an older revision
    remain): new ones surge up to desired + maxSurge, old ones go while the replicas
    running stay at or above the floor (`rollout_bounds`); a step waits for new replicas
    to be reported running, never for the clock."""
    desired = desired_replicas(status)
    current = [r for r in status.replicas if r.revision == status.revision]
    old = [r for r in status.replicas if r.revision != status.revision]
    index = status.next_index

    def order(r: Replica) -> tuple[bool, bool, int]:
        # the first to go: waiting before placed before running, then the newest
        return (r.index in running, r.index in placed, -r.index)

    if desired == 0:
        if not status.replicas:
            return None
        reason = "suspended" if status.service.suspend else "scaled to 0"
        return ReplicaStep((), tuple(sorted(r.index for r in status.replicas)), reason)
    if not old:
        if len(current) < desired:
            added = tuple(
                Replica(index + i, status.revision) for i in range(desired - len(current))
            )
            return ReplicaStep(added, (), f"scaled up to {desired}")
        if len(current) > desired:
            gone = sorted(current, key=order)[: len(current) - desired]
            return ReplicaStep(
                (), tuple(sorted(r.index for r in gone)), f"scaled down to {desired}"
            )
        return None
    surge, floor = rollout_bounds(status.service, desired)
    # Old replicas that do not run cost no availability: they go at once.
    idle_old = [r for r in old if r.index not in running]
    busy_old = [r for r in old if r.index in running]
    new_running = sum(1 for r in current if r.index in running)
    removable = max(0, new_running + len(busy_old) - floor)
    leaving = sorted(busy_old, key=order)[:removable]
    gone = [*idle_old, *leaving]
    left = len(current) + len(old) - len(gone)
    room = min(desired - len(current), desired + surge - left)
    added = tuple(Replica(index + i, status.revision) for i in range(max(0, room)))
    if not added and not gone:
        return None  # waits for the cluster to report new replicas running
    still_old = len(old) - len(gone)
    reason = (
        f"rolling update to revision {status.revision}: {len(current) + len(added)} of"
        f" {desired} new, {still_old} old left, at least {floor} running"
    )
    return ReplicaStep(added, tuple(sorted(r.index for r in gone)), reason)


def apply_step(
    status: ServiceStatus, added: tuple[Replica, ...], removed: tuple[int, ...]
) -> ServiceStatus:
    gone = set(removed)
    replicas = tuple(r for r in status.replicas if r.index not in gone) + added
    top = max((r.index + 1 for r in added), default=status.next_index)
    return dataclasses.replace(
        status,
        replicas=tuple(sorted(replicas, key=lambda r: r.index)),
        next_index=max(top, status.next_index),
    )
