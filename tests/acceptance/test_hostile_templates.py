"""A pod template is not a way around the rules (issue 32, item 3): each escape a committer
might try through `spec.template` is refused by `validate`, by `plan` on the pull request,
and by `reconcile` once merged, with file, line and field, and nothing reaches the log but
the CommitRejected. The same suite runs on a real API server through `serve`
(tests/kube/test_hostile_templates.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    git,
    gitsched,
    log_state,
    of_type,
    read_events,
)
from tests.support.plan import PR, open_pr, plan_json

JOB_FILE = "teams/ml/jobs/sneaky.yaml"


def _job(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gitsched.io/v1",
        "kind": "Job",
        "metadata": {"name": "sneaky"},
        "spec": {
            "replicas": 1,
            "resources": {"gpu": 1, "cpu": 8, "memoryGiB": 64},
            "gpuFlavors": ["h100-80g"],
            "template": template,
        },
    }


def _plain() -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "sneaky"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/train:1"}]},
    }


def _escape(change: Any) -> dict[str, Any]:
    template = _plain()
    change(template)
    return template


def _gpus(container: int, count: str, kind: str = "containers") -> Any:
    def change(t: dict[str, Any]) -> None:
        containers = t["spec"].setdefault(kind, [])
        while len(containers) <= container:
            containers.append({"name": f"c{len(containers)}", "image": "registry.example/x:1"})
        containers[container]["resources"] = {"limits": {"nvidia.com/gpu": count}}

    return change


def _set(*path: str, value: Any) -> Any:
    def change(t: dict[str, Any]) -> None:
        node = t
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value

    return change


def _both(*changes: Any) -> Any:
    def change(t: dict[str, Any]) -> None:
        for c in changes:
            c(t)

    return change


# escape -> (how the template is changed, the fields refused: (JSON path, code))
ESCAPES: dict[str, tuple[Any, list[tuple[str, str]]]] = {
    "gpus-8-in-first-4-in-second-container": (
        _both(_gpus(0, "8"), _gpus(1, "4")),
        [
            ("$.spec.template.spec.containers[0].resources.limits['nvidia.com/gpu']", "resources"),
            ("$.spec.template.spec.containers[1].resources.limits['nvidia.com/gpu']", "resources"),
        ],
    ),
    "gpus-in-init-container": (
        _gpus(0, "8", "initContainers"),
        [
            (
                "$.spec.template.spec.initContainers[0].resources.limits['nvidia.com/gpu']",
                "resources",
            )
        ],
    ),
    "privileged": (
        _set(
            "spec",
            "containers",
            value=[{"name": "train", "image": "x:1", "securityContext": {"privileged": True}}],
        ),
        [("$.spec.template.spec.containers[0].securityContext.privileged", "pod-security")],
    ),
    "hostpath-root": (
        _set("spec", "volumes", value=[{"name": "root", "hostPath": {"path": "/"}}]),
        [("$.spec.template.spec.volumes[0].hostPath", "pod-security")],
    ),
    "host-network": (
        _set("spec", "hostNetwork", value=True),
        [("$.spec.template.spec.hostNetwork", "pod-security")],
    ),
    "gitsched-service-account": (
        _set("spec", "serviceAccountName", value="gitsched"),
        [("$.spec.template.spec.serviceAccountName", "service-account")],
    ),
    "unlisted-service-account": (
        _set("spec", "serviceAccountName", value="deployer"),
        [("$.spec.template.spec.serviceAccountName", "service-account")],
    ),
    "gitsched-label": (
        _set("metadata", "labels", "gitsched.io/queue", value="infer"),
        [("$.spec.template.metadata.labels['gitsched.io/queue']", "reserved")],
    ),
    "gitsched-annotation": (
        _set("metadata", "annotations", "gitsched.io/gpus", value="0,1,2,3,4,5,6,7"),
        [("$.spec.template.metadata.annotations['gitsched.io/gpus']", "reserved")],
    ),
    "node-selector": (
        _set("spec", "nodeSelector", value={"kubernetes.io/hostname": "h100-00"}),
        [("$.spec.template.spec.nodeSelector", "reserved")],
    ),
    "node-name": (
        _set("spec", "nodeName", value="h100-00"),
        [("$.spec.template.spec", "schema")],
    ),
}


def hostile_job(escape: str) -> str:
    change, _ = ESCAPES[escape]
    return yaml.safe_dump(_job(_escape(change)), sort_keys=False)


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_each_escape_is_refused_by_validate_plan_and_reconcile(
    reconciled: ClusterRepo, escape: str
) -> None:
    _, refused = ESCAPES[escape]
    before = log_state(reconciled.log_path)
    events_before = len(read_events(reconciled.log_path))
    text = hostile_job(escape)
    open_pr(reconciled, {JOB_FILE: text}, "ml: a job that asks for more", author=ANA)

    run = gitsched("validate", reconciled.path, "--rev", PR, "--format", "json", expect=1)
    errors = [e for e in run.json()["errors"] if e["file"] == JOB_FILE]
    assert sorted((e["path"], e["code"]) for e in errors) == sorted(refused), run.stdout
    for e in errors:
        # Each finding points at its own field's line in the committed file.
        assert e["line"] and e["line"] > 1, e

    plan = plan_json(reconciled, expect=2)
    assert plan["valid"] is False
    assert sorted((e["path"], e["code"]) for e in plan["errors"]) == sorted(refused)
    assert len(read_events(reconciled.log_path)) == events_before  # plan never writes

    git(reconciled.path, "merge", "-q", "--ff-only", PR)
    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert f"REJECTED {reconciled.head()[:12]}" in run.stdout
    events = read_events(reconciled.log_path)
    (rejected,) = of_type(events, "CommitRejected")
    assert sorted((e["path"], e["code"]) for e in rejected.data["errors"]) == sorted(refused)
    assert all(e["file"] == JOB_FILE for e in rejected.data["errors"])
    assert not [e for e in of_type(events, "JobSubmitted") if "sneaky" in str(e.data)]
    after = log_state(reconciled.log_path)
    assert after["placements"] == before["placements"]
    assert "ml/sneaky" not in after["pending"]


def test_a_team_held_to_restricted_and_one_allowed_privileged(reconciled: ClusterRepo) -> None:
    policy = (
        "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata:\n  name: security\nspec:\n"
        "  podSecurity:\n    teams: {ml: restricted}\n"
    )
    reconciled.write("policies/security.yaml", policy)
    reconciled.write(JOB_FILE, yaml.safe_dump(_job(_plain()), sort_keys=False))
    reconciled.commit("platform: ml runs restricted", author=ANA)
    run = gitsched("validate", reconciled.path, "--format", "json", expect=1)
    paths = sorted(e["path"] for e in run.json()["errors"])
    at = "$.spec.template.spec.containers[0].securityContext"
    assert paths == [
        f"{at}.allowPrivilegeEscalation",
        f"{at}.capabilities.drop",
        f"{at}.runAsNonRoot",
        f"{at}.seccompProfile.type",
    ]
    hardened = _plain()
    hardened["spec"]["containers"][0]["securityContext"] = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    reconciled.write(JOB_FILE, yaml.safe_dump(_job(hardened), sort_keys=False))
    reconciled.commit("ml: a hardened job", author=ANA)
    gitsched("validate", reconciled.path, expect=0)

    # A privileged team may run a privileged pod, but never more GPUs than it is granted.
    reconciled.write("policies/security.yaml", policy.replace("restricted", "privileged"))
    privileged = copy.deepcopy(_plain())
    privileged["spec"]["hostNetwork"] = True
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    reconciled.write(JOB_FILE, yaml.safe_dump(_job(privileged), sort_keys=False))
    reconciled.commit("platform: ml may run privileged pods", author=ANA)
    gitsched("validate", reconciled.path, expect=0)
    gitsched("reconcile", "--once", reconciled.path, expect=0)
    state = log_state(reconciled.log_path)
    assert "ml/sneaky" in state["placements"] or "ml/sneaky" in state["pending"]

    _gpus(0, "8")(privileged)
    reconciled.write(JOB_FILE, yaml.safe_dump(_job(privileged), sort_keys=False))
    reconciled.commit("ml: more GPUs", author=ANA)
    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert "containers[0].resources.limits['nvidia.com/gpu']" in run.stdout
    assert "grants 1 GPU" in run.stdout
