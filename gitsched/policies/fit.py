"""Warnings, not errors: what a valid commit declares that can never run as written.

A job no node could ever host, a quota larger than the cluster: the commit is still
applied (the inventory may grow), but `validate` and `plan` say so, with file and
line, before anyone waits days for a job that was never going to start. Whether a
node can host a replica is `gitsched.engine.placement.constraints.node_rejection`, the rule
every solver uses.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence

from gitsched.engine.core import DesiredState
from gitsched.engine.model import Job, Node, NodeState
from gitsched.engine.placement.constraints import eligible_flavors, node_rejection
from gitsched.engine.placement.explain import GpuCapacity, gpu_capacity, never_runs
from gitsched.engine.units import gpus_from_milli
from gitsched.findings import Finding
from gitsched.schemas import Document, JsonPath

NEVER_FITS = "never-fits"
QUOTA_OVER_CLUSTER = "quota-over-cluster"
GPUS_UNCOVERED = "gpus-uncovered"


def fit_warnings(docs: Sequence[Document], desired: DesiredState) -> tuple[Finding, ...]:
    """Jobs that can never be placed and quotas larger than the cluster, sorted by file and line."""
    warnings: list[Finding] = []
    # Drained or failed nodes come back: "never" is judged on every node as if Ready.
    nodes = [dataclasses.replace(n, state=NodeState.READY) for n in desired.nodes.values()]
    capacity = gpu_capacity(nodes)
    by_flavor: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        if node.flavor is not None:
            by_flavor[node.flavor].append(node)
    by_name = {(d.file, d.name): d for d in docs if d.kind in ("Job", "Workspace")}
    for job in desired.jobs.values():
        doc = by_name.get((job.file, job.name))
        found = _never_fits(job, desired, nodes, by_flavor, capacity) if doc is not None else None
        if doc is not None and found is not None:
            path, reason = found
            warnings.append(
                doc.error(path, f"job '{job.name}' can never run: {reason}", NEVER_FITS)
            )
    for doc in docs:
        if doc.kind == "Queue":
            warnings.extend(_quota_over_cluster(doc, capacity.total))
    warnings.extend(_uncovered_warnings(docs, desired, capacity))
    return tuple(sorted(warnings, key=lambda e: (e.file, e.line or 0, e.column or 0)))


def _never_fits(
    job: Job,
    desired: DesiredState,
    nodes: Sequence[Node],
    by_flavor: Mapping[str, Sequence[Node]],
    capacity: GpuCapacity,
) -> tuple[JsonPath, str] | None:
    queue = desired.queues.get(job.queue)
    # GPU flavors, counts and gangs: the rule pending reasons give (engine.placement.explain).
    found = never_runs(job, queue, capacity)
    if found is not None:
        return found
    flavors = eligible_flavors(job, queue)
    candidates = [(node, f) for f in flavors for node in (nodes if f is None else by_flavor[f])]
    # Most jobs fit the first candidate: the search stops there.
    if candidates and not any(node_rejection(job, n, f) is None for n, f in candidates):
        return ("spec",), (
            f"no node can host one replica (for one: {node_rejection(job, *candidates[0])})"
        )
    return None


def uncovered_gpus(desired: DesiredState, capacity: GpuCapacity) -> list[tuple[str, int]]:
    """(flavor, GPUs) the nodes have and no queue's nominal quota covers: nobody can ever
    use them (Kueue's rule too: borrowing reaches only what some queue is promised)."""
    promised: dict[str, float] = defaultdict(float)
    for queue in desired.queues.values():
        for quota in queue.quotas:
            promised[quota.flavor] += gpus_from_milli(quota.nominal)
    out = []
    for flavor, total in sorted(capacity.total.items()):
        left = total - promised.get(flavor, 0.0)
        if left >= 1:
            out.append((flavor, int(left)))
    return out


def _uncovered_warnings(
    docs: Sequence[Document], desired: DesiredState, capacity: GpuCapacity
) -> list[Finding]:
    cluster = next((d for d in docs if d.kind == "Cluster"), None)
    if cluster is None:
        return []
    return [
        cluster.error(
            ("spec", "gpuFlavors"),
            f"{count} {flavor} GPUs of the cluster's {capacity.total[flavor]} are in no queue's"
            f" nominal quota: no job can ever use them (raise a queue's nominal {flavor} quota)",
            GPUS_UNCOVERED,
        )
        for flavor, count in uncovered_gpus(desired, capacity)
    ]


def _quota_over_cluster(doc: Document, capacity: Mapping[str, int]) -> list[Finding]:
    spec = doc.data.get("spec") or {}
    out: list[Finding] = []
    for index, quota in enumerate(spec.get("quotas", ())):
        flavor, nominal = quota["flavor"], quota["nominal"]
        has = capacity.get(flavor, 0)
        if nominal > has:
            out.append(
                doc.error(
                    ("spec", "quotas", index, "nominal"),
                    f"queue '{doc.name}' is promised {nominal:g} {flavor} GPUs but the cluster"
                    f" has {has}: the quota can never be used in full",
                    QUOTA_OVER_CLUSTER,
                )
            )
    return out
