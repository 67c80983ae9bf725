"""The audit views' fold: stored events in, row operations out (the `convert` of STYLE rule 3).

`Projector.convert` does no I/O and reads no clock: it turns each event's (upcast)
payload into rows appended to a `Batch`, which `audit.store` applies together with
the offset in one SQLite transaction. What the fold must remember between events
(open intervals, quotas in force, job specs) is `ProjectionState`; it is saved with
the offset, so an incremental run resumes exactly where the last one stopped.

Payloads are read as dicts rather than decoded into dataclasses: decoding costs
30-60 µs an event, more than the whole budget of a 50,000 events/s rebuild.
Usage accounting (`UsageLedger`) is a fold of its own that the `Projector` calls
through `Usage`, so a rebuild can run it in its writer process (`audit.loader`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from audit import preemptions
from engine.events import EVENT_TYPES
from engine.model import GPU_MILLI, Approval, Owner, utc_time
from eventlog.codec import upcast
from eventlog.envelope import GENESIS_HASH
from eventlog.timeline import COMMIT_EVENTS, Timeline
from policies.approval import judge_team, recorded_vouches, trailer_vouches

FORMAT_VERSION = "5"

# How a placement interval started and ended; `history` shows them like sacct's State.
START_ADMITTED, START_MOVED = "admitted", "moved"
END_MOVED, END_PREEMPTED, END_STOPPED = "moved", "preempted", "stopped"
END_FINISHED, END_WITHDRAWN, END_FAILED = "finished", "withdrawn", "failed"
END_NODE_FAILED, END_NODE_DRAINED, END_NODE_REMOVED = "node_failed", "node_drained", "node_removed"
NODE_ENDS = (END_NODE_FAILED, END_NODE_DRAINED, END_NODE_REMOVED)

# Compliance checks, in the order the report lists them.
CHECK_ISOLATION = "isolation"
CHECK_RESIDENCY = "residency"
CHECK_PREEMPTION = "non-preemptible"
CHECK_LIMITS = "queue-limits"
CHECK_APPROVAL = "quota-approval"
CHECK_PREEMPTION_RULES = "preemption-rules"
CHECKS = (
    CHECK_ISOLATION,
    CHECK_RESIDENCY,
    CHECK_PREEMPTION,
    CHECK_LIMITS,
    CHECK_APPROVAL,
    CHECK_PREEMPTION_RULES,
)

# Versioned facts for point-in-time queries: one row per stretch of seqs a fact held.
KIND_NODE, KIND_QUEUE, KIND_PENDING, KIND_POLICY, KIND_CLUSTER = (
    "node",
    "queue",
    "pending",
    "policy",
    "cluster",
)

# A checkpoint lists every open row, so a point-in-time query reads that list plus
# at most this many events' worth of rows; spacing grows with the open set so
# checkpoints never cost more than about one row per event.
CHECKPOINT_MIN_EVENTS = 4096


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


def person(actor: str) -> str:
    """`Name <email>` of a git actor, without the `(approved by ...)` suffix."""
    return actor.split(" (approved by ", 1)[0]


def email_of(who: str) -> str:
    start, end = who.rfind("<"), who.rfind(">")
    if 0 <= start < end:
        return who[start + 1 : end].strip().lower()
    return who.strip().lower()


def _who(name: str, email: str) -> str:
    """`Name <email>`, or "" when git did not say (a commit logged before v2)."""
    if not name and not email:
        return ""
    return f"{name} <{email}>"


def gpus(milli: int | float) -> str:
    value = milli / GPU_MILLI
    return f"{value:g}"


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


DAY = 86_400.0


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


class Batch:
    """Row operations for the sink.

    A row is written once, when it is complete (an interval or version when it
    ends); rows still open are `open_*`, a snapshot the sink writes in place of the
    last one. Only violation episodes are updated, after every insert.
    """

    __slots__ = (
        "approvals",
        "changes",
        "checkpoint_marks",
        "checkpoints",
        "commits",
        "effects",
        "events",
        "marks",
        "open_placements",
        "open_segments",
        "open_versions",
        "placement_nodes",
        "placements",
        "rates",
        "segments",
        "usage_calls",
        "usage_days",
        "user_days",
        "versions",
        "violation_close",
        "violations",
    )

    def __init__(self) -> None:
        self.events = 0
        self.placements: list[tuple[Any, ...]] = []
        self.placement_nodes: list[tuple[Any, ...]] = []
        self.versions: list[tuple[Any, ...]] = []
        self.segments: list[tuple[Any, ...]] = []
        # (queue, team, flavor, UTC day) -> used, quota, borrowed, idle, lent
        self.usage_days: dict[tuple[str, str, str, int], list[int]] = {}
        # (user, team, flavor, UTC day) -> milli-GPU-microseconds used, placements started
        self.user_days: dict[tuple[str, str, str, int], list[int]] = {}
        self.rates: list[tuple[Any, ...]] = []
        self.marks: list[tuple[Any, ...]] = []
        self.commits: list[tuple[Any, ...]] = []
        self.changes: list[tuple[Any, ...]] = []
        self.approvals: list[tuple[Any, ...]] = []
        self.effects: list[tuple[Any, ...]] = []
        self.violations: list[tuple[Any, ...]] = []
        self.violation_close: list[tuple[Any, ...]] = []
        self.checkpoints: list[tuple[Any, ...]] = []
        self.checkpoint_marks: list[tuple[Any, ...]] = []
        self.open_placements: list[tuple[Any, ...]] = []
        self.open_versions: list[tuple[Any, ...]] = []
        self.open_segments: list[tuple[Any, ...]] = []
        # a `DeferredUsage`'s calls, for the `UsageLedger` of another process
        self.usage_calls: list[tuple[Any, ...]] = []


# json.dumps with options builds an encoder per call; these are built once.
_compact = json.JSONEncoder(separators=(",", ":")).encode
_canonical = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
_string = json.encoder.encode_basestring_ascii  # what _canonical does to a str


def _pending_data(reason: str, constraint: str) -> str:
    """_canonical({"reason": ..., "constraint": ...}), spelled out: one per pending job."""
    return f'{{"constraint":{_string(constraint)},"reason":{_string(reason)}}}'


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _quotas(queue: dict[str, Any]) -> dict[str, list[int | None]]:
    return {
        q["flavor"]: [int(q["nominal"]), q.get("borrowing_limit"), q.get("lending_limit")]
        for q in queue.get("quotas", ())
    }


def _limit_text(milli: int | None) -> str:
    return "unlimited" if milli is None else gpus(milli)


def queue_diff(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """What a queue change did, in words: `h100-80g borrowing limit 8 -> 16`."""
    if new is None:
        return "queue removed"
    if old is None:
        parts = [
            f"{flavor} nominal {gpus(q[0] or 0)}"
            + (f", borrowing limit {gpus(q[1])}" if q[1] is not None else "")
            + (f", lending limit {gpus(q[2])}" if q[2] is not None else "")
            for flavor, q in sorted(_quotas(new).items())
        ]
        cohort = f" in cohort {new['cohort']}" if new.get("cohort") else ""
        return f"queue created{cohort}: " + ("; ".join(parts) or "no quota")
    out: list[str] = []
    before, after = _quotas(old), _quotas(new)
    labels = ("nominal", "borrowing limit", "lending limit")
    for flavor in sorted(set(before) | set(after)):
        if flavor not in before:
            out.append(f"{flavor} quota added: nominal {gpus(after[flavor][0] or 0)}")
            continue
        if flavor not in after:
            out.append(f"{flavor} quota removed")
            continue
        for i, label in enumerate(labels):
            if before[flavor][i] != after[flavor][i]:
                out.append(
                    f"{flavor} {label} {_limit_text(before[flavor][i])} -> {_limit_text(after[flavor][i])}"
                )
    for key in ("cohort", "weight", "max_priority_class", "team", "owners"):
        if old.get(key) != new.get(key):
            out.append(f"{key.replace('_', ' ')} {old.get(key)} -> {new.get(key)}")
    return "; ".join(out) or "no effective change"


def owners_diff(old: list[list[str]], new: list[list[str]]) -> str:
    """What an OWNERS change did: who was added or removed, whose key changed."""
    before: dict[str, str] = {e: k for e, k in old}
    after: dict[str, str] = {e: k for e, k in new}
    parts = [
        f"owner {e} added" + (" with a key" if after[e] else "") for e in after if e not in before
    ]
    parts += [f"owner {e} removed" for e in before if e not in after]
    parts += [
        f"key of {e} " + ("added" if not before[e] else "removed" if not after[e] else "changed")
        for e in after
        if e in before and before[e] != after[e]
    ]
    return "; ".join(parts) or "no effective change"


def _value_text(value: Any) -> str:
    """A value as the change summary prints it; a nested mapping (the policy's `idle`) with
    its keys sorted, so a summary never depends on the order a payload was read in."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value_text(value[k])}" for k in sorted(value)) + "}"
    return str(value)


def dict_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if not old:
        return "set: " + ", ".join(f"{k}={_value_text(new.get(k))}" for k in sorted(new))
    return "; ".join(
        f"{k.replace('_', ' ')} {_value_text(old.get(k))} -> {_value_text(new.get(k))}"
        for k in keys
    ) or ("no effective change")


class Projector:
    """Folds stored events into row operations; one instance per catch-up."""

    def __init__(self, state: ProjectionState | None = None, usage: Usage | None = None) -> None:
        """`usage`: where usage accounting goes; by default a `UsageLedger` on the same state."""
        self.state = state if state is not None else ProjectionState()
        self.usage: Usage = usage if usage is not None else UsageLedger(self.state)
        s = self.state
        # The fold's time: the last fact time it read.
        self._time = s.max_time
        self._ts = epoch(s.max_time) if s.max_time else 0.0
        # Items: (stored event, upcast data, version), or a saved held event's plain values.
        self._timeline: Timeline[Any] = Timeline(s.max_time, s.unit, s.held)
        self._marked = s.max_time
        # Who runs on each dedicated node: what the isolation check needs to see.
        self._node_jobs: dict[str, set[str]] = {}
        for name, node in self.state.nodes.items():
            if node.dedicated:
                self._node_jobs[name] = self._jobs_on(name)
        self._handlers = {
            "CommitApplied": self._commit_applied,
            "CommitRejected": self._commit_rejected,
            "ClusterConfigured": self._cluster_configured,
            "PolicyChanged": self._policy_changed,
            "NodeRegistered": self._node_registered,
            "NodeRemoved": self._node_removed,
            "NodeStateChanged": self._node_state_changed,
            "QueueConfigured": self._queue_configured,
            "QueueRemoved": self._queue_removed,
            "OwnersChanged": self._owners_changed,
            "ApprovalChecked": self._approval_checked,
            "JobSubmitted": self._job_submitted,
            "JobChanged": self._job_changed,
            "JobWithdrawn": self._job_withdrawn,
            "JobFinished": self._job_finished,
            "JobStarted": self._job_started,
            "JobFailed": self._job_failed,
            "JobInterrupted": self._job_interrupted,
            "PlacementDecided": self._placement_decided,
            "JobPreempted": self._job_preempted,
            "JobPending": self._job_pending,
            "SolveCompleted": self._solve_completed,
            # Telemetry and idle flags: read by audit/fairshare.py from the log, no rows here
            # (a reclaimed job's stop is its JobPreempted, with rule "idle").
            "GpuUtilizationReported": self._not_projected,
            "JobIdle": self._not_projected,
            "JobIdleCleared": self._not_projected,
        }
        assert set(self._handlers) == set(EVENT_TYPES), "every event type needs a handler"
        self._people: dict[str, str] = {}  # actor -> person(actor): a few authors submit every job
        # type -> (handler, the schema version it reads): one look-up an event
        self._dispatch = {
            name: (handler, EVENT_TYPES[name].schema_version)
            for name, handler in self._handlers.items()
        }

    # -- the fold --------------------------------------------------------------------------

    def convert(self, stored: Envelope, batch: Batch) -> None:
        self.convert_all((stored,), batch, batch.events + 1)

    def convert_all(self, events: Iterable[Envelope], batch: Batch, limit: int) -> bool:
        """Convert events until `batch` holds `limit` of them (True) or `events` runs out
        (False); an iterator resumes where the last call stopped.

        `convert` for a stream, its loop kept tight: a rebuild runs it a million times."""
        s = self.state
        dispatch = self._dispatch
        timeline = self._timeline
        unit = timeline.unit  # the append being read: its time, cause and fact time
        seq, hash_ = s.seq, s.hash
        checkpoint = s.next_checkpoint
        count = batch.events
        try:
            for stored in events:
                if stored.seq != seq + 1 or stored.prev_hash != hash_:
                    self._refuse(stored)
                entry = dispatch.get(stored.type)
                if entry is None:
                    raise ProjectionError(f"event {stored.seq} has unknown type {stored.type!r}")
                version = entry[1]
                data = stored.data
                if stored.schema_version != version:
                    data = upcast(stored.type, stored.schema_version, data)
                seq = s.seq = stored.seq
                hash_ = s.hash = stored.hash
                type_ = stored.type
                if (
                    unit[2]
                    and stored.time == unit[0]
                    and stored.cause == unit[1]
                    and type_ not in COMMIT_EVENTS
                    and (type_ != "PlacementDecided" or data.get("at") == self._time)
                ):
                    # The rest of an append whose time is known, at that time: the common case.
                    entry[0](stored, data, batch)
                else:
                    self._place_in_time(stored, data, version, batch)
                count += 1
                if seq >= checkpoint and not timeline.held:
                    self.checkpoint(batch)
                    checkpoint = s.next_checkpoint
                if count >= limit:
                    return True
            return False
        finally:
            batch.events = count
            s.held = timeline.held

    def _place_in_time(
        self, stored: Envelope, data: dict[str, Any], version: int, batch: Batch
    ) -> None:
        """Give an event its fact time (`eventlog.timeline`): fold it and whatever it releases,
        or hold it until its commit states the time."""
        timeline = self._timeline
        dispatch = self._dispatch
        for item, time in timeline.add(
            (stored, data, version), stored.type, data, stored.time, stored.cause, stored.actor
        ):
            if item.__class__ is list:  # held, and saved with the fold's state
                event: Envelope = HeldEvent(*item)
                values = item[3]
            else:
                event, values, _ = item
            if time != self._time:
                self._time = time
                self._ts = epoch(time)
                if time > self._marked:
                    self._marked = time
                    batch.marks.append((event.seq, time))
            dispatch[event.type][0](event, values, batch)
        self.state.max_time = timeline.time

    def _refuse(self, stored: Envelope) -> None:
        s = self.state
        if stored.seq != s.seq + 1:
            raise ProjectionError(
                f"expected seq {s.seq + 1}, read {stored.seq}: the log has a gap; run `gitsched audit verify`"
            )
        raise ProjectionError(
            f"event {stored.seq} does not link to event {s.seq} (prev_hash differs): "
            "run `gitsched audit verify`"
        )

    def snapshot_open(self, batch: Batch) -> None:
        """The rows still open, for the sink to write with the offset."""
        s = self.state
        batch.open_placements = [
            (*r.row(), None, None, None, None, None, None, r.queued) for r in s.running.values()
        ]
        batch.open_versions = [
            (v[0], v[1], v[2], v[3], v[4], v[5], None, None, None, v[6])
            for v in s.versions.values()
        ]
        self.usage.snapshot_open(batch)

    def checkpoint(self, batch: Batch) -> None:
        s = self.state
        seq = s.seq
        batch.checkpoints.extend((seq, 0, r.id) for r in s.running.values())
        batch.checkpoints.extend((seq, 1, v[0]) for v in s.versions.values())
        batch.checkpoint_marks.append((seq, s.next_placement - 1, s.next_version - 1))
        s.next_checkpoint = seq + max(CHECKPOINT_MIN_EVENTS, 2 * (len(s.running) + len(s.versions)))

    # -- versions --------------------------------------------------------------------------

    def _open_version(
        self, kind: str, key: str, stored: Envelope, data: dict[str, Any] | str, batch: Batch
    ) -> None:
        """`data`: a dict, or its canonical JSON already."""
        self._close_version(kind, key, stored, batch)
        s = self.state
        vid = s.next_version
        s.next_version += 1
        s.versions[f"{kind}\x1f{key}"] = [
            vid,
            kind,
            key,
            stored.seq,
            self._time,
            self._ts,
            data if isinstance(data, str) else _canonical(data),
        ]

    def _close_version(self, kind: str, key: str, stored: Envelope, batch: Batch) -> None:
        v = self.state.versions.pop(f"{kind}\x1f{key}", None)
        if v is not None:
            batch.versions.append(
                (v[0], v[1], v[2], v[3], v[4], v[5], stored.seq, self._time, self._ts, v[6])
            )

    # -- placement intervals --------------------------------------------------------------

    def _node_trouble(self, run: Running) -> tuple[str, str] | None:
        """Why an interval ended if one of its nodes went away: failure beats removal beats drain."""
        found: list[tuple[int, str, str]] = []
        for name in run.nodes:
            node = self.state.nodes.get(name)
            if node is None:
                found.append((1, END_NODE_REMOVED, f"node {name} was removed"))
            elif node.state == "Failed":
                found.append((0, END_NODE_FAILED, f"node {name} failed (seq {node.seq})"))
            elif node.state != "Ready":
                found.append((2, END_NODE_DRAINED, f"node {name} is {node.state} (seq {node.seq})"))
        if not found:
            return None
        _, kind, why = min(found)
        return kind, why

    def _jobs_on(self, node: str) -> set[str]:
        return {job for job, run in self.state.running.items() if node in run.nodes}

    def _close_interval(
        self, job: str, kind: str, reason: str, stored: Envelope, batch: Batch
    ) -> Running | None:
        run = self.state.running.pop(job, None)
        if run is None:
            return None
        if kind not in (END_FINISHED, END_WITHDRAWN, END_FAILED):
            trouble = self._node_trouble(run)
            if trouble is not None:
                kind, reason = trouble[0], f"{trouble[1]}; {reason}" if reason else trouble[1]
        start, end, milli, nodes = run.ts, self._ts, run.gpu_milli, run.nodes
        batch.placements.append(
            (
                run.id,
                job,
                run.name,
                run.queue,
                run.team,
                run.user,
                run.flavor,
                run.replicas,
                milli,
                " ".join(nodes),
                run.seq,
                run.time,
                start,
                run.kind,
                run.reason,
                run.cause,
                stored.seq,
                self._time,
                end,
                kind,
                reason,
                stored.cause,
                run.queued,
            )
        )
        if milli:
            # Its GPU-time by UTC day, for usage by user (integers: order-free sums).
            days = batch.user_days
            first, last = int(start // DAY), int(end // DAY)
            if first == last:  # within one day: the common case
                if end > start:
                    key = (run.user, run.team, run.flavor or "", first)
                    sums = days.get(key)
                    if sums is None:
                        sums = days[key] = [0, 0]
                    sums[0] += milli * round((end - start) * 1e6)
            else:
                for day in range(first, last + 1):
                    low, high = max(start, day * DAY), min(end, (day + 1) * DAY)
                    if high > low:
                        key = (run.user, run.team, run.flavor or "", day)
                        sums = days.get(key)
                        if sums is None:
                            sums = days[key] = [0, 0]
                        sums[0] += milli * round((high - low) * 1e6)
            if run.flavor is not None:
                self.usage.charge(stored.seq, end, run.queue, run.flavor, -milli, batch)
        node_jobs = self._node_jobs
        for node in nodes:
            if node in node_jobs:
                node_jobs[node].discard(job)
        info = self.state.jobs.get(job)
        if info is not None:
            info.waiting_since = self._time  # placed again at once when it moves: no wait
        return run

    def _effect(self, stored: Envelope, job: str, detail: str, batch: Batch) -> None:
        of = self.state.effects_of
        if of is not None and stored.cause == of[0] and stored.actor == "solver":
            batch.effects.append((of[1], stored.seq, stored.type, job, detail))

    def _violation(
        self,
        check: str,
        stored: Envelope,
        subject: str,
        message: str,
        evidence: Iterable[int],
        batch: Batch,
    ) -> None:
        self.usage.violation(
            check, stored.seq, self._time, subject, message, _compact(sorted(set(evidence))), batch
        )

    def _placement_decided(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        key: str = d["job"]
        replicas = d["replicas"]
        reason = d.get("reason", "")
        old = (
            self._close_interval(key, END_MOVED, reason, stored, batch)
            if key in s.running
            else None
        )
        job = s.jobs.get(key)
        queue_name = job.queue if job else key.split("/", 1)[0]
        queue = s.queues.get(queue_name)
        milli = 0
        nodes: list[str] = []
        for r in replicas:
            milli += r["gpu_milli"] * len(r["gpus"])
            if r["node"] not in nodes:
                nodes.append(r["node"])
        nodes.sort()
        pid = s.next_placement
        s.next_placement += 1
        action = d.get("action", START_ADMITTED)
        flavor = d.get("flavor")
        s.running[key] = Running(
            pid,
            key,
            job.name if job else key.split("/", 1)[-1],
            queue_name,
            queue.team if queue else queue_name,
            job.user if job else "",
            flavor,
            len(replicas),
            milli,
            nodes,
            stored.seq,
            self._time,
            self._ts,
            START_MOVED if old is not None or action == START_MOVED else START_ADMITTED,
            reason,
            stored.cause,
            job.waiting_since if job is not None and job.waiting_since else self._time,
        )
        if milli:
            day_key = (
                job.user if job else "",
                queue.team if queue else queue_name,
                flavor or "",
                int(self._ts // DAY),
            )
            started = batch.user_days.get(day_key)
            if started is None:
                started = batch.user_days[day_key] = [0, 0]
            started[1] += 1
        node_jobs = self._node_jobs
        for n in nodes:
            batch.placement_nodes.append((n, pid))
            if n in node_jobs:
                node_jobs[n].add(key)
        self._close_version(KIND_PENDING, key, stored, batch)
        if flavor is not None and milli:
            self.usage.charge(stored.seq, self._ts, queue_name, flavor, milli, batch)
        if s.effects_of is not None:
            self._effect(
                stored,
                key,
                f"{'moved' if old is not None else 'admitted'} to {','.join(nodes)} ({gpus(milli)} GPUs)",
                batch,
            )
        if job is not None:
            self._check_placement(key, job, nodes, stored, batch)

    def _check_placement(
        self, key: str, job: JobInfo, nodes: list[str], stored: Envelope, batch: Batch
    ) -> None:
        s = self.state
        s.checked[CHECK_ISOLATION] += 1
        for name in nodes:
            node = s.nodes.get(name)
            if node is not None and not job.dedicated and not node.dedicated:
                continue  # shared job on a shared node: the common case
            holders = self._node_jobs.get(name) or self._jobs_on(name)
            evidence = [stored.seq, job.seq] + ([node.seq] if node else [])
            if job.dedicated and (node is None or not node.dedicated):
                self._violation(
                    CHECK_ISOLATION,
                    stored,
                    key,
                    f"regulated job {key} placed on shared node {name}",
                    evidence,
                    batch,
                )
                continue
            if job.dedicated:
                others = sorted(holders - {key})
            else:
                others = sorted(
                    o
                    for o in holders
                    if o != key and (j := s.jobs.get(o)) is not None and j.dedicated
                )
            if not others:
                continue
            message = (
                f"regulated job {key} shares node {name} with {', '.join(others)}"
                if job.dedicated
                else f"job {key} placed next to regulated job {others[0]} on node {name}"
            )
            self._violation(
                CHECK_ISOLATION,
                stored,
                key if job.dedicated else others[0],
                message,
                evidence + [s.running[o].seq for o in others if o in s.running],
                batch,
            )
        if job.residency:
            s.checked[CHECK_RESIDENCY] += 1
            for name in nodes:
                node = s.nodes.get(name)
                region = node.region if node else None
                if region not in job.residency:
                    self._violation(
                        CHECK_RESIDENCY,
                        stored,
                        key,
                        f"job {key} must stay in {', '.join(job.residency)} but ran on "
                        f"{name} in region {region or 'unknown'}",
                        [stored.seq, job.seq] + ([node.seq] if node else []),
                        batch,
                    )

    def _job_preempted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        key = d["job"]
        reason = d.get("reason", "")
        open_run = s.running.get(key)
        if open_run is not None and key in s.jobs:
            s.checked[CHECK_PREEMPTION_RULES] = s.checked.get(CHECK_PREEMPTION_RULES, 0) + 1
            trouble = self._node_trouble(open_run) is not None
            broken = preemptions.check(s, key, d, open_run, trouble)
            if broken is not None:
                message, evidence = broken
                self._violation(
                    CHECK_PREEMPTION_RULES, stored, key, message, [stored.seq, *evidence], batch
                )
        run = self._close_interval(key, END_PREEMPTED, reason, stored, batch)
        self._open_version(
            KIND_PENDING,
            key,
            stored,
            _pending_data(reason, "preempted"),
            batch,
        )
        if s.effects_of is not None:
            self._effect(stored, key, f"preempted: {reason}", batch)
        job = s.jobs.get(key)
        if job is None:
            return
        s.checked[CHECK_PREEMPTION] += 1
        node_caused = run is not None and self._node_trouble(run) is not None
        if not job.preemptible and not node_caused:
            by = d.get("preempted_by")
            self._violation(
                CHECK_PREEMPTION,
                stored,
                key,
                f"non-preemptible job {key} was preempted"
                + (f" by {by}" if by else "")
                + f": {reason}",
                [stored.seq, job.seq] + ([run.seq] if run else []),
                batch,
            )

    def _job_pending(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        key = d["job"]
        reason = d.get("reason", "")
        self._close_interval(key, END_STOPPED, reason, stored, batch)
        self._open_version(
            KIND_PENDING,
            key,
            stored,
            _pending_data(reason, d.get("constraint", "")),
            batch,
        )
        if self.state.effects_of is not None:
            self._effect(stored, key, f"pending: {reason}", batch)

    def _job_gone(self, key: str, kind: str, reason: str, stored: Envelope, batch: Batch) -> None:
        self._close_interval(key, kind, reason, stored, batch)
        self._close_version(KIND_PENDING, key, stored, batch)
        self.state.jobs.pop(key, None)

    def _job_withdrawn(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self._job_gone(d["job"], END_WITHDRAWN, f"withdrawn in {stored.cause[:12]}", stored, batch)

    def _job_finished(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        # _job_gone, inlined: one job in seven finishes a step
        key = d["job"]
        self._close_interval(key, END_FINISHED, "finished", stored, batch)
        s = self.state
        v = s.versions.pop(f"{KIND_PENDING}\x1f{key}", None)
        if v is not None:
            batch.versions.append(
                (v[0], v[1], v[2], v[3], v[4], v[5], stored.seq, self._time, self._ts, v[6])
            )
        s.jobs.pop(key, None)

    def _job_started(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        # The cluster ran it: the interval starts now, not when the solver decided it.
        run = self.state.running.get(d["job"])
        if run is not None:
            run.time, run.ts = self._time, self._ts

    def _job_failed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        code = d.get("exit_code")
        reason = f"failed: {d['reason']}" + (f" (exit code {code})" if code is not None else "")
        self._job_gone(d["job"], END_FAILED, reason, stored, batch)

    def _job_interrupted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self._close_interval(d["job"], END_STOPPED, d["reason"], stored, batch)

    def _job_info(
        self, stored: Envelope, job: dict[str, Any], user: str, waiting_since: str
    ) -> JobInfo:
        return JobInfo(
            job["queue"],
            job["name"],
            user,
            bool(job.get("preemptible", True)),
            job.get("isolation") == "dedicated",
            list(job.get("residency", ())),
            int(job.get("priority", 0)),
            str(job.get("priority_class", "")),
            stored.seq,
            waiting_since,
        )

    def _job_submitted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        job = d["job"]
        key = f"{job['queue']}/{job['name']}"
        actor = stored.actor
        user = self._people.get(actor)
        if user is None:
            user = self._people[actor] = person(actor)
        self.state.jobs[key] = self._job_info(stored, job, user, self._time)

    def _job_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        job = d["job"]
        key = f"{job['queue']}/{job['name']}"
        old = s.jobs.get(key)
        info = self._job_info(
            stored,
            job,
            old.user if old else person(stored.actor),
            old.waiting_since if old else self._time,
        )
        s.jobs[key] = info
        fields = d.get("fields", ())
        if "priority" in fields or "priority_class" in fields:
            before = f"{old.priority_class} ({old.priority})" if old else "?"
            queue = s.queues.get(info.queue)
            s.staged_changes.append(
                [
                    stored.seq,
                    "priority",
                    key,
                    queue.team if queue else info.queue,
                    f"job priority {before} -> {info.priority_class} ({info.priority})",
                ]
            )

    # -- configuration --------------------------------------------------------------------

    def _cluster_configured(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        cluster = d["cluster"]
        classes = cluster.get("priority_classes", [])
        if classes != s.priority_classes:
            before = {c["name"]: c["value"] for c in s.priority_classes}
            after = {c["name"]: c["value"] for c in classes}
            s.staged_changes.append(
                [stored.seq, "priorities", "cluster", None, dict_diff(before, after)]
            )
            s.priority_classes = classes
        self._open_version(KIND_CLUSTER, "cluster", stored, cluster, batch)

    def _policy_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        policy = d["policy"]
        s.staged_changes.append([stored.seq, "policy", "policy", None, dict_diff(s.policy, policy)])
        if s.staged_signed_base is None:
            s.staged_signed_base = bool(s.policy.get("require_signed_approval"))
        s.policy = policy
        self._open_version(KIND_POLICY, "policy", stored, policy, batch)

    def _node_registered(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        node = d["node"]
        name = node["name"]
        s.nodes[name] = NodeInfo(
            flavor=node.get("flavor"),
            gpus=int(node.get("gpus", 0)),
            region=node.get("region"),
            dedicated=node.get("isolation") == "dedicated",
            state=node.get("state", "Ready"),
            seq=stored.seq,
        )
        self._open_version(
            KIND_NODE,
            name,
            stored,
            {
                "flavor": node.get("flavor"),
                "gpus": node.get("gpus", 0),
                "region": node.get("region"),
                "isolation": node.get("isolation", "shared"),
                "state": node.get("state", "Ready"),
                "topology": node.get("topology", {}),
            },
            batch,
        )
        # A node re-registered under running jobs (say, moved to another region) is re-checked.
        holders = self._jobs_on(name)
        if s.nodes[name].dedicated:
            self._node_jobs[name] = holders
        else:
            self._node_jobs.pop(name, None)
        for job_key in sorted(holders):
            job = s.jobs.get(job_key)
            if job is not None:
                self._check_placement(job_key, job, [name], stored, batch)

    def _node_removed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.state.nodes.pop(d["node"], None)
        self._close_version(KIND_NODE, d["node"], stored, batch)

    def _node_state_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        node = s.nodes.get(d["node"])
        if node is None:
            return
        node.state = d["state"]
        node.seq = stored.seq
        vid = s.versions.get(f"{KIND_NODE}\x1f{d['node']}")
        data: dict[str, Any] = {}
        if vid is not None:
            # The open version's data is not kept in memory: rebuild it from what is.
            data = {
                "flavor": node.flavor,
                "gpus": node.gpus,
                "region": node.region,
                "isolation": "dedicated" if node.dedicated else "shared",
                "state": node.state,
            }
        data["state"] = d["state"]
        data["reason"] = d.get("reason", "")
        self._open_version(KIND_NODE, d["node"], stored, data, batch)

    def _queue_configured(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        queue = d["queue"]
        name = queue["name"]
        old = s.queues.get(name)
        info = QueueInfo(
            team=queue.get("team") or name,
            cohort=queue.get("cohort"),
            quotas=_quotas(queue),
            data=queue,
            seq=stored.seq,
        )
        s.queues[name] = info
        s.staged_changes.append(
            [stored.seq, "queue", name, info.team, queue_diff(old.data if old else None, queue)]
        )
        self._open_version(KIND_QUEUE, name, stored, queue, batch)
        self.usage.requota(
            stored.seq, self._ts, name, (info.team, info.cohort, info.quotas, info.seq), batch
        )

    def _queue_removed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        name = d["queue"]
        old = s.queues.pop(name, None)
        s.staged_changes.append(
            [stored.seq, "queue", name, old.team if old else name, queue_diff(None, None)]
        )
        self._close_version(KIND_QUEUE, name, stored, batch)
        self.usage.requota(stored.seq, self._ts, name, None, batch)

    # -- commits and solves ----------------------------------------------------------------

    def _commit_row(
        self, stored: Envelope, commit: dict[str, Any], applied: bool, detail: int
    ) -> tuple[Any, ...]:
        return (
            stored.seq,
            commit["sha"],
            1 if applied else 0,
            commit.get("author", ""),
            commit.get("author_email", ""),
            "\n".join(commit.get("approvers", ())),
            utc_time(commit.get("committed_at", "")),
            stored.time,
            commit.get("subject", ""),
            detail,
            utc_time(commit.get("authored_at", "")),
            _who(commit.get("committer", ""), commit.get("committer_email", "")),
        )

    def _owners_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        team = d["team"]
        old = s.owners.get(team, [])
        new = [[o["email"], o.get("key", "")] for o in d["owners"]]
        s.staged_owners_base.setdefault(team, old)
        if new:
            s.owners[team] = new
        else:
            s.owners.pop(team, None)
        s.staged_changes.append([stored.seq, "owners", team, team, owners_diff(old, new)])

    def _approval_checked(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.state.staged_approvals.append(d)

    def _commit_applied(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        commit = d["commit"]
        batch.commits.append(self._commit_row(stored, commit, True, int(d.get("changes", 0))))
        staged, s.staged_changes = s.staged_changes, []
        records, s.staged_approvals = s.staged_approvals, []
        owners_base, s.staged_owners_base = s.staged_owners_base, {}
        signed_base, s.staged_signed_base = s.staged_signed_base, None
        s.effects_of = [commit["sha"], stored.seq] if staged else None
        for seq, kind, target, team, summary in staged:
            batch.changes.append((s.next_change, stored.seq, seq, kind, target, team, summary))
            s.next_change += 1
        governed = [c for c in staged if c[1] in ("queue", "owners")]
        if not governed:
            return
        s.checked[CHECK_APPROVAL] += 1
        base = {t: people for t, people in {**s.owners, **owners_base}.items() if people}
        signed = bool(signed_base) or bool(s.policy.get("require_signed_approval"))
        by_team = {r["team"]: r for r in records}
        for team in sorted({c[3] for c in governed if c[3]}):
            evidence = [stored.seq] + [c[0] for c in governed if c[3] == team]
            record = by_team.get(team)
            self._judge_approval(stored, commit, team, base, record, signed, evidence, batch)

    def _judge_approval(
        self,
        stored: Envelope,
        commit: dict[str, Any],
        team: str,
        base: dict[str, list[list[str]]],
        record: dict[str, Any] | None,
        signed: bool,
        evidence: list[int],
        batch: Batch,
    ) -> None:
        """The reconciler's approval rule, run again on what the log holds: the team's
        owners at the base from OwnersChanged, authors and approvals from ApprovalChecked
        (for a log written before those, the commit's author and trailers)."""
        owners = {t: [Owner(e, k) for e, k in people] for t, people in base.items()}
        listed = owners.get(team, [])
        if record is not None:
            authors = [a.lower() for a in record.get("authors", ())]
            recorded = [Approval(**a) for a in record.get("approvals", ())]
            claims = recorded_vouches(recorded)
            if not signed:
                # the commit's own trailers, so the verdict says why those did not count
                claims += trailer_vouches(commit.get("approvers", ()), commit["sha"])
        else:
            authors = [(commit.get("author_email") or "").lower()]
            recorded = []
            claims = trailer_vouches(commit.get("approvers", ()), commit["sha"])
        verdict = judge_team(
            team,
            listed,
            authors=authors,
            vouches=claims,
            signed_required=signed,
            all_owners=owners,
        )
        emails = {o.email for o in listed}
        counted = {a.approver for a in verdict.approvals}
        shown = [
            {
                "approver": a.approver,
                "owner_at_base": a.approver in emails,
                "counted": a.approver in counted,
                "via": a.via,
                "commit": a.commit,
                "fingerprint": a.fingerprint,
            }
            for a in verdict.approvals or recorded
        ]
        named = {row["approver"] for row in shown}
        for who in commit.get("approvers", ()):
            email = email_of(who)
            if email not in named:
                named.add(email)
                shown.append(
                    {
                        "approver": email,
                        "owner_at_base": email in emails,
                        "counted": email in counted,
                        "via": "trailer",
                        "commit": commit["sha"],
                        "fingerprint": "",
                    }
                )
        status = "bootstrap" if not listed else "approved" if verdict.approvals else "missing"
        batch.approvals.append(
            (
                stored.seq,
                team,
                status,
                _compact(
                    {
                        "authors": authors,
                        "owners": sorted(emails),
                        "approvals": shown,
                        "refused": list(verdict.refused),
                        "signed_required": signed,
                    }
                ),
            )
        )
        if status != "missing":
            return
        who = ", ".join(authors) or "unknown"
        reasons = "; ".join(verdict.refused)
        self._violation(
            CHECK_APPROVAL,
            stored,
            team,
            f"change of team {team} in {commit['sha'][:12]} by {who} has no "
            + ("signed " if signed else "")
            + f"approval from an owner at the base ({', '.join(sorted(emails))})"
            + (f": {reasons}" if reasons else ""),
            evidence,
            batch,
        )

    def _commit_rejected(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        batch.commits.append(self._commit_row(stored, d["commit"], False, len(d.get("errors", ()))))
        s.staged_changes = []
        s.staged_approvals = []
        s.staged_owners_base = {}
        s.staged_signed_base = None
        s.effects_of = None

    def _solve_completed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.usage.solve(stored.seq, self._time, batch)

    def _not_projected(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        return None


# A queue in force, as the usage ledger sees it: team, cohort, quotas (flavor -> [nominal,
# borrowing limit, lending limit] in milli-GPU) and the seq of the event that configured it.
QuotaInfo = tuple[str, str | None, dict[str, list[int | None]], int]


class Usage(Protocol):
    """Where the fold sends what usage accounting needs: a `UsageLedger`, or a
    `DeferredUsage` that records it for a ledger in another process."""

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None: ...

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None: ...

    def solve(self, seq: int, time: str, batch: Batch) -> None: ...

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None: ...

    def snapshot_open(self, batch: Batch) -> None: ...


# What a `DeferredUsage` records, one tuple a call: the kind first.
_CHARGE, _REQUOTA, _SOLVE, _VIOLATION = range(4)


class UsageLedger:
    """Usage accounting and the queue-limit check, a fold of its own inside the projection.

    It needs of the log only charges (a placement started or ended), quota changes and
    solves, and it numbers every violation, so it sees them in order too. That is
    little to send for a large part of the fold's work (and of the rows: segments,
    daily sums, lending rates), so a rebuild runs it in its writer process. It owns
    the state's `accounts`, `pools`, `touched`, `over_limit`, `next_segment`,
    `next_violation` and the queue-limit count of `checked`.
    """

    def __init__(self, state: ProjectionState) -> None:
        self.state = state
        self._ts = 0.0
        self._queues: dict[str, QuotaInfo] = {
            name: (q.team, q.cohort, q.quotas, q.seq) for name, q in state.queues.items()
        }

    def replay(self, batch: Batch) -> None:
        """Apply the calls a `DeferredUsage` recorded in `batch`, in their order."""
        calls, batch.usage_calls = batch.usage_calls, []
        for call in calls:
            kind = call[0]
            if kind == _CHARGE:
                self.charge(call[1], call[2], call[3], call[4], call[5], batch)
            elif kind == _SOLVE:
                self.solve(call[1], call[2], batch)
            elif kind == _VIOLATION:
                self.violation(call[1], call[2], call[3], call[4], call[5], call[6], batch)
            else:
                self.requota(call[1], call[2], call[3], call[4], batch)

    def snapshot_open(self, batch: Batch) -> None:
        batch.open_segments = [a.row(None, None) for a in self.state.accounts.values()]

    # -- violations ------------------------------------------------------------------------

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None:
        """A violation found by the fold: it takes the next id (`evidence`: its JSON)."""
        self._violation(check, seq, time, subject, message, evidence, batch)

    def _violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> int:
        s = self.state
        vid = s.next_violation
        s.next_violation += 1
        batch.violations.append((vid, check, seq, time, subject, message, evidence))
        return vid

    # -- accounts, segments and pools ------------------------------------------------------

    def _pool(self, cohort: str, flavor: str) -> Pool:
        key = f"{cohort}\x1f{flavor}"
        pool = self.state.pools.get(key)
        if pool is None:
            pool = self.state.pools[key] = Pool(ts=self._ts)
        elif pool.ts != self._ts:
            first, last = int(pool.ts // DAY) + 1, int(self._ts // DAY)
            for day in range(first, last + 1):
                pool.days[str(day)] = pool.r + pool.rate * (day * DAY - pool.ts)
            pool.r += pool.rate * (self._ts - pool.ts)
            pool.ts = self._ts
        return pool

    def _account(self, queue: str, flavor: str, batch: Batch) -> Account:
        key = f"{queue}\x1f{flavor}"
        acc = self.state.accounts.get(key)
        if acc is not None:
            return acc
        info = self._queues.get(queue)
        # Born empty (no use, no quota: nothing to add to a pool), then given its quota.
        acc = Account(
            queue=queue,
            flavor=flavor,
            team=info[0] if info else queue,
            cohort=info[1] if info else None,
            used=0,
            nominal=0,
            borrowing_limit=None,
            lending_limit=None,
            segment=0,
            from_ts=self._ts,
            r_from=0.0,
        )
        self.state.accounts[key] = acc
        self._open_segment(acc)
        quota = info[2].get(flavor) if info else None
        if quota is not None:
            self._reaccount(
                acc, batch, 0, (quota[0] or 0, quota[1], quota[2]), acc.cohort, acc.team
            )
        return acc

    def _open_segment(self, acc: Account) -> None:
        s = self.state
        acc.segment = s.next_segment
        s.next_segment += 1
        acc.from_ts = self._ts
        acc.r_from = self._pool(acc.cohort, acc.flavor).r if acc.cohort else 0.0

    def _close_segment(self, acc: Account, r_to: float, batch: Batch) -> None:
        """Write the account's segment as it stood, and open the next one now."""
        self._end_segment(acc, r_to, batch)
        self._open_segment(acc)

    def _end_segment(self, acc: Account, r_to: float, batch: Batch) -> None:
        """The segment's row, and its part of each UTC day's sums (integer milli-GPU-
        microseconds, so they do not depend on the order they were added in)."""
        start, end = acc.from_ts, self._ts
        used, nominal, r_from = acc.used, acc.nominal, acc.r_from
        unused = nominal - used
        limit = acc.lending_limit
        lendable = 0 if unused <= 0 else (unused if limit is None or unused < limit else limit)
        queue, team, flavor = acc.queue, acc.team, acc.flavor
        lent = lendable * (r_to - r_from)
        batch.segments.append(
            (
                acc.segment,
                queue,
                team,
                acc.cohort,
                flavor,
                start,
                end,
                used,
                nominal,
                lendable,
                r_from,
                r_to,
                lent,
            )
        )
        if end <= start:
            return
        borrowed = -unused if unused < 0 else 0
        idle = unused if unused > 0 else 0
        days = batch.usage_days
        first, last = int(start // DAY), int(end // DAY)
        if end == last * DAY:
            last -= 1  # a segment that ends at 00:00:00 has no part of the day it ends on
        if first == last:
            # Within one day: the common case.
            micros = round((end - start) * 1e6)
            key = (queue, team, flavor, first)
            sums = days.get(key)
            if sums is None:
                days[key] = [
                    used * micros,
                    nominal * micros,
                    borrowed * micros,
                    idle * micros,
                    round(lent * 1e6),
                ]
            else:
                sums[0] += used * micros
                sums[1] += nominal * micros
                sums[2] += borrowed * micros
                sums[3] += idle * micros
                if lendable:
                    sums[4] += round(lent * 1e6)
            return
        boundaries = self.state.pools[f"{acc.cohort}\x1f{flavor}"].days if acc.cohort else {}
        r_low = r_from
        for day in range(first, last + 1):
            low, high = max(start, day * DAY), min(end, (day + 1) * DAY)
            if high <= low:
                continue
            micros = round((high - low) * 1e6)
            r_high = r_to if high == end else boundaries.get(str(day + 1), r_to)
            key = (queue, team, flavor, day)
            sums = days.get(key)
            if sums is None:
                sums = days[key] = [0, 0, 0, 0, 0]
            sums[0] += used * micros
            sums[1] += nominal * micros
            sums[2] += borrowed * micros
            sums[3] += idle * micros
            if lendable:
                sums[4] += round(lendable * (r_high - r_low) * 1e6)
            r_low = r_high

    def _reaccount(
        self,
        acc: Account,
        batch: Batch,
        used: int,
        quota: tuple[int, int | None, int | None],
        cohort: str | None,
        team: str,
    ) -> None:
        """Give the account new use, quota or cohort: a new segment, new pool sums."""
        old_pool = self._pool(acc.cohort, acc.flavor) if acc.cohort else None
        old_cohort, old_team = acc.cohort, acc.team
        b0, l0 = acc.borrowed, acc.lendable
        if acc.from_ts != self._ts or (cohort, team) != (old_cohort, old_team):
            # Several changes at one instant (one solve) make one segment, not empty ones.
            self._close_segment(acc, old_pool.r if old_pool else 0.0, batch)
        acc.used = used
        acc.nominal, acc.borrowing_limit, acc.lending_limit = quota
        acc.cohort, acc.team = cohort, team
        if acc.cohort != old_cohort:
            acc.r_from = self._pool(acc.cohort, acc.flavor).r if acc.cohort else 0.0
        if old_pool is not None and old_cohort is not None:
            old_pool.borrowed -= b0
            old_pool.lendable -= l0
            self._rerate(old_cohort, acc.flavor, old_pool, batch)
        if acc.cohort is not None:
            pool = self._pool(acc.cohort, acc.flavor)
            pool.borrowed += acc.borrowed
            pool.lendable += acc.lendable
            self._rerate(acc.cohort, acc.flavor, pool, batch)

    def _rerate(self, cohort: str, flavor: str, pool: Pool, batch: Batch) -> None:
        rate = min(pool.borrowed, pool.lendable) / pool.lendable if pool.lendable > 0 else 0.0
        if rate != pool.rate:
            pool.rate = rate
            batch.rates.append((cohort, flavor, self._ts, pool.r, rate))

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None:
        """A placement started or ended: only the account's use moves (the hot path)."""
        self._ts = ts
        s = self.state
        key = f"{queue}\x1f{flavor}"
        acc = s.accounts.get(key) or self._account(queue, flavor, batch)
        seqs = s.touched.get(key)
        if seqs is None:
            s.touched[key] = [seq]
        else:
            seqs.append(seq)
        nominal = acc.nominal
        before = acc.used
        cohort = acc.cohort
        if cohort is None:
            if acc.from_ts != ts:
                self._close_segment(acc, 0.0, batch)
            acc.used = before + milli
            return
        pool = s.pools.get(f"{cohort}\x1f{flavor}")
        if pool is None:
            pool = self._pool(cohort, flavor)
        elif pool.ts != ts:
            if int(pool.ts // DAY) == int(ts // DAY):
                # _pool, inlined for the common case: no day boundary to record
                pool.r += pool.rate * (ts - pool.ts)
                pool.ts = ts
            else:
                pool = self._pool(cohort, flavor)
        if acc.from_ts != ts:
            # _close_segment, inlined: this runs for every placement that starts or ends.
            r = pool.r
            self._end_segment(acc, r, batch)
            acc.segment = s.next_segment
            s.next_segment += 1
            acc.from_ts = ts
            acc.r_from = r
        after = acc.used = before + milli
        limit = acc.lending_limit
        unused0, unused1 = nominal - before, nominal - after
        l0 = 0 if unused0 <= 0 else (unused0 if limit is None or unused0 < limit else limit)
        l1 = 0 if unused1 <= 0 else (unused1 if limit is None or unused1 < limit else limit)
        over0, over1 = before - nominal, after - nominal
        borrowed = pool.borrowed = (
            pool.borrowed + (over1 if over1 > 0 else 0) - (over0 if over0 > 0 else 0)
        )
        lendable = pool.lendable = pool.lendable + l1 - l0
        rate = (borrowed if borrowed < lendable else lendable) / lendable if lendable > 0 else 0.0
        if rate != pool.rate:
            pool.rate = rate
            batch.rates.append((cohort, flavor, ts, pool.r, rate))

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None:
        """Quotas in force changed: every account of the queue takes the new limits and cohort."""
        self._ts = ts
        s = self.state
        if quota is None:
            self._queues.pop(name, None)
        else:
            self._queues[name] = quota
        flavors = set(quota[2]) if quota else set()
        flavors |= {a.flavor for a in s.accounts.values() if a.queue == name}
        for flavor in sorted(flavors):
            acc = self._account(name, flavor, batch)
            limit = quota[2].get(flavor) if quota else None
            limits = (limit[0] or 0, limit[1], limit[2]) if limit else (0, None, None)
            cohort = quota[1] if quota else None
            self._reaccount(acc, batch, acc.used, limits, cohort, quota[0] if quota else acc.team)
            s.touched.setdefault(f"{name}\x1f{flavor}", []).append(seq)

    # -- queue limits ------------------------------------------------------------------------

    def solve(self, seq: int, time: str, batch: Batch) -> None:
        """A solve's events are one atomic append: limits are checked where it ends."""
        s = self.state
        if not s.touched:
            return
        touched, s.touched = s.touched, {}
        s.checked[CHECK_LIMITS] += 1
        accounts, over_limit = s.accounts, s.over_limit
        cohorts: dict[str, list[int]] = {}
        turned: list[str] = []
        # Most solves start and end no episode: find those that do, then go through them in
        # order (violation ids follow it).
        for key, seqs in touched.items():
            acc = accounts.get(key)
            if acc is None:
                continue
            ceiling: int | None
            if acc.cohort is None:
                ceiling = acc.nominal
            else:
                pool_key = f"{acc.cohort}\x1f{acc.flavor}"
                merged = cohorts.get(pool_key)
                if merged is None:
                    cohorts[pool_key] = list(seqs)
                else:
                    merged.extend(seqs)
                limit = acc.borrowing_limit
                ceiling = None if limit is None else acc.nominal + limit
            over = ceiling is not None and acc.used > ceiling
            if over != (bool(over_limit) and f"queue\x1f{key}" in over_limit):
                turned.append(key)
        for key in sorted(turned):
            acc = accounts[key]
            limit = acc.borrowing_limit
            if acc.cohort is None:
                ceiling = acc.nominal
            else:
                ceiling = None if limit is None else acc.nominal + limit
            over = ceiling is not None and acc.used > ceiling
            what = ""
            if over:
                what = (
                    f"queue {acc.queue} uses {gpus(acc.used)} {acc.flavor} GPUs; "
                    f"its limit is {gpus(ceiling or 0)}"
                    + (
                        f" (nominal {gpus(acc.nominal)} + borrowing limit {gpus(limit)})"
                        if acc.cohort is not None and limit is not None
                        else " (nominal, no cohort to borrow from)"
                    )
                )
            queue = self._queues.get(acc.queue)
            evidence = touched[key] + ([queue[3]] if queue else [])
            self._limit_episode(
                f"queue\x1f{key}", over, acc.queue, what, evidence, seq, time, batch
            )
        pools = s.pools
        for key in sorted(cohorts):
            pool = pools.get(key)
            if pool is None:
                continue
            over = pool.borrowed > pool.lendable
            if over == (bool(over_limit) and f"cohort\x1f{key}" in over_limit):
                continue
            cohort, flavor = key.split("\x1f")
            what = (
                f"cohort {cohort} borrows {gpus(pool.borrowed)} {flavor} GPUs but its members "
                f"can lend only {gpus(pool.lendable)}"
            )
            self._limit_episode(
                f"cohort\x1f{key}", over, cohort, what, cohorts[key], seq, time, batch
            )

    def _limit_episode(
        self,
        key: str,
        over: bool,
        subject: str,
        message: str,
        evidence: list[int],
        seq: int,
        time: str,
        batch: Batch,
    ) -> None:
        s = self.state
        open_id = s.over_limit.get(key)
        if over and open_id is None:
            s.over_limit[key] = self._violation(
                CHECK_LIMITS, seq, time, subject, message, _compact(sorted({*evidence, seq})), batch
            )
        elif not over and open_id is not None:
            del s.over_limit[key]
            batch.violation_close.append((seq, time, open_id))


class DeferredUsage:
    """A `Usage` that records each call in the batch (`usage_calls`) for a `UsageLedger` in
    the rebuild's writer process to replay; the rows it would make are made there."""

    def __init__(self) -> None:
        # Whether anything was charged or requoted since the last solve: one that follows
        # nothing checks nothing, and need not be sent.
        self._touched = True

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None:
        self._touched = True
        batch.usage_calls.append((_CHARGE, seq, ts, queue, flavor, milli))

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None:
        self._touched = True
        batch.usage_calls.append((_REQUOTA, seq, ts, name, quota))

    def solve(self, seq: int, time: str, batch: Batch) -> None:
        if self._touched:
            self._touched = False
            batch.usage_calls.append((_SOLVE, seq, time))

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None:
        batch.usage_calls.append((_VIOLATION, check, seq, time, subject, message, evidence))

    def snapshot_open(self, batch: Batch) -> None:
        pass  # the ledger's process writes the open segments
