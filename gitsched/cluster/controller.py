"""One pass of gitsched as a Kubernetes controller: observe, decide, act.

1. What the cluster did since the last pass (nodes, pod phases) becomes events
   in the log, appended with the log's fencing (expected last seq).
2. The reconciler places again if those events ask for it, then applies new commits.
3. The actuator makes the pods match the placements now in the log.

A decision in step 2 that stops running jobs (preempts, moves, times out) is appended
only if the cluster has not meanwhile said those jobs ended: the solve takes time, and a
job whose pods Succeeded during it must be recorded finished, not stopped and run again.

Every step reads the log and the cluster as they are, so a pass that dies half
way is finished by the next one, in this process or in the one after a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gitsched.cluster.actuator import ActuationReport, Actuator
from gitsched.cluster.api import KubeApi, Obj
from gitsched.cluster.informer import Informer, Key, key_of
from gitsched.cluster.inventory import InventoryConfig, node_events
from gitsched.cluster.observer import job_events
from gitsched.cluster.pods import JOB_LABEL, SELECTOR, job_label
from gitsched.engine.events import Event
from gitsched.engine.retries import due_retries, with_requeues
from gitsched.engine.state import ClusterState, fold
from gitsched.eventlog.base import ConcurrencyConflict, DuplicateEvent, EventLog
from gitsched.eventlog.codec import encode
from gitsched.eventlog.replay import Replayed, replay
from gitsched.reconciler.loop import Reconciler, ReconcileReport

log = logging.getLogger("gitsched.cluster")

ACTOR = "kubernetes"
# Past this many jobs to check before stopping them, one LIST of every gitsched pod
# rather than a label selector naming each job.
LISTED_JOBS_MAX = 50


@dataclass
class StepReport:
    observed: list[Event] = field(default_factory=list)
    reconcile: ReconcileReport | None = None
    actuation: ActuationReport = field(default_factory=ActuationReport)
    state: ClusterState = field(default_factory=ClusterState)
    last_seq: int = 0
    decided_at: float = 0.0  # time.monotonic() once the log held this pass's placements


def _clock_now() -> str:
    """The wall clock in the log's time format: only ever asked whether a moment the log
    already fixed (a backoff's end) has come, never written as a decision's time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Controller:
    def __init__(
        self,
        api: KubeApi,
        event_log: EventLog,
        reconciler: Reconciler | None,
        *,
        inventory: InventoryConfig | None = None,
        grace_period_s: int = 30,
        create_namespaces: bool = False,
        wake: threading.Event | None = None,
    ) -> None:
        self.api = api
        self.log = event_log
        self.reconciler = reconciler
        self.inventory = inventory
        self.pods = Informer(api, "pods", SELECTOR, wake=wake)
        self.nodes = Informer(api, "nodes", wake=wake) if inventory is not None else None
        self.actuator = Actuator(
            api, self.pods, grace_period_s=grace_period_s, create_namespaces=create_namespaces
        )
        self._tip: Replayed | None = None
        if reconciler is not None:
            reconciler.check_stopped = self._ended_meanwhile

    def start(self, timeout_s: float = 30.0) -> None:
        """Fill the caches (a first list) and keep them current from then on."""
        informers = [i for i in (self.pods, self.nodes) if i is not None]
        for informer in informers:
            informer.start()
        deadline = time.monotonic() + timeout_s
        for informer in informers:
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"the {informer.kind} cache did not fill within {timeout_s}s")

    def stop(self) -> None:
        for informer in (self.pods, self.nodes):
            if informer is not None:
                informer.stop()

    def step(self) -> StepReport:
        report = StepReport()
        tip = self._tip = replay(self.log, since=self._tip)
        report.observed = self._observe(tip)
        if self.reconciler is not None:
            # Time limits reached by now (docs/time.md): the clock says only when to look.
            self.reconciler.solve_due(datetime.now(UTC).isoformat())
            # A no-op unless what was observed (now or before a crash) asks for a new placement.
            self.reconciler.solve_now(f"{ACTOR}/{self._tip.last_seq}")
            report.reconcile = self.reconciler.run_once()
            if tip.state.cluster is None and report.reconcile.state.cluster is not None:
                # The first cluster.yaml came with this pass: register the nodes now, with
                # its flavors (node_events waits for one), and place on them.
                self._tip = replay(self.log, since=self._tip)
                report.observed += self._observe(self._tip)
                self.reconciler.solve_now(f"{ACTOR}/{self._tip.last_seq}")
        self._tip = replay(self.log, since=self._tip)
        report.state, report.last_seq = self._tip.state, self._tip.last_seq
        report.decided_at = time.monotonic()
        report.actuation = self.actuator.converge(report.state)
        return report

    def observe_only(self) -> list[Event]:
        """Step 1 alone (for a standby that must not act, and for tests)."""
        tip = self._tip = replay(self.log, since=self._tip)
        return self._observe(tip)

    def _ended_meanwhile(self, tip: Replayed, stopping: frozenset[str]) -> str | None:
        """Before the reconciler appends a step that stops `stopping` (decided on `tip`):
        whether any of them ended (or failed, or lost a pod) by what the cluster says now,
        read fresh for those jobs. If so, everything observed now is appended first, at its
        own times, and the cause to place after it is returned: the reconciler decides again
        from the log that holds it. A decision stays a function of the log, and a job that
        finished is not stopped and run again."""
        pods = self._pods_now(stopping)
        if not any(getattr(e, "job", None) in stopping for e in job_events(tip.state, pods)):
            return None
        if not self._observe(tip, pods):  # another writer came first: read what it wrote
            self._tip = replay(self.log, since=tip)
        assert self._tip is not None
        return f"{ACTOR}/{self._tip.last_seq}"

    def _pods_now(self, jobs: frozenset[str]) -> dict[Key, Obj]:
        """The watch's pods, with the pods of `jobs` as a LIST gives them now: the watch may
        lag the server by a moment, and these are jobs about to be stopped."""
        pods = self.pods.snapshot()
        labels = {job_label(job) for job in jobs}
        selector = SELECTOR
        if len(labels) <= LISTED_JOBS_MAX:
            selector += f",{JOB_LABEL} in ({','.join(sorted(labels))})"
        listed = [
            p
            for p in self.api.list("pods", selector).items
            if (p["metadata"].get("labels") or {}).get(JOB_LABEL) in labels
        ]
        pods = {
            k: p
            for k, p in pods.items()
            if (p["metadata"].get("labels") or {}).get(JOB_LABEL) not in labels
        }
        pods.update((key_of(p), p) for p in listed)
        for pod in listed:
            # Into the cache too, so the actuator sees what was decided on: a finished job's
            # pods are kept (for their logs), not taken for running pods to delete.
            self.pods.put(pod)
        return pods

    def _observe(self, tip: Replayed, pods: dict[Key, Obj] | None = None) -> list[Event]:
        events: list[Event] = []
        state = tip.state
        if self.nodes is not None and self.inventory is not None:
            events.extend(node_events(state, self.nodes.snapshot().values(), self.inventory))
            state = fold(events, state)
        # Each failure followed by its requeue (engine/retries.py), judged on the log's times.
        pods = self.pods.snapshot() if pods is None else pods
        events.extend(with_requeues(state, job_events(state, pods)))
        # Moments no other event marks: a backoff that has ended is recorded at its end, so a
        # replay meets the same decision point (the clock only says that it has come).
        events.extend(due_retries(fold(events, state), _clock_now()))
        if not events:
            return []
        # Ids from the log position they were observed at: a retried append of the same
        # observation is recognised, and no two observations share an id.
        batch = [
            encode(e, id=f"{ACTOR}/{tip.last_seq}/{i}", actor=ACTOR, cause=ACTOR)
            for i, e in enumerate(events)
        ]
        try:
            self.log.append(batch, expected_last_seq=tip.last_seq)
        except (ConcurrencyConflict, DuplicateEvent):
            log.info("another writer appended first; observing again next pass")
            return []
        for e in events:
            log.info("cluster: %s %s", e.type, getattr(e, "job", getattr(e, "node", "")))
        self._tip = replay(self.log, since=tip)
        return events
