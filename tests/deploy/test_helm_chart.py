"""deploy/helm/gitsched: `helm lint` passes, and what `helm template` renders is what the
chart promises: the RBAC of deploy/rbac.yaml (which tests/kube/test_rbac.py proves enough
and no more), a pod that meets the Pod Security Standard `restricted` with a read-only
root filesystem, serve's flags for each value, and values that cannot work together
refused with a message. tests/kube/test_helm_apply.py sends the rendered objects to the
API server."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy_tools import CHART, KAFKA_EXPOSED, ROOT, render, rendered

pytestmark = pytest.mark.helm


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def test_helm_lint_passes_for_the_defaults_and_the_kafka_values(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "kafka.yaml"
    values.write_text(yaml.safe_dump(KAFKA_EXPOSED))
    for extra in ([], ["--values", str(values)]):
        done = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_chart_grants_exactly_the_rules_of_deploy_rbac(helm: str, tmp_path: Path) -> None:
    """One set of rules: the chart's roles are deploy/rbac.yaml's, which
    tests/kube/test_rbac.py runs gitsched with as a service account."""
    kustomize = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    }
    for values in (None, KAFKA_EXPOSED):
        docs = rendered(helm, values, tmp=tmp_path)
        assert (
            _one(docs, "ClusterRole", "gitsched")["rules"]
            == kustomize["ClusterRole", "gitsched"]["rules"]
        )
        assert (
            _one(docs, "ClusterRole", "gitsched-team")["rules"]
            == kustomize["ClusterRole", "gitsched-team"]["rules"]
        )
        lease = _one(docs, "Role", "gitsched-leader-election")
        assert lease["rules"] == kustomize["Role", "gitsched-leader-election"]["rules"]
        # The pod-writing role is bound only per team namespace, never cluster-wide.
        bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
        assert bound == {"gitsched"}
        teams = [
            d
            for d in docs
            if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "gitsched-team"
        ]
        expected = KAFKA_EXPOSED["rbac"]["teamNamespaces"] if values else []
        assert sorted(b["metadata"]["namespace"] for b in teams) == sorted(expected)
        for binding in teams:
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "gitsched", "namespace": "gitsched-system"}
            ]


def test_namespace_creation_and_the_lease_role_follow_their_values(
    helm: str, tmp_path: Path
) -> None:
    docs = rendered(
        helm,
        {"rbac": {"createNamespaces": True}, "leaderElection": {"enabled": False}},
        tmp=tmp_path,
    )
    rules = _one(docs, "ClusterRole", "gitsched")["rules"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"]} in rules
    assert not [d for d in docs if d["kind"] == "Role"]
    args = _containers(docs)["gitsched"]["args"]
    assert "--create-namespaces" in args and "--no-leader-election" in args


def test_the_pod_meets_restricted_with_a_read_only_root(helm: str, tmp_path: Path) -> None:
    for values in (None, KAFKA_EXPOSED):
        docs = rendered(helm, values, tmp=tmp_path)
        pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert (
            pod["securityContext"]["runAsUser"] == 65532
        )  # the image's user (deploy/Containerfile)
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, container["name"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            # Writes go only to volumes: /tmp, the log's, git-sync's clone.
            for mount in container["volumeMounts"]:
                assert mount["name"] in volumes
            assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp", "/repo"}
        assert not any("hostPath" in v for v in pod["volumes"])


def test_serves_flags_and_environment_follow_the_values(helm: str, tmp_path: Path) -> None:
    default = _containers(rendered(helm, tmp=tmp_path))
    args = default["gitsched"]["args"]
    env = {e["name"]: e for e in default["gitsched"]["env"]}
    assert args[:2] == ["serve", "/repo/current"]
    assert env["GITSCHED_LOG"]["value"] == "sqlite:////data/log.db"
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "--console" in args and not any(a.startswith("--console-token-file") for a in args)
    assert not any(a.startswith("--webhook-secret-file") for a in args)
    sync = {e["name"]: e.get("value") for e in default["git-sync"]["env"]}
    assert sync["GITSYNC_REF"] == "main" and sync["GITSYNC_ROOT"] == "/repo"

    docs = rendered(helm, KAFKA_EXPOSED, tmp=tmp_path)
    kafka = _containers(docs)
    args = kafka["gitsched"]["args"]
    env = {e["name"]: e for e in kafka["gitsched"]["env"]}
    assert env["GITSCHED_LOG"]["value"] == "kafka://kafka.kafka.svc:9092/gitsched"
    assert "--branch=prod" in args
    assert "--lease-name=gitsched-leader" in args and "--lease-seconds=20" in args
    assert "--console-token-file=/etc/gitsched/console/token" in args
    assert "--webhook-secret-file=/etc/gitsched/webhook/secret" in args
    sync = {e["name"]: e.get("value") for e in kafka["git-sync"]["env"]}
    assert sync["GITSYNC_REPO"] == "https://git.example.com/platform/cluster.git"
    assert sync["GITSYNC_REF"] == "prod"
    deployment = _one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert "strategy" not in deployment["spec"]  # rolling: a standby waits behind the Lease
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    # The Secrets the chart made are the ones mounted where the flags point.
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["console-token"]["secret"]["secretName"] in secrets
    assert volumes["webhook"]["secret"]["secretName"] in secrets
    # Only /console and /webhook face out; /metrics stays inside.
    ingress = _one(docs, "Ingress")
    paths = [p["path"] for p in ingress["spec"]["rules"][0]["http"]["paths"]]
    assert paths == ["/console", "/webhook"]
    monitor = _one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["name"] == "http"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, "replicas > 1 needs log.backend kafka"),
        (
            {
                "replicas": 2,
                "log": {"backend": "kafka", "kafka": {"url": "kafka://k:9092/t"}},
                "leaderElection": {"enabled": False},
            },
            "replicas > 1 needs leaderElection.enabled",
        ),
        ({"log": {"backend": "kafka"}}, "log.kafka.url: kafka://host:port/topic"),
        (
            {"log": {"backend": "kafka", "kafka": {"url": "http://k:9092"}}},
            "log.kafka.url must start with kafka://",
        ),
        # values.schema.json: types, enums and no unknown key (a misspelt value is an error).
        (
            {"log": {"backend": "postgres"}},
            "at '/log/backend': value must be one of 'sqlite', 'kafka'",
        ),
        ({"replica": 2}, "additional properties 'replica' not allowed"),
        ({"console": {"tokn": {"value": "x"}}}, "additional properties 'tokn' not allowed"),
        ({"replicas": "two"}, "at '/replicas'"),
        ({"ingress": {"enabled": True}}, "ingress.enabled exposes the console"),
        ({"repo": {"url": ""}}, "repo.url: the cluster repo to follow"),
        ({"replicas": 0}, "at '/replicas': minimum: got 0, want 1"),
    ],
)
def test_values_that_cannot_work_are_refused_with_a_message(
    helm: str, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    done = render(helm, values, tmp=tmp_path)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_an_exposed_console_behind_an_auth_proxy_needs_no_token(helm: str, tmp_path: Path) -> None:
    docs = rendered(
        helm, {"ingress": {"enabled": True}, "console": {"trustForwardedUser": True}}, tmp=tmp_path
    )
    assert "--trust-forwarded-user" in _containers(docs)["gitsched"]["args"]
    assert _one(docs, "Ingress")
