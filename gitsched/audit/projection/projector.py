"""The audit views' fold: stored events in, row operations out (the `convert` of STYLE rule 3).

`Projector.convert` does no I/O and reads no clock: it turns each event's (upcast)
payload into rows appended to a `Batch`, which `gitsched.audit.store` applies together with
the offset in one SQLite transaction. What the fold must remember between events
is `ProjectionState` (`gitsched.audit.projection.state`); the compliance checks it runs on
the way are `gitsched.audit.projection.checks`, usage accounting `gitsched.audit.projection.ledger`.

Payloads are read as dicts rather than decoded into dataclasses: see
docs/audit.md, "Why the fold reads dicts", for the measured cost of decoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gitsched.audit.projection.checks import ComplianceChecks
from gitsched.audit.projection.cluster_fold import ClusterFold, DeferredClusterFold
from gitsched.audit.projection.diffs import dict_diff, owners_diff, queue_diff, quotas_of
from gitsched.audit.projection.ledger import Usage, UsageLedger
from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import (
    Envelope,
    HeldEvent,
    JobInfo,
    NodeInfo,
    ProjectionError,
    ProjectionState,
    QueueInfo,
    Running,
)
from gitsched.audit.projection.vocabulary import (
    CHECKPOINT_MIN_EVENTS,
    DAY,
    END_FAILED,
    END_FINISHED,
    END_MOVED,
    END_NODE_DRAINED,
    END_NODE_FAILED,
    END_NODE_REMOVED,
    END_PREEMPTED,
    END_STOPPED,
    END_TIMED_OUT,
    END_WITHDRAWN,
    KIND_CLUSTER,
    KIND_IDLE_SUSPENDED,
    KIND_NODE,
    KIND_PENDING,
    KIND_POLICY,
    KIND_QUEUE,
    KIND_WORK,
    SERVICE_KIND,
    START_ADMITTED,
    START_MOVED,
    canonical_json,
    epoch,
    person,
)
from gitsched.engine import events as ev
from gitsched.engine.events import EVENT_TYPES
from gitsched.engine.model import QueueingStrategy, utc_time
from gitsched.engine.placement.preemption import Rule
from gitsched.engine.state import requeue_reason
from gitsched.engine.suspension import (
    SUSPENDED,
    commit_suspension,
    idle_suspension,
    resumed_reason,
)
from gitsched.engine.units import gpus_text as gpus
from gitsched.eventlog.codec import upcast
from gitsched.eventlog.timeline import COMMIT_EVENTS, Timeline
from gitsched.policies.approval import PLATFORM

SUSPENDED_RULE = Rule.SUSPEND.value
_string = json.encoder.encode_basestring_ascii  # what canonical_json does to a str


def _pending_data(reason: str, constraint: str) -> str:
    """canonical_json({"reason": ..., "constraint": ...}), spelled out: one per pending job."""
    return f'{{"constraint":{_string(constraint)},"reason":{_string(reason)}}}'


def _who(name: str, email: str) -> str:
    """`Name <email>`, or "" when git did not say (a commit logged before v2)."""
    if not name and not email:
        return ""
    return f"{name} <{email}>"


# The events whose payload states their fact time (eventlog.timeline.stated_time).
_STATES_TIME = frozenset(("PlacementDecided", "JobTimedOut"))
STRICT_FIFO = QueueingStrategy.STRICT_FIFO.value


class Projector:
    """Folds stored events into row operations; one instance per catch-up."""

    def __init__(
        self,
        state: ProjectionState | None = None,
        usage: Usage | None = None,
        cluster: ClusterFold | DeferredClusterFold | None = None,
    ) -> None:
        """`usage`: where usage accounting goes; by default a `UsageLedger` on the same state.
        `cluster`: where the engine's fold goes; by default a `ClusterFold` of the state's."""
        self.state = state if state is not None else ProjectionState()
        self.usage: Usage = usage if usage is not None else UsageLedger(self.state)
        s = self.state
        # The fold's time: the last fact time it read.
        self._time = s.max_time
        self._ts = epoch(s.max_time) if s.max_time else 0.0
        # Items: (stored event, upcast data, version), or a saved held event's plain values.
        self._timeline: Timeline[Any] = Timeline(s.max_time, s.unit, s.held)
        self._marked = s.max_time
        self.checks = ComplianceChecks(self.state, self.usage)
        self.cluster = cluster if cluster is not None else ClusterFold(s.cluster)
        self._node_jobs = self.checks.node_jobs
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
            "MembersChanged": self._members_changed,
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
            # Telemetry and idle flags: only the engine's fold reads them (`cluster_fold`),
            # no rows here (a reclaimed job's stop is its JobPreempted, with rule "idle").
            "GpuUtilizationReported": self._not_projected,
            "JobIdle": self._not_projected,
            "JobIdleCleared": self._not_projected,
            "JobRequeued": self._job_requeued,
            # The end of a backoff only wakes the solver: the placement that follows is the row.
            "JobBackoffEnded": self._not_projected,
            "JobTimedOut": self._job_timed_out,
            "ReservationsDecided": self._reservations_decided,
            # Autoscaling's inputs and decisions: rows come with the InferenceService views.
            "ServiceMetricObserved": self._not_projected,
            "ServiceScaled": self._not_projected,
            # Services: their replicas are jobs (queue/name.<index>) whose placements are
            # the rows; the replica counts over time are `audit history --service`'s
            # (audit/services.py), folded from these events.
            "ServiceSubmitted": self._service_submitted,
            "ServiceChanged": self._service_changed,
            "ServiceWithdrawn": self._service_withdrawn,
            "ServiceReplicasChanged": self._service_replicas_changed,
            "JobSuspended": self._job_suspended,
            "WorkspaceSuspended": self._workspace_suspended,
            "JobResumed": self._job_resumed,
        }
        assert set(self._handlers) == set(EVENT_TYPES), "every event type needs a handler"
        self._people: dict[str, str] = {}  # actor -> person(actor): a few authors submit every job
        self._failed: dict[str, JobInfo] = {}  # the job the last JobFailed forgot
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
        cluster = self.cluster.convert
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
                cluster(stored, data, batch)  # in log order, as the engine folds it
                if (
                    unit[2]
                    and stored.time == unit[0]
                    and stored.cause == unit[1]
                    and type_ not in COMMIT_EVENTS
                    and (type_ not in _STATES_TIME or data.get("at") == self._time)
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
        """Give an event its fact time (`gitsched.eventlog.timeline`): fold it and whatever it releases,
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
                f"expected seq {s.seq + 1}, read {stored.seq}: the log has a gap; run `gitsched log verify`"
            )
        raise ProjectionError(
            f"event {stored.seq} does not link to event {s.seq} (prev_hash differs): "
            "run `gitsched log verify`"
        )

    def snapshot_open(self, batch: Batch) -> None:
        """The rows still open, for the sink to write with the offset."""
        s = self.state
        s.cluster = self.cluster.save()
        batch.open_placements = [
            (
                *r.row(),
                *(None,) * 6,
                r.queued,
                r.priority_class,
                r.attempt,
                epoch(r.queued) if r.queued else None,
            )
            for r in s.running.values()
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
            data if isinstance(data, str) else canonical_json(data),
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

    def _close_interval(
        self, job: str, kind: str, reason: str, stored: Envelope, batch: Batch
    ) -> Running | None:
        run = self.state.running.pop(job, None)
        if run is None:
            return None
        if kind not in (END_FINISHED, END_WITHDRAWN, END_FAILED, END_TIMED_OUT):
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
                run.priority_class,
                run.attempt,
                epoch(run.queued) if run.queued else None,
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
        if job is not None and job.resumed:
            reason, job.resumed = f"{reason}; {job.resumed}" if reason else job.resumed, ""
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
            job.priority_class if job is not None else "",
            job.attempt if job is not None else 1,
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
            self.checks.placement(key, job, nodes, stored, self._time, batch)
            if old is None and action == START_ADMITTED:
                self.checks.reservations(key, job, nodes, stored, self._time, batch)
                if queue is not None and queue.data.get("queueing_strategy") == STRICT_FIFO:
                    # judged when the solve is read: a head it admits too blocks nobody
                    s.strict_admitted.append([stored.seq, key])

    def _reservations_decided(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.state.reservations = list(d.get("reservations", ()))

    def _job_preempted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        key = d["job"]
        reason = d.get("reason", "")
        open_run = s.running.get(key)
        if open_run is not None and key in s.jobs:
            trouble = self._node_trouble(open_run) is not None
            self.checks.preemption_rules(stored, key, d, open_run, trouble, self._time, batch)
        run = self._close_interval(key, END_PREEMPTED, reason, stored, batch)
        self._open_version(
            KIND_PENDING,
            key,
            stored,
            _pending_data(reason, SUSPENDED if d.get("rule") == SUSPENDED_RULE else "preempted"),
            batch,
        )
        if s.effects_of is not None:
            self._effect(stored, key, f"preempted: {reason}", batch)
        job = s.jobs.get(key)
        if job is None:
            return
        node_caused = run is not None and self._node_trouble(run) is not None
        self.checks.non_preemptible(
            stored, key, job, d, run, node_caused, reason, self._time, batch
        )

    def _suspended(self, stored: Envelope, key: str, reason: str, batch: Batch) -> None:
        """A suspended job waits, saying why; a running one's stop is its JobPreempted."""
        self._open_version(KIND_PENDING, key, stored, _pending_data(reason, SUSPENDED), batch)
        if self.state.effects_of is not None:
            self._effect(stored, key, reason, batch)

    def _job_suspended(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        e = ev.JobSuspended(job=d["job"], at=d["at"], by=d["by"], commit=d["commit"])
        self._suspended(stored, e.job, commit_suspension(e).reason, batch)

    def _workspace_suspended(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        e = ev.WorkspaceSuspended(
            job=d["job"],
            since=d["since"],
            until=d["until"],
            utilization_percent=float(d["utilization_percent"]),
            threshold_percent=float(d["threshold_percent"]),
            after_minutes=int(d["after_minutes"]),
        )
        self._suspended(stored, e.job, idle_suspension(e).reason, batch)
        # The idle evidence, open until a commit resumes it (the report lists them).
        self._open_version(
            KIND_IDLE_SUSPENDED,
            e.job,
            stored,
            {
                "since": e.since,
                "until": e.until,
                "utilization_percent": e.utilization_percent,
                "threshold_percent": e.threshold_percent,
                "after_minutes": e.after_minutes,
            },
            batch,
        )

    def _job_resumed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        """Queued again: it waits from now, and its next interval says who resumed it."""
        e = ev.JobResumed(job=d["job"], at=d["at"], by=d["by"], commit=d["commit"], how=d["how"])
        reason = resumed_reason(e)
        self._close_version(KIND_IDLE_SUSPENDED, e.job, stored, batch)
        info = self.state.jobs.get(e.job)
        if info is not None:
            info.resumed = reason
            info.waiting_since = self._time
        self._open_version(KIND_PENDING, e.job, stored, _pending_data(reason, "resumed"), batch)

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

    def _work_kind(self, stored: Envelope, key: str, job: dict[str, Any], batch: Batch) -> None:
        """A job that is not a plain Job (a Workspace) keeps a version saying so."""
        kind = job.get("kind", "Job")
        if kind != "Job" and f"{KIND_WORK}\x1f{key}" not in self.state.versions:
            self._open_version(KIND_WORK, key, stored, {"kind": kind}, batch)

    def _job_gone(self, key: str, kind: str, reason: str, stored: Envelope, batch: Batch) -> None:
        self._close_interval(key, kind, reason, stored, batch)
        self._close_version(KIND_PENDING, key, stored, batch)
        self._close_version(KIND_WORK, key, stored, batch)
        self._close_version(KIND_IDLE_SUSPENDED, key, stored, batch)
        self.state.jobs.pop(key, None)

    def _job_withdrawn(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        if d["job"] in self.state.jobs:
            # A job that ended is a record, not work on the quota: removing its file needs
            # nobody (the reconciler's changed_work_files skips it too).
            queue = d["job"].partition("/")[0]
            self.state.staged_jobs.append([stored.seq, queue, d["job"], stored.cause])
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
        self._close_version(KIND_WORK, key, stored, batch)
        s.jobs.pop(key, None)

    def _job_started(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        # The cluster ran it: the interval starts now, not when the solver decided it.
        run = self.state.running.get(d["job"])
        if run is not None:
            run.time, run.ts = self._time, self._ts

    def _job_failed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        code = d.get("exit_code")
        reason = f"failed: {d['reason']}" + (f" (exit code {code})" if code is not None else "")
        info = self.state.jobs.get(d["job"])
        self._job_gone(d["job"], END_FAILED, reason, stored, batch)
        if info is not None:
            # A JobRequeued may follow in the same append: it takes the job up again.
            self._failed = {d["job"]: info}

    def _job_timed_out(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        reason = f"reached its time limit of {d['limit_minutes']} min"
        self._job_gone(d["job"], END_TIMED_OUT, reason, stored, batch)

    def _job_interrupted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self._close_interval(d["job"], END_STOPPED, d["reason"], stored, batch)

    def _job_requeued(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        """The failed job waits again: its next interval is attempt `attempt` + 1, and it
        waits from the end of its backoff (Kueue counts a requeued workload's wait from
        its requeue), the reason in its pending version."""
        s = self.state
        job = d["job"]
        key = f"{job['queue']}/{job['name']}"
        # An interrupted gang's interval is closed by its JobInterrupted; a failed one's by
        # its JobFailed, which forgot the job: the user is the one who submitted it.
        old = s.jobs.get(key) or self._failed.get(key)
        info = self._job_info(stored, job, old.user if old else person(stored.actor), d["ready_at"])
        info.attempt = int(d["attempt"]) + 1
        s.jobs[key] = info
        self._work_kind(stored, key, job, batch)
        self._failed.pop(key, None)
        reason = requeue_reason(
            int(d["attempt"]), int(d["max_retries"]), d["cause"], d["reason"], d["ready_at"]
        )
        self._open_version(KIND_PENDING, key, stored, _pending_data(reason, "backoff"), batch)
        if s.effects_of is not None:
            self._effect(stored, key, f"requeued: {reason}", batch)

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
            waiting_since=waiting_since,
            submitted_at=str(job.get("submitted_at", "")),
            time_limit_minutes=job.get("time_limit_minutes"),
            submission=int(job.get("submission", 0)),
            kind=str(job.get("kind", "Job")),
        )

    def _job_submitted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        job = d["job"]
        key = f"{job['queue']}/{job['name']}"
        actor = stored.actor
        user = self._people.get(actor)
        if user is None:
            user = self._people[actor] = person(actor)
        self.state.jobs[key] = self._job_info(stored, job, user, self._time)
        self._work_kind(stored, key, job, batch)
        self.state.staged_jobs.append(
            [stored.seq, job["queue"], job.get("file", key), stored.cause]
        )

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
        if old is not None:
            info.resumed = old.resumed
        s.jobs[key] = info
        self._work_kind(stored, key, job, batch)
        s.staged_jobs.append([stored.seq, job["queue"], job.get("file", key), stored.cause])
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
        s.staged_platform.append([stored.seq, "cluster", "cluster", stored.cause])
        self._open_version(KIND_CLUSTER, "cluster", stored, cluster, batch)

    def _policy_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        policy = d["policy"]
        s.staged_changes.append([stored.seq, "policy", "policy", None, dict_diff(s.policy, policy)])
        if s.staged_signed_base is None:
            s.staged_signed_base = bool(s.policy.get("require_signed_approval"))
        if s.staged_member_rule_base is None:
            s.staged_member_rule_base = bool(s.policy.get("require_member_for_jobs"))
        s.policy = policy
        self._open_version(KIND_POLICY, "policy", stored, policy, batch)

    def _node_registered(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        node = d["node"]
        name = node["name"]
        s.staged_platform.append([stored.seq, "node", name, stored.cause])
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
        holders = self.checks.jobs_on(name)
        if s.nodes[name].dedicated:
            self._node_jobs[name] = holders
        else:
            self._node_jobs.pop(name, None)
        for job_key in sorted(holders):
            job = s.jobs.get(job_key)
            if job is not None:
                self.checks.placement(job_key, job, [name], stored, self._time, batch)

    def _node_removed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.state.staged_platform.append([stored.seq, "node", d["node"], stored.cause])
        self.state.nodes.pop(d["node"], None)
        self._close_version(KIND_NODE, d["node"], stored, batch)

    def _node_state_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        node = s.nodes.get(d["node"])
        if node is None:
            return
        s.staged_platform.append([stored.seq, "node", d["node"], stored.cause])
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

    def _stage_teams(self) -> None:
        """Remember the teams before the commit being read changes any of them."""
        s = self.state
        if s.staged_teams_base is None:
            s.staged_teams_base = sorted(_teams(s))

    def _queue_configured(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self._stage_teams()
        s = self.state
        queue = d["queue"]
        name = queue["name"]
        old = s.queues.get(name)
        info = QueueInfo(
            team=queue.get("team") or name,
            cohort=queue.get("cohort"),
            quotas=quotas_of(queue),
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
        self._stage_teams()
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
        self._stage_teams()
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

    def _members_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        team = d["team"]
        old = s.members.get(team, [])
        s.staged_members_base.setdefault(team, old)
        added = sorted(set(d["members"]) - set(old))
        removed = sorted(set(old) - set(d["members"]))
        summary = ", ".join(
            [f"member {m} added" for m in added] + [f"member {m} removed" for m in removed]
        )
        s.staged_changes.append([stored.seq, "members", team, team, summary])
        if d["members"]:
            s.members[team] = list(d["members"])
        else:
            s.members.pop(team, None)

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
        platform_staged, s.staged_platform = s.staged_platform, []
        members_base, s.staged_members_base = s.staged_members_base, {}
        jobs_staged, s.staged_jobs = s.staged_jobs, []
        member_rule_base, s.staged_member_rule_base = s.staged_member_rule_base, None
        if member_rule_base or s.policy.get("require_member_for_jobs"):
            jobs: dict[str, list[tuple[int, str]]] = {}
            for seq, queue, file, cause in jobs_staged:
                if cause == commit["sha"]:
                    info = s.queues.get(queue)
                    jobs.setdefault(info.team if info else queue, []).append((seq, file))
            if jobs:
                self.checks.membership(
                    stored,
                    commit,
                    jobs,
                    records,
                    {**s.owners, **owners_base},
                    {**s.members, **members_base},
                    bool(signed_base) or bool(s.policy.get("require_signed_approval")),
                    self._time,
                    batch,
                )
        s.effects_of = [commit["sha"], stored.seq] if staged else None
        for seq, kind, target, team, summary in staged:
            batch.changes.append((s.next_change, stored.seq, seq, kind, target, team, summary))
            s.next_change += 1
        governed = [c for c in staged if c[1] in ("queue", "owners", "members")]
        # The platform's own changes (the reconciler's `commit_platform_changes`): the
        # cluster, nodes and Policy this commit changed, and each team it removed.
        mine = [p for p in platform_staged if p[3] == commit["sha"]]
        existing = _teams(s)
        teams_base, s.staged_teams_base = s.staged_teams_base, None
        before = set(teams_base) if teams_base is not None else existing
        if existing - before:
            self.checks.namespaces(stored, commit, sorted(existing - before), self._time, batch)
        platform = [[c[0], "policy", c[2], PLATFORM, c[4]] for c in staged if c[1] == "policy"] + [
            [p[0], p[1], p[2], PLATFORM, ""] for p in mine
        ]
        platform += [
            [c[0], "team", c[3], PLATFORM, ""] for c in governed if c[3] in before - existing
        ]
        if {**s.owners, **owners_base}.get(PLATFORM):
            governed += platform  # (no platform owners at the base: bootstrap, nobody to ask)
        if not governed:
            return
        self.checks.approvals(
            stored, commit, governed, records, owners_base, signed_base, self._time, batch
        )

    def _commit_rejected(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        s = self.state
        batch.commits.append(self._commit_row(stored, d["commit"], False, len(d.get("errors", ()))))
        s.staged_changes = []
        s.staged_approvals = []
        s.staged_owners_base = {}
        s.staged_signed_base = None
        s.staged_platform = []
        s.staged_members_base = {}
        s.staged_jobs = []
        s.staged_member_rule_base = None
        s.staged_teams_base = None
        s.effects_of = None

    def _solve_completed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        self.usage.solve(stored.seq, self._time, batch)
        admitted, self.state.strict_admitted = self.state.strict_admitted, []
        if admitted:
            self.checks.strict_fifo(stored, admitted, self._time, batch)

    def _not_projected(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        return None

    # -- inference services: their replicas are jobs (engine/services.py) --

    def _stage_service(self, stored: Envelope, spec: dict[str, Any]) -> None:
        """A commit's change of a service is a change of its team's work, judged by
        approval.requireMemberForJobs like a job's (reconciler `changed_work_files`)."""
        file = spec.get("file") or f"{spec['team']}/{spec['name']}"
        self.state.staged_jobs.append([stored.seq, spec["queue"], file, stored.cause])

    def _service_submitted(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        spec = d["service"]
        key = f"{spec['team']}/{spec['name']}"
        self.state.services[key] = {"spec": spec, "user": person(stored.actor), "replicas": []}
        self._stage_service(stored, spec)

    def _service_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        spec = d["service"]
        key = f"{spec['team']}/{spec['name']}"
        known = self.state.services.get(key)
        if known is None:
            self._service_submitted(stored, d, batch)
            return
        known["spec"] = spec
        self._stage_service(stored, spec)
        self._replica_jobs(key, stored)

    def _service_withdrawn(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        known = self.state.services.pop(d["service"], None)
        if known is None:
            return
        spec = known["spec"]
        self._stage_service(stored, spec)
        for index in known["replicas"]:
            key = f"{spec['queue']}/{spec['name']}.{index}"
            self._job_gone(key, END_WITHDRAWN, f"withdrawn in {stored.cause[:12]}", stored, batch)

    def _service_replicas_changed(self, stored: Envelope, d: dict[str, Any], batch: Batch) -> None:
        known = self.state.services.get(d["service"])
        if known is None:
            return
        spec = known["spec"]
        removed = set(d.get("removed", ()))
        for index in sorted(removed):
            key = f"{spec['queue']}/{spec['name']}.{index}"
            self._job_gone(key, END_WITHDRAWN, f"replica removed: {d['reason']}", stored, batch)
        kept = [i for i in known["replicas"] if i not in removed]
        known["replicas"] = sorted(kept + [int(r["index"]) for r in d.get("added", ())])
        for r in d.get("added", ()):
            # `audit usage --by kind`: a replica's GPU-hours are its service's kind of work
            key = f"{spec['queue']}/{spec['name']}.{int(r['index'])}"
            if f"{KIND_WORK}\x1f{key}" not in self.state.versions:
                self._open_version(KIND_WORK, key, stored, {"kind": SERVICE_KIND}, batch)
        self._replica_jobs(d["service"], stored, {int(r["index"]) for r in d.get("added", ())})

    def _replica_jobs(self, service: str, stored: Envelope, new: set[int] | None = None) -> None:
        """The service's replicas as jobs: the first `min` non-preemptible (engine.services)."""
        known = self.state.services[service]
        spec = known["spec"]
        for rank, index in enumerate(known["replicas"]):
            key = f"{spec['queue']}/{spec['name']}.{index}"
            old = self.state.jobs.get(key)
            if old is None and (new is None or index not in new):
                continue  # ended in the cluster: gone from the view with its end
            job = {
                **spec,
                "name": f"{spec['name']}.{index}",
                "preemptible": rank >= int(spec["min_replicas"]),
                "isolation": "shared",
                "time_limit_minutes": None,
            }
            info = self._job_info(
                stored, job, known["user"], old.waiting_since if old else self._time
            )
            if old is not None:
                info.seq = old.seq
            self.state.jobs[key] = info


def _teams(s: ProjectionState) -> set[str]:
    """The teams that exist: those with a queue or OWNERS (`gitsched.policies.approval.teams_of`)."""
    return ({q.team for q in s.queues.values()} | set(s.owners)) - {PLATFORM}
