"""Hostile pod templates: each way a committer might try to get more through a job's
`spec.template` than the job spec grants (issue 32, item 3), and the fields gitsched
refuses for it. Driven through validate, plan and reconcile
(tests/acceptance/test_hostile_templates.py) and through serve on a real API server
(tests/kube/test_hostile_templates.py)."""

from __future__ import annotations

from typing import Any

import yaml


def job_doc(template: dict[str, Any]) -> dict[str, Any]:
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


def plain_template() -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "sneaky"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example/train:1"}]},
    }


def escaped_template(change: Any) -> dict[str, Any]:
    template = plain_template()
    change(template)
    return template


def gpus(container: int, count: str, kind: str = "containers") -> Any:
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
        _both(gpus(0, "8"), gpus(1, "4")),
        [
            ("$.spec.template.spec.containers[0].resources.limits['nvidia.com/gpu']", "resources"),
            ("$.spec.template.spec.containers[1].resources.limits['nvidia.com/gpu']", "resources"),
        ],
    ),
    "gpus-in-init-container": (
        gpus(0, "8", "initContainers"),
        [
            (
                "$.spec.template.spec.initContainers[0].resources.limits['nvidia.com/gpu']",
                "resources",
            )
        ],
    ),
    "nvidia-visible-devices": (
        _set(
            "spec",
            "containers",
            value=[
                {
                    "name": "train",
                    "image": "x:1",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ],
        ),
        [("$.spec.template.spec.containers[0].env[0].name", "resources")],
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
    return yaml.safe_dump(job_doc(escaped_template(change)), sort_keys=False)
