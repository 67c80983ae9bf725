"""When a running job may move, written once: every solver's plan goes through `settle_moves`
(greedy, the MILP on every backend, its incremental and decomposed solves) and `check_plan`
asks `move_reasons`, so no plan moves a running job without one of these reasons:
- its place is gone (node drained, failed or removed, its spec or topology changed);
- its queue's quota of the flavor it runs on was cut below what the queue holds;
- it grows (an elastic job runs more replicas than before);
- it makes room: a job this plan admits, or a move that itself makes room, takes GPUs it
  left (or the CPU or memory of a node it left, so that it could not go back) -- KAI's
  consolidation: a move only to place a pending job.
A move for anything else (fragmentation, a tidier packing, a solver that stopped short)
is undone: the job stays where it is. The work a move loses (since the last checkpoint,
plus a restart per replica) is priced by objective.move_penalty; how many moves one solve
may make of its own accord is the Policy's `maxMovesPerSolve` (`voluntary_moves_left`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from enum import StrEnum

from gitsched.engine.model import Isolation, Placement, ReplicaPlacement
from gitsched.engine.placement.constraints import QuotaLedger, quota_charge
from gitsched.engine.placement.objective import jobs_by_key, lost_gpu_seconds, nodes_by_name
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus, PlacementInstance
from gitsched.engine.placement.preemption import (
    Rule,
    judge_jobs,
    over_limits,
    reason_text,
    start_ledger,
    victim_order,
)
from gitsched.engine.placement.running import keep_problem


class MoveReason(StrEnum):
    """Why a running job moved (JobOutcome.rule and PlacementDecided.rule of a move)."""

    PLACE_GONE = "place-gone"  # its node, spec or topology no longer holds it
    QUOTA_CUT = "quota-cut"  # its queue is over a cut quota of the flavor it ran on
    GROWS = "grows"  # an elastic job runs more replicas than before
    MAKES_ROOM = "makes-room"  # work the plan admits takes the GPUs (or CPU, memory) it left
    UNRECORDED = "unrecorded"  # logged before moves recorded a reason (PlacementDecided v1)


# The reasons a rule forces (the move is no choice: never counted against the cap).
REQUIRED = frozenset((MoveReason.PLACE_GONE, MoveReason.QUOTA_CUT))


def move_reasons(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome]
) -> dict[str, tuple[MoveReason, str] | None]:
    """Each move of the plan and its reason (code, words); None: a move no rule allows."""
    jobs = jobs_by_key(instance)
    nodes = nodes_by_name(instance)
    ledger = start_ledger(instance)
    moved = {
        o.job: o
        for o in outcomes
        if o.status is OutcomeStatus.MOVED and o.job in instance.current and o.job in jobs
    }
    found: dict[str, tuple[MoveReason, str] | None] = {}
    for key, o in moved.items():
        job, was = jobs[key], instance.current[key]
        why = keep_problem(instance, job, was, nodes)
        if why is not None:
            found[key] = (MoveReason.PLACE_GONE, f"moved: {why}")
        elif job.preemptible and over_limits(ledger, job.queue, was.flavor):
            found[key] = (
                MoveReason.QUOTA_CUT,
                f"moved: queue {job.queue} is over its quota of {was.flavor}",
            )
        elif len(o.replicas) > len(was.replicas):
            found[key] = (
                MoveReason.GROWS,
                f"moved: it grows from {len(was.replicas)} to {len(o.replicas)} replicas",
            )
        else:
            found[key] = None
    placed = {o.job for o in outcomes if o.status is OutcomeStatus.PLACED}
    final = {o.job: o for o in outcomes}
    # Who takes each GPU anew (node, index): admitted jobs, and moved jobs on GPUs they did
    # not hold or hold more of (an elastic job's new share on a GPU it shared already); a
    # job without GPUs takes the node ((node, -1)).
    arrivals: dict[tuple[str, int], list[str]] = defaultdict(list)
    for o in outcomes:
        if o.status is OutcomeStatus.PLACED or o.job in moved:
            before = instance.current[o.job].replicas if o.job in moved else ()
            for spot in _arrived(before, o.replicas):
                arrivals[spot].append(o.job)

    def admits(key: str) -> bool:
        return key in placed or found.get(key) is not None

    changed = True
    while changed:  # a move makes room for an admitted job, or for a move that does
        changed = False
        for key in sorted(k for k, v in found.items() if v is None):
            for node, gpu in sorted(_held(instance.current[key])):
                by = next((k for k in arrivals.get((node, gpu), ()) if admits(k)), None)
                if by is not None:
                    found[key] = _makes_room(node, by, by in placed)
                    changed = True
                    break
        if changed:
            continue
        # What is left may go back but where the CPU or memory it held went to a job the
        # plan admits: those moves made room too (on that node).
        stay = {k for k, v in found.items() if v is None}
        for node_name, key, by in _crowded(instance, final, stay, admits):
            if found[key] is None:
                found[key] = _makes_room(node_name, by, by in placed)
                changed = True
    return found


def _held(placement: Placement) -> set[tuple[str, int]]:
    """The GPUs (node, index) a placement holds; a replica without GPUs holds (node, -1)."""
    return {(r.node, g) for r in placement.replicas for g in (r.gpus or (-1,))}


def _arrived(
    before: Sequence[ReplicaPlacement], after: Sequence[ReplicaPlacement]
) -> list[tuple[str, int]]:
    """The GPUs (node, index) a job takes anew going from `before` to `after`: those it did
    not hold, and those it holds more of (an elastic job's new share on a GPU it already
    shared); a replica without GPUs takes one of (node, -1)."""

    def taken(replicas: Sequence[ReplicaPlacement]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = defaultdict(int)
        for r in replicas:
            for g in r.gpus or (-1,):
                out[(r.node, g)] += r.gpu_milli if g >= 0 else 1
        return out

    was, now = taken(before), taken(after)
    return sorted(spot for spot, amount in now.items() if amount > was.get(spot, 0))


def _makes_room(node: str, by: str, admitted: bool) -> tuple[MoveReason, str]:
    what = "admitted" if admitted else "moved"
    return MoveReason.MAKES_ROOM, f"moved to make room on {node} for {by} ({what} by this plan)"


def _crowded(
    instance: PlacementInstance,
    final: Mapping[str, JobOutcome],
    stay: set[str],
    admits: Callable[[str], bool],
) -> list[tuple[str, str, str]]:
    """(node, mover, arrival) for each node whose CPU or memory the jobs in `stay` would
    overfill if they went back to it, or where an isolated job would share it, with a job
    the plan admits there."""
    jobs = jobs_by_key(instance)
    nodes = nodes_by_name(instance)
    cpu: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    newcomers: dict[str, list[str]] = defaultdict(list)
    movers: dict[str, list[str]] = defaultdict(list)
    dedicated: set[str] = set()  # nodes an isolated job would share
    for key, o in final.items():
        job = jobs.get(key)
        if job is None or not o.running:
            continue
        replicas = instance.current[key].replicas if key in stay else o.replicas
        for r in replicas:
            cpu[r.node] += job.resources.cpu_milli
            memory[r.node] += job.resources.memory_mib
            if job.isolation is Isolation.DEDICATED:
                dedicated.add(r.node)
            if key in stay:
                movers[r.node].append(key)
            elif admits(key):
                newcomers[r.node].append(key)
    out = []
    for name in sorted(movers):
        node = nodes.get(name)
        if node is None or not newcomers.get(name):
            continue
        if cpu[name] > node.cpu_milli or memory[name] > node.memory_mib or name in dedicated:
            by = sorted(newcomers[name])[0]
            out += [(name, key, by) for key in sorted(set(movers[name]))]
    return out


def settle_moves(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome]
) -> tuple[JobOutcome, ...]:
    """The plan with every move that no rule allows undone (the job stays where it is: its
    old place holds only jobs that were there with it, so it is free again), every move
    that stays carrying its reason code (`rule`), its words and the work it loses, and at
    most maxMovesPerSolve moves of the plan's own accord: past the cap, a job that moved
    to make room for an admitted job stops instead where the rules let that job preempt
    it (Kueue's way), lowest in victim order first. An undone move that would break a
    quota (it changed flavor or replica count) is kept as it was."""
    settled = _settle(instance, outcomes)
    for _ in range(CAP_ROUNDS):
        capped = _stop_past_cap(instance, settled)
        if capped is None:
            break
        settled = _settle(instance, capped)  # a move that made room for a stopped one goes
    return settled


CAP_ROUNDS = 4  # stopping a mover can undo a move that made room for it: a few rounds


def _stop_past_cap(
    instance: PlacementInstance, outcomes: tuple[JobOutcome, ...]
) -> tuple[JobOutcome, ...] | None:
    """The plan with the moves past the cap stopped instead, where a rule lets the job they
    made room for preempt them; None when the plan is within the cap or none may stop."""
    cap = instance.policy.max_moves_per_solve
    if cap is None:
        return None
    jobs = jobs_by_key(instance)
    voluntary = [
        o
        for o in outcomes
        if o.status is OutcomeStatus.MOVED
        and o.rule in (MoveReason.MAKES_ROOM, MoveReason.GROWS)
        and o.job in jobs
    ]
    excess = len(voluntary) - cap
    if excess <= 0:
        return None
    placed = {o.job for o in outcomes if o.status is OutcomeStatus.PLACED}
    ledger = start_ledger(instance)
    stopped: dict[str, JobOutcome] = {}
    candidates = []
    for o in voluntary:
        by = _beneficiary(instance, outcomes, o.job)
        if by is None or by not in placed:
            continue
        was = instance.current[o.job]
        lost = lost_gpu_seconds(jobs[o.job], was, instance.now)
        candidates.append((victim_order(jobs[by], jobs[o.job], lost, was.started_at), o, by))
    for _, o, by in sorted(candidates, key=lambda c: c[0]):
        if len(stopped) >= excess:
            break
        victim, preemptor = jobs[o.job], jobs[by]
        was = instance.current[o.job]
        rule = judge_jobs(instance.policy, preemptor, victim, was.flavor, ledger)
        if not isinstance(rule, Rule):
            continue
        stopped[o.job] = JobOutcome(
            o.job,
            OutcomeStatus.PREEMPTED,
            reason=reason_text(rule, preemptor, victim, was.flavor)
            + f" (maxMovesPerSolve {cap}: it stops rather than moves)",
            constraint="preemption",
            preempted_by=by,
            lost_gpu_seconds=lost_gpu_seconds(victim, was, instance.now),
            rule=rule,
        )
    if not stopped:
        return None
    return tuple(stopped.get(o.job, o) for o in outcomes)


def _beneficiary(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome], key: str
) -> str | None:
    """The job that took the GPUs the moved job left, first by name; None if none did."""
    left = _held(instance.current[key])
    takers = []
    for o in outcomes:
        if o.job == key or not o.running:
            continue
        before = instance.current[o.job].replicas if o.job in instance.current else ()
        if left.intersection(_arrived(before, o.replicas)):
            takers.append(o.job)
    return min(takers) if takers else None


def _settle(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> tuple[JobOutcome, ...]:
    """settle_moves without the cap: undo the moves no rule allows, label the others."""
    reasons = move_reasons(instance, outcomes)
    if not reasons:
        return tuple(outcomes)
    jobs = jobs_by_key(instance)
    undo = {k for k, v in reasons.items() if v is None}
    risky = {
        o.job
        for o in outcomes
        if o.job in undo
        and (
            o.flavor != instance.current[o.job].flavor
            or len(o.replicas) != len(instance.current[o.job].replicas)
        )
    }
    if risky and _quota_broken(instance, outcomes, undo):
        undo -= risky
    out: list[JobOutcome] = []
    for o in outcomes:
        if o.job not in reasons:
            out.append(o)
            continue
        was = instance.current[o.job]
        if o.job in undo:
            out.append(
                JobOutcome(
                    o.job,
                    OutcomeStatus.KEPT,
                    was.flavor,
                    was.replicas,
                    reason="stays: a move would let no waiting work run",
                )
            )
            continue
        verdict = reasons[o.job]
        code, words = verdict if verdict is not None else (None, o.reason)
        out.append(
            replace(
                o,
                reason=words,
                rule=code.value if code is not None else "",
                lost_gpu_seconds=lost_gpu_seconds(jobs[o.job], was, instance.now),
            )
        )
    return tuple(out)


def _quota_broken(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome], undo: set[str]
) -> bool:
    """Whether the plan with the moves in `undo` undone breaks a quota limit."""
    jobs = jobs_by_key(instance)
    nodes = nodes_by_name(instance)
    ledger = QuotaLedger(instance.queues)
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None or not o.running:
            continue
        flavor, replicas = (
            (instance.current[o.job].flavor, instance.current[o.job].replicas)
            if o.job in undo
            else (o.flavor, o.replicas)
        )
        if o.status is OutcomeStatus.KEPT and not job.preemptible:
            continue
        if o.job in undo and not job.preemptible:
            continue
        ledger.add(job.queue, flavor, quota_charge(job, replicas, nodes))
    return bool(ledger.violations())


def voluntary_moves_left(instance: PlacementInstance, made: int) -> bool:
    """Whether the plan may make one more move of its own accord (the Policy's
    maxMovesPerSolve; None: no cap) after `made` such moves."""
    cap = instance.policy.max_moves_per_solve
    return cap is None or made < cap


def unexplained_moves(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> list[str]:
    """The plan's moves that no rule allows, and a cap broken (check.py's findings)."""
    reasons = move_reasons(instance, outcomes)
    problems = [f"{k}: moved, but no rule allows the move" for k, v in reasons.items() if v is None]
    voluntary = sum(1 for v in reasons.values() if v is not None and v[0] not in REQUIRED)
    cap = instance.policy.max_moves_per_solve
    if cap is not None and voluntary > cap:
        problems.append(f"moves: {voluntary} running jobs moved, maxMovesPerSolve is {cap}")
    return problems
