"""An independent check of any plan against its instance.

It shares only the quota arithmetic and eligibility rules with the solvers and
re-counts capacity from scratch, so a solver bug shows up as a violation here.
"""

from __future__ import annotations

from collections import defaultdict

from gitsched.engine.model import Isolation
from gitsched.engine.placement.constraints import (
    QuotaLedger,
    node_rejection,
    quota_charge,
    replica_shape_error,
    replicas_text,
)
from gitsched.engine.placement.moves import unexplained_moves
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.preemption import borrowing_reclaimable, non_preemptible_borrowing
from gitsched.engine.placement.spread import spread_violations
from gitsched.engine.placement.topology import Tree, topology_violation
from gitsched.engine.units import GPU_MILLI


def check_plan(instance: PlacementInstance, plan: PlacementPlan) -> list[str]:
    """Every rule the plan breaks; an empty list means the plan is legal."""
    instance = borrowing_reclaimable(instance)
    problems: list[str] = non_preemptible_borrowing(instance, plan.outcomes)
    jobs = {j.key: j for j in instance.jobs}
    nodes = {n.name: n for n in instance.nodes}
    tree = Tree.of(instance.cluster, instance.nodes)
    seen: set[str] = set()
    gpu_use: dict[tuple[str, int], int] = defaultdict(int)
    cpu_use: dict[str, int] = defaultdict(int)
    mem_use: dict[str, int] = defaultdict(int)
    holders: dict[str, set[str]] = defaultdict(set)
    ledger = QuotaLedger(instance.queues)

    for outcome in plan.outcomes:
        if outcome.job in seen:
            problems.append(f"{outcome.job}: appears twice in the plan")
        seen.add(outcome.job)
        job = jobs.get(outcome.job)
        if job is None:
            problems.append(f"{outcome.job}: not a job of the instance")
            continue
        was_running = outcome.job in instance.current
        if outcome.status is OutcomeStatus.PREEMPTED and not was_running:
            problems.append(f"{job.key}: preempted but was not running")
        if outcome.status in (OutcomeStatus.KEPT, OutcomeStatus.MOVED) and not was_running:
            problems.append(f"{job.key}: {outcome.status} but was not running")
        if outcome.status is OutcomeStatus.PLACED and was_running:
            problems.append(f"{job.key}: placed anew but was running (should be kept or moved)")
        if (
            outcome.status is OutcomeStatus.KEPT
            and was_running
            and instance.current[job.key].replicas != outcome.replicas
        ):
            problems.append(f"{job.key}: kept, but its replicas changed")
        if not outcome.running:
            if outcome.replicas:
                problems.append(f"{job.key}: {outcome.status} yet holds replicas")
            if outcome.status is OutcomeStatus.PREEMPTED and not job.preemptible:
                gone = any(
                    r.node not in nodes or not nodes[r.node].schedulable
                    for r in instance.current[job.key].replicas
                )
                if not gone:
                    problems.append(f"{job.key}: non-preemptible job preempted")
            continue
        count = len(outcome.replicas)
        if not job.smallest_gang <= count <= job.replicas:
            problems.append(
                f"{job.key}: gang split: {replicas_text(count)} placed, needs {job.smallest_gang}..{job.replicas}"
            )
        for replica in outcome.replicas:
            node = nodes.get(replica.node)
            if node is None:
                problems.append(f"{job.key}: placed on unknown node {replica.node}")
                continue
            if job.resources.gpu_milli > 0 and outcome.flavor is None:
                problems.append(f"{job.key}: GPU job with no flavor")
            why = node_rejection(job, node, outcome.flavor if job.resources.gpu_milli else None)
            if why is not None:
                problems.append(f"{job.key}: {why}")
            shape = replica_shape_error(job, replica)
            if shape is not None:
                problems.append(shape)
            for gpu in replica.gpus:
                if not 0 <= gpu < node.gpus:
                    problems.append(f"{job.key}: GPU index {gpu} does not exist on {node.name}")
                gpu_use[(node.name, gpu)] += replica.gpu_milli
            cpu_use[node.name] += job.resources.cpu_milli
            mem_use[node.name] += job.resources.memory_mib
            holders[node.name].add(job.key)
        broken = topology_violation(tree, job, [r.node for r in outcome.replicas])
        if broken is not None:
            problems.append(f"{job.key}: {broken}")
        exempt = outcome.status is OutcomeStatus.KEPT and not job.preemptible
        if not exempt:
            ledger.add(job.queue, outcome.flavor, quota_charge(job, outcome.replicas, nodes))

    for job_key in jobs:
        if job_key not in seen:
            problems.append(f"{job_key}: missing from the plan")
    for (node_name, gpu), used in sorted(gpu_use.items()):
        if used > GPU_MILLI:
            problems.append(f"{node_name}: GPU {gpu} over-committed ({used} milli)")
    for node_name, used in sorted(cpu_use.items()):
        if used > nodes[node_name].cpu_milli:
            problems.append(f"{node_name}: CPU over-committed")
    for node_name, used in sorted(mem_use.items()):
        if used > nodes[node_name].memory_mib:
            problems.append(f"{node_name}: memory over-committed")
    for node_name, keys in sorted(holders.items()):
        isolated = [k for k in keys if jobs[k].isolation is Isolation.DEDICATED]
        if isolated and len(keys) > 1:
            problems.append(
                f"{node_name}: dedicated job {isolated[0]} shares the node with {sorted(keys - {isolated[0]})}"
            )
    problems.extend(f"quota: {v}" for v in ledger.violations())
    running = [(o.job, [r.node for r in o.replicas]) for o in plan.outcomes if o.running]
    problems.extend(f"spread: {v}" for v in spread_violations(jobs, nodes, running))
    problems.extend(unexplained_moves(instance, plan.outcomes))
    return problems
