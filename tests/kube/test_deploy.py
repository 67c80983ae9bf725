"""deploy/ is what the API server accepts: every manifest the kustomization lists, sent with
a server-side dry run and strict field validation (the client refuses an unknown field
first), in the namespace the kustomization puts them in. The image itself is not built here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.api import KubeApi, release

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

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
