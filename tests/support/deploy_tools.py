"""The tools the deploy tests drive, built by the repo's own scripts: helm (scripts/helm,
from the Go module proxy), kubectl (scripts/kube, from the Kubernetes release the test API
server runs) and the image (scripts/image, with buildah). A tool that cannot be built
fails the test with what to do; it is never skipped."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gitsched"
# A build from cold takes minutes on a busy 2-core machine; scripts/test builds these
# before pytest starts, so a test usually finds them built.
BUILD_TIMEOUT_S = 1800

# The values CI checks besides the defaults: the Kafka log with two replicas, the console
# and webhook exposed through an Ingress with a token, two team namespaces, the
# ServiceMonitor on, leader election's Lease named.
KAFKA_EXPOSED: dict[str, Any] = {
    "log": {"backend": "kafka", "kafka": {"url": "kafka://kafka.kafka.svc:9092/gitsched"}},
    "replicas": 2,
    "leaderElection": {"leaseName": "gitsched-leader", "leaseSeconds": 20},
    "console": {"token": {"value": "a-console-token"}},
    "webhook": {"secret": "a-webhook-secret"},
    "ingress": {"enabled": True, "className": "nginx", "host": "gitsched.example.com"},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "rbac": {"teamNamespaces": ["ml", "cv"]},
    "repo": {"url": "https://git.example.com/platform/cluster.git", "branch": "prod"},
}


def built(script: str, *args: str) -> str:
    """The path a build script prints (building first when needed)."""
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / script), *args],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/{script} {' '.join(args)} took over {BUILD_TIMEOUT_S}s")
    if done.returncode != 0:
        pytest.fail(
            f"scripts/{script} {' '.join(args)} failed (exit {done.returncode}): this test "
            f"needs it (a Go 1.26 toolchain and the Go module proxy to build it the first "
            f"time):\n{done.stderr[-3000:]}"
        )
    return done.stdout.strip().splitlines()[-1]


def render(
    helm: str,
    values: dict[str, Any] | None = None,
    *,
    release: str = "gitsched",
    namespace: str = "gitsched-system",
    tmp: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    cmd = [helm, "template", release, str(CHART), "--namespace", namespace]
    if values is not None:
        assert tmp is not None
        file = tmp / f"values-{len(list(tmp.glob('values-*.yaml')))}.yaml"
        file.write_text(yaml.safe_dump(values))
        cmd += ["--values", str(file)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def rendered(helm: str, values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    done = render(helm, values, **kw)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
