"""The pods the log asks for: one per placed replica, named and labelled deterministically.

Pure. The name is the job's key, its placement and the replica index, so a
restarted actuator finds the pods it made before and never makes a second one.
A job moved or placed again gets pods of new names: they never wait for the old
ones, which on a dead node may stay Terminating until someone removes the node.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from gitsched.cluster.api import Obj
from gitsched.engine.model import Job, Placement, Queue
from gitsched.engine.state import ClusterState
from gitsched.engine.units import GPU_MILLI
from gitsched.policies.pod_security import (
    CONTAINER_KINDS,
    GPU_RESOURCE,
    PLACEMENT_FIELDS,
    UNACCOUNTED_ALLOWED,
    UNACCOUNTED_POD_FIELDS,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gitsched"
JOB_LABEL = "gitsched.io/job"  # "<queue>.<name>": label values cannot hold '/'
QUEUE_LABEL = "gitsched.io/queue"
GANG_LABEL = "gitsched.io/gang"
REPLICA_LABEL = "gitsched.io/replica"
PLACEMENT_LABEL = "gitsched.io/placement"
JOB_ANNOTATION = "gitsched.io/job-key"
GPUS_ANNOTATION = "gitsched.io/gpus"
SCHEDULING_GATE = "gitsched.io/placement"
SCHEDULER_NAME = "gitsched"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
DEFAULT_IMAGE = "registry.k8s.io/pause:3.10"
# A job without a template runs the pause image, as the Pod Security Standard
# `restricted` asks, so it runs in a namespace of any level.
DEFAULT_CONTAINER = {
    "name": "main",
    "image": DEFAULT_IMAGE,
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65535,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}


@dataclass(frozen=True, slots=True)
class DesiredPod:
    job: str
    namespace: str
    name: str
    replica: int
    node: str
    placement: str
    body: Obj


def pod_name(job: Job, placement: str, replica: int) -> str:
    # '.' cannot occur in a queue or job name (DNS-1123 labels), so names never collide.
    return f"{job.queue}.{job.name}-{placement[:6]}-{replica}"


def namespace_of(queue: Queue | None, job: Job) -> str:
    """The team's namespace (the queue's team; the queue's name when it has none)."""
    if queue is not None and queue.team:
        return queue.team
    return job.queue


def placement_id(placement: Placement) -> str:
    text = "|".join(
        [placement.job, placement.started_at]
        + [f"{r.node}:{','.join(map(str, r.gpus))}" for r in placement.replicas]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job_label(key: str) -> str:
    return key.replace("/", ".")


def desired_pods(state: ClusterState) -> dict[tuple[str, str], DesiredPod]:
    """(namespace, name) -> the pod that should exist, for every placed job."""
    out: dict[tuple[str, str], DesiredPod] = {}
    for key, placement in state.placements.items():
        job = state.jobs.get(key)
        if job is None:
            continue
        ns = namespace_of(state.queues.get(job.queue), job)
        pid = placement_id(placement)
        for i, replica in enumerate(placement.replicas):
            name = pod_name(job, pid, i)
            out[ns, name] = DesiredPod(
                key,
                ns,
                name,
                i,
                replica.node,
                pid,
                _body(job, ns, name, i, len(placement.replicas), pid, replica.gpus),
            )
    return out


def _body(
    job: Job, ns: str, name: str, replica: int, replicas: int, pid: str, gpus: tuple[int, ...]
) -> Obj:
    template: dict[str, Any] = copy.deepcopy(dict(job.template or {}))
    meta = template.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    spec = template.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    containers = spec.get("containers")
    if not (isinstance(containers, list) and containers and isinstance(containers[0], dict)):
        # No template, or one the actuator refuses (policies/pod_security.py): never a crash.
        spec["containers"] = [copy.deepcopy(DEFAULT_CONTAINER)]
    spec.setdefault("restartPolicy", "Never")
    # Gated until every replica of the gang exists; a scheduler of our own name, so
    # no kube-scheduler takes the pod in the moment between ungating and binding.
    spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    spec["schedulerName"] = SCHEDULER_NAME
    for field in PLACEMENT_FIELDS:  # placement is gitsched's (the template may not state it)
        if field not in ("schedulingGates", "schedulerName"):
            spec.pop(field, None)
    _set_resources(spec, job)
    main = spec["containers"][0]
    if not isinstance(main.get("env"), list):
        main["env"] = []
    env = main["env"]
    env.extend(
        [
            {"name": "GITSCHED_JOB", "value": job.key},
            {"name": "GITSCHED_REPLICA", "value": str(replica)},
            {"name": "GITSCHED_REPLICAS", "value": str(replicas)},
        ]
    )
    labels = dict(meta["labels"]) if isinstance(meta.get("labels"), dict) else {}
    labels.update(
        {
            MANAGED_BY: MANAGER,
            JOB_LABEL: job_label(job.key),
            QUEUE_LABEL: job.queue,
            GANG_LABEL: job_label(job.key),
            REPLICA_LABEL: str(replica),
            PLACEMENT_LABEL: pid,
        }
    )
    annotations = dict(meta["annotations"]) if isinstance(meta.get("annotations"), dict) else {}
    annotations[JOB_ANNOTATION] = job.key
    annotations[GPUS_ANNOTATION] = ",".join(map(str, gpus))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def _set_resources(spec: dict[str, Any], job: Job) -> None:
    """Exactly the resources gitsched accounts: the job's per-replica figures on the first
    container, and none of cpu, memory, GPUs or any other resource anywhere else.

    Validation refuses a template that states other figures (policies/pod_security.py);
    this makes it so for any pod made, whatever the log holds. Scratch disk
    (ephemeral-storage) is not accounted and stays as the template states it.
    """
    main = spec["containers"][0]
    resources = main.get("resources")
    stated_limits = resources.get("limits") if isinstance(resources, dict) else None
    cpu_limit = isinstance(stated_limits, dict) and "cpu" in stated_limits
    for field in UNACCOUNTED_POD_FIELDS:
        spec.pop(field, None)
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else []:
            if isinstance(container, dict):
                container["resources"] = _unaccounted_only(container.get("resources"))
    stated = main["resources"]
    requests = stated.setdefault("requests", {})
    limits = stated.setdefault("limits", {})
    r = job.resources
    if r.gpu_milli >= GPU_MILLI:
        # Whole GPUs are an extended resource: requests equal limits. A share of one GPU is
        # no extended resource: the pod's GPU annotation names the device it shares.
        limits[GPU_RESOURCE] = str(r.whole_gpus)
        requests[GPU_RESOURCE] = str(r.whole_gpus)
    if r.cpu_milli:
        requests["cpu"] = f"{r.cpu_milli}m"
        if cpu_limit:  # a CPU limit throttles: only when the template asks for one
            limits["cpu"] = f"{r.cpu_milli}m"
    if r.memory_mib:
        # Memory cannot be taken back from a pod that outgrows it: its limit is its grant.
        requests["memory"] = f"{r.memory_mib}Mi"
        limits["memory"] = f"{r.memory_mib}Mi"
    for section in ("requests", "limits"):
        if not stated[section]:
            del stated[section]


def _unaccounted_only(resources: object) -> dict[str, Any]:
    if not isinstance(resources, dict):
        return {}
    out: dict[str, Any] = {}
    for section in ("requests", "limits"):
        figures = resources.get(section)
        if isinstance(figures, dict):
            kept = {k: v for k, v in figures.items() if k in UNACCOUNTED_ALLOWED}
            if kept:
                out[section] = kept
    return out
