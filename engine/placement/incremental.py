"""The warm start and fallback of an incremental solve: greedy on the change alone. Every
running job stays where it is, the changed jobs go where they fit, and nobody is preempted
for them (the MILP decides that).
"""

from __future__ import annotations

import time
from collections.abc import Collection

from engine.placement.greedy import Fit, Packing, priority_order
from engine.placement.objective import lost_gpu_seconds, plan_objective
from engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from engine.placement.realise import can_take, new_packing
from engine.placement.running import keep_problem


def incremental_start(
    sub: PlacementInstance, free: Collection[str]
) -> tuple[PlacementPlan, Packing]:
    """The warm start and fallback of an incremental solve, greedy on the change alone: every
    running job stays where it is (highest priority first, as greedy keeps them), and the
    free jobs go, in priority order, wherever they fit; nobody is preempted for them (the
    MILP decides that)."""
    started = time.perf_counter()
    packing = new_packing(sub)
    outcomes: dict[str, JobOutcome] = {}
    running = [j for j in sub.jobs if j.key in sub.current and j.key not in free]
    running.sort(key=lambda j: (j.preemptible, -j.priority, j.submitted_at, j.key))
    for job in running:
        placement = sub.current[job.key]
        amount = len(placement.replicas) * job.resources.gpu_milli
        if can_take(packing, job, placement.replicas) and (
            not job.preemptible
            or packing.ledger.rejection(job.queue, placement.flavor, amount) is None
        ):
            packing.commit(job, Fit(placement.flavor, placement.replicas))
            if not job.preemptible:
                # A non-preemptible job that stays is not charged to quota (check.py agrees).
                packing.ledger.remove(job.queue, placement.flavor, amount)
            outcomes[job.key] = JobOutcome(
                job.key, OutcomeStatus.KEPT, placement.flavor, placement.replicas
            )
    for job in priority_order(j for j in sub.jobs if j.key not in outcomes):
        result = packing.find(job)
        was = sub.current.get(job.key)
        why = "" if was is None else keep_problem(sub, job, was) or "its place is taken"
        if isinstance(result, Fit):
            packing.commit(job, result)
            status = OutcomeStatus.MOVED if was is not None else OutcomeStatus.PLACED
            reason = f"moved: {why}" if was is not None else "admitted"
            outcomes[job.key] = JobOutcome(
                job.key, status, result.flavor, result.replicas, reason=reason
            )
        elif was is not None:
            outcomes[job.key] = JobOutcome(
                job.key,
                OutcomeStatus.PREEMPTED,
                reason=f"{why}; no other place: {result.reason}",
                constraint=result.constraint,
                lost_gpu_seconds=lost_gpu_seconds(job, was, sub.now),
            )
        else:
            outcomes[job.key] = JobOutcome(
                job.key, OutcomeStatus.PENDING, reason=result.reason, constraint=result.constraint
            )
    ordered = tuple(outcomes[j.key] for j in priority_order(sub.jobs))
    plan = PlacementPlan(
        outcomes=ordered,
        stats=SolveStats(
            solver="greedy",
            status="heuristic",
            objective=plan_objective(sub, ordered),
            seconds=time.perf_counter() - started,
        ),
    )
    return plan, packing
