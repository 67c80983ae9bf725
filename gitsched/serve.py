"""`gitsched serve REPO`: the daemon that runs a Kubernetes cluster from the git repo.

Polls the repo (reconciler), observes and acts on the cluster (cluster.Controller),
holds a coordination.k8s.io Lease so only one replica acts, and serves /healthz,
/readyz and Prometheus /metrics. A signed push webhook (POST /webhook) starts a pass
at once instead of at the next poll; the poll stays, so a lost delivery only costs
time. SIGTERM stops it cleanly (the Lease is given back); SIGKILL loses nothing,
because every pass starts from the log and the cluster.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import click
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from cluster.api import KubeApi
from cluster.controller import Controller, StepReport
from cluster.inventory import InventoryConfig
from cluster.lease import LeaderElector
from engine.errors import TemporaryError
from engine.model import Job
from engine.state import ClusterState
from eventlog import open_log
from eventlog.base import EventLog, LogUnavailable
from gitsched.config import resolve_log_url
from gitsched.options import log_option, repo_of, repo_path, user_errors
from reconciler.git import GitRepo
from reconciler.loop import Reconciler

log = logging.getLogger("gitsched.serve")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "gitsched_events_appended",
            "Events appended to the log by this daemon",
            ["source"],
            registry=r,
        )
        self.solve_seconds = Histogram(
            "gitsched_solve_seconds", "Seconds one placement solve took", registry=r
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
        # (gitsched_jobs_pending); reserved GPUs per queue come with the backfill
        # reservations (issue 30 item 2) as gitsched_reserved_gpus{queue}, set in `record`.
        self.admission_wait = Histogram(
            "gitsched_admission_wait_seconds",
            "From a job's start of waiting to its admission, by queue and priority class",
            ["queue", "priority_class"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
            registry=r,
        )
        self._waits = AdmissionWaits()

    def record(self, report: StepReport, now: datetime) -> None:
        self.events.labels("cluster").inc(len(report.observed))
        rec = report.reconcile
        if rec is not None:
            self.events.labels("reconciler").inc(rec.events_appended)
            if rec.plan is not None:
                self.solve_seconds.observe(rec.plan.stats.seconds)
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
        total = sum(n.gpus for n in state.nodes.values() if n.schedulable) * 1000
        used = sum(p.gpu_milli for p in state.placements.values())
        self.gpu_ratio.set(used / total if total else 0.0)


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


def _parse(text: str) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


# A push's commit may reach the daemon's clone after the push's delivery (git-sync polls
# on its own period): look for it this often, for this long, before leaving it to the poll.
PUSH_LOOK_S = 0.2
PUSH_WAIT_S = 60.0
MAX_WEBHOOK_BYTES = (
    5 * 1024 * 1024
)  # GitHub caps its payloads at 25 MB; a push of one branch is far less
NO_COMMIT = "0" * 40  # the `after` of a push that deleted the branch


class Webhook:
    """Push deliveries from a git host (GitHub, Gitea, Forgejo, GitLab's compatible mode),
    signed with a shared secret: HMAC-SHA256 of the body, in `X-Hub-Signature-256`
    (`sha256=<hex>`) or Gitea's `X-Gitea-Signature` (`<hex>`)."""

    def __init__(self, secret: bytes, branch: str) -> None:
        if not secret:
            raise click.UsageError("the webhook secret is empty")
        self.secret = secret
        self.ref = f"refs/heads/{branch}"

    def signed(self, body: bytes, headers: Any) -> bool:
        sent = (headers.get("X-Hub-Signature-256") or "").strip()
        if sent:
            algorithm, _, sent = sent.partition("=")
            if algorithm != "sha256":
                return False
        else:
            sent = (headers.get("X-Gitea-Signature") or "").strip()
        expected = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        return bool(sent) and hmac.compare_digest(expected, sent.lower())

    def push(self, event: str, body: bytes, content_type: str) -> tuple[int, str, str | None]:
        """What a signed delivery asks for: (HTTP status, reply, the pushed commit to
        reconcile, or None when the delivery asks for nothing)."""
        if event == "ping":
            return 200, "pong", None
        if event not in ("push", ""):
            return 202, f"ignored: {event} is not a push", None
        try:
            # GitHub's other content type: the JSON in a form field `payload`.
            form = parse_qs(body.decode()) if "form-urlencoded" in content_type else {}
            payload = json.loads(form["payload"][0] if "payload" in form else body)
        except (UnicodeDecodeError, ValueError):
            return 400, "the payload is not JSON", None
        if not isinstance(payload, dict) or not isinstance(payload.get("ref"), str):
            return 400, "the payload names no ref", None
        if payload["ref"] != self.ref:
            return 202, f"ignored: a push to {payload['ref']}, not {self.ref}", None
        after = payload.get("after")
        return 202, "reconciling", after if isinstance(after, str) else ""


class Daemon:
    def __init__(
        self,
        repo: GitRepo,
        event_log: EventLog,
        api: KubeApi,
        *,
        branch: str,
        solver: str | None,
        inventory: InventoryConfig | None,
        elector: LeaderElector | None,
        poll_s: float,
        grace_period_s: int,
        create_namespaces: bool = False,
        webhook: Webhook | None = None,
    ) -> None:
        self.repo, self.event_log, self.api = repo, event_log, api
        self.webhook = webhook
        self.branch, self.solver, self.inventory = branch, solver, inventory
        self.elector = elector
        self.poll_s = poll_s
        self.grace_period_s = grace_period_s
        self.create_namespaces = create_namespaces
        self.metrics = Metrics()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.controller: Controller | None = None
        self.last_tick = time.monotonic()
        self.ready = False
        # The newest pushed commit not yet seen on the branch, and until when to look for it.
        self._push_lock = threading.Lock()
        self._pushed: tuple[str, float] | None = None

    def _new_controller(self) -> Controller:
        reconciler = Reconciler(self.repo, self.event_log, branch=self.branch, solver=self.solver)
        return Controller(
            self.api,
            self.event_log,
            reconciler,
            inventory=self.inventory,
            grace_period_s=self.grace_period_s,
            create_namespaces=self.create_namespaces,
            wake=self.wake,
        )

    def pushed(self, sha: str) -> None:
        """A verified push to the branch: pass now, and again as soon as its commit is here."""
        with self._push_lock:
            self._pushed = (sha, time.monotonic() + PUSH_WAIT_S)
        self.wake.set()

    def _push_trigger(self) -> bool | None:
        """True: a push's commit is on the branch now, so this pass reads it; None: one is
        awaited (look again soon); False: none."""
        with self._push_lock:
            if self._pushed is None:
                return False
            sha, until = self._pushed
        if sha in ("", NO_COMMIT) or self.repo.is_ancestor(sha, self.branch):
            arrived = True
        elif time.monotonic() > until:
            log.warning(
                "pushed commit %s not on %s after %.0fs; the poll goes on",
                sha,
                self.branch,
                PUSH_WAIT_S,
            )
            arrived = False
        else:
            return None
        with self._push_lock:
            if self._pushed == (sha, until):  # not replaced by a newer push meanwhile
                self._pushed = None
        return arrived

    def run(self) -> None:
        backoff = 1.0
        woken = False
        while not self.stopping.is_set():
            self.last_tick = time.monotonic()
            push = self._push_trigger()
            trigger = "webhook" if push else "watch" if woken else "poll"
            try:
                if self._tick():
                    self.metrics.passes.labels(trigger).inc()
                backoff = 1.0
            except (TemporaryError, LogUnavailable, TimeoutError) as e:
                log.warning("%s; retrying in %.0fs", e, backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            woken = self.wake.wait(PUSH_LOOK_S if push is None else self.poll_s)
            self.wake.clear()
            self.stopping.wait(0.05)  # a burst of watch events makes one pass, not one each
        self.shutdown()

    def _tick(self) -> bool:
        """One pass if this replica leads: whether it ran."""
        leader = self.elector.try_acquire_or_renew() if self.elector else True
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            if self.controller is not None:
                log.warning("lost the lease: stopping to act")
                self.controller.stop()
                self.controller = None
            # A standby that reaches the API server is ready to take over.
            self.ready = self.elector is not None and self.elector.reached_api
            return False
        if self.controller is None:
            log.info("holding the lease: acting on the cluster")
            controller = self._new_controller()
            try:
                controller.start()
            except BaseException:
                controller.stop()  # its watch threads must not outlive a failed start
                raise
            self.controller = controller
        self.ready = True
        report = self.controller.step()
        self.metrics.record(report, datetime.now(UTC))
        return True

    def shutdown(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        if self.elector is not None:
            self.elector.release()
        self.metrics.leader.set(0)


def _http(daemon: Daemon, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                alive = time.monotonic() - daemon.last_tick < max(60.0, 10 * daemon.poll_s)
                self._reply(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
            elif self.path == "/readyz":
                self._reply(
                    200 if daemon.ready else 503, b"ok\n" if daemon.ready else b"not ready\n"
                )
            elif self.path == "/metrics":
                self._reply(200, generate_latest(daemon.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n")

        def do_POST(self) -> None:
            if self.path != "/webhook":
                self._reply(404, b"not found\n")
                return
            hook = daemon.webhook
            if hook is None:
                self._reply(404, b"no webhook: start gitsched serve with a webhook secret\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_WEBHOOK_BYTES:
                daemon.metrics.webhooks.labels("too_large").inc()
                self._reply(413, b"payload too large\n")
                return
            body = self.rfile.read(length)
            if not hook.signed(body, self.headers):
                daemon.metrics.webhooks.labels("rejected").inc()
                log.warning(
                    "webhook: a delivery without a valid signature, from %s", self.client_address[0]
                )
                self._reply(401, b"missing or invalid signature\n")
                return
            event = self.headers.get("X-GitHub-Event") or self.headers.get("X-Gitea-Event") or ""
            status, message, sha = hook.push(
                event, body, self.headers.get("Content-Type") or "application/json"
            )
            if sha is not None:
                log.info("webhook: push of %s to %s: passing now", sha or "?", hook.ref)
                daemon.pushed(sha)
            daemon.metrics.webhooks.labels(
                "accepted" if sha is not None else "ignored" if status < 300 else "invalid"
            ).inc()
            self._reply(status, message.encode() + b"\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def _webhook(secret_file: str | None, branch: str) -> Webhook | None:
    """The webhook, if a secret is given: from the file, else GITSCHED_WEBHOOK_SECRET."""
    if secret_file:
        secret = Path(secret_file).read_bytes().strip()
    else:
        secret = os.environ.get("GITSCHED_WEBHOOK_SECRET", "").strip().encode()
        if not secret:
            return None
    return Webhook(secret, branch)


@click.command()
@repo_path
@click.option("--branch", default="main", show_default=True, help="Branch to follow.")
@log_option
@click.option(
    "--kubeconfig",
    envvar="GITSCHED_KUBECONFIG",
    show_envvar=True,
    help="kubeconfig file [default: in-cluster service account, else ~/.kube/config]",
)
@click.option(
    "--inventory",
    type=click.Choice(["kubernetes", "git"]),
    default="kubernetes",
    show_default=True,
    help="Where nodes come from: the API's Node objects, or the repo's inventory/ alone.",
)
@click.option("--node-selector", default="", help="Only nodes with this label (key or key=value).")
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    envvar="GITSCHED_LISTEN",
    help="host:port for /healthz, /readyz and /metrics.",
)
@click.option("--poll-seconds", default=1.0, show_default=True, help="Longest wait between passes.")
@click.option(
    "--grace-period-seconds", default=30, show_default=True, help="For deleting preempted pods."
)
@click.option(
    "--lease-namespace",
    envvar="POD_NAMESPACE",
    default="default",
    show_default=True,
    help="Namespace of the leader election Lease.",
)
@click.option("--lease-name", default="gitsched", show_default=True)
@click.option("--lease-seconds", default=15, show_default=True, help="Lease duration.")
@click.option("--identity", help="This replica's name in the Lease [default: hostname-pid].")
@click.option("--no-leader-election", is_flag=True, help="Act without a Lease (one replica only).")
@click.option(
    "--create-namespaces",
    is_flag=True,
    help="Create a team's namespace when missing (needs RBAC to create namespaces).",
)
@click.option("--solver", help="Override the Policy's solver (greedy, highs, cbc).")
@click.option(
    "--webhook-secret-file",
    envvar="GITSCHED_WEBHOOK_SECRET_FILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Serve POST /webhook for the git host's push deliveries, signed with the secret in this"
    " file (HMAC-SHA256, X-Hub-Signature-256). Or put the secret itself in GITSCHED_WEBHOOK_SECRET."
    " Without either, /webhook answers 404 and only the poll finds new commits.",
)
def serve(
    path: str | None,
    repo_opt: str | None,
    branch: str,
    log_url: str | None,
    kubeconfig: str | None,
    inventory: str,
    node_selector: str,
    listen: str,
    poll_seconds: float,
    grace_period_seconds: int,
    lease_namespace: str,
    lease_name: str,
    lease_seconds: int,
    identity: str | None,
    no_leader_election: bool,
    create_namespaces: bool,
    solver: str | None,
    webhook_secret_file: str | None,
) -> None:
    """Run the cluster from the repo: place every commit's jobs and make their pods run.

    Pods are created gated in the team's namespace, bound to the decided nodes once
    the whole gang exists, and deleted when preempted; pod phases and node health
    go into the log. A signed push webhook starts a pass at once. Stop with SIGTERM.
    """
    path = repo_of(path, repo_opt)
    url = resolve_log_url(log_url, path)
    host, _, port = listen.rpartition(":")
    with user_errors():
        repo = GitRepo(path)
        webhook = _webhook(webhook_secret_file, branch)
        api = KubeApi.connect(kubeconfig)
        me = identity or f"{socket.gethostname()}-{os.getpid()}"
        elector = (
            None
            if no_leader_election
            else LeaderElector(api, lease_namespace, lease_name, me, lease_duration_s=lease_seconds)
        )
        with open_log(url) as event_log:
            daemon = Daemon(
                repo,
                event_log,
                api,
                branch=branch,
                solver=solver,
                inventory=InventoryConfig(node_selector=node_selector)
                if inventory == "kubernetes"
                else None,
                elector=elector,
                poll_s=poll_seconds,
                grace_period_s=grace_period_seconds,
                create_namespaces=create_namespaces,
                webhook=webhook,
            )

            def stop(signum: int, frame: object) -> None:
                daemon.stopping.set()
                daemon.wake.set()

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            server = _http(daemon, host or "127.0.0.1", int(port))
            click.echo(f"gitsched serve: {me}, /metrics on {listen}", err=True)
            try:
                daemon.run()
            finally:
                server.shutdown()
