"""What the audit fold remembers between events, saved with the view's offset.

Open intervals, quotas in force, job specs, open versions, the commit being read:
`ProjectionState` is written beside the offset in the same transaction, so an
incremental catch-up resumes exactly where the last one stopped.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from gitsched.audit.projection.vocabulary import CHECK_LIMITS, CHECKPOINT_MIN_EVENTS, CHECKS
from gitsched.eventlog.envelope import GENESIS_HASH


class Envelope(Protocol):
    """What the fold reads of a stored event (a `StoredEvent`)."""

    @property
    def seq(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def schema_version(self) -> int: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def time(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def cause(self) -> str: ...
    @property
    def prev_hash(self) -> str: ...
    @property
    def hash(self) -> str: ...


@dataclass(frozen=True, slots=True)
class HeldEvent:
    """A stored event the timeline held, as the fold reads it (an `Envelope`)."""

    seq: int
    type: str
    schema_version: int
    data: dict[str, Any]
    time: str
    actor: str
    cause: str
    prev_hash: str
    hash: str


class ProjectionError(Exception):
    """The log cannot be projected: a gap in seq, a broken link, an unknown event type."""


@dataclass(slots=True)
class JobInfo:
    queue: str
    name: str
    user: str
    preemptible: bool
    dedicated: bool
    residency: list[str]
    priority: int
    priority_class: str
    seq: int
    # When it last began waiting to be placed: its commit, or the end of its last interval.
    waiting_since: str = ""
    # 1, then one more each time it is requeued after a failure (JobRequeued)
    attempt: int = 1
    # Its place in the wait order (priority, then this) and its time limit: what the
    # reservations check judges a start by (docs/time.md).
    submitted_at: str = ""
    time_limit_minutes: int | None = None
    submission: int = 0
    # "Job" | "Workspace" (docs/workspaces.md), and who resumed it and when, until the
    # placement that follows (its start reason says so)
    kind: str = "Job"
    resumed: str = ""


@dataclass(slots=True)
class Running:
    """An open placement interval: its row, written to `placements` when it ends."""

    id: int
    job: str
    name: str
    queue: str
    team: str
    user: str
    flavor: str | None
    replicas: int
    gpu_milli: int
    nodes: list[str]
    seq: int
    time: str
    ts: float
    kind: str
    reason: str
    cause: str
    queued: str = ""  # when the job began waiting for this placement
    priority_class: str = ""
    attempt: int = 1  # the job's attempt this interval belongs to (retries)

    def row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.job,
            self.name,
            self.queue,
            self.team,
            self.user,
            self.flavor,
            self.replicas,
            self.gpu_milli,
            " ".join(self.nodes),
            self.seq,
            self.time,
            self.ts,
            self.kind,
            self.reason,
            self.cause,
        )


@dataclass(slots=True)
class NodeInfo:
    flavor: str | None
    gpus: int
    region: str | None
    dedicated: bool
    state: str
    seq: int


@dataclass(slots=True)
class QueueInfo:
    team: str
    cohort: str | None
    # flavor -> [nominal, borrowing_limit, lending_limit] in milli-GPU
    quotas: dict[str, list[int | None]]
    data: dict[str, Any]
    seq: int


@dataclass(slots=True)
class Account:
    """One queue's use of one flavor: the open usage segment and what it holds."""

    queue: str
    flavor: str
    team: str
    cohort: str | None
    used: int
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    segment: int
    from_ts: float
    r_from: float

    def row(self, to_ts: float | None, r_to: float | None) -> tuple[Any, ...]:
        """The segment's row; a closed one carries its lent milli-GPU-seconds."""
        lendable = self.lendable
        return (
            self.segment,
            self.queue,
            self.team,
            self.cohort,
            self.flavor,
            self.from_ts,
            to_ts,
            self.used,
            self.nominal,
            lendable,
            self.r_from,
            r_to,
            None if r_to is None else lendable * (r_to - self.r_from),
        )

    @property
    def borrowed(self) -> int:
        return max(0, self.used - self.nominal)

    @property
    def lendable(self) -> int:
        unused = max(0, self.nominal - self.used)
        return unused if self.lending_limit is None else min(unused, self.lending_limit)


@dataclass(slots=True)
class Pool:
    """A cohort's flavor: what its members borrow and can lend, and the lending rate's integral.

    Lent GPU-hours are attributed to lenders pro rata to what each could lend:
    rate = min(borrowed, lendable) / lendable, and R = the integral of rate over
    time, so a queue's lent GPU-seconds over a stretch are lendable * (R_end - R_start).
    """

    borrowed: int = 0
    lendable: int = 0
    rate: float = 0.0
    r: float = 0.0
    ts: float = 0.0
    # UTC day number -> R at that day's start, for splitting lent GPU-hours by day
    days: dict[str, float] = field(default_factory=dict)


@dataclass
class ProjectionState:
    seq: int = 0
    hash: str = GENESIS_HASH
    max_time: str = ""
    next_placement: int = 1
    next_version: int = 1
    next_segment: int = 1
    next_violation: int = 1
    next_change: int = 1
    next_checkpoint: int = CHECKPOINT_MIN_EVENTS
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    queues: dict[str, QueueInfo] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    # kind + "\x1f" + key -> the open version row: id, kind, key, from seq, time, ts, data
    versions: dict[str, list[Any]] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    priority_classes: list[Any] = field(default_factory=list)
    # changes of the commit being read, until its CommitApplied names author and approvers
    staged_changes: list[list[Any]] = field(default_factory=list)
    # team -> its OWNERS as [e-mail, key] pairs, as the log last recorded them
    owners: dict[str, list[list[str]]] = field(default_factory=dict)
    # of the commit being read: its ApprovalChecked payloads, each team's OWNERS and the
    # signed-approval rule as they were before it (its base)
    staged_approvals: list[dict[str, Any]] = field(default_factory=list)
    staged_owners_base: dict[str, list[list[str]]] = field(default_factory=dict)
    staged_signed_base: bool | None = None
    # of the commit being read: [seq, what, name, cause] for each change of the cluster or
    # a node (the platform's own files, with the policy's in staged_changes)
    staged_platform: list[list[Any]] = field(default_factory=list)
    # team -> its MEMBERS (e-mails), as the log last recorded them
    members: dict[str, list[str]] = field(default_factory=dict)
    # of the commit being read: each team's MEMBERS before it, [seq, queue, file, cause]
    # for each job it adds, changes or removes, and approval.requireMemberForJobs before it
    staged_members_base: dict[str, list[str]] = field(default_factory=dict)
    staged_jobs: list[list[Any]] = field(default_factory=list)
    staged_member_rule_base: bool | None = None
    # of the commit being read: the teams (with a queue or OWNERS) before it
    staged_teams_base: list[str] | None = None
    effects_of: list[Any] | None = None  # [sha, commit seq] whose solve is being read
    touched: dict[str, list[int]] = field(
        default_factory=dict
    )  # account key -> seqs since the last solve
    over_limit: dict[str, int] = field(default_factory=dict)  # limit key -> open violation id
    checked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    # The fact timeline (eventlog.timeline): the append being read, and a commit's changes
    # read before their commit stated its time, as (stored event, upcast data, its version)
    # or, once saved, [seq, type, schema_version, data, time, actor, cause, prev_hash,
    # hash]. `max_time` is the last fact time.
    unit: list[str] = field(default_factory=lambda: ["", "", ""])
    held: list[Any] = field(default_factory=list)
    # The engine's own fold of the log (`cluster_fold`), as base64 of `gitsched.engine.snapshot` bytes.
    cluster: str = ""
    # [seq, job] admitted in a StrictFIFO queue by the solve being read, judged at its
    # SolveCompleted (checks.strict_fifo).
    strict_admitted: list[list[Any]] = field(default_factory=list)
    # The reservations in force (the last ReservationsDecided's, as its payload lists them).
    reservations: list[dict[str, Any]] = field(default_factory=list)
    # "team/name" -> an inference service: {"spec": its payload, "user": who submitted it,
    # "replicas": [ordinal, ...]}; its replicas are jobs in `jobs` (queue/name.<ordinal>).
    services: dict[str, dict[str, Any]] = field(default_factory=dict)

    _TYPES: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {
            "jobs": JobInfo,
            "running": Running,
            "nodes": NodeInfo,
            "queues": QueueInfo,
            "accounts": Account,
            "pools": Pool,
        },
        repr=False,
        compare=False,
    )

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "_TYPES":
                continue
            value = getattr(self, f.name)
            if f.name in self._TYPES:
                names = _FIELD_NAMES[self._TYPES[f.name]]
                value = {k: [getattr(v, n) for n in names] for k, v in value.items()}
            elif f.name == "held":
                value = [_held_values(item) for item in value]
            out[f.name] = value
        return json.dumps(out, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProjectionState:
        raw = json.loads(text)
        state = cls()
        for f in dataclasses.fields(state):
            if f.name == "_TYPES" or f.name not in raw:
                continue
            value = raw[f.name]
            if f.name in state._TYPES:
                kind = state._TYPES[f.name]
                value = {k: kind(*v) for k, v in value.items()}
            setattr(state, f.name, value)
        return state

    def take_usage(self, other: ProjectionState) -> None:
        """Take what a `UsageLedger` folded on `other` (in a rebuild's writer process)."""
        for name in USAGE_FIELDS:
            setattr(self, name, getattr(other, name))
        self.checked[CHECK_LIMITS] = other.checked[CHECK_LIMITS]


def _held_values(item: Any) -> list[Any]:
    """A held event as plain values, to save with the fold's state."""
    if isinstance(item, list):
        return item
    stored, data, version = item
    return [
        stored.seq,
        stored.type,
        version,
        data,
        stored.time,
        stored.actor,
        stored.cause,
        stored.prev_hash,
        stored.hash,
    ]


# The fields of `ProjectionState` a `UsageLedger` keeps, besides its count in `checked`.
USAGE_FIELDS = ("accounts", "pools", "touched", "over_limit", "next_segment", "next_violation")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls))
    for cls in (JobInfo, Running, NodeInfo, QueueInfo, Account, Pool)
}
