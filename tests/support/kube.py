"""A real Kubernetes API server (etcd + kube-apiserver + kwok, started by scripts/kube), for cluster tests:
the world a test builds on it (fake nodes, a team namespace, a controller).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import KubeApi
from gitsched.cluster.controller import Controller, StepReport
from gitsched.cluster.inventory import InventoryConfig
from gitsched.cluster.pods import SELECTOR
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from tests.support.cluster_repo import (
    CLUSTER_YAML,
    POLICY_YAML,
    ClusterRepo,
    H,
    Run,
    start_gitsched,
)

ENV_VAR = "GITSCHED_TEST_KUBECONFIG"


HOW_TO_START = (
    f"start the test cluster with `scripts/kube up` and run the tests with "
    f"{ENV_VAR}=$(scripts/kube kubeconfig)"
)


TEST_LABEL = "gitsched.io/test-run"


T = TypeVar("T")


def stop_serve(process: subprocess.Popen[str], name: str, timeout_s: float = 30.0) -> str:
    """SIGTERM a `gitsched serve` and its stderr once it exits. One that has not exited in
    `timeout_s` (Kubernetes' default termination grace) is asked for its threads' stacks
    (SIGUSR1: faulthandler) before it is killed, and the test fails with them."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        time.sleep(2)
        process.kill()
        stderr = process.communicate()[1]
        pytest.fail(
            f"{name} ignored SIGTERM for {timeout_s:g}s; its threads then:\n{stderr[-8000:]}"
        )


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """Poll until `probe` returns something truthy; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def queue_yaml(name: str, nominal: float) -> str:
    return (
        H
        + f"""kind: Queue
metadata:
  name: {name}
spec:
  quotas:
    - {{flavor: h100-80g, nominal: {nominal:g}}}
"""
    )


def job_yaml(
    name: str,
    *,
    replicas: int = 1,
    gpu: int = 8,
    priority: str | None = None,
    topology: str | None = None,
) -> str:
    text = (
        H
        + f"""kind: Job
metadata:
  name: {name}
spec:
  replicas: {replicas}
  resources: {{gpu: {gpu}, cpu: 4, memoryGiB: 16}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
        - name: train
          image: registry.example/train:1
          command: [python, train.py]
          env:
            - {{name: EPOCHS, value: "3"}}
"""
    )
    if priority:
        text += f"  priorityClass: {priority}\n"
    if topology:
        text += f"  topology: {{level: {topology}, mode: required}}\n"
    return text


@dataclass
class KubeWorld:
    """One test's slice of the shared API server: its nodes, its team, its repo and log."""

    api: KubeApi
    tmp: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    nodes: list[str] = field(default_factory=list)
    controllers: list[Controller] = field(default_factory=list)
    logs: list[EventLog] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.team = f"t-{self.run_id}"
        self.repo = ClusterRepo(self.tmp / "repo")
        self.log_path = self.tmp / "log.db"
        # SQLite by default; a test may point it at a Kafka topic instead.
        self.log_url = f"sqlite:///{self.log_path}"

    # -- the cluster ----------------------------------------------------------------------

    def add_node(self, name: str, *, gpus: int = 8, clique: str = "", zone: str = "eu-1a") -> str:
        full = f"{self.run_id}-{name}"
        labels = {
            TEST_LABEL: self.run_id,
            "type": "kwok",
            "nvidia.com/gpu.product": "H100",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.count": str(gpus),
            "topology.kubernetes.io/zone": zone,
            "topology.gitsched.io/rack": "rack-a",
        }
        if clique:
            labels["nvidia.com/gpu.clique"] = clique
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": full,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {},
            "status": {"capacity": resources, "allocatable": resources},
        }
        self.api.core.create_node(body, _preload_content=False)
        self.nodes.append(full)
        wait_for(f"node {full} Ready (kwok)", lambda: self.node_ready(full))
        return full

    def node_ready(self, name: str) -> bool:
        node = self.api.core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def fail_node(self, name: str) -> None:
        """The node stops answering: kwok leaves it alone and its Ready condition goes False."""
        self.api.core.patch_node(
            name, {"metadata": {"annotations": {"gitsched.io/test-frozen": "true"}}}
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.core.patch_node_status(
            name,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "KubeletStopped",
                            "message": "test: the node stopped",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ]
                }
            },
        )

    def pods(self) -> dict[str, dict[str, Any]]:
        """This test's gitsched pods, by name, as the API has them now."""
        listed = self.api.list("pods", SELECTOR)
        return {
            p["metadata"]["name"]: p
            for p in listed.items
            if p["metadata"]["namespace"] == self.team
        }

    def end_pods(self, job: str, outcome: str, exit_code: int = 0) -> None:
        """Make kwok end every pod of `job` (succeeded or failed) through the test stages."""
        for name, pod in self.pods().items():
            if pod["metadata"]["labels"].get("gitsched.io/job") == f"{self.team}.{job}":
                self.annotate_pod(name, outcome, exit_code)

    def annotate_pod(self, name: str, outcome: str, exit_code: int = 0) -> None:
        annotations = {"gitsched.io/test-outcome": outcome}
        if outcome == "failed":
            annotations["gitsched.io/test-exit-code"] = str(exit_code)
        self.api.core.patch_namespaced_pod(
            name, self.team, {"metadata": {"annotations": annotations}}
        )

    # -- the repo and the daemon's parts ---------------------------------------------------

    def bootstrap(self, nominal: float = 16) -> str:
        self.api.ensure_namespace(self.team)  # the platform team's job, once per team
        self.repo.write_all(
            {
                "cluster.yaml": CLUSTER_YAML,
                f"teams/{self.team}/queue.yaml": queue_yaml(self.team, nominal),
                "policies/default.yaml": POLICY_YAML,
            }
        )
        return self.repo.commit("Bootstrap the cluster (nodes come from Kubernetes)")

    def submit(self, job: str, **kwargs: Any) -> str:
        self.repo.write(f"teams/{self.team}/jobs/{job}.yaml", job_yaml(job, **kwargs))
        return self.repo.commit(f"Submit {job}")

    def controller(self, api: KubeApi | None = None, *, grace_period_s: int = 5) -> Controller:
        event_log = open_log(self.log_url)
        self.logs.append(event_log)
        controller = Controller(
            api or self.api,
            event_log,
            Reconciler(GitRepo(self.repo.path), event_log),
            inventory=InventoryConfig(node_selector=f"{TEST_LABEL}={self.run_id}"),
            grace_period_s=grace_period_s,
        )
        controller.start()
        self.controllers.append(controller)
        return controller

    def events(self) -> list[Any]:
        with open_log(self.log_url, create=False) as event_log:
            return [decode(stored) for stored in event_log.read(0)]

    def job_key(self, job: str) -> str:
        return f"{self.team}/{job}"

    def close(self) -> None:
        for controller in self.controllers:
            controller.stop()
        for event_log in self.logs:
            event_log.close()
        for name, pod in self.pods().items():
            self.api.delete_pod(self.team, name, pod["metadata"]["uid"], 0)
        for node in self.nodes:
            with contextlib.suppress(ApiException):
                self.api.core.delete_node(node, _preload_content=False)


def run_until(
    controller: Controller, what: str, done: Callable[[StepReport], bool], timeout_s: float = 30.0
) -> StepReport:
    """Step the controller until `done` holds; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = controller.step()
        if done(report):
            return report
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s}s waiting for {what}; last state: {report.state}"
            )
        time.sleep(0.1)


def serve_args(
    world: KubeWorld,
    kubeconfig: str,
    port: int,
    *extra: str,
    identity: str | None = None,
    poll_seconds: float = 0.2,
    lease_seconds: int | None = 5,
) -> list[str]:
    """`gitsched serve` on the world's repo, log and nodes, listening on 127.0.0.1:`port`,
    with a Lease of its own and a short grace period; `extra` after the rest."""
    args = [
        "serve",
        str(world.repo.path),
        "--log",
        world.log_url,
        "--kubeconfig",
        kubeconfig,
        "--node-selector",
        f"{TEST_LABEL}={world.run_id}",
        "--listen",
        f"127.0.0.1:{port}",
        "--lease-name",
        f"gitsched-{world.run_id}",
    ]
    if lease_seconds is not None:
        args += ["--lease-seconds", str(lease_seconds)]
    if identity is not None:
        args += ["--identity", identity]
    return [
        *args,
        "--poll-seconds",
        str(poll_seconds),
        "--grace-period-seconds",
        "1",
        *extra,
    ]


def gitsched_for(timeout_s: float, *args: str) -> Run:
    """`python -m gitsched ARGS` for a command that runs longer than `gitsched()` allows
    (a scenario of `bench kube`): past timeout_s it is interrupted (SIGINT, so it deletes
    the nodes and pods it made) and the test fails; never a traceback."""
    process = start_gitsched(*args)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"gitsched {' '.join(args)} ran over {timeout_s}s: {stderr}")
    run = Run(tuple(args), process.returncode, stdout, stderr)
    assert "Traceback" not in run.stderr, f"a user saw a traceback:\n{run}"
    return run
