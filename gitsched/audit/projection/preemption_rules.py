"""`audit compliance`'s preemption-rules check: every JobPreempted is judged again, by the
engine's own rule (`gitsched.engine.placement.preemption.judge`), on what the fold knows at that
event: the policy, both jobs, their queues, and what each queue runs of the flavor.

A stop that no rule allows is a violation: a preemptor that may not preempt the victim
or a victim younger than its minimum run time (`too_young`, on the decision's time),
a reclaim from a queue that did not borrow or by a queue not below its nominal quota, a
recorded rule that is not the one the rules give, or a "place-gone" stop with no node,
spec or quota change since the victim started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gitsched.engine.model import BackfillPolicy, Policy, PreemptionScope
from gitsched.engine.placement.constraints import held_gpu_milli
from gitsched.engine.placement.preemption import (
    Party,
    Rule,
    judge,
    protected,
    protection_minutes,
    reservation_yields,
    too_young,
)

if TYPE_CHECKING:
    from gitsched.audit.projection.state import JobInfo, ProjectionState, Running


def _policy(data: dict[str, Any]) -> Policy:
    base = Policy()
    backfill = data.get("backfill") or {}
    return Policy(
        backfill=BackfillPolicy(
            reservations=int(backfill.get("reservations", base.backfill.reservations)),
            yield_to_reclaim=bool(backfill.get("yield_to_reclaim", base.backfill.yield_to_reclaim)),
        ),
        preemption_enabled=bool(data.get("preemption_enabled", base.preemption_enabled)),
        preempt_within_queue=PreemptionScope(
            data.get("preempt_within_queue", base.preempt_within_queue)
        ),
        reclaim_within_cohort=PreemptionScope(
            data.get("reclaim_within_cohort", base.reclaim_within_cohort)
        ),
    )


def _party(state: ProjectionState, job: JobInfo, preemptible: bool = True) -> Party:
    """A job of the log as the engine's rules see one (engine.placement.preemption.party):
    its queue, cohort, priority, whether it may be a victim, and its queue's reclaim scope."""
    queue = state.queues.get(job.queue)
    return Party(
        job.queue,
        queue.cohort if queue else None,
        job.priority,
        preemptible,
        reclaim=_reclaim(queue.data if queue else {}),
    )


def _reclaim(queue: dict[str, Any]) -> PreemptionScope | None:
    """The queue's own reclaimWithinCohort, as its QueueDefined recorded it (None: the
    Policy's; queues logged before the field existed have none)."""
    value = queue.get("reclaim_within_cohort")
    return PreemptionScope(value) if value else None


def held_borrowed(
    state: ProjectionState, key: str, queue: str, flavor: str | None, run: Running | None = None
) -> bool:
    """Whether a non-preemptible job held borrowed capacity at this event, so that it was
    preemptible like any other (engine.placement.preemption.protected, the same rule)."""
    info = state.queues.get(queue)
    nominal = _nominal(state, queue, flavor) if flavor is not None else None
    if info is None or info.cohort is None or nominal is None:
        return False
    held = [
        (k, r.time, _charge(state, k, r))
        for k, r in state.running.items()
        if r.queue == queue
        and r.flavor == flavor
        and (job := state.jobs.get(k)) is not None
        and not job.preemptible
    ]
    if run is not None and key not in state.running:
        held.append((key, run.time, _charge(state, key, run)))  # its interval just closed
    return key not in protected(nominal, held)


def _charge(state: ProjectionState, key: str, run: Running) -> int:
    """What a running job costs its queue's quota (engine.placement.constraints'
    held_gpu_milli: a dedicated job is charged the nodes it holds)."""
    job = state.jobs.get(key)
    nodes = [n.gpus for name in run.nodes if (n := state.nodes.get(name)) is not None]
    return held_gpu_milli(job is not None and job.dedicated, run.gpu_milli, nodes)


def _usage(state: ProjectionState, queue: str, flavor: str, leave_out: str | None) -> int:
    return sum(
        _charge(state, key, r)
        for key, r in state.running.items()
        if r.queue == queue and r.flavor == flavor and key != leave_out
    )


def _nominal(state: ProjectionState, queue: str, flavor: str) -> int | None:
    info = state.queues.get(queue)
    quota = info.quotas.get(flavor) if info is not None else None
    return quota[0] if quota else None


def _min_runtime(state: ProjectionState, queue: str, priority_class: str) -> int:
    """`gitsched.engine.placement.preemption.min_runtime_minutes`, on what the fold keeps."""
    info = state.queues.get(queue)
    by_queue = info.data.get("min_runtime_minutes") if info is not None else None
    by_class = next(
        (
            c.get("min_runtime_minutes")
            for c in state.priority_classes
            if c["name"] == priority_class
        ),
        None,
    )
    return protection_minutes(by_queue, by_class)


def check(
    state: ProjectionState, key: str, d: dict[str, Any], run: Running | None, node_trouble: bool
) -> tuple[str, list[int]] | None:
    """(message, evidence seqs) if the rules did not allow this preemption, else None.
    `run`: the victim's open placement (still open: called before it is closed)."""
    victim = state.jobs.get(key)
    if victim is None or run is None:
        return None
    rule = d.get("rule") or Rule.UNRECORDED
    by = d.get("preempted_by")
    evidence = [victim.seq, run.seq]
    if by is None and rule in (Rule.IDLE, Rule.SUSPEND):
        # reclaimed for idleness, or suspended: the JobIdle, JobSuspended or
        # WorkspaceSuspended before it is the evidence
        return None
    if by is None or rule == Rule.PLACE_GONE:
        if rule not in (Rule.PLACE_GONE, Rule.UNRECORDED):
            return f"{key} stopped under rule {rule} with no preemptor", evidence
        queue = state.queues.get(victim.queue)
        changed = (
            node_trouble
            or victim.seq > run.seq
            or queue is None
            or queue.seq > run.seq
            or any((n := state.nodes.get(name)) is None or n.seq > run.seq for name in run.nodes)
        )
        if changed:
            return None
        return (
            f"{key} stopped as if its place were gone, but no node, job spec or quota "
            f"changed since it started (seq {run.seq})",
            evidence,
        )
    preemptor = state.jobs.get(by)
    if preemptor is None:
        return f"{key} preempted by {by}, a job the log does not know", evidence
    evidence.append(preemptor.seq)
    queues = state.queues
    victim_queue, preemptor_queue = queues.get(victim.queue), queues.get(preemptor.queue)
    evidence += [q.seq for q in (victim_queue, preemptor_queue) if q is not None]
    flavor = run.flavor
    borrows = below = False
    if flavor is not None:
        nominal = _nominal(state, victim.queue, flavor)
        borrows = nominal is not None and _usage(state, victim.queue, flavor, None) > nominal
        own = _nominal(state, preemptor.queue, flavor)
        below = own is not None and _usage(state, preemptor.queue, flavor, by) < own
    verdict = judge(
        _policy(state.policy),
        _party(state, preemptor),
        _party(
            state,
            victim,
            preemptible=victim.preemptible or held_borrowed(state, key, victim.queue, flavor),
        ),
        victim_queue_borrows=borrows,
        preemptor_queue_below_nominal=below,
    )
    if not isinstance(verdict, Rule):
        return f"{key} preempted by {by}, which the rules do not allow: {verdict}", evidence
    young = too_young(
        key,
        _min_runtime(state, victim.queue, victim.priority_class),
        run.time,
        d.get("at") or "",  # "" before JobPreempted v3: the decision's time is unknown
        preemptor_preemptible=preemptor.preemptible,
    )
    if young is not None:
        return f"{key} preempted by {by} too early: {young}", evidence
    if rule != Rule.UNRECORDED and rule != verdict:
        return f"{key} preempted by {by} under rule {rule}, but the rules give {verdict}", evidence
    return None


def reservation_yields_to(
    state: ProjectionState, key: str, job: JobInfo, reservation: dict[str, Any]
) -> bool:
    """Whether `reservation` (a ReservationsDecided entry) was not held against `key`, which
    has just started: `gitsched.engine.placement.preemption.reservation_yields`, with the
    job's queue's usage of the reservation's flavor, the job counted, against its nominal
    quota. Reservations logged before v2 borrowed nothing."""
    flavor = reservation.get("flavor")
    borrowed = int(reservation.get("borrowed_milli", 0) or 0)
    reserved = state.jobs.get(reservation["job"])
    if flavor is None or borrowed <= 0 or reserved is None:
        return False
    nominal = _nominal(state, job.queue, flavor)
    within = nominal is not None and _usage(state, job.queue, flavor, None) <= nominal
    return reservation_yields(
        _policy(state.policy),
        _party(state, job),
        _party(state, reserved, preemptible=reserved.preemptible),
        borrowed_milli=borrowed,
        within_nominal=within,
    )
