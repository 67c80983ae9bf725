"""The Prometheus series `gitsched serve` exports on /metrics.

The counters of what went into the log are read from the log itself, from the seq at
which this replica began to lead: whatever appended them (a commit, a solve after a pod
finished, an observation of the cluster), /metrics says what the log says.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gitsched.cluster.autoscaler import AutoscalerStatus
from gitsched.cluster.controller import ACTOR as CLUSTER_ACTOR
from gitsched.cluster.controller import StepReport
from gitsched.engine import events as ev
from gitsched.engine.model import Job
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode
from gitsched.render import services_view


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "gitsched_events_appended",
            "Events appended to the log while this replica led, by who made them: the"
            " cluster's observations, or the reconciler (commits and solves)",
            ["source"],
            registry=r,
        )
        self.solve_seconds = Histogram(
            "gitsched_solve_seconds",
            "Seconds one placement solve took: one per SolveCompleted in the log",
            registry=r,
        )
        self.pending = Gauge(
            "gitsched_jobs_pending", "Jobs waiting, per queue", ["queue"], registry=r
        )
        self.gpu_ratio = Gauge(
            "gitsched_gpu_allocation_ratio",
            "Allocated GPUs / GPUs on schedulable nodes",
            registry=r,
        )
        self.commit_to_bound = Histogram(
            "gitsched_commit_to_bound_seconds",
            "From a job's commit to the moment its whole gang was bound",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
            registry=r,
        )
        self.pods = Counter("gitsched_pods", "Pod actions", ["action"], registry=r)
        self.leader = Gauge("gitsched_leader", "1 while this replica holds the Lease", registry=r)
        self.source_ready = Gauge(
            "gitsched_source_ready",
            "1 once the followed branch has a commit (as the leader last looked); 0 while it"
            " waits for the branch's first commit",
            ["branch"],
            registry=r,
        )
        self.passes = Counter(
            "gitsched_passes",
            "Passes (observe, decide, act) this replica ran as leader, by what started them",
            ["trigger"],
            registry=r,
        )
        self.webhooks = Counter(
            "gitsched_webhook_deliveries",
            "Webhook deliveries, by what was done with them",
            ["result"],
            registry=r,
        )
        # Waits, as Kueue's kueue_local_queue_admission_wait_time_seconds: from when a job
        # began waiting (its commit, the end of its retry backoff, its preemption) to the
        # decision that admitted it, in the log's own times. Per queue: pending jobs above
        # (gitsched_jobs_pending) and the GPUs backfill reservations hold
        # (gitsched_reserved_gpus).
        self.admission_wait = Histogram(
            "gitsched_admission_wait_seconds",
            "From a job's start of waiting to its admission, by queue and priority class",
            ["queue", "priority_class"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
            registry=r,
        )
        self.reserved = Gauge(
            "gitsched_reserved_gpus",
            "GPUs held by backfill reservations for a queue's waiting jobs (docs/time.md)",
            ["queue"],
            registry=r,
        )
        # The autoscaler's series (cluster/autoscaler.py), from its first poll on: a serve
        # without --prometheus-url has none, rather than an autoscaler that looks down.
        self._autoscaler: _AutoscalerSeries | None = None
        self._autoscaler_seen: dict[str, int] = {}
        self.service_replicas = Gauge(
            "gitsched_service_replicas",
            "Replicas of an inference service (docs/services.md), by state: desired, current"
            " (replicas it has), running (the cluster reports them running), pending, min, max",
            ["service", "state"],
            registry=r,
        )
        self._services: set[str] = set()
        self._waits = AdmissionWaits()
        # The log's events up to this seq are counted (None: not leading, nothing to count).
        self.counted_seq: int | None = None

    def record_autoscaler(self, status: AutoscalerStatus) -> None:
        """The autoscaler's status after a poll (its counts are totals: add what is new)."""
        if self._autoscaler is None:
            self._autoscaler = _AutoscalerSeries(self.registry)
        series = self._autoscaler
        series.up.set(1 if status.up else 0)
        for reason, n in sorted(status.failures.items()):
            new = n - self._autoscaler_seen.get(reason, 0)
            if new > 0:
                series.failures.labels(reason).inc(new)
            self._autoscaler_seen[reason] = n
        ignored = status.ignored - self._autoscaler_seen.get("", 0)
        if ignored > 0:
            series.ignored.inc(ignored)
        self._autoscaler_seen[""] = status.ignored
        if status.last_success_at is not None:
            series.last_success.set(status.last_success_at)

    def count_from(self, seq: int) -> None:
        """This replica leads from here: the events after `seq` are its own."""
        self.counted_seq = seq

    def count_log(self, event_log: EventLog, until_seq: int) -> None:
        """Count the log's events appended since the last count, up to `until_seq`."""
        if self.counted_seq is None or until_seq <= self.counted_seq:
            return
        for stored in event_log.read(self.counted_seq, until_seq=until_seq):
            source = "cluster" if stored.actor == CLUSTER_ACTOR else "reconciler"
            self.events.labels(source).inc()
            if stored.type == ev.SolveCompleted.type:
                solve = decode(stored)
                assert isinstance(solve, ev.SolveCompleted)
                self.solve_seconds.observe(solve.seconds)
            self.counted_seq = stored.seq

    def record(self, report: StepReport, now: datetime) -> None:
        a = report.actuation
        self.pods.labels("created").inc(a.created)
        self.pods.labels("bound").inc(a.bound)
        self.pods.labels("deleted").inc(a.deleted)
        state = report.state
        for key in a.gangs_bound:
            submitted = _parse(state.jobs[key].submitted_at) if key in state.jobs else None
            if submitted is not None:
                self.commit_to_bound.observe(max(0.0, (now - submitted).total_seconds()))
        pending: dict[str, int] = {q: 0 for q in state.queues}
        for key in state.pending:
            job = state.jobs.get(key)
            if job is not None:
                pending[job.queue] = pending.get(job.queue, 0) + 1
        for queue, n in pending.items():
            self.pending.labels(queue).set(n)
        for job, wait in self._waits.admitted(state):
            self.admission_wait.labels(job.queue, job.priority_class).observe(wait)
        reserved: dict[str, float] = {q: 0.0 for q in state.queues}
        for r in state.reservations:
            owner = state.jobs.get(r.job)
            if owner is not None:
                reserved[owner.queue] = reserved.get(owner.queue, 0.0) + r.gpu_milli / 1000
        for queue, gpus in reserved.items():
            self.reserved.labels(queue).set(gpus)
        self.record_services(state)
        total = sum(n.gpus for n in state.nodes.values() if n.schedulable) * 1000
        used = sum(p.gpu_milli for p in state.placements.values())
        self.gpu_ratio.set(used / total if total else 0.0)

    def record_services(self, state: ClusterState) -> None:
        """gitsched_service_replicas for every service; a withdrawn service's series go."""
        now: set[str] = set()
        for view in services_view(state):
            now.add(view["service"])
            for word in SERVICE_STATES:
                self.service_replicas.labels(view["service"], word).set(view[word])
        for gone in sorted(self._services - now):
            for word in SERVICE_STATES:
                self.service_replicas.remove(gone, word)
        self._services = now


SERVICE_STATES = ("desired", "current", "running", "pending", "min", "max")


class _AutoscalerSeries:
    """Is Prometheus answering the autoscaler, and if not, why (docs/autoscaling.md)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.up = Gauge(
            "gitsched_autoscaler_up",
            "1 when Prometheus answered every service's query in the autoscaler's last poll;"
            " 0 while it is down, slow or answers garbage (every service keeps its count)",
            registry=r,
        )
        self.failures = Counter(
            "gitsched_autoscaler_query_failures",
            "Queries to Prometheus that gave no value, by why (PrometheusUnavailable,"
            " PrometheusAnswerInvalid, MetricMissing)",
            ["reason"],
            registry=r,
        )
        self.ignored = Counter(
            "gitsched_autoscaler_ignored_answers",
            "Answers ignored because the metric was NaN, infinite or negative",
            registry=r,
        )
        self.last_success = Gauge(
            "gitsched_autoscaler_last_success_timestamp_seconds",
            "Prometheus' time of the last usable answer",
            registry=r,
        )


def _parse(text: str) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


class AdmissionWaits:
    """Which jobs each pass admitted, and how long each waited, from the folded state: a
    placement not seen before is an admission (a new time on a running job is a move);
    a job waits from its commit, from the end of its retry backoff, or, preempted, from
    the latest time the log told when it was seen waiting. The first pass only learns
    what runs (admitted before this process started)."""

    def __init__(self) -> None:
        self._running: dict[str, str] | None = None  # job -> its placement's time
        # waiting job -> (when it began waiting, its retry attempt then)
        self._since: dict[str, tuple[str, int]] = {}

    def admitted(self, state: ClusterState) -> list[tuple[Job, float]]:
        out: list[tuple[Job, float]] = []
        before = self._running
        running = {key: p.started_at for key, p in state.placements.items()}
        for key, at in sorted(running.items()):
            job = state.jobs.get(key)
            if before is None or job is None or key in before:
                continue  # known, or moved (a move is no admission)
            known = self._since.get(key)
            since = _parse(known[0] if known else _waiting_since(state, key))
            start = _parse(at)
            if since is not None and start is not None:
                out.append((job, max(0.0, (start - since).total_seconds())))
        clock = datetime.fromtimestamp(state.clock, UTC).isoformat()
        waiting: dict[str, tuple[str, int]] = {}
        for key in state.jobs:
            if key in running:
                continue
            retry = state.retries.get(key)
            attempt = retry.attempt if retry is not None else 0
            known = self._since.get(key)
            if known is not None and known[1] == attempt:
                waiting[key] = known  # still waiting since then
            elif retry is not None and (known is not None or before is None or key in before):
                waiting[key] = (retry.ready_at, attempt)  # requeued after a failure
            elif before is not None and key in before:
                waiting[key] = (clock, attempt)  # preempted
            else:
                waiting[key] = (_waiting_since(state, key), attempt)
        self._running, self._since = running, waiting
        return out


def _waiting_since(state: ClusterState, key: str) -> str:
    attempt = state.retries.get(key)
    if attempt is not None:
        return attempt.ready_at
    job = state.jobs.get(key)
    return job.submitted_at if job is not None else ""
