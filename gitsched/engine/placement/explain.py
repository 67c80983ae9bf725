"""Every job's outcome told: why a job that does not run does not run (what greedy's
packing reports for it), why a running job moved or stopped, and which rule allowed each
preemption (engine.placement.preemption.attribute).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gitsched.engine.model import Isolation, Job, Node, Queue
from gitsched.engine.placement.constraints import eligible_flavors
from gitsched.engine.placement.greedy import Fit, Miss, Packing, priority_order
from gitsched.engine.placement.objective import lost_gpu_seconds
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
)
from gitsched.engine.placement.preemption import Attribution, attribute, reclaim_note
from gitsched.engine.placement.running import keep_problem
from gitsched.engine.placement.topology import explain_spans
from gitsched.engine.units import gpus_text, milli_from_gpus

NEVER_RUNS = "never-runs"


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    """The cluster's GPUs by flavor, isolation and region, every node counted whatever its
    state (a drained or failed node comes back): what "never" is judged against."""

    # (flavor, isolation, region) -> (GPUs in all, the most GPUs one node has)
    kinds: Mapping[tuple[str, Isolation, str | None], tuple[int, int]]

    @property
    def total(self) -> dict[str, int]:
        """GPUs in all by flavor."""
        out: dict[str, int] = defaultdict(int)
        for (flavor, _, _), (gpus, _) in self.kinds.items():
            out[flavor] += gpus
        return dict(out)

    def of(
        self, flavors: Iterable[str], isolation: Isolation | None, residency: Iterable[str]
    ) -> tuple[int, int]:
        """GPUs in all and the largest node among the nodes of `flavors` with `isolation`
        (None: any) in the regions of `residency` (empty: any)."""
        wanted, regions = set(flavors), set(residency)
        total = largest = 0
        for (flavor, iso, region), (gpus, most) in self.kinds.items():
            if flavor not in wanted or (isolation is not None and iso is not isolation):
                continue
            if regions and region not in regions:
                continue
            total, largest = total + gpus, max(largest, most)
        return total, largest


def gpu_capacity(nodes: Iterable[Node]) -> GpuCapacity:
    kinds: dict[tuple[str, Isolation, str | None], tuple[int, int]] = {}
    for node in nodes:
        if node.flavor is not None:
            key = (node.flavor, node.isolation, node.region)
            total, largest = kinds.get(key, (0, 0))
            kinds[key] = (total + node.gpus, max(largest, node.gpus))
    return GpuCapacity(kinds)


def never_runs(
    job: Job, queue: Queue | None, capacity: GpuCapacity
) -> tuple[tuple[str, ...], str] | None:
    """Why `job` can never run on this cluster whatever else runs or leaves (its field, the
    reason), or None when it could: the one rule for pending reasons, `reconcile`'s
    warnings and `validate`'s (policies.fit). The nodes a job may use are those of its
    eligible flavors, of its isolation (a shared job never uses a dedicated node, nor a
    dedicated job a shared one) and in its residency's regions."""
    flavors = eligible_flavors(job, queue)
    if flavors == (None,):
        return None  # no GPU asked: any node will do
    if not flavors:
        wanted = ", ".join(job.gpu_flavors)
        return ("spec", "gpuFlavors"), (
            f"queue '{job.queue}' has no quota for {wanted}"
            if wanted
            else f"queue '{job.queue}' has no GPU quota"
        )
    names = [str(f) for f in flavors]
    named = " or ".join(names)
    total, largest = capacity.of(names, job.isolation, job.residency)
    # Name the narrowing only where it narrows: a dedicated job, a shared one on a cluster
    # with dedicated nodes of its flavors, a residency.
    kind = ""
    if job.isolation is Isolation.DEDICATED:
        kind = "dedicated "
    elif capacity.of(names, Isolation.DEDICATED, ())[0]:
        kind = "shared "
    where = f" in {', '.join(job.residency)}" if job.residency else ""
    if total == 0:
        if not kind and not where:
            return ("spec", "gpuFlavors") if job.gpu_flavors else ("spec",), (
                f"no node has GPU flavor {named}"
            )
        field = ("spec", "residency") if where else ("spec",)
        return field, f"no {kind}node of flavor {named}{where}"
    per_replica = job.resources.gpu_milli
    if per_replica > milli_from_gpus(largest):
        return ("spec", "resources", "gpu"), (
            f"no {kind}node of flavor {named}{where} has {gpus_text(per_replica)} GPUs (the"
            f" largest has {largest}); the cluster has {total} {kind}{named} GPUs{where} in all"
        )
    gang = job.smallest_gang * per_replica
    if gang > milli_from_gpus(total):
        return ("spec", "replicas"), (
            f"its smallest gang needs {gpus_text(gang)} GPUs and the cluster has {total}"
            f" {kind}{named} GPUs{where} in all"
        )
    return None


def _capacity(instance: PlacementInstance) -> GpuCapacity:
    return gpu_capacity(instance.nodes)


def _queues(instance: PlacementInstance) -> dict[str, Queue]:
    return {q.name: q for q in instance.queues}


def _jobs(instance: PlacementInstance) -> dict[str, Job]:
    return {j.key: j for j in instance.jobs}


def tell_never_runs(instance: PlacementInstance, plan: PlacementPlan) -> PlacementPlan:
    """The plan, each job it leaves pending that can never run on this cluster (`never_runs`)
    saying so and why instead of what blocks it today: every solver's plan goes through it."""
    pending = [i for i, o in enumerate(plan.outcomes) if o.status is OutcomeStatus.PENDING]
    if not pending:
        return plan
    jobs, queues = instance.derived(_jobs), instance.derived(_queues)
    capacity = instance.derived(_capacity)
    outcomes = list(plan.outcomes)
    # A backlog is mostly alike: `never_runs` reads only the queue and the placement fields.
    known: dict[tuple[object, ...], tuple[tuple[str, ...], str] | None] = {}
    for i in pending:
        o = outcomes[i]
        job = jobs.get(o.job)
        never = None
        if job is not None:
            shape = (job.queue, *job.placement_fields())
            if shape not in known:
                known[shape] = never_runs(job, queues.get(job.queue), capacity)
            never = known[shape]
        if never is not None:
            outcomes[i] = replace(
                o, reason=f"can never run: {never[1]}", constraint=f"{NEVER_RUNS}__{o.job}"
            )
    return replace(plan, outcomes=tuple(outcomes))


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
