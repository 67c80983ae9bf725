"""deploy/ grants gitsched pod creation only in team namespaces, and labels those for Pod
Security Admission: read from the manifests themselves, so it holds without an API server
(tests/kube/test_deploy.py and test_rbac.py show the server agrees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
WRITES = {"create", "patch", "update", "delete", "deletecollection", "*"}
LEVELS = {"privileged", "baseline", "restricted"}


def _docs(folder: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        out.extend(d for d in yaml.safe_load_all((folder / name).read_text()) if d)
    return out


def _writes_pods(role: dict[str, Any]) -> bool:
    return any(
        {"pods", "pods/binding", "*"} & set(rule.get("resources", []))
        and WRITES & set(rule.get("verbs", []))
        for rule in role.get("rules", [])
    )


def test_no_cluster_wide_binding_lets_gitsched_write_pods() -> None:
    base = _docs(DEPLOY)
    roles = {d["metadata"]["name"]: d for d in base if d["kind"] == "ClusterRole"}
    cluster_bound = [d["roleRef"]["name"] for d in base if d["kind"] == "ClusterRoleBinding"]
    assert cluster_bound and all(not _writes_pods(roles[name]) for name in cluster_bound)
    # The role that writes pods exists, and only RoleBindings (one per team) name it.
    writers = [name for name, role in roles.items() if _writes_pods(role)]
    assert writers == ["gitsched-team"]


def test_every_team_namespace_is_labelled_and_bound_in_itself() -> None:
    teams = _docs(DEPLOY / "teams")
    namespaces = {d["metadata"]["name"]: d for d in teams if d["kind"] == "Namespace"}
    bindings = [d for d in teams if d["kind"] == "RoleBinding"]
    assert namespaces and sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)
    for name, namespace in namespaces.items():
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] in LEVELS - {"privileged"}, name
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gitsched-team",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gitsched", "namespace": "gitsched-system"}
        ]
    assert {d["kind"] for d in teams} == {"Namespace", "RoleBinding"}  # nothing cluster-wide


def test_gitscheds_own_namespace_is_restricted() -> None:
    (namespace,) = [d for d in _docs(DEPLOY) if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
