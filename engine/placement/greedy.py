"""The greedy baseline: priority order, best fit, gangs all-or-nothing.

This is what Kueue- and Volcano-style schedulers do, and the plan every other
solver is measured against (and warm-started from). Running jobs stay where
they are unless their node went away, their spec changed, a quota cut leaves
no room, or a higher-priority job preempts them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.model import (
    NODE_LEVEL,
    Job,
    Node,
    Placement,
    PreemptionScope,
    Queue,
    ReplicaPlacement,
    TopologyMode,
)
from engine.placement.constraints import (
    NodeFree,
    QuotaLedger,
    eligible_flavors,
    gpus_text,
    node_rejection,
    replica_shape_error,
)
from engine.placement.objective import (
    job_value,
    lost_gpu_seconds,
    move_penalty,
    preemption_penalty,
)
from engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)


@dataclass(frozen=True, slots=True)
class Fit:
    flavor: str | None
    replicas: tuple[ReplicaPlacement, ...]


@dataclass(frozen=True, slots=True)
class Miss:
    reason: str
    constraint: str


def priority_order(jobs: Iterable[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.key))


class Packing:
    """The mutable working state of one plan: free capacity and quota usage."""

    def __init__(self, instance: PlacementInstance) -> None:
        self.instance = instance
        self.nodes = {n.name: n for n in instance.nodes}
        self.free = {n.name: NodeFree.of(n) for n in instance.nodes}
        self.ledger = QuotaLedger(instance.queues)
        self.queues: dict[str, Queue] = {q.name: q for q in instance.queues}
        self.running: dict[str, Fit] = {}

    # -- bookkeeping -----------------------------------------------------------------
    def commit(self, job: Job, fit: Fit) -> None:
        for replica in fit.replicas:
            self.free[replica.node].take(replica, job.resources, job)
        self.ledger.add(job.queue, fit.flavor, len(fit.replicas) * job.resources.gpu_milli)
        self.running[job.key] = fit

    def release(self, job: Job) -> Fit:
        fit = self.running.pop(job.key)
        for replica in fit.replicas:
            self.free[replica.node].give(replica, job.resources, job)
        self.ledger.remove(job.queue, fit.flavor, len(fit.replicas) * job.resources.gpu_milli)
        return fit

    # -- keeping a running job where it is ---------------------------------------------
    def keep_problem(self, job: Job, placement: Placement) -> Miss | None:
        """Why the running placement cannot stay as it is, or None if it can."""
        queue = self.queues.get(job.queue)
        if placement.flavor not in eligible_flavors(job, queue):
            return Miss(f"flavor {placement.flavor} is no longer allowed for the job", "spec")
        if not job.smallest_gang <= len(placement.replicas) <= job.replicas:
            return Miss("the job's replica count changed", "spec")
        for replica in placement.replicas:
            node = self.nodes.get(replica.node)
            if node is None:
                return Miss(f"node {replica.node} was removed", "node")
            why = node_rejection(job, node, placement.flavor)
            if why is not None:
                return Miss(why, "node")
            shape = replica_shape_error(job, replica)
            if shape is not None:
                return Miss("the job's resources changed", "spec")
        if job.topology is not None and job.topology.mode is TopologyMode.REQUIRED:
            domains = {self.nodes[r.node].domain(job.topology.level) for r in placement.replicas}
            if len(domains) > 1:
                return Miss(f"the job now needs one {job.topology.level} domain", "spec")
        # Check capacity on a copy: a replica must not half-commit.
        taken: list[ReplicaPlacement] = []
        for replica in placement.replicas:
            free = self.free[replica.node]
            if not free.can_take(replica, job.resources, job):
                for done in taken:
                    self.free[done.node].give(done, job.resources, job)
                return Miss(f"GPUs on {replica.node} are taken", "capacity")
            free.take(replica, job.resources, job)
            taken.append(replica)
        for done in taken:
            self.free[done.node].give(done, job.resources, job)
        amount = len(placement.replicas) * job.resources.gpu_milli
        quota = self.ledger.rejection(job.queue, placement.flavor, amount)
        if quota is not None and job.preemptible:
            return Miss(quota[0], quota[1])
        return None

    # -- finding room for a job ----------------------------------------------------------
    def find(self, job: Job) -> Fit | Miss:
        queue = self.queues.get(job.queue)
        flavors = eligible_flavors(job, queue)
        if queue is None:
            return Miss(f"queue {job.queue} does not exist", "queue")
        if not flavors:
            wanted = ", ".join(job.gpu_flavors) or "any flavor"
            return Miss(
                f"queue {job.queue} has no quota for {wanted}", f"quota__{job.queue}__flavor"
            )
        misses: list[Miss] = []
        for flavor in flavors:
            result = self._find_on_flavor(job, flavor)
            if isinstance(result, Fit):
                return result
            misses.append(result)
        if len(misses) == 1:
            return misses[0]
        return Miss(
            "; ".join(f"{f}: {m.reason}" for f, m in zip(flavors, misses, strict=True)),
            misses[0].constraint,
        )

    def _find_on_flavor(self, job: Job, flavor: str | None) -> Fit | Miss:
        candidates = [n for n in self.instance.nodes if node_rejection(job, n, flavor) is None]
        what = f"{gpus_text(job.resources.gpu_milli)} × {flavor}" if flavor else "CPU only"
        if not candidates:
            return Miss(
                f"no Ready node can host a replica ({what}"
                + (f", {job.isolation} isolation" if job.isolation.value != "shared" else "")
                + (f", regions {', '.join(job.residency)}" if job.residency else "")
                + ")",
                "eligibility",
            )
        first_miss: Miss | None = None
        for count in range(job.replicas, job.smallest_gang - 1, -1):
            quota = self.ledger.rejection(job.queue, flavor, count * job.resources.gpu_milli)
            result = self._pack_gang(job, flavor, candidates, count)
            if quota is None and isinstance(result, Fit):
                return result
            if first_miss is None:
                first_miss = self._explain(quota, result)
        assert first_miss is not None
        return first_miss

    @staticmethod
    def _explain(quota: tuple[str, str] | None, packed: Fit | Miss) -> Miss:
        """Every constraint that blocks the job, quota first: a person fixes them all at once."""
        if quota is None:
            assert isinstance(packed, Miss)
            return packed
        if isinstance(packed, Fit):
            return Miss(*quota)
        return Miss(f"{quota[0]}; and even within quota: {packed.reason}", quota[1])

    def _pack_gang(
        self, job: Job, flavor: str | None, candidates: list[Node], count: int
    ) -> Fit | Miss:
        topo = job.topology
        if topo is None:
            return self._pack(job, flavor, candidates, count) or self._capacity_miss(
                job, flavor, candidates, count
            )
        groups: dict[str, list[Node]] = defaultdict(list)
        for node in candidates:
            groups[node.domain(topo.level)].append(node)
        # Best fit over domains: the fullest domain that still holds the gang.
        ordered = sorted(groups.items(), key=lambda kv: (self._domain_free(kv[1]), kv[0]))
        for _, nodes in ordered:
            fit = self._pack(job, flavor, nodes, count)
            if fit is not None:
                return fit
        if topo.mode is TopologyMode.PREFERRED:
            return self._pack(job, flavor, candidates, count) or self._capacity_miss(
                job, flavor, candidates, count
            )
        best = max((self._domain_capacity(job, nodes) for nodes in groups.values()), default=0)
        level = "node" if topo.level == NODE_LEVEL else f"{topo.level} domain"
        need = count * job.resources.gpu_milli
        return Miss(
            f"needs {gpus_text(need)} × {flavor or 'CPU'} GPU ({count} × {gpus_text(job.resources.gpu_milli)}) "
            f"in one {level}; the largest free {level} holds {best} of the {count} replicas",
            f"topology__{job.key}__{topo.level}",
        )

    def _domain_free(self, nodes: Sequence[Node]) -> int:
        return sum(self.free[n.name].free_gpu_milli for n in nodes)

    def _domain_capacity(self, job: Job, nodes: Sequence[Node]) -> int:
        """How many replicas of the job fit in these nodes right now."""
        fit = 0
        for count in range(1, job.replicas + 1):
            if (
                self._pack(
                    job, None if job.resources.gpu_milli == 0 else nodes[0].flavor, nodes, count
                )
                is None
            ):
                break
            fit = count
        return fit

    def _pack(self, job: Job, flavor: str | None, nodes: Sequence[Node], count: int) -> Fit | None:
        """Best fit, replica by replica, on a scratch copy; None if the gang does not fit."""
        r = job.resources
        scratch = {
            n.name: NodeFree(
                n,
                list(self.free[n.name].gpu_free),
                self.free[n.name].cpu_free,
                self.free[n.name].memory_free,
                self.free[n.name].jobs,
                self.free[n.name].dedicated_holder,
            )
            for n in nodes
        }
        placed: list[ReplicaPlacement] = []
        for _ in range(count):
            best: NodeFree | None = None
            best_key: tuple[int, int, str] | None = None
            for free in scratch.values():
                if not free.fits(r, job):
                    continue
                key = (
                    free.free_gpu_milli - r.gpu_milli,
                    free.cpu_free - r.cpu_milli,
                    free.node.name,
                )
                if best_key is None or key < best_key:
                    best, best_key = free, key
            if best is None:
                return None
            replica = best.choose(r)
            best.take(replica, r, job)
            placed.append(replica)
        return Fit(flavor, tuple(placed))

    def _capacity_miss(
        self, job: Job, flavor: str | None, candidates: list[Node], count: int
    ) -> Miss:
        fitting = sum(1 for n in candidates if self.free[n.name].fits(job.resources, job))
        return Miss(
            f"needs {count} replicas of {gpus_text(job.resources.gpu_milli)} × {flavor or 'CPU'} "
            f"GPU; {fitting} eligible node(s) have room for one now",
            "capacity",
        )


class GreedyPlacer:
    name = "greedy"

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        started = time.perf_counter()
        packing = Packing(instance)
        policy = instance.policy
        jobs = {j.key: j for j in instance.jobs}
        outcomes: dict[str, JobOutcome] = {}
        displaced: dict[str, Miss] = {}

        # 1. Running jobs keep their place, highest priority first (a quota cut evicts the lowest).
        running = [jobs[k] for k in instance.current if k in jobs]
        running.sort(key=lambda j: (j.preemptible, -j.priority, j.submitted_at, j.key))
        for job in running:
            placement = instance.current[job.key]
            problem = packing.keep_problem(job, placement)
            if problem is None:
                packing.commit(job, Fit(placement.flavor, placement.replicas))
                outcomes[job.key] = JobOutcome(
                    job.key, OutcomeStatus.KEPT, placement.flavor, placement.replicas
                )
            else:
                displaced[job.key] = problem

        # 2. Everything else in priority order, preempting where the policy allows.
        waiting = priority_order(j for j in instance.jobs if j.key not in packing.running)
        retry: list[Job] = []
        for job in waiting:
            result = packing.find(job)
            preempted_here: list[Job] = []
            if isinstance(result, Miss) and policy.preemption_enabled:
                victims = self._victims(packing, job, jobs)
                if victims is not None:
                    for victim in victims:
                        packing.release(victim)
                        was = instance.current.get(victim.key)
                        lost = lost_gpu_seconds(victim, was, instance.now) if was else 0.0
                        outcomes[victim.key] = JobOutcome(
                            victim.key,
                            OutcomeStatus.PREEMPTED,
                            reason=f"preempted by {job.key} (priority {job.priority} > {victim.priority})"
                            if victim.queue == job.queue
                            else f"preempted by {job.key}: queue {job.queue} reclaims its quota",
                            constraint="preemption",
                            preempted_by=job.key,
                            lost_gpu_seconds=lost,
                        )
                        preempted_here.append(victim)
                    result = packing.find(job)
                    assert isinstance(result, Fit), "victims were chosen so that the job fits"
            if isinstance(result, Fit):
                packing.commit(job, result)
                was_running = job.key in instance.current
                outcomes[job.key] = JobOutcome(
                    job.key,
                    OutcomeStatus.MOVED if was_running else OutcomeStatus.PLACED,
                    result.flavor,
                    result.replicas,
                    reason=displaced[job.key].reason
                    if was_running and job.key in displaced
                    else "admitted",
                )
            else:
                outcomes[job.key] = self._not_running(instance, job, result, displaced)
            retry.extend(preempted_here)

        # 3. A preempted job may still fit elsewhere: then it moves instead of stopping.
        for victim in priority_order(retry):
            result = packing.find(victim)
            if isinstance(result, Fit):
                packing.commit(victim, result)
                outcomes[victim.key] = JobOutcome(
                    victim.key,
                    OutcomeStatus.MOVED,
                    result.flavor,
                    result.replicas,
                    reason=f"moved to make room for {outcomes[victim.key].preempted_by}",
                )

        ordered = tuple(outcomes[j.key] for j in priority_order(instance.jobs))
        objective = plan_objective(instance, ordered)
        return PlacementPlan(
            outcomes=ordered,
            stats=SolveStats(
                solver=self.name,
                status="heuristic",
                objective=objective,
                seconds=time.perf_counter() - started,
            ),
        )

    @staticmethod
    def _not_running(
        instance: PlacementInstance, job: Job, miss: Miss, displaced: dict[str, Miss]
    ) -> JobOutcome:
        if job.key in instance.current:
            cause = displaced.get(job.key, miss)
            lost = lost_gpu_seconds(job, instance.current[job.key], instance.now)
            return JobOutcome(
                job.key,
                OutcomeStatus.PREEMPTED,
                reason=f"{cause.reason}; no other place: {miss.reason}",
                constraint=cause.constraint,
                lost_gpu_seconds=lost,
            )
        return JobOutcome(
            job.key, OutcomeStatus.PENDING, reason=miss.reason, constraint=miss.constraint
        )

    @staticmethod
    def _victims(packing: Packing, job: Job, jobs: dict[str, Job]) -> list[Job] | None:
        """The fewest, cheapest running jobs whose removal lets `job` fit; None if none do."""
        policy = packing.instance.policy
        queue = packing.queues.get(job.queue)
        if queue is None:
            return None
        flavors = eligible_flavors(job, queue)
        candidates: list[Job] = []
        for key, fit in packing.running.items():
            other = jobs[key]
            if not other.preemptible:
                continue
            if other.queue == job.queue:
                if (
                    policy.preempt_within_queue is PreemptionScope.LOWER_PRIORITY
                    and other.priority < job.priority
                ):
                    candidates.append(other)
                continue
            other_queue = packing.queues.get(other.queue)
            if other_queue is None or queue.cohort is None or other_queue.cohort != queue.cohort:
                continue
            scope = policy.reclaim_within_cohort
            if scope is PreemptionScope.NEVER:
                continue
            if scope is PreemptionScope.LOWER_PRIORITY and other.priority >= job.priority:
                continue
            if fit.flavor is None or fit.flavor not in flavors:
                continue
            # Reclaim: only borrowed capacity, and only for a queue still within its nominal quota.
            if packing.ledger.borrowing(other.queue, fit.flavor) and packing.ledger.below_nominal(
                job.queue, fit.flavor, job.replicas * job.resources.gpu_milli
            ):
                candidates.append(other)
        if not candidates:
            return None
        now = packing.instance.now

        def cost(j: Job) -> tuple[int, float, str]:
            was = packing.instance.current.get(j.key)
            return (j.priority, lost_gpu_seconds(j, was, now) if was else 0.0, j.key)

        candidates.sort(key=cost)
        removed: list[tuple[Job, Fit]] = []
        fits = False
        for victim in candidates:
            removed.append((victim, packing.release(victim)))
            if isinstance(packing.find(job), Fit):
                fits = True
                break
        if not fits:
            for victim, fit in reversed(removed):
                packing.commit(victim, fit)
            return None
        # Give back every victim the job can do without, most expensive first.
        needed: list[tuple[Job, Fit]] = []
        for victim, fit in reversed(removed):
            packing.commit(victim, fit)
            if not isinstance(packing.find(job), Fit):
                packing.release(victim)
                needed.append((victim, fit))
        for victim, fit in needed:
            packing.commit(victim, fit)
        return [victim for victim, _ in needed]


def plan_objective(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> float:
    """Score any plan with engine.placement.objective, the same way for every solver."""
    jobs = {j.key: j for j in instance.jobs}
    policy = instance.policy
    total = 0.0
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None:
            continue
        if o.running:
            total += job_value(job, len(o.replicas), policy)
        if o.status is OutcomeStatus.MOVED:
            total -= move_penalty(job, policy)
        if o.status is OutcomeStatus.PREEMPTED:
            total -= preemption_penalty(job, o.lost_gpu_seconds, policy)
    return total
