"""Kueue's StrictFIFO queueing strategy: in a queue that asks for it, the first waiting job
(priority, then submission) that cannot start blocks every later job of that queue, even
one that would fit; other queues go on (docs/time.md, Queueing strategy).

One rule for every solver: `with_strict_fifo` wraps the solve (greedy, the MILP, an
incremental solve, with or without reservations), looks at which of a strict queue's
waiting jobs the plan starts, and when one starts behind a head the plan leaves waiting,
solves again without it; it waits, and says behind whom. BestEffortFIFO, the default,
is the plan as it comes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gitsched.engine.model import Job, QueueingStrategy
from gitsched.engine.placement.explain import NEVER_RUNS, tell_never_runs
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
)
from gitsched.engine.placement.preemption import wait_order

# The constraint a held job's outcome names (JobPending.constraint).
STRICT_FIFO = "strict-fifo"


def strict_queues(instance: PlacementInstance) -> frozenset[str]:
    return frozenset(
        q.name for q in instance.queues if q.queueing_strategy is QueueingStrategy.STRICT_FIFO
    )


def with_strict_fifo(
    instance: PlacementInstance, solve: Callable[[PlacementInstance], PlacementPlan | None]
) -> PlacementPlan | None:
    """`solve(instance)`, with no job of a StrictFIFO queue started while a job ahead of it
    in that queue waits. A head that can never run on this cluster (its reason says so)
    blocks nobody: it would block its queue for good. Every job behind a head waits, with
    the head as its reason, for the next decision, even where the solve without them
    starts the head."""
    strict = strict_queues(instance)
    if not strict:
        return solve(instance)
    waiting: dict[str, list[Job]] = {}
    for job in sorted(instance.jobs, key=wait_order):
        if job.queue in strict and job.key not in instance.current:
            waiting.setdefault(job.queue, []).append(job)
    if not any(len(jobs) > 1 for jobs in waiting.values()):
        return solve(instance)  # no queue has a job behind another: nothing to hold
    held: dict[str, Job] = {}  # held job -> the head it waits behind
    never_runs: set[str] = set()  # blocks nobody
    part = instance
    while True:
        plan = solve(part)
        if plan is None:
            return None
        outcomes = {o.job: o for o in tell_never_runs(part, plan).outcomes}
        # Every job behind a head is held, started or not: none may start in this
        # decision, so none is a candidate (Kueue does not try them). When one did
        # start, the rest is solved again without them all: one more solve, over the
        # heads and the other queues, however long the queues behind the heads are.
        behind: dict[str, Job] = {}
        started_behind = False
        for queue in sorted(waiting):
            head: Job | None = None
            for job in waiting[queue]:
                outcome = outcomes.get(job.key)
                if outcome is None:
                    continue  # held already
                started = outcome.running
                never = outcome.constraint.startswith(NEVER_RUNS)
                if never:
                    never_runs.add(job.key)
                if head is None:
                    if not started and not never:
                        head = job
                elif not never:
                    behind[job.key] = head
                    started_behind = started_behind or started
        held.update(behind)
        if not started_behind:
            break
        part = dataclasses.replace(
            instance, jobs=tuple(j for j in instance.jobs if j.key not in held)
        )
    if not held:
        return plan
    running = {o.job for o in plan.outcomes if o.running}
    extra = []
    for key, head in sorted(held.items()):
        ahead = [
            j.key for j in waiting[head.queue] if j.key not in running and j.key not in never_runs
        ]
        first = ahead[0] if ahead and ahead[0] != key else None
        reason = (
            f"queue {head.queue} is StrictFIFO and {first} waits ahead of it"
            if first is not None
            else f"queue {head.queue} is StrictFIFO: it waits for the next decision, "
            f"as {head.key} did not start when it would have"
        )
        extra.append(JobOutcome(key, OutcomeStatus.PENDING, reason=reason, constraint=STRICT_FIFO))
    jobs = {j.key: j for j in instance.jobs}
    ordered = tuple(
        sorted(
            (*(o for o in plan.outcomes if o.job not in held), *extra),
            key=lambda o: wait_order(jobs[o.job]) if o.job in jobs else (0, 0, "", o.job),
        )
    )
    return dataclasses.replace(plan, outcomes=ordered)
