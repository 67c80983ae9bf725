"""`gitsched serve REPO`: the daemon that runs a Kubernetes cluster from the git repo.

Polls the repo (reconciler), observes and acts on the cluster (cluster.Controller),
holds a coordination.k8s.io Lease so only one replica acts, and serves /healthz,
/readyz and Prometheus /metrics. A signed push webhook (POST /webhook) starts a pass
at once instead of at the next poll; the poll stays, so a lost delivery only costs
time. SIGTERM stops it cleanly (the Lease is given back); SIGKILL loses nothing,
because every pass starts from the log and the cluster.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import click
from prometheus_client import CollectorRegistry, Counter
from starlette.routing import Mount

from gitsched.cluster.api import KubeApi
from gitsched.cluster.autoscaler import Autoscaler, services_of
from gitsched.cluster.controller import Controller
from gitsched.cluster.inventory import InventoryConfig
from gitsched.cluster.lease import LeaderElector
from gitsched.cluster.prometheus import PrometheusClient
from gitsched.config import resolve_log_url
from gitsched.console.app import console_app
from gitsched.console.command import read_token
from gitsched.engine.errors import TemporaryError
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog, LogUnavailable
from gitsched.http import HttpServer, http_app
from gitsched.metrics import Metrics
from gitsched.options import log_option, repo_of, repo_path, user_errors
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.webhook import NO_COMMIT, Webhook, WebhookSecretMissing

log = logging.getLogger("gitsched.serve")

# A push's commit may reach the daemon's clone after the push's delivery (git-sync polls
# on its own period): look for it this often, for this long, before leaving it to the poll.
PUSH_LOOK_S = 0.2
PUSH_WAIT_S = 60.0
# How long a stop waits for the console's threads (a plan in flight): the Lease is given
# back before, and the whole stop must end inside Kubernetes' 30 s termination grace.
CONSOLE_STOP_S = 5.0


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
        autoscaler: Autoscaler | None = None,
    ) -> None:
        self.repo, self.event_log, self.api = repo, event_log, api
        # Inference services' autoscaler (docs/autoscaling.md): polled from this loop, so
        # only the replica that holds the Lease appends its decisions.
        self.autoscaler = autoscaler
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
        # Whether the branch exists: until its first commit, the daemon waits and says so,
        # as Flux and Argo CD do for a source not ready, instead of exiting.
        self.branch_found: bool | None = None

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

    # What the HTTP surface reads (gitsched.http.ServedDaemon).
    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def webhook_deliveries(self) -> Counter:
        return self.metrics.webhooks

    def alive(self) -> bool:
        """The loop is turning: a pass began lately (a pass may take a while; a hung one not)."""
        return time.monotonic() - self.last_tick < max(60.0, 10 * self.poll_s)

    def run(self) -> None:
        if self.elector is not None:
            # The Lease is renewed from its own thread, so a long pass never loses it; a
            # change of leader wakes the loop, to act at once or stop acting.
            self.elector.start(on_change=lambda _: self.wake.set())
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
        leader = self.elector.is_leader if self.elector else True
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            if self.controller is not None:
                log.warning("lost the lease: stopping to act")
                self.controller.stop()
                self.controller = None
                self.metrics.counted_seq = None
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
            self.metrics.count_from(self.event_log.last_seq())
        self.ready = True
        if not self.branch_found and not self.repo.has_revision(self.branch):
            self._branch_missing()
            return False
        report = self.controller.step()
        if not self.branch_found:
            if self.branch_found is False:  # said it waited: say the wait is over
                log.warning("branch %s has its first commit: running the cluster", self.branch)
            self.branch_found = True
            self.metrics.source_ready.labels(self.branch).set(1)
        self.metrics.count_log(self.event_log, report.last_seq)
        self.metrics.record(report, datetime.now(UTC))
        if self.autoscaler is not None:
            # The services it scales are the fold's, as of this pass.
            self.autoscaler.services = functools.partial(services_of, report.state)
            self.autoscaler.tick(self.event_log)
            self.metrics.record_autoscaler(self.autoscaler.status)
        return True

    def _branch_missing(self) -> None:
        """No commit on the branch yet (a repo just made, a branch not pushed yet): wait for
        one. Still ready, so the push webhook that brings it reaches this replica."""
        if self.branch_found is not False:
            log.warning(
                "branch %s has no commit yet in %s: waiting for its first commit",
                self.branch,
                self.repo.path,
            )
        self.branch_found = False
        self.metrics.source_ready.labels(self.branch).set(0)

    def shutdown(self) -> None:
        if self.elector is not None:
            self.elector.stop()
        if self.controller is not None:
            self.controller.stop()
        if self.elector is not None:
            self.elector.release()
        self.metrics.leader.set(0)


def _webhook(secret_file: str | None, branch: str) -> Webhook | None:
    """The webhook, if a secret is given: from the file, else GITSCHED_WEBHOOK_SECRET."""
    if secret_file:
        secret = Path(secret_file).read_bytes().strip()
    else:
        secret = os.environ.get("GITSCHED_WEBHOOK_SECRET", "").strip().encode()
        if not secret:
            return None
    try:
        return Webhook(secret, branch)
    except WebhookSecretMissing as e:
        raise click.UsageError(str(e)) from e


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
    help="host:port for /healthz, /readyz, /metrics and /webhook.",
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
@click.option("--solver", help="Override the Policy's solver (greedy, highs, cbc, cpsat).")
@click.option(
    "--webhook-secret-file",
    envvar="GITSCHED_WEBHOOK_SECRET_FILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Serve POST /webhook for the git host's push deliveries, signed with the secret in this"
    " file (HMAC-SHA256, X-Hub-Signature-256). Or put the secret itself in GITSCHED_WEBHOOK_SECRET."
    " Without either, /webhook answers 404 and only the poll finds new commits.",
)
@click.option(
    "--prometheus-url",
    envvar="GITSCHED_PROMETHEUS_URL",
    show_envvar=True,
    help="Prometheus server whose /api/v1/query gives inference services' autoscaling"
    " metrics (docs/autoscaling.md). Without it, services keep their replica counts.",
)
@click.option(
    "--autoscale-seconds",
    default=15.0,
    show_default=True,
    help="How often the autoscaler asks Prometheus (HPA's sync period).",
)
@click.option(
    "--console/--no-console",
    default=True,
    show_default=True,
    help="Serve the read-only web console under /console on the same address (docs/console.md).",
)
@click.option(
    "--console-token-file",
    envvar="GITSCHED_CONSOLE_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Ask the console's visitors for the bearer token in this file.",
)
@click.option(
    "--trust-forwarded-user",
    is_flag=True,
    help="Let an auth proxy in front (oauth2-proxy) vouch for the console's visitors with"
    " X-Forwarded-User.",
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
    prometheus_url: str | None = None,
    autoscale_seconds: float = 15.0,
    console: bool = True,
    console_token_file: str | None = None,
    trust_forwarded_user: bool = False,
) -> None:
    """Run the cluster from the repo: place every commit's jobs and make their pods run.

    Pods are created gated in the team's namespace, bound to the decided nodes once
    the whole gang exists, and deleted when preempted; pod phases and node health
    go into the log. A signed push webhook starts a pass at once. Stop with SIGTERM.
    """
    path = repo_of(path, repo_opt)
    url = resolve_log_url(log_url, path)
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{listen!r} is not host:port", param_hint="--listen")
    autoscaler = _autoscaler(prometheus_url, autoscale_seconds)
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
                autoscaler=autoscaler,
            )

            def stop(signum: int, frame: object) -> None:
                daemon.stopping.set()
                daemon.wake.set()

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            # `kill -USR1` prints every thread's stack to stderr: what a daemon that does not
            # stop, or a pass that does not end, is doing (docs/kubernetes.md).
            faulthandler.register(signal.SIGUSR1, all_threads=True)
            mounted = (
                console_app(
                    path,
                    url,
                    token=read_token(console_token_file) if console_token_file else None,
                    trust_forwarded_user=trust_forwarded_user,
                    branch=branch,
                )
                if console
                else None
            )
            extra = (Mount("/console", app=mounted),) if mounted is not None else ()
            server = _listen(http_app(daemon, extra), host, int(port))
            click.echo(
                f"gitsched serve: {me}, /metrics on {listen}"
                + (f", the console on http://{listen}/console/" if mounted else ""),
                err=True,
            )
            try:
                daemon.run()
            finally:
                server.stop()
                if mounted is not None and mounted.source is not None:
                    # Inside Kubernetes' 30 s grace with the rest of the stop.
                    mounted.source.stop(timeout_s=CONSOLE_STOP_S)


def _autoscaler(url: str | None, interval_s: float) -> Autoscaler | None:
    """The autoscaler on `url`'s Prometheus; each pass hands it the fold's services."""
    if not url:
        return None
    try:
        client = PrometheusClient(url)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--prometheus-url") from e
    if interval_s <= 0:
        raise click.BadParameter("must be > 0", param_hint="--autoscale-seconds")
    return Autoscaler(client, interval_s=interval_s)


def _listen(app: object, host: str, port: int) -> HttpServer:
    try:
        server = HttpServer(app, host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    server.start()
    return server
