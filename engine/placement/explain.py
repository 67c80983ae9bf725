"""Every job's outcome told: why a job that does not run does not run (what greedy's
packing reports for it), why a running job moved or stopped, and which rule allowed each
preemption (engine.placement.preemption.attribute).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from engine.model import Job
from engine.placement.greedy import Fit, Miss, Packing, priority_order
from engine.placement.objective import lost_gpu_seconds
from engine.placement.plan import JobOutcome, OutcomeStatus, PlacementInstance
from engine.placement.preemption import Attribution, attribute, reclaim_note
from engine.placement.running import keep_problem
from engine.placement.topology import explain_spans


def explain_outcomes(
    instance: PlacementInstance,
    packing: Packing,
    status: dict[str, OutcomeStatus],
    notes: dict[str, str],
) -> tuple[JobOutcome, ...]:
    out: dict[str, JobOutcome] = {}
    placed_on: dict[str, set[str]] = defaultdict(set)  # node -> jobs now placed or moved there
    for key, st in status.items():
        if st in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
            for r in packing.running[key].replicas:
                placed_on[r.node].add(key)
    for job in priority_order(instance.jobs):
        key = job.key
        now = status.get(key)
        was = instance.current.get(key)
        if now is not None:
            fit = packing.running[key]
            reason = notes.get(key, "admitted")
            if now is OutcomeStatus.MOVED and was is not None:
                why = keep_problem(instance, job, was)
                reason = f"moved: {why}" if why else "moved to make room (its move cost is paid)"
            out[key] = JobOutcome(key, now, fit.flavor, fit.replicas, reason=reason)
            continue
        miss = packing.find(job)
        if isinstance(miss, Fit):
            reason = "fits, but placing it lowers the objective (fragmentation or fairness terms)"
            miss = Miss(reason, f"objective__{key}")
        if was is None:
            note = reclaim_note(instance.policy, job, packing.ledger, packing.holders)
            out[key] = JobOutcome(
                key,
                OutcomeStatus.PENDING,
                reason=f"{miss.reason}; {note}" if note else miss.reason,
                constraint=miss.constraint,
            )
            continue
        lost = lost_gpu_seconds(job, was, instance.now)
        why = keep_problem(instance, job, was)
        out[key] = JobOutcome(
            key,
            OutcomeStatus.PREEMPTED,
            reason=f"{why}; no other place: {miss.reason}" if why else miss.reason,
            constraint=miss.constraint if why else "preemption",
            lost_gpu_seconds=lost,
        )
    found = attribution(instance, tuple(out.values()), placed_on)
    for key, (by, rule, reason) in found.by.items():
        o = out[key]
        if by is not None:
            o = replace(o, reason=reason, preempted_by=by)
        out[key] = replace(o, rule=rule)
    return explain_spans(instance, tuple(out[j.key] for j in priority_order(instance.jobs)))


def attribution(
    instance: PlacementInstance,
    outcomes: tuple[JobOutcome, ...],
    placed_on: dict[str, set[str]] | None = None,
) -> Attribution:
    """What allowed each preemption of a plan (engine.placement.preemption.attribute): a
    job placed on the victim's nodes is tried first, highest priority first."""
    if placed_on is None:
        placed_on = defaultdict(set)
        for o in outcomes:
            if o.status in (OutcomeStatus.PLACED, OutcomeStatus.MOVED):
                for r in o.replicas:
                    placed_on[r.node].add(o.job)
    jobs = {j.key: j for j in instance.jobs}

    def near(victim: Job) -> list[str]:
        was = instance.current[victim.key]
        keys = {k for r in was.replicas for k in placed_on.get(r.node, ())}
        return sorted(keys, key=lambda k: (-jobs[k].priority, k))

    return attribute(instance, outcomes, lambda j, p: keep_problem(instance, j, p), near)
