"""`gitsched serve` on a real API server never makes the pod of a hostile template: each
escape of the acceptance suite (tests/acceptance/test_hostile_templates.py) is committed
while a good job runs; every one is rejected in the log, no pod of it is ever created, and
the good job keeps running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
import yaml

from gitsched.cluster.api import Obj
from gitsched.engine import events as ev
from tests.support.cluster_repo import PROJECT_ROOT, gitsched_env
from tests.support.hostile_templates import ESCAPES, escaped_template, job_doc
from tests.support.kube import ENV_VAR, TEST_LABEL, KubeWorld, wait_for

pytestmark = pytest.mark.kube


def _serve(world: KubeWorld, output: IO[str]) -> subprocess.Popen[str]:
    """`gitsched serve` on the world's repo and log; its output goes to a file, so a
    long run never blocks on a full pipe."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gitsched",
            "serve",
            str(world.repo.path),
            "--log",
            f"sqlite:///{world.log_path}",
            "--kubeconfig",
            os.environ[ENV_VAR],
            "--node-selector",
            f"{TEST_LABEL}={world.run_id}",
            "--listen",
            f"127.0.0.1:{port}",
            "--lease-name",
            f"gitsched-{world.run_id}",
            "--lease-seconds",
            "5",
            "--poll-seconds",
            "0.2",
            "--grace-period-seconds",
            "1",
        ],
        cwd=PROJECT_ROOT,
        env=gitsched_env(),
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _running(world: KubeWorld, job: str) -> list[Obj]:
    return [
        p
        for p in world.pods().values()
        if p["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
        and p["status"].get("phase") == "Running"
    ]


def test_serve_rejects_every_escape_and_never_creates_its_pod(world: KubeWorld) -> None:
    world.add_node("n0")
    world.add_node("n1")
    world.bootstrap(nominal=16)
    world.submit("good", replicas=1)
    log_file = world.tmp / "serve.log"
    with log_file.open("w") as output:
        _rejects_every_escape(world, _serve(world, output), log_file)


def _rejects_every_escape(world: KubeWorld, daemon: subprocess.Popen[str], log_file: Path) -> None:
    try:
        wait_for("good's pod Running", lambda: len(_running(world, "good")) == 1, timeout_s=90)
        for escape, (change, refused) in ESCAPES.items():
            job = job_doc(escaped_template(change))
            world.repo.write(f"teams/{world.team}/jobs/sneaky.yaml", yaml.safe_dump(job))
            sha = world.repo.commit(f"{world.team}: {escape}")

            def rejected(sha: str = sha) -> list[ev.CommitRejected]:
                return [
                    e
                    for e in world.events()
                    if isinstance(e, ev.CommitRejected) and e.commit.sha == sha
                ]

            (event,) = wait_for(f"the commit of {escape} rejected", rejected, timeout_s=60)
            assert sorted((f.path, f.code) for f in event.errors) == sorted(refused), escape
            # Put the file back as it was, so the next escape is judged on its own.
            world.repo.remove(f"teams/{world.team}/jobs/sneaky.yaml")
            world.repo.commit(f"{world.team}: withdraw {escape}")
        sneaky = [
            p
            for p in world.pods().values()
            if p["metadata"]["labels"].get("gitsched.io/job") == f"{world.team}.sneaky"
        ]
        assert sneaky == []
        assert not [
            e for e in world.events() if isinstance(e, ev.JobSubmitted) and e.job.name == "sneaky"
        ]
        assert len(_running(world, "good")) == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        output = log_file.read_text()
        assert daemon.returncode == 0 and "Traceback" not in output, output
