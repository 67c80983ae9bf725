"""Quotas and preemption as a Kueue user reads them, written once: who may preempt whom,
which victims go first, and which waiting job is admitted first. Greedy, the MILP, `plan`
and `audit compliance` all ask this module, so no two of them can disagree.

The rules (docs/quotas-and-preemption.md has the examples):
- within a queue, with `withinQueue: LowerPriority`, a job preempts lower-priority jobs of
  its own queue;
- within a cohort, with `reclaimWithinCohort` (`Any`, or `LowerPriority`: only lower
  priority), a queue below its nominal quota of a flavor reclaims it from the queues of
  its cohort that borrow that flavor, and only while they still borrow;
- never preempt to borrow: a job that preempts must fit within its queue's nominal quota
  of the flavor once its victims are gone;
- victims are taken borrowers first, then lowest priority, then a service's replicas above
  its minimum, then least work lost since the last checkpoint, then the newest; every
  victim the job can do without is given back;
- waiting jobs: per queue by priority (then age), and across queues a job that fits within
  its queue's nominal quota goes before one that would borrow.
Priority is an order, never a price: lost work chooses victims, not whether to preempt.
A running job younger than its queue's or priority class's minRuntimeMinutes is no victim
but of non-preemptible work (`too_young`; docs/time.md).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from gitsched.engine.model import ClusterSpec, Job, Placement, Policy, PreemptionScope, Queue
from gitsched.engine.placement.constraints import QuotaLedger, eligible_flavors, quota_charge
from gitsched.engine.placement.plan import JobOutcome, OutcomeStatus, PlacementInstance
from gitsched.engine.services import surplus


class Rule(StrEnum):
    """Why a running job stopped: the rule that allowed it (JobPreempted.rule)."""

    WITHIN_QUEUE = "within-queue"  # a higher-priority job of its own queue took its place
    RECLAIM = "reclaim"  # a queue below nominal took back what the victim's queue borrowed
    PLACE_GONE = "place-gone"  # its node, its spec or its queue's quota no longer holds it
    IDLE = "idle"  # its GPUs stayed idle and the policy reclaims them (engine/idle.py, JobIdle)
    SUSPEND = "suspend"  # suspended: spec.suspend (JobSuspended) or idle (WorkspaceSuspended)
    UNRECORDED = "unrecorded"  # logged before the rule was recorded (upcast JobPreempted v1)


@dataclass(frozen=True, slots=True)
class Party:
    """The preemptor or the victim, as the rules see it."""

    queue: str
    cohort: str | None
    priority: int
    preemptible: bool = True
    # The party's queue's own reclaimWithinCohort (Kueue: per ClusterQueue); None: the Policy's.
    reclaim: PreemptionScope | None = None


def judge(
    policy: Policy,
    preemptor: Party,
    victim: Party,
    *,
    victim_queue_borrows: bool,
    preemptor_queue_below_nominal: bool,
) -> Rule | str:
    """The rule that lets `preemptor` preempt `victim`, or why none does (a Rule is a str
    too: test the answer with isinstance(answer, Rule)). The quota facts are those of the
    flavor the victim holds, before the preemption."""
    if not policy.preemption_enabled:
        return "preemption is disabled by the policy"
    if not victim.preemptible:
        return "the victim is not preemptible"
    if preemptor.queue == victim.queue:
        if policy.preempt_within_queue is not PreemptionScope.LOWER_PRIORITY:
            return f"withinQueue is {policy.preempt_within_queue}"
        if preemptor.priority <= victim.priority:
            return f"priority {preemptor.priority} is not above {victim.priority}"
        return Rule.WITHIN_QUEUE
    if preemptor.cohort is None or preemptor.cohort != victim.cohort:
        return f"queues {preemptor.queue} and {victim.queue} share no cohort"
    scope = preemptor.reclaim or policy.reclaim_within_cohort
    if scope is PreemptionScope.NEVER:
        return "reclaimWithinCohort is Never"
    if scope is PreemptionScope.LOWER_PRIORITY and preemptor.priority <= victim.priority:
        return (
            f"reclaimWithinCohort is LowerPriority and priority {preemptor.priority} "
            f"is not above {victim.priority}"
        )
    if not victim_queue_borrows:
        return f"queue {victim.queue} does not borrow: nothing to reclaim"
    if not preemptor_queue_below_nominal:
        return f"queue {preemptor.queue} is not below its nominal quota: it would preempt to borrow"
    return Rule.RECLAIM


def reservation_yields(
    policy: Policy, claimant: Party, reserved: Party, *, borrowed_milli: int, within_nominal: bool
) -> bool:
    """Whether a backfill reservation of `reserved`'s job is not held against `claimant`'s
    (docs/time.md, "Reservations and reclaim"). A reservation promises only what its queue
    is entitled to: when part of it is borrowed (`borrowed_milli` > 0) and the claimant's
    queue, within its nominal quota of the reservation's flavor with the claimant started
    (`within_nominal`), could reclaim from the reserved job's queue by the rules above
    (`judge`: same cohort, reclaimWithinCohort, preemption on), the claimant does not wait
    for it: the reserved job, started on borrowed quota, would be reclaimed at once.
    Greedy, the MILP, `plan`, `reconcile` and `audit compliance` all ask this. Policy
    `backfill.yieldToReclaim: false` keeps every reservation (Slurm's: a promise to the
    top job is kept whatever the quota it rests on)."""
    if borrowed_milli <= 0 or not policy.backfill.yield_to_reclaim:
        return False
    verdict = judge(
        policy,
        claimant,
        reserved,
        victim_queue_borrows=True,
        preemptor_queue_below_nominal=within_nominal,
    )
    return verdict is Rule.RECLAIM


def party(job: Job, queues: Mapping[str, Queue]) -> Party:
    queue = queues.get(job.queue)
    return Party(
        job.queue,
        queue.cohort if queue else None,
        job.priority,
        job.preemptible,
        queue.reclaim_within_cohort if queue else None,
    )


# -- non-preemptible work stays within nominal quota -----------------------------------------


def non_preemptible_fits(nominal: int, held: int, amount: int) -> bool:
    """Whether `amount` more milli-GPU of non-preemptible work fits a queue's nominal quota of
    a flavor that already holds `held` of it. A non-preemptible job does not borrow (KAI's
    rule): the queue's non-preemptible jobs together stay within nominal, so whatever the
    queue borrows is held by preemptible jobs and can always be reclaimed."""
    return held + amount <= nominal


def protected(nominal: int, held: Sequence[tuple[str, str, int]]) -> frozenset[str]:
    """Of a queue's running non-preemptible jobs on one flavor, as (key, started_at,
    milli-GPU), those that keep their protection: taken oldest first while they fit the
    nominal quota together (`non_preemptible_fits`). The others hold borrowed capacity (the
    flag was added to a borrowing job, or the nominal quota was cut): they are preemptible
    like any other job. greedy, the MILP, check.py and audit compliance all ask this."""
    kept: list[str] = []
    total = 0
    for key, _, milli in sorted(held, key=lambda h: (h[1], h[0])):
        if not non_preemptible_fits(nominal, total, milli):
            break
        total += milli
        kept.append(key)
    return frozenset(kept)


def borrowing_reclaimable(instance: PlacementInstance) -> PlacementInstance:
    """The instance as the rules see it: a running non-preemptible job of a queue in a
    cohort that `protected` does not protect is preemptible (borrowed capacity is always
    reclaimable). A queue without a cohort borrows nothing: its jobs keep their flag.
    Taken once, on the whole instance (its parts keep it)."""
    if instance.rules_applied:
        return instance
    jobs = {j.key: j for j in instance.jobs}
    queues = {q.name: q for q in instance.queues}
    nodes = {n.name: n for n in instance.nodes}
    held: dict[tuple[str, str], list[tuple[str, str, int]]] = defaultdict(list)
    for key in sorted(instance.current):
        job = jobs.get(key)
        placement = instance.current[key]
        queue = queues.get(job.queue) if job is not None else None
        if job is None or job.preemptible or placement.flavor is None:
            continue
        if queue is None or queue.cohort is None:
            continue
        held[(job.queue, placement.flavor)].append(
            (key, placement.started_at, quota_charge(job, placement.replicas, nodes))
        )
    unprotected: set[str] = set()
    for (name, flavor), items in held.items():
        fq = queues[name].quota(flavor)
        keep = protected(fq.nominal if fq is not None else 0, items)
        unprotected.update(k for k, _, _ in items if k not in keep)
    return replace(
        instance,
        jobs=tuple(
            replace(j, preemptible=True) if j.key in unprotected else j for j in instance.jobs
        )
        if unprotected
        else instance.jobs,
        rules_applied=True,
    )


def non_preemptible_borrowing(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome]
) -> list[str]:
    """The queues and flavors whose non-preemptible jobs in a plan hold more than the
    nominal quota, where one of them is placed anew (check.py's rule)."""
    jobs = {j.key: j for j in instance.jobs}
    queues = {q.name: q for q in instance.queues}
    nodes = {n.name: n for n in instance.nodes}
    held: dict[tuple[str, str], int] = defaultdict(int)
    fresh: set[tuple[str, str]] = set()
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None or job.preemptible or not o.running or o.flavor is None:
            continue
        held[(job.queue, o.flavor)] += quota_charge(job, o.replicas, nodes)
        if o.status is not OutcomeStatus.KEPT:
            fresh.add((job.queue, o.flavor))
    problems = []
    for name, flavor in sorted(fresh):
        queue = queues.get(name)
        fq = queue.quota(flavor) if queue is not None else None
        nominal = fq.nominal if fq is not None else 0
        if not non_preemptible_fits(nominal, 0, held[(name, flavor)]):
            problems.append(
                f"queue {name}'s non-preemptible jobs hold {held[(name, flavor)] / 1000:g} "
                f"{flavor} GPUs, above its nominal {nominal / 1000:g}: a non-preemptible job "
                "does not borrow"
            )
    return problems


# -- minimum run time (KAI's preemptMinRuntime / reclaimMinRuntime) ------------------------


def min_runtime_minutes(
    victim: Job, queues: Mapping[str, Queue], cluster: ClusterSpec | None
) -> int:
    """The victim's protection: the longer of its queue's and its priority class's
    preemption.minRuntimeMinutes (0 when neither sets one)."""
    queue = queues.get(victim.queue)
    by_queue = queue.min_runtime_minutes if queue is not None else None
    by_class = None
    if cluster is not None:
        for pc in cluster.priority_classes:
            if pc.name == victim.priority_class:
                by_class = pc.min_runtime_minutes
    return protection_minutes(by_queue, by_class)


def protection_minutes(by_queue: int | None, by_class: int | None) -> int:
    """A queue's and a priority class's minRuntimeMinutes together: the longer protects."""
    return max(by_queue or 0, by_class or 0)


def too_young(
    victim: str, minutes: int, started_at: str, now: str, *, preemptor_preemptible: bool
) -> str | None:
    """Why the job `victim`, running since `started_at` under a minimum run time of
    `minutes`, is no victim at `now` (the time of the event being decided); None when it
    may be preempted: old enough, no minimum, or the preemptor is non-preemptible work
    (which always may). A node loss never asks: a place that is gone is no preemption by
    a job. Greedy, the MILP (through `Rights` and `attribute`), `plan` and `audit
    compliance` all ask this one function."""
    if not preemptor_preemptible or minutes <= 0 or not started_at or not now:
        return None
    ran = _epoch(now) - _epoch(started_at)
    if ran >= minutes * 60:
        return None
    return (
        f"{victim} has run {max(ran, 0.0) / 60:.1f} of its {minutes} minimum minutes"
        " (preemption.minRuntimeMinutes)"
    )


def min_runtime_protection(
    victim: Job,
    started_at: str,
    now: str,
    queues: Mapping[str, Queue],
    cluster: ClusterSpec | None,
    *,
    preemptor_preemptible: bool = True,
) -> str | None:
    """`too_young` for a job of the instance."""
    return too_young(
        victim.key,
        min_runtime_minutes(victim, queues, cluster),
        started_at,
        now,
        preemptor_preemptible=preemptor_preemptible,
    )


# -- the order of victims and of waiting jobs ------------------------------------------------


def _epoch(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp() if text else 0.0
    except ValueError:
        return 0.0


def victim_order(
    preemptor: Job, victim: Job, lost_seconds: float, started_at: str
) -> tuple[bool, int, bool, float, float, str]:
    """Sort key of candidates: other queues' (borrowers') first, then the lowest priority,
    then a service's replicas above its minimum (they give capacity back first:
    engine/services.py), the least work lost since the last checkpoint, the newest, and by
    name."""
    return (
        victim.queue == preemptor.queue,
        victim.priority,
        not surplus(victim),
        round(lost_seconds, 6),
        -_epoch(started_at),
        victim.key,
    )


def wait_order(job: Job) -> tuple[int, int, str, str]:
    """Within a queue: higher priority first, then the oldest (its commit's place in the
    log, then its time), then by name."""
    return wait_key(job.priority, job.submission, job.submitted_at, job.key)


def wait_key(
    priority: int, submission: int, submitted_at: str, key: str
) -> tuple[int, int, str, str]:
    """`wait_order` of a job known by these fields alone (the audit view's copy of it, which
    `audit compliance` re-judges StrictFIFO with): one order, one function."""
    return (-priority, submission, submitted_at, key)


def would_borrow(job: Job, ledger: QuotaLedger, queue: Queue | None) -> bool:
    """Whether admitting the job takes its queue above nominal in every flavor it may use."""
    flavors = eligible_flavors(job, queue)
    if not flavors or flavors == (None,):
        return False
    amount = job.smallest_gang * job.resources.gpu_milli
    return not any(f is not None and ledger.below_nominal(job.queue, f, amount) for f in flavors)


def admission_order(
    jobs: Iterable[Job], ledger: QuotaLedger, queues: Mapping[str, Queue]
) -> Iterator[Job]:
    """Waiting jobs in the order they are considered: per queue by `wait_order`; across
    queues the heads that fit within nominal quota first, then priority, then age (Kueue's
    order of the heads in a cohort). The order follows the ledger as jobs are admitted or
    preempted between two steps (the queues whose usage changed are looked at again)."""
    per_queue: dict[str, list[Job]] = defaultdict(list)
    for job in sorted(jobs, key=wait_order, reverse=True):
        per_queue[job.queue].append(job)  # a stack: the head is last
    heap: list[tuple[bool, int, int, str, str, str, int]] = []
    version: dict[str, int] = defaultdict(int)

    def push(name: str) -> None:
        stack = per_queue[name]
        if not stack:
            return
        head = stack[-1]
        version[name] += 1
        borrows = would_borrow(head, ledger, queues.get(name))
        heapq.heappush(
            heap,
            (
                borrows,
                -head.priority,
                head.submission,
                head.submitted_at,
                head.key,
                name,
                version[name],
            ),
        )

    for name in sorted(per_queue):
        push(name)
    ledger.touched.clear()
    while heap:
        *_, name, seen = heapq.heappop(heap)
        if seen != version[name] or not per_queue[name]:
            continue
        job = per_queue[name].pop()
        yield job
        changed = ledger.touched | {name}
        ledger.touched.clear()
        for other in sorted(changed):
            push(other)


# -- the quota facts the rules read ------------------------------------------------------------


def start_ledger(instance: PlacementInstance) -> QuotaLedger:
    """Usage per queue and flavor of what runs before the decision, every job counted (the
    rules' facts, as greedy's ledger and `audit compliance` count them: a queue whose
    non-preemptible jobs fill its nominal quota borrows what its other jobs hold)."""
    ledger = QuotaLedger(instance.queues)
    jobs = {j.key: j for j in instance.jobs}
    nodes = {n.name: n for n in instance.nodes}
    for key in sorted(instance.current):
        job = jobs.get(key)
        placement = instance.current[key]
        if job is not None:
            ledger.add(job.queue, placement.flavor, quota_charge(job, placement.replicas, nodes))
    return ledger


def below_nominal(ledger: QuotaLedger, queue: str, flavor: str | None) -> bool:
    q = ledger.queues.get(queue)
    if q is None or flavor is None:
        return False
    fq = q.quota(flavor)
    return fq is not None and ledger.usage[(queue, flavor)] < fq.nominal


def over_limits(ledger: QuotaLedger, queue: str, flavor: str | None) -> bool:
    """Whether the queue's usage of the flavor breaks a limit (a quota was cut)."""
    if flavor is None:
        return False
    used = ledger.usage[(queue, flavor)]
    ledger.usage[(queue, flavor)] = 0
    try:
        return used > 0 and ledger.rejection(queue, flavor, used) is not None
    finally:
        ledger.usage[(queue, flavor)] = used


def judge_jobs(
    policy: Policy,
    preemptor: Job | Party,
    victim: Job,
    flavor: str | None,
    ledger: QuotaLedger,
) -> Rule | str:
    """`judge` for two jobs, with the quota facts of `flavor` (the victim's) from `ledger`."""
    queues = ledger.queues
    claimant = preemptor if isinstance(preemptor, Party) else party(preemptor, queues)
    borrows = flavor is not None and ledger.borrowing(victim.queue, flavor)
    return judge(
        policy,
        claimant,
        party(victim, queues),
        victim_queue_borrows=borrows,
        preemptor_queue_below_nominal=below_nominal(ledger, claimant.queue, flavor),
    )


class Rights:
    """Who could claim whose place in an instance, before anything is decided: what the MILP
    protects (a job nobody may claim runs on) and what an incremental solve frees."""

    def __init__(self, instance: PlacementInstance) -> None:
        self.policy = instance.policy
        self.ledger = start_ledger(instance)
        self.queues = self.ledger.queues
        self.current = instance.current
        self.now = instance.now
        self.cluster = instance.cluster
        # Queues with non-preemptible work: a claimant of theirs may preempt a young job.
        self.unstoppable = frozenset(j.queue for j in instance.jobs if not j.preemptible)
        self.members: dict[str, list[str]] = defaultdict(list)
        for q in instance.queues:
            if q.cohort is not None:
                self.members[q.cohort].append(q.name)
        # Per queue its jobs' priorities, highest first, with their keys (two suffice: a job
        # never claims its own place).
        self.tops: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for j in instance.jobs:
            self.tops[j.queue].append((j.priority, j.key))
        for name in self.tops:
            self.tops[name] = sorted(self.tops[name], reverse=True)[:2]

    def may(self, preemptor: Job | Party, victim: Job) -> Rule | None:
        placement = self.current.get(victim.key)
        flavor = placement.flavor if placement is not None else None
        found = judge_jobs(self.policy, preemptor, victim, flavor, self.ledger)
        if not isinstance(found, Rule):
            return None
        if placement is not None and min_runtime_protection(
            victim,
            placement.started_at,
            self.now,
            self.queues,
            self.cluster,
            preemptor_preemptible=preemptor.preemptible,
        ):
            return None
        return found

    def claimable(self, claimants: Iterable[Job], candidates: Iterable[Job]) -> set[str]:
        """The candidates some claimant (not the candidate itself) may preempt."""
        if not self.policy.preemption_enabled:
            return set()
        tops: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for c in claimants:
            tops[c.queue].append((c.priority, c.key))
        best = {q: sorted(ts, reverse=True)[:2] for q, ts in tops.items()}
        return {v.key for v in candidates if self._claimed(v, best)}

    def anyone_may(self, victim: Job) -> bool:
        """Whether some job of the instance could ever claim this one's place."""
        return self.policy.preemption_enabled and self._claimed(victim, self.tops)

    def _claimed(self, victim: Job, best: Mapping[str, list[tuple[int, str]]]) -> bool:
        """Whether the best claimant of the victim's queue or of a queue of its cohort (the
        highest priority that is not the victim) may preempt it."""
        if not victim.preemptible:
            return False
        queue = self.queues.get(victim.queue)
        cohort = queue.cohort if queue is not None else None
        names = [victim.queue]
        if cohort is not None:
            names += [n for n in self.members[cohort] if n != victim.queue]
        for name in names:
            top = next((t for t in best.get(name, ()) if t[1] != victim.key), None)
            if top is None:
                continue
            other = self.queues.get(name)
            claimant = Party(
                name,
                other.cohort if other else None,
                top[0],
                name not in self.unstoppable,
                reclaim=other.reclaim_within_cohort if other else None,
            )
            if self.may(claimant, victim) is not None:
                return True
        return False


def reclaim_note(
    policy: Policy,
    job: Job,
    ledger: QuotaLedger,
    holders: Callable[[str, str], Sequence[Job]],
) -> str:
    """Why a waiting job took nothing back from the queues of its cohort that borrow a
    flavor it may use, in words ("" when none borrows): the rule that refused (`judge`), or
    that its queue would borrow itself. `holders(queue, flavor)`: that queue's running jobs
    on the flavor."""
    queue = ledger.queues.get(job.queue)
    if queue is None or queue.cohort is None:
        return ""
    claimant = party(job, ledger.queues)
    need = job.smallest_gang * job.resources.gpu_milli
    notes: list[str] = []
    for flavor in eligible_flavors(job, queue):
        if flavor is None:
            continue
        for other in sorted(ledger.queues.values(), key=lambda q: q.name):
            fq = other.quota(flavor)
            if other.name == job.queue or other.cohort != queue.cohort or fq is None:
                continue
            if not ledger.borrowing(other.name, flavor):
                continue
            over = ledger.usage[(other.name, flavor)] - fq.nominal
            if not ledger.below_nominal(job.queue, flavor, need):
                why = (
                    f"queue {job.queue} would be above its nominal {flavor} quota with this "
                    "job (never preempt to borrow)"
                )
            else:
                verdicts = [
                    judge(
                        policy,
                        claimant,
                        party(victim, ledger.queues),
                        victim_queue_borrows=True,
                        preemptor_queue_below_nominal=True,
                    )
                    for victim in holders(other.name, flavor)
                ]
                refused = [v for v in verdicts if not isinstance(v, Rule)]
                if len(refused) < len(verdicts):
                    why = "what it may reclaim would not make room for the job"
                else:
                    why = refused[0] if refused else "none of its jobs may be reclaimed"
            notes.append(
                f"queue {other.name} borrows {over / 1000:g} {flavor} GPUs; not reclaimed: {why}"
            )
    return "; ".join(notes)


# -- checking a plan against the rules -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attribution:
    """Each stopped job's preemptor and rule, and the stops no rule allows."""

    by: Mapping[str, tuple[str | None, Rule, str]]  # victim -> (preemptor, rule, reason)
    problems: tuple[str, ...]


def reason_text(rule: Rule, preemptor: Job | None, victim: Job, flavor: str | None) -> str:
    if rule is Rule.WITHIN_QUEUE and preemptor is not None:
        return (
            f"preempted by {preemptor.key} (priority {preemptor.priority} > {victim.priority}, "
            f"within queue {victim.queue})"
        )
    if rule is Rule.RECLAIM and preemptor is not None:
        return (
            f"preempted by {preemptor.key}: queue {preemptor.queue} reclaims its nominal "
            f"{flavor} quota from borrowing queue {victim.queue}"
        )
    return "its place is gone"


def attribute(
    instance: PlacementInstance,
    outcomes: Sequence[JobOutcome],
    place_gone: Callable[[Job, Placement], str | None],
    near: Callable[[Job], Sequence[str]] = lambda victim: (),
) -> Attribution:
    """Find, for every running job the plan stops, what allowed it: its place is gone
    (`place_gone`: node, spec or a quota cut), or a job the plan admits that may preempt it
    under the rules, judged on the usage before the plan, and that does not borrow once
    admitted (its queue's usage of the flavor, counting the jobs that stay and those
    admitted up to it in its queue's order, is within nominal). `near`: the preemptors to
    try first (those now on the victim's nodes)."""
    instance = borrowing_reclaimable(instance)
    jobs = {j.key: j for j in instance.jobs}
    ledger = start_ledger(instance)
    policy = instance.policy
    # The jobs the plan lets in: new ones, and running ones whose place went away.
    admitted = [
        jobs[o.job]
        for o in outcomes
        if o.job in jobs
        and (
            (o.status is OutcomeStatus.PLACED and o.job not in instance.current)
            or (
                o.status is OutcomeStatus.MOVED
                and place_gone(jobs[o.job], instance.current[o.job]) is not None
            )
        )
    ]
    admitted.sort(key=wait_order)
    by_queue: dict[str, list[Job]] = defaultdict(list)
    for job in admitted:
        by_queue[job.queue].append(job)
    cohorts: dict[str, list[str]] = defaultdict(list)
    for q in instance.queues:
        if q.cohort is not None:
            cohorts[q.cohort].append(q.name)
    nodes = {n.name: n for n in instance.nodes}
    flavor_of = {o.job: o.flavor for o in outcomes if o.running}
    stays: dict[tuple[str, str | None], int] = defaultdict(int)
    for o in outcomes:
        kept = jobs.get(o.job)
        if kept is not None and o.status is OutcomeStatus.KEPT and kept.preemptible:
            stays[(kept.queue, o.flavor)] += quota_charge(kept, o.replicas, nodes)
    # Each admitted job's usage of its queue's flavor once admitted, in its queue's order.
    held = {o.job: o.replicas for o in outcomes if o.running}
    after: dict[str, int] = {}
    running_total: dict[tuple[str, str | None], int] = dict(stays)
    for job in admitted:
        key = (job.queue, flavor_of.get(job.key))
        running_total[key] = running_total.get(key, 0) + quota_charge(job, held[job.key], nodes)
        after[job.key] = running_total[key]

    def borrows_after(job: Job) -> bool:
        flavor = flavor_of.get(job.key)
        queue = ledger.queues.get(job.queue)
        fq = queue.quota(flavor) if queue is not None and flavor is not None else None
        return fq is not None and after[job.key] > fq.nominal

    by: dict[str, tuple[str | None, Rule, str]] = {}
    problems: list[str] = []
    for o in outcomes:
        if o.status is not OutcomeStatus.PREEMPTED:
            continue
        victim = jobs.get(o.job)
        was = instance.current.get(o.job)
        if victim is None or was is None:
            continue
        gone = place_gone(victim, was)
        if gone is None and victim.preemptible and over_limits(ledger, victim.queue, was.flavor):
            gone = f"queue {victim.queue} is over its quota of {was.flavor}"
        if gone is not None:
            by[victim.key] = (None, Rule.PLACE_GONE, gone)
            continue
        queue = ledger.queues.get(victim.queue)
        names = [victim.queue]
        if queue is not None and queue.cohort is not None:
            names += [n for n in cohorts[queue.cohort] if n != victim.queue]
        order = [jobs[k] for k in near(victim) if k in jobs]
        order += [j for name in names for j in by_queue.get(name, ())]
        found: tuple[Job, Rule] | None = None
        refused = ""
        for p in order:
            if p.key == victim.key or p.key not in after:
                continue
            verdict = judge_jobs(policy, p, victim, was.flavor, ledger)
            if isinstance(verdict, Rule):
                young = min_runtime_protection(
                    victim,
                    was.started_at,
                    instance.now,
                    ledger.queues,
                    instance.cluster,
                    preemptor_preemptible=p.preemptible,
                )
                verdict = young or verdict
            if isinstance(verdict, Rule) and borrows_after(p):
                verdict = f"{p.key} would borrow once admitted (never preempt to borrow)"
            if isinstance(verdict, Rule):
                found = (p, verdict)
                break
            refused = refused or f"{p.key}: {verdict}"
        if found is None:
            problems.append(
                f"{victim.key}: preempted, but no admitted job may preempt it"
                + (f" ({refused})" if refused else "")
            )
            continue
        p, rule = found
        by[victim.key] = (p.key, rule, reason_text(rule, p, victim, was.flavor))
    return Attribution(by, tuple(problems))
