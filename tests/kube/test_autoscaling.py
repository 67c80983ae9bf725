"""The whole autoscaling chain on a real API server: an exporter the test controls -> the
real Prometheus (scripts/prometheus) -> `gitsched serve --prometheus-url` -> ServiceScaled
in the log -> replica pods on the kwok nodes; the metric falls and the service shrinks
back; `audit history --service` then tells each count and why."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gitsched.engine import events as ev
from tests.support.cluster_repo import PROJECT_ROOT, H, gitsched, gitsched_env
from tests.support.kube import ENV_VAR, KubeWorld, serve_args, wait_for
from tests.support.prometheus import prometheus_from_env, scraped_exporter, wait_for_series

pytestmark = [pytest.mark.kube, pytest.mark.prometheus]

# A busy 2-core machine: serve starts in seconds, but a scrape, a query and a pass each
# take their turn.
DEADLINE_S = 120.0


def service_yaml(query: str) -> str:
    # 5 waiting requests per replica; a 2 s down-window and a 1 s period so the test
    # sees the service shrink in seconds, not HPA's 5 minutes.
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: chat
spec:
  replicas: {{min: 1, max: 4}}
  resources: {{gpu: 2, cpu: 4, memoryGiB: 16}}
  autoscaling:
    metric: {{query: '{query}'}}
    target: 5
    scaleDown:
      stabilizationWindowSeconds: 2
      policies: [{{type: Percent, value: 100, periodSeconds: 1}}]
  template:
    metadata:
      labels: {{app: chat}}
    spec:
      containers:
        - name: serve
          image: registry.example/serve:1
"""
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def running_replicas(world: KubeWorld) -> int:
    return sum(
        1
        for pod in world.pods().values()
        if pod["metadata"]["labels"]["gitsched.io/job"].startswith(f"{world.team}.chat.")
        and pod["status"].get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    )


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def scaled(world: KubeWorld) -> list[ev.ServiceScaled]:
    return [e for e in world.events() if isinstance(e, ev.ServiceScaled)]


def test_a_real_prometheus_metric_scales_a_service_up_and_down_on_the_cluster(
    world: KubeWorld, tmp_path: Path
) -> None:
    url, targets = prometheus_from_env()
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    with scraped_exporter(targets) as (exporter, test):
        query = f'sum(vllm:num_requests_waiting{{test="{test}"}})'
        exporter.set('vllm:num_requests_waiting{pod="a"} 2\n')
        wait_for_series(url, query, "2")
        world.repo.write(f"teams/{world.team}/services/chat.yaml", service_yaml(query))
        world.repo.commit("serve chat, scaled on requests waiting")

        stderr_path = tmp_path / "serve.stderr"
        with stderr_path.open("w") as stderr:
            # stderr to a file: a pipe nobody reads would fill and stall the daemon.
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gitsched",
                    *serve_args(
                        world,
                        os.environ[ENV_VAR],
                        _free_port(),
                        "--prometheus-url",
                        url,
                        "--autoscale-seconds",
                        "1",
                        lease_seconds=None,
                    ),
                ],
                cwd=PROJECT_ROOT,
                env=gitsched_env(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                text=True,
            )
        try:

            def alive() -> None:
                if process.poll() is not None:
                    pytest.fail(f"serve exited {process.returncode}: {stderr_path.read_text()}")

            def scaled_to(n: int) -> list[ev.ServiceScaled]:
                alive()
                return [e for e in scaled(world) if e.to_replicas == n]

            def replicas(n: int) -> bool:
                alive()
                return running_replicas(world) == n

            # 2 waiting against 5 a replica: the minimum, one replica.
            wait_for("chat's first replica Running", lambda: replicas(1), DEADLINE_S)

            # The load rises: 15 waiting asks for ceil(15 / 5) = 3 replicas.
            exporter.set('vllm:num_requests_waiting{pod="a"} 15\n')
            wait_for_series(url, query, "15")
            up = wait_for(
                "ServiceScaled to 3 in the log",
                lambda: scaled_to(3),
                DEADLINE_S,
            )[0]
            assert up.service == f"{world.team}/chat"
            assert (up.from_replicas, up.metric_value, up.target, up.bound_by) == (
                1,
                15.0,
                5.0,
                "hpa",
            )
            wait_for("3 replicas Running on the kwok nodes", lambda: replicas(3), DEADLINE_S)

            # The load falls: 4 waiting asks for one replica again, after the 2 s down-window.
            exporter.set('vllm:num_requests_waiting{pod="a"} 4\n')
            wait_for_series(url, query, "4")
            down = wait_for(
                "ServiceScaled back to 1 in the log",
                lambda: scaled_to(1),
                DEADLINE_S,
            )[0]
            assert down.from_replicas == 3 and down.target == 5.0
            assert down.metric_value == round(4 / 3, 6)
            wait_for("one replica left Running", lambda: replicas(1), DEADLINE_S)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    log = stderr_path.read_text()
    assert process.returncode == 0, log
    assert "Traceback" not in log, log

    # Every decision is the service's and no count ever left [min, max].
    decisions = scaled(world)
    assert decisions[0] == up and decisions[-1] == down
    assert all(1 <= d.to_replicas <= 4 for d in decisions)
    # The 2 s down-window held the service at 3 from the first answer of 4 (the window
    # the decision was taken on starts there) for at least those 2 s.
    lull = next(
        e
        for e in world.events()
        if isinstance(e, ev.ServiceMetricObserved) and e.value == 4.0 and e.end == down.at
    )
    assert parse_time(down.at) - parse_time(lull.start) >= timedelta(seconds=2)

    # The audit, from the log alone: each count over time, with the metric that moved it.
    run = gitsched(
        "audit",
        "history",
        "--service",
        f"{world.team}/chat",
        "--log",
        world.log_url,
        "--format",
        "json",
    )
    assert run.returncode == 0, run
    rows = json.loads(run.stdout)
    scaled_rows = [r for r in rows if r["event"] == "ServiceScaled"]
    assert [r["desired"] for r in scaled_rows] == [d.to_replicas for d in decisions]
    assert scaled_rows[0]["why"] == "scaled 1 -> 3 (metric 15, target 5; bound by hpa)"
    assert scaled_rows[-1]["why"].startswith("scaled 3 -> 1 (metric 1.33333, target 5;")
    assert rows[-1]["replicas"] == 1
