"""Backfill with reservations: the top waiting jobs that cannot start get a reservation,
and no later job may start now if it could delay one.

Slurm's `sched/backfill` idea, in our decision step and with event times instead of the
clock. `reserve` walks the waiting jobs in wait order (priority, then submission) over
the cluster as it runs now; a job that fits starts (in the walk), the first ones that do
not (`Policy.backfill.reservations` of them) get the earliest time at which, by the
running jobs' start + time limit, room frees for them within their flavors, topology and
quota, and the nodes they would take then. `with_reservations` wraps any solver: the jobs
a reservation constrains (later in wait order, and running past its start: no limit, or
now + limit after it; but not a job whose queue may reclaim the part of it that is
borrowed, engine.placement.preemption.reservation_yields) are left out of the solve,
then placed by a backfill pass that keeps them off the reserved nodes and out of the
reserved quota. One rule, so greedy,
the MILP, `plan`, `reconcile` and `audit` agree (docs/time.md).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gitsched.engine.model import Job, Reservation
from gitsched.engine.placement.constraints import NodeFree, eligible_flavors
from gitsched.engine.placement.greedy import Fit, Miss, Packing, claim_shape, priority_key
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
)
from gitsched.engine.placement.preemption import reservation_yields
from gitsched.engine.timelimits import limit_reached_at, parse_time, plus_minutes
from gitsched.engine.units import gpus_text

# The constraints a reservation puts on a job's outcome, as JobPending.constraint says them.
RESERVED = "reservation"
HELD = "backfill"


@dataclass(frozen=True, slots=True)
class Book:
    """The reservations of one decision, and what the plan says of the jobs around them."""

    now: str
    reservations: tuple[Reservation, ...] = ()
    # wait-order position of every waiting job (the lower, the earlier)
    order: dict[str, int] = dataclasses.field(default_factory=dict)
    # a top job that got no reservation -> the running jobs without a limit that block it
    unbounded: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # (waiting job, reserved job): the reservation is not held against that job, whose
    # queue may reclaim what the reservation borrows (`yielding`)
    yields: frozenset[tuple[str, str]] = frozenset()
    # now + a limit in minutes -> that moment's text: every waiting job asks, and most ask
    # one of a few limits (a cache, not data)
    _ends: dict[int, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def constraining(self, job: Job) -> tuple[Reservation, ...]:
        """The reservations `job` could delay if it started now: those of jobs ahead of it
        in wait order whose start it would run past (no limit, or now + limit after it),
        but for those that yield to it (a reclaim of what they borrow)."""
        mine = self.order.get(job.key)
        if mine is None:
            return ()
        minutes = job.time_limit_minutes
        ends = None if minutes is None else self._ends.get(minutes)
        if minutes is not None and ends is None:
            ends = self._ends[minutes] = plus_minutes(self.now, minutes)
        return tuple(
            r
            for r in self.reservations
            if self.order[r.job] < mine
            and (ends is None or ends > r.start)
            and (job.key, r.job) not in self.yields
        )


def reserve(instance: PlacementInstance) -> Book:
    """The reservations at `instance.now` (see the module's docstring)."""
    wanted = instance.policy.backfill.reservations
    now = plus_minutes(instance.now, 0)
    if wanted <= 0 or not now:
        return Book(now)
    jobs = {j.key: j for j in instance.jobs}
    packing = Packing(instance)
    ends: dict[str, str | None] = {}
    for key in sorted(instance.current):
        job = jobs.get(key)
        if job is None:
            continue
        placement = instance.current[key]
        packing.commit(job, Fit(placement.flavor, placement.replicas))
        reached = limit_reached_at(job, placement)
        ends[key] = None if reached is None else max(reached, now)
    used = dict(packing.ledger.usage)  # what the running jobs hold: a reclaim's baseline
    waiting = sorted((j for j in instance.jobs if j.key not in instance.current), key=priority_key)
    order = {j.key: i for i, j in enumerate(waiting)}
    reservations: list[Reservation] = []
    unbounded: dict[str, tuple[str, ...]] = {}
    for job in waiting:
        if len(reservations) + len(unbounded) >= wanted:
            break
        found = packing.find(job)
        if isinstance(found, Fit):
            packing.commit(job, found)  # it starts now, in the walk
            ends[job.key] = (
                None
                if job.time_limit_minutes is None
                else plus_minutes(now, job.time_limit_minutes)
            )
            continue
        made = _earliest(packing, job, ends, jobs)
        if made is None:
            blockers = tuple(sorted(k for k, end in ends.items() if end is None))
            if blockers:  # else it never fits, whatever ends: it holds no reservation
                unbounded[job.key] = blockers
            continue
        reservation, fit = made
        reservations.append(reservation)
        packing.commit(job, fit)  # held from now on: a later reservation goes around it
        # ... on top of what runs there until its start: the free-GPU count `_earliest`
        # looks at first stays what the running jobs leave (find has the last word).
        for replica in fit.replicas:
            flavor = packing.nodes[replica.node].flavor
            packing.flavor_free[flavor] += replica.gpu_milli * len(replica.gpus)
        ends[job.key] = None
    return Book(
        now, tuple(reservations), order, unbounded, yielding(packing, used, waiting, reservations)
    )


def yielding(
    packing: Packing,
    used: dict[tuple[str, str], int],
    waiting: list[Job],
    reservations: list[Reservation],
) -> frozenset[tuple[str, str]]:
    """(waiting job, reserved job) for each reservation that is not held against the job
    (engine.placement.preemption.reservation_yields): its queue, with the running jobs'
    usage `used` and the waiting jobs of the queue before it in wait order and it
    started, stays within its nominal quota of the reservation's flavor, and may
    reclaim from the reserved job's queue what the reservation borrows."""
    borrowing = [r for r in reservations if r.borrowed_milli > 0 and r.flavor is not None]
    if not borrowing or not packing.instance.policy.backfill.yield_to_reclaim:
        return frozenset()  # reservation_yields would say no to every pair: skip the walk
    flavors = sorted({r.flavor for r in borrowing if r.flavor is not None})
    jobs = {j.key: j for j in waiting}
    claimed: dict[tuple[str, str], int] = defaultdict(int)
    pairs: set[tuple[str, str]] = set()
    policy = packing.instance.policy
    for job in waiting:  # in wait order: the first of a queue claim its nominal quota first
        queue = packing.queues.get(job.queue)
        eligible = eligible_flavors(job, queue)
        within: dict[str, bool] = {}
        for flavor in flavors:
            fq = queue.quota(flavor) if queue is not None else None
            if fq is None or flavor not in eligible:
                continue
            claimed[(job.queue, flavor)] += job.smallest_gang * job.resources.gpu_milli
            within[flavor] = (
                used.get((job.queue, flavor), 0) + claimed[(job.queue, flavor)] <= fq.nominal
            )
        for r in borrowing:
            if r.job == job.key or r.flavor is None or r.flavor not in within or r.job not in jobs:
                continue
            if reservation_yields(
                policy,
                packing.party(job),
                packing.party(jobs[r.job]),
                borrowed_milli=r.borrowed_milli,
                within_nominal=within[r.flavor],
            ):
                pairs.add((job.key, r.job))
    return frozenset(pairs)


def _earliest(
    packing: Packing, job: Job, ends: dict[str, str | None], jobs: dict[str, Job]
) -> tuple[Reservation, Fit] | None:
    """The earliest end of a running job after which `job` fits, and where; None when it
    never does by the limits known."""
    timeline = sorted((end, key) for key, end in ends.items() if end is not None)
    released: list[tuple[str, Fit, str]] = []
    result: tuple[Reservation, Fit] | None = None
    flavors = eligible_flavors(job, packing.queues.get(job.queue))
    need = job.smallest_gang * job.resources.gpu_milli
    for i, (end, key) in enumerate(timeline):
        released.append((key, packing.release(jobs[key]), end))
        if i + 1 < len(timeline) and timeline[i + 1][0] == end:
            continue  # every job ending at the same moment goes first
        if need and max((packing.flavor_free[f] for f in flavors), default=0) < need:
            continue  # not GPUs enough free yet on any flavor it may take: no look needed
        found = packing.find(job)
        if isinstance(found, Fit):
            nodes = tuple(sorted({r.node for r in found.replicas}))
            freed = tuple(
                sorted(
                    k
                    for k, fit, _ in released
                    if {r.node for r in fit.replicas} & set(nodes)
                    or (fit.flavor == found.flavor and jobs[k].queue == job.queue)
                )
            )
            amount = len(found.replicas) * job.resources.gpu_milli
            reservation = Reservation(
                job=job.key,
                start=end,
                nodes=nodes,
                flavor=found.flavor,
                gpu_milli=amount,
                waits_for=freed,
                borrowed_milli=borrowed(packing, job, found.flavor, amount),
            )
            result = (reservation, found)
            break
    for key, fit, _ in reversed(released):
        packing.commit(jobs[key], fit)
    return result


def borrowed(packing: Packing, job: Job, flavor: str | None, amount: int) -> int:
    """What of `amount` milli-GPU of `flavor` the job's queue would borrow, with the usage
    the packing has at the reservation's start (a queue in no cohort borrows nothing)."""
    queue = packing.queues.get(job.queue)
    if flavor is None or queue is None or queue.cohort is None:
        return 0
    fq = queue.quota(flavor)
    if fq is None:
        return 0
    over = packing.ledger.usage[(job.queue, flavor)] + amount - fq.nominal
    return max(0, min(amount, over))


def with_reservations(
    instance: PlacementInstance, solve: Callable[[PlacementInstance], PlacementPlan | None]
) -> PlacementPlan | None:
    """`solve(instance)` under the instance's reservations: the jobs they constrain are
    decided by the backfill pass after it. With backfill off, `solve(instance)` itself."""
    if instance.policy.backfill.reservations <= 0 or not any(
        j.time_limit_minutes is not None for j in instance.jobs
    ):
        return solve(instance)  # off, or no end is known: no reservation can be made
    book = reserve(instance)
    held = [j for j in instance.jobs if j.key in book.order and book.constraining(j)]
    if not book.reservations and not book.unbounded:
        return solve(instance)
    keys = {j.key for j in held}
    part = (
        dataclasses.replace(instance, jobs=tuple(j for j in instance.jobs if j.key not in keys))
        if held
        else instance
    )
    plan = solve(part)
    if plan is None:
        return None
    return backfill(instance, plan, book, held)


def backfill(
    instance: PlacementInstance, plan: PlacementPlan, book: Book, held: list[Job]
) -> PlacementPlan:
    """The plan with the held jobs decided: each starts where it delays no reservation (off
    the reserved nodes and quota, or ending before the reservation starts), else waits."""
    jobs = {j.key: j for j in instance.jobs}
    packing = Packing(instance)
    for outcome in plan.outcomes:
        if outcome.running and outcome.job in jobs:
            packing.commit(jobs[outcome.job], Fit(outcome.flavor, outcome.replicas))
    running = {o.job for o in plan.outcomes if o.running}
    live = tuple(r for r in book.reservations if r.job not in running)
    book = dataclasses.replace(book, reservations=live)
    extra: dict[str, JobOutcome] = {}
    before: list[Packing] = []

    def base() -> Packing:
        """The cluster as it ran before this decision: what a held job's reason is told on."""
        if not before:
            before.append(Packing(instance))
            for key in sorted(instance.current):
                if key in jobs:
                    placement = instance.current[key]
                    before[0].commit(jobs[key], Fit(placement.flavor, placement.replicas))
        return before[0]

    # Held jobs are mostly alike (a queue's stream of 1-GPU jobs): a miss is remembered per
    # shape, for as long as nothing is committed (misses on `base()` for good, nothing is
    # ever committed there), so a backlog of hundreds costs a few looks, not thousands.
    misses = _Misses()
    for job in sorted(held, key=priority_key):
        around = book.constraining(job)
        found: Fit | Miss | None = misses.get(job, around, "off")
        if found is None:
            with _kept_off(packing, around, jobs):
                found = misses.put(job, around, "off", packing.find(job))
        if isinstance(found, Fit):
            misses.forget()
            packing.commit(job, found)
            extra[job.key] = JobOutcome(
                job.key,
                OutcomeStatus.PLACED,
                found.flavor,
                found.replicas,
                reason="admitted (backfilled)",
            )
            continue
        free = misses.get(job, (), "free") or misses.put(job, (), "free", packing.find(job))
        if isinstance(free, Miss) and not misses.held_back(job, around, base, jobs):
            # No room even off the reservations; but held, it was not put to the solve, so
            # it preempted nothing either: the reason says so, naming the reservation.
            reason = free.reason
            if around:  # none when the reservations that held it are gone (started now)
                # The reserved job's name only, not the start: a backlog's reasons (and
                # their JobPending events) change when the reservation does, not each time
                # its start moves.
                first = min(around, key=lambda r: (r.start, r.job))
                reason = (
                    f"{reason}; held for the reservation of {first.job}: it neither takes "
                    "reserved nodes nor preempts"
                )
            extra[job.key] = JobOutcome(
                job.key, OutcomeStatus.PENDING, reason=reason, constraint=free.constraint
            )
            continue
        extra[job.key] = JobOutcome(
            job.key,
            OutcomeStatus.PENDING,
            reason=held_reason(job, around, instance),
            constraint=HELD,
        )
    outcomes = []
    reserved = {r.job: r for r in live}
    for outcome in plan.outcomes:
        if outcome.job in extra:
            continue
        if outcome.status is OutcomeStatus.PENDING and outcome.job in reserved:
            outcome = dataclasses.replace(
                outcome,
                reason=reservation_text(reserved[outcome.job], instance),
                constraint=RESERVED,
            )
        elif outcome.status is OutcomeStatus.PENDING and outcome.job in book.unbounded:
            blockers = book.unbounded[outcome.job]
            if blockers:
                outcome = dataclasses.replace(
                    outcome,
                    reason=f"{outcome.reason}; no reservation: {names_text(blockers)} "
                    f"{'has' if len(blockers) == 1 else 'have'} no time limit and run until "
                    f"{'it ends' if len(blockers) == 1 else 'they end'}",
                )
        outcomes.append(outcome)
    outcomes.extend(extra.values())
    ordered = tuple(
        sorted(
            outcomes, key=lambda o: priority_key(jobs[o.job]) if o.job in jobs else (0, "", o.job)
        )
    )
    return dataclasses.replace(plan, outcomes=ordered, reservations=live)


class _Misses:
    """What `Packing.find` answered for a job of the same shape (its queue and what
    placement reads of it), while the packing it asked is unchanged: only misses that do
    not name the job, of jobs no rule tells apart by name (preemptible, shared)."""

    def __init__(self) -> None:
        self.found: dict[tuple[object, ...], Miss] = {}
        self.held: dict[tuple[object, ...], bool] = {}

    @staticmethod
    def shape(job: Job) -> tuple[object, ...] | None:
        return claim_shape(job)

    def get(self, job: Job, around: tuple[Reservation, ...], look: str) -> Miss | None:
        shape = self.shape(job)
        if shape is None:
            return None
        return self.found.get((look, shape, tuple(r.job for r in around)))

    def put(
        self, job: Job, around: tuple[Reservation, ...], look: str, found: Fit | Miss
    ) -> Fit | Miss:
        shape = self.shape(job)
        if (
            shape is not None
            and isinstance(found, Miss)
            and job.key not in found.reason
            and job.key not in found.constraint
        ):
            self.found[(look, shape, tuple(r.job for r in around))] = found
        return found

    def forget(self) -> None:
        """The packing changed: what was asked of it before holds no more."""
        self.found.clear()

    def held_back(
        self,
        job: Job,
        around: tuple[Reservation, ...],
        base: Callable[[], Packing],
        jobs: dict[str, Job],
    ) -> bool:
        shape = self.shape(job)
        key = (shape, tuple(r.job for r in around))
        if shape is not None and key in self.held:
            return self.held[key]
        answer = _held_back(base(), job, around, jobs)
        if shape is not None:
            self.held[key] = answer
        return answer


def _held_back(
    packing: Packing, job: Job, around: tuple[Reservation, ...], jobs: dict[str, Job]
) -> bool:
    """Whether `job` fits on `packing` but not off the reserved nodes and quota."""
    if isinstance(packing.find(job), Miss):
        return False
    with _kept_off(packing, around, jobs):
        return isinstance(packing.find(job), Miss)


@contextmanager
def _kept_off(
    packing: Packing, reservations: tuple[Reservation, ...], jobs: dict[str, Job]
) -> Iterator[None]:
    """The packing with the reserved nodes full and the reserved quota in use, for the
    time of one look."""
    saved: dict[str, NodeFree] = {}
    charged: list[tuple[str, str | None, int]] = []
    for r in reservations:
        for name in r.nodes:
            if name in saved or name not in packing.free:
                continue
            saved[name] = packing.free[name]
            node = saved[name].node
            packing.free[name] = NodeFree(node, [0] * node.gpus, 0, 0, jobs=1)
            packing._stale[name] = None
        queue = jobs[r.job].queue if r.job in jobs else None
        if queue is not None and r.flavor is not None and r.gpu_milli:
            packing.ledger.add(queue, r.flavor, r.gpu_milli)
            charged.append((queue, r.flavor, r.gpu_milli))
    try:
        yield
    finally:
        for name, free in saved.items():
            packing.free[name] = free
            packing._stale[name] = None
        for queue, flavor, amount in charged:
            packing.ledger.remove(queue, flavor, amount)


def names_text(keys: tuple[str, ...]) -> str:
    if len(keys) <= 1:
        return "".join(keys)
    return f"{', '.join(keys[:-1])} and {keys[-1]}"


def clock_text(text: str) -> str:
    moment = parse_time(text)
    return text if moment is None else moment.strftime("%Y-%m-%d %H:%M UTC")


def where(instance: PlacementInstance, nodes: tuple[str, ...]) -> str:
    """The narrowest topology domain holding all of `nodes`, as "rack r3 (nodes a, b)"."""
    listed = f"nodes {', '.join(nodes)}" if len(nodes) != 1 else f"node {nodes[0]}"
    if instance.cluster is None or len(nodes) < 2:
        return listed
    by_name = {n.name: n for n in instance.nodes}
    for level in instance.cluster.topology_levels:
        domains = {by_name[n].domain(level) for n in nodes if n in by_name}
        if len(domains) == 1:
            return f"{level} {domains.pop()} ({listed})"
    return listed


def reservation_text(r: Reservation, instance: PlacementInstance) -> str:
    """A pending job's reason, as Slurm's `squeue --start` would tell it."""
    what = f"{gpus_text(r.gpu_milli)} × {r.flavor} GPU" if r.flavor else "its replicas"
    return (
        f"reserved from {clock_text(r.start)} on {where(instance, r.nodes)} ({what}){when_text(r)}"
    )


def when_text(r: Reservation) -> str:
    """ ", when a and b reach their limits": the jobs whose ends free the reservation's room."""
    if not r.waits_for:
        return ""
    if len(r.waits_for) == 1:
        return f", when {r.waits_for[0]} reaches its limit"
    return f", when {names_text(r.waits_for)} reach their limits"


def held_text(job: Job, around: tuple[Reservation, ...], instance: PlacementInstance) -> str:
    """ "held for the reservation of x from t on n: it has no time limit ...": which
    reservation holds a job back, and why."""
    first = min(around, key=lambda r: (r.start, r.job))
    runs = (
        "it has no time limit and runs until it ends"
        if job.time_limit_minutes is None
        else f"its limit of {job.time_limit_minutes} min runs past that"
    )
    return (
        f"held for the reservation of {first.job} from {clock_text(first.start)} on "
        f"{where(instance, first.nodes)}: {runs}"
    )


def held_reason(job: Job, around: tuple[Reservation, ...], instance: PlacementInstance) -> str:
    """Why a job that fits now waits: starting it could delay a reservation."""
    return f"{held_text(job, around, instance)}, and every place it fits now takes reserved nodes or quota"
