"""The placement interface: the instance a solver reads and the plan it returns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Protocol, TypeVar, cast

from gitsched.engine.model import (
    ClusterSpec,
    Job,
    Node,
    Placement,
    Policy,
    Queue,
    ReplicaPlacement,
    Reservation,
)
from gitsched.engine.shapes import JobShape

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PlacementInstance:
    """Everything a solver may look at. `now` (ISO-8601 UTC) prices lost work."""

    cluster: ClusterSpec | None
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[Job, ...]
    current: Mapping[str, Placement]
    policy: Policy
    now: str = ""
    # Where the objective's weights come from when not from this instance: the whole
    # instance, for the part of it an incremental solve decides (so both score alike).
    basis: PlacementInstance | None = None
    # queue -> its decayed past usage, as a share of what the whole cluster could have run
    # over the decay window (engine/fairshare.py): lowers the fair share of a queue that
    # used much lately. Empty: no history.
    usage: Mapping[str, float] = field(default_factory=dict)
    # The job shapes the cluster has seen (engine.shapes.learned_shapes of
    # the folded state) with their weights: node choice keeps room for them. Empty: unknown.
    shapes: tuple[tuple[JobShape, int], ...] = ()
    # Whether the rules' view is already taken (preemption.borrowing_reclaimable): a part of
    # a decomposed instance holds a share of each quota, and keeps the whole's protection.
    rules_applied: bool = False
    # What `derived` has worked out of this instance. Not data: no constructor argument,
    # no part of equality, not pickled (a part sent to a worker works it out there).
    _derived: dict[Callable[..., Any], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def derived(self, compute: Callable[[PlacementInstance], T]) -> T:
        """`compute(self)`, worked out once per instance: `compute` must be a pure function
        of the instance (its weights, fair shares, jobs by key), read by every plan a
        solve scores. A changed instance (dataclasses.replace) is a new one and starts
        afresh."""
        memo = self._derived
        if compute not in memo:
            memo[compute] = compute(self)
        return cast(T, memo[compute])

    def __getstate__(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self) if f.init]

    def __setstate__(self, state: list[Any]) -> None:
        for f, value in zip((f for f in fields(self) if f.init), state, strict=True):
            object.__setattr__(self, f.name, value)
        object.__setattr__(self, "_derived", {})

    def queue(self, name: str) -> Queue | None:
        for q in self.queues:
            if q.name == name:
                return q
        return None


class OutcomeStatus(StrEnum):
    PLACED = "placed"  # admitted now
    KEPT = "kept"  # running and stays where it is
    MOVED = "moved"  # running and goes elsewhere
    PREEMPTED = "preempted"  # was running, now stops
    PENDING = "pending"  # was not running and still is not


# The outcomes of a job that runs once the plan is applied.
RUNNING_STATUSES = frozenset((OutcomeStatus.PLACED, OutcomeStatus.KEPT, OutcomeStatus.MOVED))


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job: str
    status: OutcomeStatus
    flavor: str | None = None
    replicas: tuple[ReplicaPlacement, ...] = ()
    reason: str = ""
    constraint: str = ""
    preempted_by: str | None = None
    lost_gpu_seconds: float = 0.0
    # What allowed a preemption (engine.placement.preemption.Rule), or why a running job
    # moved (engine.placement.moves.MoveReason).
    rule: str = ""

    @property
    def running(self) -> bool:
        return self.status in RUNNING_STATUSES


@dataclass(frozen=True, slots=True)
class SolveStats:
    solver: str
    status: str  # optimal | feasible | time_limit (the clock stopped it) | heuristic | infeasible
    objective: float
    bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0
    variables: int = 0
    constraints: int = 0
    # Which placer's plan this is ("milp" or "greedy"), and, when the policy asked for the
    # MILP and greedy's plan was taken instead, why ("" when the MILP's own plan stands).
    plan_source: str = ""
    fallback: str = ""
    # How the MILP took the lexicographic objective ("weighted" | "sequential",
    # engine/placement/levels.py); "" for a solve without one (greedy).
    levels: str = ""


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    outcomes: tuple[JobOutcome, ...]
    stats: SolveStats
    broken_soft: tuple[str, ...] = field(default=())
    # The reservations the plan holds (engine/placement/reservations.py): facts of the plan.
    reservations: tuple[Reservation, ...] = ()

    def outcome(self, job: str) -> JobOutcome | None:
        for o in self.outcomes:
            if o.job == job:
                return o
        return None

    def counts(self) -> Counter[OutcomeStatus]:
        counts: Counter[OutcomeStatus] = Counter({s: 0 for s in OutcomeStatus})
        counts.update(o.status for o in self.outcomes)
        return counts

    def placements(self) -> dict[str, Placement]:
        """The placements the cluster has once the plan is applied."""
        return {
            o.job: Placement(job=o.job, flavor=o.flavor, replicas=o.replicas)
            for o in self.outcomes
            if o.running
        }


class Placer(Protocol):
    """A placement solver. Pure: the same instance gives the same plan (up to time limits)."""

    name: str

    def solve(self, instance: PlacementInstance) -> PlacementPlan: ...
