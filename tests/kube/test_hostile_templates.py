"""`gitsched serve` on a real API server never makes the pod of a hostile template: each
escape of the acceptance suite (tests/acceptance/test_hostile_templates.py) is committed
while a good job runs; every one is rejected in the log, no pod of it is ever created, and
the good job keeps running."""

from __future__ import annotations

import os

import pytest
import yaml

from engine import events as ev
from tests.acceptance.test_hostile_templates import ESCAPES, _escape, _job
from tests.kube.test_serve import Daemon, _job_pods
from tests.support.kube import ENV_VAR, KubeWorld, wait_for

pytestmark = pytest.mark.kube


def test_serve_rejects_every_escape_and_never_creates_its_pod(world: KubeWorld) -> None:
    kubeconfig = os.environ[ENV_VAR]
    world.add_node("n0")
    world.add_node("n1")
    world.bootstrap(nominal=16)
    world.submit("good", replicas=1)
    daemon = Daemon(world, "replica-a", kubeconfig)
    try:
        wait_for("good's pod Running", lambda: len(_job_pods(world, "good")) == 1)
        for escape, (change, refused) in ESCAPES.items():
            job = _job(_escape(change))
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
        assert len(_job_pods(world, "good")) == 1
    finally:
        code, stderr = daemon.stop()
        assert code == 0 and "Traceback" not in stderr, stderr
