"""deploy/rbac.yaml is enough, and no more: gitsched runs a job and holds its Lease with a
service account bound to exactly those rules."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import KubeApi
from gitsched.cluster.lease import LeaderElector
from tests.support.kube import KubeWorld, run_until

pytestmark = pytest.mark.kube

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"
TEAM = Path(__file__).resolve().parents[2] / "deploy" / "teams" / "ml.yaml"


def _service_account_api(world: KubeWorld, namespace: str) -> tuple[KubeApi, list[Any]]:
    """A client that authenticates as the `gitsched` service account of `namespace`,
    bound to deploy/rbac.yaml's rules (cluster-wide names made unique to this test), with
    the RoleBinding of deploy/teams/ml.yaml in the test's team namespace."""
    api = world.api
    api.ensure_namespace(namespace)
    api.core.create_namespaced_service_account(
        namespace, {"metadata": {"name": "gitsched"}}, _preload_content=False
    )
    rbac: Any = client.RbacAuthorizationV1Api(api.api_client)
    made: list[Any] = []
    team_binding = [d for d in yaml.safe_load_all(TEAM.read_text()) if d["kind"] == "RoleBinding"]
    for doc in [*yaml.safe_load_all(RBAC.read_text()), *team_binding]:
        doc = copy.deepcopy(doc)
        kind = doc["kind"]
        target = namespace
        if doc["metadata"].get("namespace") == "ml":  # the team's binding: in the team's namespace
            doc["metadata"]["namespace"] = target = world.team
        if kind.startswith("Cluster"):
            doc["metadata"]["name"] += f"-{world.run_id}"
        if "roleRef" in doc and doc["roleRef"]["kind"] == "ClusterRole":
            doc["roleRef"]["name"] += f"-{world.run_id}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        if kind == "ClusterRole":
            rbac.create_cluster_role(doc, _preload_content=False)
            made.append(lambda n=doc["metadata"]["name"]: rbac.delete_cluster_role(n))
        elif kind == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(doc, _preload_content=False)
            made.append(lambda n=doc["metadata"]["name"]: rbac.delete_cluster_role_binding(n))
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc, _preload_content=False)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(target, doc, _preload_content=False)
    token = json.loads(
        api.core.create_namespaced_service_account_token(
            "gitsched", namespace, {"spec": {"expirationSeconds": 3600}}, _preload_content=False
        ).data
    )["status"]["token"]
    admin = api.api_client.configuration
    conf = client.Configuration()
    conf.host = admin.host
    conf.ssl_ca_cert = admin.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return KubeApi(client.ApiClient(conf)), made


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "not-here"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }


def test_the_deploy_rbac_runs_gitsched_and_allows_nothing_else(world: KubeWorld) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("job", replicas=2)
    namespace = f"gs-{world.run_id}"
    sa_api, cleanup = _service_account_api(world, namespace)
    try:
        elector = LeaderElector(sa_api, namespace, "gitsched", "sa-replica", lease_duration_s=5)
        assert elector.try_acquire_or_renew()
        assert elector.try_acquire_or_renew()  # a renewal is an update of the same Lease
        controller = world.controller(sa_api)
        run_until(
            controller,
            "the job started",
            lambda r: world.job_key("job") in r.state.started,
        )
        # Nothing beyond the rules: no node is deleted, no secret read, no namespace made.
        for forbidden in (
            lambda: sa_api.core.delete_node(world.nodes[0], _preload_content=False),
            lambda: sa_api.core.list_secret_for_all_namespaces(_preload_content=False),
            lambda: sa_api.core.create_namespace(
                {"metadata": {"name": f"x-{world.run_id}"}}, _preload_content=False
            ),
            lambda: sa_api.core.read_namespaced_pod(
                next(iter(world.pods())), world.team, _preload_content=False
            ),
            # Pods only in team namespaces: not in its own, not in kube-system.
            lambda: sa_api.core.create_namespaced_pod(namespace, _pod(), _preload_content=False),
            lambda: sa_api.core.create_namespaced_pod(
                "kube-system", _pod(), _preload_content=False
            ),
        ):
            with pytest.raises(ApiException) as refused:
                forbidden()
            assert refused.value.status == 403
        elector.release()
    finally:
        for undo in cleanup:
            with contextlib.suppress(ApiException):
                undo()
