"""The engine's own fold, run by the audit views: rows for `audit fairshare` and `audit solves`.

Fair share is what the solver weighed: the usage `gitsched.engine.state.evolve` keeps, decayed by
`gitsched.engine.fairshare`. Rather than re-derive it, the view folds every event through the
engine and writes a row whenever an input of fair share changes (a queue's usage,
weight, cohort or idle jobs; the cluster's capacity or the policy's half-life), and one
whenever the fold's clock moves, so a query reads the inputs at any time by index seeks.
The engine's state is saved with the view's offset (`gitsched.engine.snapshot`), so a catch-up
folds only the new events.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.service_rows import ServiceRows
from gitsched.audit.projection.state import Envelope, ProjectionError
from gitsched.engine.codec import from_data
from gitsched.engine.events import EVENT_TYPES, SolveCompleted
from gitsched.engine.fairshare import QueueUsage, capacity_gpus
from gitsched.engine.snapshot import SnapshotDecodeError, decode_state, encode_state
from gitsched.engine.state import ClusterState, evolve

_sorted_encoder = msgspec.msgpack.Encoder(order="sorted")


@dataclass(frozen=True, slots=True)
class QueueInputs:
    """What fair share reads of one queue: its config, its usage and its idle jobs."""

    cohort: str | None
    weight: float
    usage: QueueUsage
    idle_jobs: int


def _queue_of_key(job: str) -> str:
    """The queue fair share counts an idle job in: its key's first part ("queue/name")."""
    return job.partition("/")[0]


def queue_inputs(state: ClusterState) -> dict[str, QueueInputs]:
    """Every queue's fair-share inputs in `state`."""
    idle: dict[str, int] = {}
    for key in state.idle:
        queue = _queue_of_key(key)
        idle[queue] = idle.get(queue, 0) + 1
    empty = QueueUsage()
    return {
        name: QueueInputs(q.cohort, q.weight, state.usage.get(name, empty), idle.get(name, 0))
        for name, q in state.queues.items()
    }


def _idle_jobs(state: ClusterState, queue: str) -> int:
    return sum(1 for key in state.idle if _queue_of_key(key) == queue)


def global_inputs(state: ClusterState) -> tuple[float, int]:
    """(the policy's usage half-life in hours, the schedulable GPUs)."""
    return state.policy.usage_half_life_hours, capacity_gpus(state.nodes)


def queue_row(seq: int, name: str, q: QueueInputs | None) -> tuple[Any, ...]:
    """A `fairshare_queues` row: `q` from `seq` on; None: the queue is gone."""
    if q is None:
        return (name, seq, 0, None, 0.0, 0.0, 0.0, 0, 0)
    u = q.usage
    return (
        name,
        seq,
        1,
        q.cohort,
        q.weight,
        u.gpu_seconds,
        u.as_of,
        u.running_gpu_milli,
        q.idle_jobs,
    )


class ClusterFold:
    """`gitsched.engine.state.evolve` over the log, in log order, writing fair-share and solve rows."""

    def __init__(self, saved: str = "") -> None:
        try:
            self.state = decode_state(base64.b64decode(saved)) if saved else ClusterState()
        except (SnapshotDecodeError, ValueError) as e:
            raise ProjectionError(f"the view's saved cluster state cannot be read: {e}") from e
        self._queues = queue_inputs(self.state)
        self._globals = global_inputs(self.state) if saved else None
        self._services = ServiceRows(self.state)

    def save(self) -> str:
        """The state as text, the same bytes in every process: the snapshot's maps follow
        the persistent maps' order, which follows str hashes, salted per process; sorted
        here, so a view built in steps equals one rebuilt from 0, byte for byte."""
        canonical = _sorted_encoder.encode(msgspec.msgpack.decode(encode_state(self.state)))
        return base64.b64encode(canonical).decode("ascii")

    def convert(self, stored: Envelope, data: dict[str, Any], batch: Batch) -> None:
        """Fold one event (its `data` upcast to the version this gitsched reads)."""
        self.fold(stored.seq, stored.type, stored.time, stored.cause, data, batch)

    def replay(self, batch: Batch) -> None:
        """Fold the events a `DeferredClusterFold` put in `batch` (in a rebuild's writer)."""
        for seq, type_, time, cause, data in batch.cluster_events:
            self.fold(seq, type_, time, cause, data, batch)
        batch.cluster_events = []

    def fold(
        self, seq: int, type_: str, time: str, cause: str, data: dict[str, Any], batch: Batch
    ) -> None:
        try:
            event = from_data(EVENT_TYPES[type_], data)
        except (KeyError, TypeError, ValueError) as e:
            raise ProjectionError(f"event {seq} ({type_}) cannot be decoded: {e}") from e
        before = self.state
        after = self.state = evolve(before, event)
        if after.clock != before.clock:
            batch.fairshare_clock.append((after.clock, seq))
        if (
            after.nodes is not before.nodes
            or after.policy is not before.policy
            or (self._globals is None)
        ):
            now = global_inputs(after)
            if now != self._globals:
                self._globals = now
                batch.fairshare_globals.append((seq, *now))
        if after.queues is not before.queues:
            self._changed(seq, queue_inputs(after), batch)
        elif after.usage is not before.usage or after.idle is not before.idle:
            job = getattr(event, "job", None)
            key = job if isinstance(job, str) else getattr(job, "key", None)
            if key is None:
                self._changed(seq, queue_inputs(after), batch)
            else:
                self._job_changed(seq, before, after, key, batch)
        if after.services or before.services:
            self._services.fold(seq, event, before, after, batch.service_counts)
        if type_ == "SolveCompleted":
            assert isinstance(event, SolveCompleted)
            batch.solves.append(
                (
                    seq,
                    time,
                    cause,
                    event.solver,
                    event.status,
                    event.plan_source,
                    event.fallback,
                    event.objective,
                    event.bound,
                    event.gap,
                    event.seconds,
                )
            )

    def _job_changed(
        self, seq: int, before: ClusterState, after: ClusterState, key: str, batch: Batch
    ) -> None:
        """An event about job `key` moved usage or idle flags: only its queue's inputs (the
        engine charges the job's queue, and counts idle jobs by their key's queue) can have
        changed, so only they are compared; comparing every queue cost most of the fold."""
        names = {_queue_of_key(key)}
        for state in (before, after):
            known = state.jobs.get(key)
            if known is not None:
                names.add(known.queue)
        idle_moved = after.idle is not before.idle
        empty = QueueUsage()
        for name in sorted(names):
            config = after.queues.get(name)
            old = self._queues.get(name)
            if config is None or old is None:
                continue  # a queue absent stays absent: its rows change with `queues`
            idle = _idle_jobs(after, name) if idle_moved else old.idle_jobs
            now = QueueInputs(config.cohort, config.weight, after.usage.get(name, empty), idle)
            if now != old:
                self._queues[name] = now
                batch.fairshare_queues.append(queue_row(seq, name, now))

    def _changed(self, seq: int, now: Mapping[str, QueueInputs], batch: Batch) -> None:
        old = self._queues
        for name in sorted(now.keys() | old.keys()):
            q = now.get(name)
            if q != old.get(name):
                batch.fairshare_queues.append(queue_row(seq, name, q))
        self._queues = dict(now)


class DeferredClusterFold:
    """The engine's fold for another process: each event goes into the batch as it was read
    (seq, type, time, cause, upcast payload) for a rebuild's writer to fold with
    `ClusterFold.replay`, so that `evolve` runs on the writer's core, not the folding one."""

    def convert(self, stored: Envelope, data: dict[str, Any], batch: Batch) -> None:
        batch.cluster_events.append((stored.seq, stored.type, stored.time, stored.cause, data))

    def save(self) -> str:
        return ""  # the writer holds the state, and saves it with the last batch
