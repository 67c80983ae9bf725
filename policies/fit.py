"""Warnings, not errors: what a valid commit declares that can never run as written.

A job no node could ever host, a quota larger than the cluster: the commit is still
applied (the inventory may grow), but `validate` and `plan` say so, with file and
line, before anyone waits days for a job that was never going to start. Whether a
node can host a replica is `engine.placement.constraints.node_rejection`, the rule
every solver uses.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence

from engine.core import DesiredState
from engine.model import Job, Node, NodeState
from engine.placement.constraints import eligible_flavors, node_rejection
from engine.units import gpus_text, milli_from_gpus
from findings import Finding
from schemas import Document, JsonPath

NEVER_FITS = "never-fits"
QUOTA_OVER_CLUSTER = "quota-over-cluster"


def fit_warnings(docs: Sequence[Document], desired: DesiredState) -> tuple[Finding, ...]:
    """Jobs that can never be placed and quotas larger than the cluster, sorted by file and line."""
    warnings: list[Finding] = []
    # Drained or failed nodes come back: "never" is judged on every node as if Ready.
    nodes = [dataclasses.replace(n, state=NodeState.READY) for n in desired.nodes.values()]
    capacity: dict[str, int] = defaultdict(int)
    by_flavor: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        if node.flavor is not None:
            capacity[node.flavor] += node.gpus
            by_flavor[node.flavor].append(node)
    by_name = {(d.file, d.name): d for d in docs if d.kind == "Job"}
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
            warnings.extend(_quota_over_cluster(doc, capacity))
    return tuple(sorted(warnings, key=lambda e: (e.file, e.line or 0, e.column or 0)))


def _never_fits(
    job: Job,
    desired: DesiredState,
    nodes: Sequence[Node],
    by_flavor: Mapping[str, Sequence[Node]],
    capacity: Mapping[str, int],
) -> tuple[JsonPath, str] | None:
    flavors = eligible_flavors(job, desired.queues.get(job.queue))
    if not flavors:
        wanted = ", ".join(job.gpu_flavors)
        return ("spec", "gpuFlavors"), (
            f"queue '{job.queue}' has no quota for {wanted}"
            if wanted
            else f"queue '{job.queue}' has no GPU quota"
        )
    if all(f is not None and capacity.get(f, 0) == 0 for f in flavors):
        return ("spec", "gpuFlavors") if job.gpu_flavors else ("spec",), (
            f"no node has GPU flavor {' or '.join(str(f) for f in flavors)}"
        )
    candidates = [(node, f) for f in flavors for node in (nodes if f is None else by_flavor[f])]
    # Most jobs fit the first candidate: the search stops there.
    if candidates and not any(node_rejection(job, n, f) is None for n, f in candidates):
        most = max((node for node, _ in candidates), key=lambda n: (n.gpus, n.cpu_milli))
        if job.resources.gpu_milli > milli_from_gpus(most.gpus):
            return ("spec", "resources", "gpu"), (
                f"a replica asks for {gpus_text(job.resources.gpu_milli)} GPUs and the largest"
                f" node it may use ({most.name}) has {most.gpus}"
            )
        return ("spec",), (
            f"no node can host one replica (for one: {node_rejection(job, *candidates[0])})"
        )
    total = milli_from_gpus(sum(capacity.get(f, 0) for f in flavors if f is not None))
    if flavors != (None,) and job.smallest_gang * job.resources.gpu_milli > total:
        return ("spec", "replicas"), (
            f"its smallest gang needs {gpus_text(job.smallest_gang * job.resources.gpu_milli)}"
            f" GPUs and the cluster has {gpus_text(total)} of"
            f" {' or '.join(str(f) for f in flavors)}"
        )
    return None


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
