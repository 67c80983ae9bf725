"""Kubernetes Node objects -> the cluster's nodes, and the node events that bring the log up to date.

Pure: a Node object (a dict, as the API returns it) and the cluster spec in,
`gitsched.engine.model.Node` out; the diff against the folded state gives NodeRegistered,
NodeStateChanged and NodeRemoved. What the API says wins over the log: the log
records what the cluster had, and when.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gitsched.engine import events as ev
from gitsched.engine.model import ClusterSpec, Isolation, Node, NodeState
from gitsched.engine.state import ClusterState

GPU_RESOURCE = "nvidia.com/gpu"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
GFD_COUNT = "nvidia.com/gpu.count"
GFD_CLIQUE = "nvidia.com/gpu.clique"  # NVLink domain (NVL72)
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
FLAVOR_LABEL = "gitsched.io/flavor"
ISOLATION_LABEL = "gitsched.io/isolation"
# Labels copied onto the node in the log (the rest change too often, or say nothing of placement).
KEPT_LABEL_PREFIXES = (
    "nvidia.com/",
    "topology.kubernetes.io/",
    "gitsched.io/",
    "node.kubernetes.io/",
)
# Taints that mean the node is gone for its pods (the node lifecycle controller sets them).
FAILED_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(frozen=True, slots=True)
class InventoryConfig:
    """Which label names each topology level of the cluster. A level not named here
    reads `topology.gitsched.io/<level>`."""

    level_labels: Mapping[str, str] = field(
        default_factory=lambda: {
            "zone": ZONE_LABEL,
            "nvlink": GFD_CLIQUE,
            "clique": GFD_CLIQUE,
            "rack": "topology.gitsched.io/rack",
            "block": "topology.gitsched.io/block",
        }
    )
    # Only nodes with this label (key or key=value) are the cluster's; empty: every node.
    node_selector: str = ""

    def label_of(self, level: str) -> str:
        return self.level_labels.get(level, f"topology.gitsched.io/{level}")


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}


def quantity(text: str | int | float | None) -> float:
    """A Kubernetes resource quantity ('8', '500m', '64Gi') as a number; unreadable is 0."""
    if text is None:
        return 0.0
    if isinstance(text, int | float):
        return float(text)
    m = _QUANTITY.match(text.strip())
    if m is None or m.group(2) not in _SUFFIX:
        return 0.0
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def selected(obj: Mapping[str, Any], cfg: InventoryConfig) -> bool:
    if not cfg.node_selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    key, _, value = cfg.node_selector.partition("=")
    return key in labels and (not value or labels[key] == value)


def node_state(obj: Mapping[str, Any]) -> tuple[NodeState, str]:
    """Ready, Drained (cordoned) or Failed (not Ready, or tainted unreachable), and why."""
    spec = obj.get("spec") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        why = ready.get("reason") or ready.get("status") if ready else "no Ready condition"
        return NodeState.FAILED, f"Kubernetes: node not Ready ({why})"
    for taint in spec.get("taints") or []:
        if taint.get("key") in FAILED_TAINTS:
            return NodeState.FAILED, f"Kubernetes: taint {taint['key']}"
    if spec.get("unschedulable"):
        return NodeState.DRAINED, "Kubernetes: node cordoned"
    return NodeState.READY, "Kubernetes: node Ready"


def _flavor(labels: Mapping[str, str], cluster: ClusterSpec | None) -> str | None:
    if FLAVOR_LABEL in labels:
        return labels[FLAVOR_LABEL]
    product = labels.get(GFD_PRODUCT)
    if product is None:
        return None
    for flavor in cluster.gpu_flavors if cluster else ():
        if product in (flavor.model, flavor.name):
            return flavor.name
    return product


def to_node(obj: Mapping[str, Any], cluster: ClusterSpec | None, cfg: InventoryConfig) -> Node:
    meta = obj["metadata"]
    labels: dict[str, str] = dict(meta.get("labels") or {})
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    topology: dict[str, str] = {}
    for level in cluster.topology_levels if cluster else ():
        value = labels.get(cfg.label_of(level))
        if value:
            topology[level] = value
    kept = {k: v for k, v in labels.items() if k.startswith(KEPT_LABEL_PREFIXES)}
    for taint in (obj.get("spec") or {}).get("taints") or []:
        kept[f"taint/{taint.get('key')}"] = f"{taint.get('value', '')}:{taint.get('effect', '')}"
    state, _ = node_state(obj)
    return Node(
        name=meta["name"],
        flavor=_flavor(labels, cluster),
        gpus=int(quantity(allocatable.get(GPU_RESOURCE))),
        cpu_milli=round(quantity(allocatable.get("cpu")) * 1000),
        memory_mib=int(quantity(allocatable.get("memory")) // 1024**2),
        topology=topology,
        region=labels.get(REGION_LABEL),
        isolation=Isolation.DEDICATED
        if labels.get(ISOLATION_LABEL) == "dedicated"
        else Isolation.SHARED,
        state=state,
        labels=kept,
    )


def node_events(
    state: ClusterState, objects: Iterable[Mapping[str, Any]], cfg: InventoryConfig
) -> list[ev.Event]:
    """The events that make the log's nodes what the API shows now. None before the log
    holds a cluster: a node's flavor and topology are read against its flavors and levels,
    so each node is registered once, with them, not first under its raw GPU product."""
    if state.cluster is None:
        return []
    out: list[ev.Event] = []
    seen: set[str] = set()
    for obj in sorted(objects, key=lambda o: str(o["metadata"]["name"])):
        if not selected(obj, cfg):
            continue
        node = to_node(obj, state.cluster, cfg)
        seen.add(node.name)
        old = state.nodes.get(node.name)
        if old == node:
            continue
        if old is not None and replace(old, state=node.state) == node:
            out.append(
                ev.NodeStateChanged(node=node.name, state=node.state, reason=node_state(obj)[1])
            )
        else:
            out.append(ev.NodeRegistered(node=node))
    for name in sorted(set(state.nodes) - seen):
        out.append(ev.NodeRemoved(node=name))
    return out
