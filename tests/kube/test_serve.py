"""`gitsched serve`: two daemons on one cluster and one log, one Lease: only the leader acts,
and a SIGTERMed leader hands over at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request

import pytest

from cluster.api import Obj
from engine import events as ev
from tests.acceptance.conftest import start_gitsched
from tests.kube.conftest import ENV_VAR, TEST_LABEL, KubeWorld, wait_for

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


class Daemon:
    def __init__(self, world: KubeWorld, identity: str, kubeconfig: str) -> None:
        self.identity = identity
        self.port = _free_port()
        self.args = [
            "serve",
            str(world.repo.path),
            "--log",
            f"sqlite:///{world.log_path}",
            "--kubeconfig",
            kubeconfig,
            "--node-selector",
            f"{TEST_LABEL}={world.run_id}",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--lease-name",
            f"gitsched-{world.run_id}",
            "--lease-seconds",
            "5",
            "--identity",
            identity,
            "--poll-seconds",
            "0.2",
            "--grace-period-seconds",
            "1",
        ]
        self.process: subprocess.Popen[str] = start_gitsched(*self.args)

    def leader(self) -> bool:
        return _metric(self.port, "gitsched_leader") == 1.0

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            _, stderr = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
            pytest.fail(f"daemon {self.identity} ignored SIGTERM for 30s: {stderr}")
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
        wait_for("one's pods Running", lambda: len(_job_pods(world, "one")) == 2)
        leaders = wait_for("exactly one leader", lambda: [d for d in daemons if d.leader()] or None)
        assert len(leaders) == 1
        leader = leaders[0]
        standby = next(d for d in daemons if d is not leader)
        assert _metric(standby.port, "gitsched_leader") == 0.0
        # The standby acted on nothing: the leader made and bound every pod.
        assert _metric(standby.port, 'gitsched_pods_total{action="created"}') in (None, 0.0)
        assert _metric(leader.port, 'gitsched_pods_total{action="bound"}') == 2.0
        for d in daemons:
            assert _get(d.port, "/healthz")[0] == 200
            assert _get(d.port, "/readyz")[0] == 200
        lease = json.loads(
            world.api.coordination.read_namespaced_lease(
                f"gitsched-{world.run_id}", "default", _preload_content=False
            ).data
        )
        assert lease["spec"]["holderIdentity"] == leader.identity

        code, stderr = leader.stop()
        assert code == 0, stderr
        assert "Traceback" not in stderr
        wait_for("the standby to take over", standby.leader)
        world.submit("two", replicas=1)
        wait_for("two's pod Running", lambda: len(_job_pods(world, "two")) == 1)
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
