"""`gitsched serve REPO`: the daemon that runs a Kubernetes cluster from the git repo.

Polls the repo (reconciler), observes and acts on the cluster (cluster.Controller),
holds a coordination.k8s.io Lease so only one replica acts, and serves /healthz,
/readyz and Prometheus /metrics. SIGTERM stops it cleanly (the Lease is given
back); SIGKILL loses nothing, because every pass starts from the log and the cluster.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
        total = sum(n.gpus for n in state.nodes.values() if n.schedulable) * 1000
        used = sum(p.gpu_milli for p in state.placements.values())
        self.gpu_ratio.set(used / total if total else 0.0)


def _parse(text: str) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


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
    ) -> None:
        self.repo, self.event_log, self.api = repo, event_log, api
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

    def run(self) -> None:
        backoff = 1.0
        while not self.stopping.is_set():
            self.last_tick = time.monotonic()
            try:
                self._tick()
                backoff = 1.0
            except (TemporaryError, LogUnavailable, TimeoutError) as e:
                log.warning("%s; retrying in %.0fs", e, backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            self.wake.wait(self.poll_s)
            self.wake.clear()
            self.stopping.wait(0.05)  # a burst of watch events makes one pass, not one each
        self.shutdown()

    def _tick(self) -> None:
        leader = self.elector.try_acquire_or_renew() if self.elector else True
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            if self.controller is not None:
                log.warning("lost the lease: stopping to act")
                self.controller.stop()
                self.controller = None
            # A standby that reaches the API server is ready to take over.
            self.ready = self.elector is not None and self.elector.reached_api
            return
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
) -> None:
    """Run the cluster from the repo: place every commit's jobs and make their pods run.

    Pods are created gated in the team's namespace, bound to the decided nodes once
    the whole gang exists, and deleted when preempted; pod phases and node health
    go into the log. Stop with SIGTERM.
    """
    path = repo_of(path, repo_opt)
    url = resolve_log_url(log_url, path)
    host, _, port = listen.rpartition(":")
    with user_errors():
        repo = GitRepo(path)
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
