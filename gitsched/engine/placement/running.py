"""What runs now, as the placement sees it: whether a running placement may stay exactly as
it is, and which running jobs are the solve's to decide. The formulation, the packing of a
solution, the incremental start and the explanations all ask `keep_problem`, so they agree
on what may stay.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from gitsched.engine.model import Job, Node, Placement
from gitsched.engine.placement.constraints import (
    eligible_flavors,
    node_rejection,
    replica_shape_error,
)
from gitsched.engine.placement.objective import instance_tree
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.topology import topology_violation


@dataclass(slots=True)
class RunningJob:
    """A job that runs now, and whether it may stay put."""

    job: Job
    placement: Placement
    keepable: bool
    fixed: bool  # stays put, not a decision


def keep_problem(
    instance: PlacementInstance,
    job: Job,
    placement: Placement,
    nodes: Mapping[str, Node] | None = None,
) -> str | None:
    """Why a running placement cannot stay as it is, whatever else runs; None if it can."""
    if nodes is None:
        nodes = {n.name: n for n in instance.nodes}
    queue = instance.queue(job.queue)
    if placement.flavor not in eligible_flavors(job, queue):
        return f"flavor {placement.flavor} is no longer allowed for the job"
    if not job.smallest_gang <= len(placement.replicas) <= job.replicas:
        return "the job's replica count changed"
    for replica in placement.replicas:
        node = nodes.get(replica.node)
        if node is None:
            return f"node {replica.node} was removed"
        why = node_rejection(job, node, placement.flavor)
        if why is not None:
            return why
        if replica_shape_error(job, replica) is not None:
            return "the job's resources changed"
        if any(not 0 <= g < node.gpus for g in replica.gpus):
            return "the job's GPUs are gone"
    broken = topology_violation(instance_tree(instance), job, [r.node for r in placement.replicas])
    if broken is not None:
        return f"the job's topology changed: it {broken}"
    return None


def running_jobs(
    instance: PlacementInstance,
    warm: PlacementPlan,
    keep_all: bool,
    movable: Set[str],
    unkeepable: Set[str] | None,
) -> dict[str, RunningJob]:
    """The running jobs of the instance, in a fixed order. `keep_all`: every running job the
    warm start keeps stays put but those in `movable`; `unkeepable`: those known not to
    stay (None: ask `keep_problem`)."""
    jobs = {j.key: j for j in instance.jobs}
    nodes = {n.name: n for n in instance.nodes}
    warm_outcomes = {o.job: o for o in warm.outcomes}
    out: dict[str, RunningJob] = {}
    for key, placement in sorted(instance.current.items()):  # columns in a fixed order
        job = jobs.get(key)
        if job is None:
            continue
        outcome = warm_outcomes.get(key)
        kept_by_warm = outcome is not None and outcome.status is OutcomeStatus.KEPT
        decided = job.preemptible and (not keep_all or key in movable)
        fixed = kept_by_warm and not decided
        if unkeepable is not None:
            keepable = key not in unkeepable
        else:
            keepable = fixed or keep_problem(instance, job, placement, nodes) is None
        out[key] = RunningJob(job, placement, keepable, fixed)
    return out
