"""deploy/helm/gitsched is what the API server accepts: `helm template | kubectl apply
--dry-run=server --validate=strict`, for the default values and for the Kafka + exposed
console values, in a namespace of the test's own. kubectl is built by scripts/kube from
the release the test API server runs. The ServiceMonitor's CRD (Prometheus Operator's)
is not on the test server, so the test installs one for monitoring.coreos.com/v1
ServiceMonitor whose schema types the fields the chart sets as the operator's CRD types
them, without x-kubernetes-preserve-unknown-fields: a field the operator does not have is
refused, as on a real cluster."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import KubeApi, release
from tests.support.deploy_tools import KAFKA_EXPOSED, built, render
from tests.support.kube import ENV_VAR

pytestmark = [pytest.mark.kube, pytest.mark.helm]

CRD_NAME = "servicemonitors.monitoring.coreos.com"
# Prometheus Operator's duration pattern (monitoring.coreos.com_servicemonitors.yaml).
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
LABELS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "shortNames": ["smon"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "required": ["spec"],
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["selector"],
                                "properties": {
                                    "jobLabel": {"type": "string"},
                                    "selector": {
                                        "type": "object",
                                        "properties": {"matchLabels": LABELS},
                                    },
                                    "namespaceSelector": {
                                        "type": "object",
                                        "properties": {
                                            "any": {"type": "boolean"},
                                            "matchNames": {
                                                "type": "array",
                                                "items": {"type": "string"},
                                            },
                                        },
                                    },
                                    "endpoints": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "port": {"type": "string"},
                                                "path": {"type": "string"},
                                                "scheme": {
                                                    "type": "string",
                                                    "enum": ["http", "https", "HTTP", "HTTPS"],
                                                },
                                                "interval": {"type": "string", "pattern": DURATION},
                                                "scrapeTimeout": {
                                                    "type": "string",
                                                    "pattern": DURATION,
                                                },
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return built("kube", "kubectl")


@pytest.fixture(scope="module")
def helm() -> str:
    return built("helm", "build")


@pytest.fixture(scope="module")
def service_monitor_crd(kube_api: KubeApi) -> None:
    """The CRD, made once on the shared server (kept: another run may be using it; one
    that is already there, the real operator's included, is used as it is)."""
    ext: Any = client.ApiextensionsV1Api(kube_api.api_client)
    with contextlib.suppress(ApiException):
        release(ext.create_custom_resource_definition(SERVICE_MONITOR_CRD, _preload_content=False))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(CRD_NAME)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        if conditions.get("Established") == "True":
            return
        time.sleep(0.2)
    pytest.fail(f"the CRD {CRD_NAME} was not Established within 120s")


@pytest.fixture
def namespaces(kube_api: KubeApi) -> Iterator[list[str]]:
    """The release's namespace and two team namespaces, unique to the test."""
    run = uuid.uuid4().hex[:8]
    names = [f"gs-helm-{run}", f"ml-{run}", f"cv-{run}"]
    for name in names:
        kube_api.ensure_namespace(name)
    # The release's namespace enforces `restricted`, as deploy/namespace.yaml's does: the
    # API server warns of a Deployment whose pods that level would refuse.
    restricted = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    release(
        kube_api.core.patch_namespace(
            names[0], {"metadata": {"labels": restricted}}, _preload_content=False
        )
    )
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                release(kube_api.core.delete_namespace(name, _preload_content=False))


def _apply_dry_run(kubectl: str, manifest: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECACHEDIR": str(tmp / "kube-cache"), "HOME": str(tmp)}
    return subprocess.run(
        [
            kubectl,
            "--kubeconfig",
            os.environ[ENV_VAR],
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
        ],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )


def _render(helm: str, values: dict[str, Any] | None, release_name: str, ns: str, tmp: Path) -> str:
    done = render(helm, values, release=release_name, namespace=ns, tmp=tmp)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _kafka_values(teams: list[str]) -> dict[str, Any]:
    return {**KAFKA_EXPOSED, "rbac": {"teamNamespaces": teams}}


@pytest.mark.usefixtures("service_monitor_crd")
def test_the_rendered_chart_is_accepted_by_the_api_server(
    kube_api: KubeApi, kubectl: str, helm: str, namespaces: list[str], tmp_path: Path
) -> None:
    ns, *teams = namespaces
    release_name = f"gs-{ns.rsplit('-', 1)[1]}"
    for values in (None, _kafka_values(teams)):
        manifest = _render(helm, values, release_name, ns, tmp_path)
        kinds = sorted({d["kind"] for d in yaml.safe_load_all(manifest) if d})
        done = _apply_dry_run(kubectl, manifest, tmp_path)
        assert done.returncode == 0, f"values {values}:\n{done.stdout}\n{done.stderr}"
        assert "PodSecurity" not in done.stderr, done.stderr
        # Every object was sent: kubectl names each one with "(server dry run)".
        sent = [line for line in done.stdout.splitlines() if line.endswith("(server dry run)")]
        assert len(sent) == manifest.count("\nkind: ") + manifest.startswith("kind: "), done.stdout
        if values is not None:
            assert {"ServiceMonitor", "Ingress", "Secret"} <= set(kinds)
            assert sum(".rbac.authorization.k8s.io/" in s for s in sent) >= 6


@pytest.mark.usefixtures("service_monitor_crd")
def test_an_object_the_server_refuses_fails_the_dry_run(
    kubectl: str, helm: str, namespaces: list[str], tmp_path: Path
) -> None:
    """The check above can fail: a misspelt ServiceMonitor field (strict validation
    against the CRD's schema) and an invalid port are refused, and a pod that
    `restricted` would refuse is warned of."""
    ns, *teams = namespaces
    manifest = _render(helm, _kafka_values(teams), f"gs-{ns.rsplit('-', 1)[1]}", ns, tmp_path)
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    done = _apply_dry_run(kubectl, yaml.safe_dump(monitor), tmp_path)
    assert done.returncode != 0
    assert 'unknown field "spec.endpoints[0].intervall"' in done.stderr, done.stderr
    monitor["spec"]["endpoints"][0].pop("intervall")
    monitor["spec"]["endpoints"][0]["interval"] = "half a minute"
    done = _apply_dry_run(kubectl, yaml.safe_dump(monitor), tmp_path)
    assert done.returncode != 0 and "interval" in done.stderr, done.stderr
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    pod["containers"][1]["securityContext"]["allowPrivilegeEscalation"] = True
    done = _apply_dry_run(kubectl, yaml.safe_dump(deployment), tmp_path)
    assert 'would violate PodSecurity "restricted:latest"' in done.stderr, done.stderr
    pod["containers"][1]["ports"][0]["containerPort"] = 0
    done = _apply_dry_run(kubectl, yaml.safe_dump(deployment), tmp_path)
    assert done.returncode != 0 and "containerPort" in done.stderr, done.stderr
