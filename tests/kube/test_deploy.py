"""deploy/ is what the API server accepts: every manifest the kustomization lists, sent with
a server-side dry run and strict field validation (the client refuses an unknown field
first), in the namespace the kustomization puts them in. The image itself is not built here."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import KubeApi, release

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PAUSE = "registry.k8s.io/pause:3.10"

# kind -> (API class, its create method; namespaced when the method says so)
CREATE = {
    "Namespace": (client.CoreV1Api, "create_namespace"),
    "ServiceAccount": (client.CoreV1Api, "create_namespaced_service_account"),
    "Service": (client.CoreV1Api, "create_namespaced_service"),
    "PersistentVolumeClaim": (client.CoreV1Api, "create_namespaced_persistent_volume_claim"),
    "Deployment": (client.AppsV1Api, "create_namespaced_deployment"),
    "ClusterRole": (client.RbacAuthorizationV1Api, "create_cluster_role"),
    "ClusterRoleBinding": (client.RbacAuthorizationV1Api, "create_cluster_role_binding"),
    "Role": (client.RbacAuthorizationV1Api, "create_namespaced_role"),
    "RoleBinding": (client.RbacAuthorizationV1Api, "create_namespaced_role_binding"),
}


def _manifests() -> tuple[str, list[dict[str, Any]]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d)
    return kustomization["namespace"], docs


def _dry_run(api: KubeApi, namespace: str, doc: dict[str, Any]) -> None:
    cls, method = CREATE[doc["kind"]]
    create = getattr(cls(api.api_client), method)
    where = (namespace,) if "namespaced" in method else ()
    release(create(*where, doc, dry_run="All", field_validation="Strict", _preload_content=False))


def test_every_manifest_of_the_kustomization_is_valid_for_the_api_server(
    kube_api: KubeApi,
) -> None:
    namespace, docs = _manifests()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted(CREATE), f"a kind this test does not know: {kinds}"
    # The namespace itself first (really made: namespaced dry runs need it to exist).
    kube_api.ensure_namespace(namespace)
    for doc in docs:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == namespace
            continue
        try:
            _dry_run(kube_api, namespace, doc)
        except ApiException as e:
            reason = json.loads(e.body).get("message") if e.body else e.reason
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {reason}")


def test_an_invalid_manifest_is_refused_so_the_check_above_can_fail(kube_api: KubeApi) -> None:
    namespace, docs = _manifests()
    kube_api.ensure_namespace(namespace)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = 0
    with pytest.raises(ApiException) as refused:
        _dry_run(kube_api, namespace, deployment)
    assert refused.value.status == 422
    assert "containerPort" in (refused.value.body or "")


TEAMS = DEPLOY / "teams"


def _team_manifests(name: str) -> list[dict[str, Any]]:
    """deploy/teams/'s manifests, every team namespace renamed `name` (unique to the test)."""
    kustomization = yaml.safe_load((TEAMS / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for file in kustomization["resources"]:
        for doc in yaml.safe_load_all((TEAMS / file).read_text()):
            if doc["kind"] == "Namespace":
                doc["metadata"]["name"] = name
            else:
                doc["metadata"]["namespace"] = name
            docs.append(doc)
    return docs


def _make_team_namespace(api: KubeApi, name: str) -> dict[str, Any]:
    (namespace,) = [d for d in _team_manifests(name) if d["kind"] == "Namespace"]
    release(api.core.create_namespace(namespace, _preload_content=False))
    return namespace


def test_the_team_namespace_manifests_are_valid_for_the_api_server(kube_api: KubeApi) -> None:
    name = f"team-{uuid.uuid4().hex[:8]}"
    docs = _team_manifests(name)
    assert sorted(d["kind"] for d in docs) == ["Namespace", "RoleBinding"]
    namespace = _make_team_namespace(kube_api, name)
    try:
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
        (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
        # The per-namespace grant names the ClusterRole that no ClusterRoleBinding names.
        _, cluster = _manifests()
        cluster_bound = {d["roleRef"]["name"] for d in cluster if d["kind"] == "ClusterRoleBinding"}
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gitsched-team",
        }
        assert "gitsched-team" not in cluster_bound
        roles = {d["metadata"]["name"]: d for d in cluster if d["kind"] == "ClusterRole"}
        assert "create" not in str(roles["gitsched"]["rules"])  # pod creation: per namespace only
        try:
            _dry_run(kube_api, name, binding)
        except ApiException as e:
            pytest.fail(f"RoleBinding: {json.loads(e.body).get('message') if e.body else e}")
    finally:
        release(kube_api.core.delete_namespace(name, _preload_content=False))


def test_pod_security_admission_refuses_what_the_team_namespace_does_not_allow(
    kube_api: KubeApi,
) -> None:
    """The second wall: even a pod gitsched's check let through (or a pod made another
    way) is judged by the API server against the namespace's level."""
    name = f"team-{uuid.uuid4().hex[:8]}"
    _make_team_namespace(kube_api, name)
    try:
        for escape in (
            {"hostNetwork": True},
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            {
                "containers": [
                    {
                        "name": "c",
                        "image": PAUSE,
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                    }
                ]
            },
        ):
            pod = {
                "metadata": {"name": "escape"},
                "spec": {"containers": [{"name": "c", "image": PAUSE}], **escape},
            }
            with pytest.raises(ApiException) as refused:
                release(
                    kube_api.core.create_namespaced_pod(
                        name, pod, dry_run="All", _preload_content=False
                    )
                )
            assert refused.value.status == 403, refused.value.body
            assert "violates PodSecurity" in (refused.value.body or "")
        # A pod the level allows is accepted, so the refusals above are the level's.
        plain = {
            "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "c", "image": PAUSE}]},
        }
        release(
            kube_api.core.create_namespaced_pod(name, plain, dry_run="All", _preload_content=False)
        )
    finally:
        release(kube_api.core.delete_namespace(name, _preload_content=False))
