"""`gitsched serve`: two daemons on one cluster and one log, one Lease: only the leader acts,
and a SIGTERMed leader hands over at once; a signed push webhook starts a pass at once,
and an unsigned or wrongly signed one is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gitsched.cluster.api import Obj
from gitsched.engine import events as ev
from gitsched.eventlog import open_log
from gitsched.eventlog.codec import decode
from gitsched.eventlog.envelope import StoredEvent
from tests.support.cluster_repo import PRIYA, git, start_gitsched
from tests.support.kube import ENV_VAR, KubeWorld, job_yaml, serve_args, stop_serve, wait_for

pytestmark = pytest.mark.kube


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def _metric(port: int, name: str) -> float | None:
    status, text = _get(port, "/metrics")
    if status != 200:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/webhook", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Daemon:
    def __init__(
        self,
        world: KubeWorld,
        identity: str,
        kubeconfig: str,
        *extra: str,
        poll_seconds: float = 0.2,
    ) -> None:
        self.identity = identity
        self.port = _free_port()
        self.args = serve_args(
            world,
            kubeconfig,
            self.port,
            *extra,
            identity=identity,
            poll_seconds=poll_seconds,
        )
        self.process: subprocess.Popen[str] = start_gitsched(*self.args)

    def leader(self) -> bool:
        return _metric(self.port, "gitsched_leader") == 1.0

    def stop(self) -> tuple[int, str]:
        stderr = stop_serve(self.process, f"daemon {self.identity}")
        return self.process.returncode, stderr


def _job_pods(world: KubeWorld, job: str) -> list[Obj]:
    return [
        p
        for p in world.pods().values()
        if p["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
        and p["status"].get("phase") == "Running"
    ]


def test_two_daemons_one_leader_acts_and_sigterm_hands_over(world: KubeWorld) -> None:
    kubeconfig = os.environ[ENV_VAR]
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    world.submit("one", replicas=2)
    daemons = [Daemon(world, "replica-a", kubeconfig), Daemon(world, "replica-b", kubeconfig)]
    try:
        # Two processes start on a machine that may be busy: one may still be importing
        # when the other has run the job (seen: the standby's /metrics not up yet), so
        # wait for both to serve, with a generous deadline.
        wait_for(
            "both daemons serving /metrics",
            lambda: all(_metric(d.port, "gitsched_leader") is not None for d in daemons),
            timeout_s=120,
        )
        wait_for("one's pods Running", lambda: len(_job_pods(world, "one")) == 2, timeout_s=120)
        leaders = wait_for("exactly one leader", lambda: [d for d in daemons if d.leader()] or None)
        assert len(leaders) == 1
        leader = leaders[0]
        standby = next(d for d in daemons if d is not leader)
        assert _metric(standby.port, "gitsched_leader") == 0.0
        # The standby acted on nothing: the leader made and bound every pod.
        assert _metric(standby.port, 'gitsched_pods_total{action="created"}') in (None, 0.0)
        assert _metric(leader.port, 'gitsched_pods_total{action="bound"}') == 2.0
        assert _get(leader.port, "/healthz")[0] == 200
        assert _get(leader.port, "/readyz")[0] == 200
        assert _get(standby.port, "/healthz")[0] == 200
        # A standby is ready once a Lease round of its own has reached the API server.
        wait_for("the standby ready", lambda: _get(standby.port, "/readyz")[0] == 200)
        lease = json.loads(
            world.api.coordination.read_namespaced_lease(
                f"gitsched-{world.run_id}", "default", _preload_content=False
            ).data
        )
        assert lease["spec"]["holderIdentity"] == leader.identity
        # Held since it was first taken: no pass, however slow, let it lapse under the leader.
        assert lease["spec"]["leaseTransitions"] == 0

        code, stderr = leader.stop()
        assert code == 0, stderr
        assert "Traceback" not in stderr
        wait_for("the standby to take over", standby.leader, timeout_s=60)
        world.submit("two", replicas=1)
        wait_for("two's pod Running", lambda: len(_job_pods(world, "two")) == 1, timeout_s=60)
        assert len(world.pods()) == 3  # no pod made twice
        wait_for(
            "JobStarted for both jobs in the log",
            lambda: (
                {e.job for e in world.events() if isinstance(e, ev.JobStarted)}
                == {world.job_key("one"), world.job_key("two")}
            ),
        )
    finally:
        for d in daemons:
            d.stop()


READY_MAIN = 'gitsched_source_ready{branch="main"}'  # no sample before serve first looked


def test_serve_waits_for_the_branchs_first_commit_and_says_so(world: KubeWorld) -> None:
    """A repo whose branch has no commit yet (made before its first push): serve waits,
    says so in its log and /metrics, and runs the cluster from the first commit on."""
    world.add_node("n0")
    daemon = Daemon(world, "early", os.environ[ENV_VAR])
    try:
        wait_for(
            "serve leading and waiting for the branch",
            lambda: daemon.leader() and _metric(daemon.port, READY_MAIN) == 0.0,
            timeout_s=120,
        )
        assert daemon.process.poll() is None  # still running, not exited
        # Ready: the push webhook that brings the first commit must reach it.
        assert _get(daemon.port, "/readyz")[0] == 200
        assert _metric(daemon.port, 'gitsched_passes_total{trigger="poll"}') in (None, 0.0)
        world.bootstrap(nominal=8)
        world.submit("one", replicas=1)
        running = _wait_or_none(lambda: len(_job_pods(world, "one")) == 1, timeout_s=120)
        ready = _metric(daemon.port, READY_MAIN)
        # What a daemon is doing, asked of it without stopping it (docs/kubernetes.md).
        daemon.process.send_signal(signal.SIGUSR1)
        assert _wait_or_none(lambda: daemon.leader(), timeout_s=10)
    finally:
        code, stderr = daemon.stop()
    assert "Current thread" in stderr and "most recent call first" in stderr, stderr[-3000:]
    # The rest, less the stacks (their lines name functions, not faults):
    stderr = "\n".join(
        line
        for line in stderr.splitlines()
        if not line.startswith(("Thread 0x", "Current thread 0x", '  File "'))
    )
    assert running, f"one's pod not Running within 120s; serve said: {stderr[-3000:]}"
    assert ready == 1.0
    assert code == 0, stderr
    assert "branch main has no commit yet" in stderr
    assert "waiting for its first commit" in stderr
    assert "branch main has its first commit" in stderr
    assert "Traceback" not in stderr


def _wait_or_none(probe: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `probe` held within timeout_s (a test that must still stop its daemon)."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _commit_off_branch(world: KubeWorld, job: str) -> str:
    """Submit `job` as a commit that main does not point at yet (as when the push's delivery
    comes before git-sync fetched it); main moves to it with `git update-ref`."""
    world.repo.write(f"teams/{world.team}/jobs/{job}.yaml", job_yaml(job, replicas=1))
    git(world.repo.path, "add", "-A")
    tree = git(world.repo.path, "write-tree").strip()
    who = {
        "GIT_AUTHOR_NAME": PRIYA[0],
        "GIT_AUTHOR_EMAIL": PRIYA[1],
        "GIT_COMMITTER_NAME": PRIYA[0],
        "GIT_COMMITTER_EMAIL": PRIYA[1],
    }
    return git(
        world.repo.path, "commit-tree", tree, "-p", "main", "-m", f"Submit {job}", env=who
    ).strip()


def test_signed_push_webhook_starts_a_pass_at_once_unsigned_ones_are_refused(
    world: KubeWorld, tmp_path: Path
) -> None:
    kubeconfig = os.environ[ENV_VAR]
    world.add_node("n0")
    world.add_node("n1")
    world.bootstrap(nominal=16)
    secret = b"webhook-secret-" + world.run_id.encode()
    secret_file = tmp_path / "webhook-secret"
    secret_file.write_bytes(secret + b"\n")  # as `kubectl create secret --from-file` keeps it
    # A poll far longer than the test: only the webhook (or a watch event) starts a pass.
    daemon = Daemon(
        world,
        "hooked",
        kubeconfig,
        "--webhook-secret-file",
        str(secret_file),
        poll_seconds=600,
    )
    try:
        wait_for("the daemon to lead", daemon.leader)
        world.submit("one", replicas=1)
        body = json.dumps({"ref": "refs/heads/main", "after": world.repo.head()}).encode()
        push = {"X-GitHub-Event": "push", "Content-Type": "application/json"}

        # Refused, and nothing done: no signature, another secret's, another body's, not sha256.
        for headers in (
            push,
            {**push, "X-Hub-Signature-256": _signature(b"not-the-secret", body)},
            {**push, "X-Hub-Signature-256": _signature(secret, body + b" ")},
            {**push, "X-Hub-Signature-256": "sha1=" + hmac.new(secret, body, "sha1").hexdigest()},
        ):
            assert _post(daemon.port, body, headers)[0] == 401
        assert _metric(daemon.port, 'gitsched_webhook_deliveries_total{result="rejected"}') == 4
        assert _metric(daemon.port, 'gitsched_passes_total{trigger="webhook"}') is None

        # Signed: acknowledged, and a pass starts at once.
        status, text = _post(
            daemon.port, body, {**push, "X-Hub-Signature-256": _signature(secret, body)}
        )
        assert (status, text.strip()) == (202, "reconciling")
        # The same signed delivery again (captured and replayed): 409, no second pass asked.
        replay = {
            **push,
            "X-Hub-Signature-256": _signature(secret, body),
            "X-GitHub-Delivery": "replayed-id",
        }
        assert _post(daemon.port, body, replay)[0] == 409
        assert _metric(daemon.port, 'gitsched_webhook_deliveries_total{result="replayed"}') == 1
        wait_for("one's pod Running", lambda: len(_job_pods(world, "one")) == 1)
        wait_for(
            "a pass started by the push",
            lambda: (_metric(daemon.port, 'gitsched_passes_total{trigger="webhook"}') or 0) >= 1,
        )

        # Gitea's header; a push to another branch and a ping are acknowledged, no pass.
        other = json.dumps({"ref": "refs/heads/dev", "after": "f" * 40}).encode()
        status, text = _post(
            daemon.port,
            other,
            {"X-Gitea-Event": "push", "X-Gitea-Signature": _signature(secret, other)[7:]},
        )
        assert status == 202 and "ignored" in text
        ping = b'{"zen": "Design for failure."}'
        pong = _post(
            daemon.port,
            ping,
            {"X-GitHub-Event": "ping", "X-Hub-Signature-256": _signature(secret, ping)},
        )
        assert pong == (200, "pong\n")

        # The delivery comes before the commit reaches the daemon's clone: the daemon looks
        # for it until it is on the branch, then passes.
        sha = _commit_off_branch(world, "two")
        late = json.dumps({"ref": "refs/heads/main", "after": sha}).encode()
        before = _metric(daemon.port, 'gitsched_passes_total{trigger="webhook"}') or 0
        status, _ = _post(
            daemon.port, late, {**push, "X-Hub-Signature-256": _signature(secret, late)}
        )
        assert status == 202
        git(world.repo.path, "update-ref", "refs/heads/main", sha)
        wait_for("two's pod Running", lambda: len(_job_pods(world, "two")) == 1)
        wait_for(
            "a pass started by the push once its commit is on the branch",
            lambda: (
                (_metric(daemon.port, 'gitsched_passes_total{trigger="webhook"}') or 0) > before
            ),
        )
        assert _metric(daemon.port, 'gitsched_webhook_deliveries_total{result="accepted"}') == 2
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr
    assert "Traceback" not in stderr


def test_webhook_is_off_without_a_secret(world: KubeWorld) -> None:
    world.add_node("n0")
    world.bootstrap(nominal=8)
    daemon = Daemon(world, "plain", os.environ[ENV_VAR])
    try:
        wait_for("the daemon to lead", daemon.leader)
        body = b'{"ref": "refs/heads/main"}'
        assert _post(daemon.port, body, {"X-GitHub-Event": "push"})[0] == 404
    finally:
        daemon.stop()


def test_serve_serves_the_console_beside_its_probes(world: KubeWorld) -> None:
    """One server: /healthz and the read-only console under /console, which reads the log
    the daemon writes (the cluster's queue appears once the daemon has applied it)."""
    world.add_node("n0")
    world.bootstrap(nominal=8)
    daemon = Daemon(world, "console", os.environ[ENV_VAR])
    try:
        wait_for("the daemon to lead", daemon.leader)
        assert _get(daemon.port, "/healthz")[0] == 200

        def queues_page() -> bool:
            status, text = _get(daemon.port, "/console/queues")
            return status == 200 and f'href="/console/queues/{world.team}"' in text

        wait_for("the console's queues page", queues_page, timeout_s=60)
        assert _get(daemon.port, "/console/jobs/nobody/nothing")[0] == 404
    finally:
        daemon.stop()


def test_a_sigkilled_daemon_loses_nothing_its_successor_converges_without_duplicates(
    world: KubeWorld,
) -> None:
    kubeconfig = os.environ[ENV_VAR]
    for i in range(5):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=40)
    world.submit("gang", replicas=4)
    world.submit("solo", replicas=1)
    first = Daemon(world, "first", kubeconfig)
    # Killed as soon as it has made a pod: most likely mid-actuation, never cleanly.
    wait_for("a first pod", lambda: len(world.pods()) >= 1)
    first.process.kill()
    first.process.communicate(timeout=30)
    gang = [
        p
        for p in world.pods().values()
        if p["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.gang"
    ]
    if len(gang) < 4:  # not every replica's pod made: none of them may be bound
        assert not any(p["spec"].get("nodeName") for p in gang)

    # A successor (the dead one's Lease expires in 5 s) converges to the log.
    second = Daemon(world, "second", kubeconfig)
    try:
        wait_for("the gang Running", lambda: len(_job_pods(world, "gang")) == 4, timeout_s=60)
        wait_for("solo Running", lambda: len(_job_pods(world, "solo")) == 1)
        pods = world.pods()
        assert len(pods) == 5  # no pod made twice
        replicas = sorted(
            (
                p["metadata"]["labels"]["gitsched.io/job"],
                p["metadata"]["labels"]["gitsched.io/replica"],
            )
            for p in pods.values()
        )
        assert replicas == [(f"{world.team}.gang", str(i)) for i in range(4)] + [
            (f"{world.team}.solo", "0")
        ]
        wait_for(
            "JobStarted for both jobs in the log",
            lambda: (
                {e.job for e in world.events() if isinstance(e, ev.JobStarted)}
                == {world.job_key("gang"), world.job_key("solo")}
            ),
        )
    finally:
        code, stderr = second.stop()
    assert code == 0, stderr


def test_metrics_agree_with_the_log_after_pods_finish_and_nodes_register_once(
    world: KubeWorld,
) -> None:
    """Every counter on /metrics says what the log says: solves made after a pod ends
    (no commit behind them) are counted like a commit's; each node is registered once,
    with its flavor, not first under its raw GPU product."""
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("a", replicas=1)
    world.submit("b", replicas=1)
    daemon = Daemon(world, "counted", os.environ[ENV_VAR])
    try:
        wait_for(
            "a and b Running",
            lambda: len(_job_pods(world, "a")) == 1 and len(_job_pods(world, "b")) == 1,
            timeout_s=120,
        )
        world.end_pods("a", "succeeded")
        world.end_pods("b", "failed", exit_code=3)
        wait_for(
            "a finished and b failed, in the log",
            lambda: (
                any(isinstance(e, ev.JobFinished) for e in world.events())
                and any(isinstance(e, ev.JobFailed) for e in world.events())
            ),
            timeout_s=60,
        )

        def stored() -> list[StoredEvent]:
            with open_log(world.log_url, create=False) as event_log:
                return list(event_log.read(0))

        def agree() -> bool:
            log = stored()
            solves = sum(1 for s in log if s.type == "SolveCompleted")
            cluster = sum(1 for s in log if s.actor == "kubernetes")
            return (
                _metric(daemon.port, "gitsched_solve_seconds_count") == solves
                and _metric(daemon.port, 'gitsched_events_appended_total{source="cluster"}')
                == cluster
                and _metric(daemon.port, 'gitsched_events_appended_total{source="reconciler"}')
                == len(log) - cluster
            )

        wait_for("/metrics to agree with the log", agree, timeout_s=60)
        log = stored()
        solves = [s for s in log if s.type == "SolveCompleted"]
        # Solves no commit made (after a pod ended) are among those counted.
        assert any(s.cause.startswith("kubernetes/") for s in solves)
        registered = [decode(s) for s in log if s.type == "NodeRegistered"]
        assert sorted((e.node.name, e.node.flavor) for e in registered) == [
            (name, "h100-80g") for name in sorted(world.nodes)
        ]
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr
    assert "Traceback" not in stderr
