"""The one objective every solver is scored by, so plans from different solvers compare.

It is lexicographic, with weights derived from the instance, so that only the order of
priority classes matters, never their values (engine.placement.preemption has the rules):
1. GPUs used within a queue's nominal quota, filled by its jobs from the highest priority
   down (a nominal quota is a guarantee: it goes before any borrowing, whatever the
   priorities across queues, as Kueue admits and reclaims);
2. the GPUs of running jobs, higher priority classes first (a CPU-only job counts one
   tenth of a GPU per replica);
3. the small terms: moves, preemptions (lost work since the last checkpoint chooses which
   jobs stop, never whether), fragmentation, unfair shares (lowered for a queue that used
   much lately: engine/fairshare.py), gangs spread over more than their preferred
   topology domain, and wait order (among plans that run as much, the one that starts
   the jobs waiting longest: priority, then submission, as greedy and Kueue order them).
Each level's weight is above everything the levels below can add up to in the instance.

The MILP in `formulation.py` expresses each term linearly; its versions never exceed these (its
objective is an upper bound of this score), so its LP bound bounds every plan's score.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from gitsched.engine.model import (
    Job,
    Node,
    Placement,
    Policy,
    Queue,
    TopologyMode,
)
from gitsched.engine.placement.plan import (
    RUNNING_STATUSES,
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
)
from gitsched.engine.placement.preemption import wait_order
from gitsched.engine.placement.topology import Span, Tree, gang_topology, span_of
from gitsched.engine.services import surplus
from gitsched.engine.units import GPU_MILLI, gpus_from_milli, milli_from_gpus

CPU_JOB_VALUE_MILLI = 100
PREFERRED_TOPOLOGY_SHARE = 0.05  # a preferred-topology gang that spreads loses 5% of its GPUs
MARGIN = 1.01  # each level weighs this much more than all the levels below can add up to
# The widest range of weights a solver's tolerances take in: past it, levels are spaced
# evenly inside it (each still above the one below, no longer above all it adds up to).
WEIGHT_RANGE = 1e6
RESOURCES = ("gpu", "cpu", "memory")
SURPLUS_SHARE = 0.01  # a surplus service replica's stop cost per GPU (a job's is 0.1 and up)
# What starting the first waiting job in wait order is worth per GPU, on top of its value;
# the last is worth nearly nothing (wait_order_bonus). A tie-break: below one GPU of any
# priority class (it never costs a GPU), below one GPU of fairness (fair share still
# decides between queues), and below the least a preemption or a move costs per GPU (a
# tenth of it, times their costs' weights of 1 built in: it never pays for stopping or
# moving a job; measured at 0.5 on Philly, it did: 134 -> 205 preemptions in 12 hours).
WAIT_ORDER_SHARE = 0.05


def gpu_value(job: Job, replicas: int) -> float:
    """Running `replicas` replicas of `job`, in GPUs (a CPU-only replica: a tenth of one)."""
    milli = job.resources.gpu_milli or CPU_JOB_VALUE_MILLI
    return gpus_from_milli(replicas * milli)


@dataclass(frozen=True, slots=True)
class Weights:
    """What one GPU of running work is worth per priority value: `running` for any GPU,
    `nominal` for one within its queue's nominal quota (on top). Lexicographic over the
    instance's priority classes, in the order of their values."""

    running: Mapping[int, float]
    nominal: Mapping[int, float]
    # Each level outweighs all the levels below it (False where WEIGHT_RANGE spaced them
    # evenly instead): then a plan of a lower level 1 never scores higher (levels.py).
    lexicographic: bool = True

    def value(self, job: Job, replicas: int) -> float:
        return gpu_value(job, replicas) * self.running.get(job.priority, 1.0)

    def nominal_steps(self, priorities: Iterable[int]) -> list[tuple[int, float]]:
        """(priority, weight step) from the highest priority down: the worth of the
        in-nominal GPUs of the jobs at or above a priority is the sum of the steps down to
        it times min(nominal, their usage) (a linear form of filling nominal quota in
        priority order)."""
        ranks = sorted(set(priorities), reverse=True)
        out = []
        for i, p in enumerate(ranks):
            below = self.nominal[ranks[i + 1]] if i + 1 < len(ranks) else 0.0
            out.append((p, self.nominal[p] - below))
        return out


def jobs_by_key(instance: PlacementInstance) -> Mapping[str, Job]:
    """The instance's jobs by key, worked out once per instance."""
    return instance.derived(_jobs_by_key)


def _jobs_by_key(instance: PlacementInstance) -> dict[str, Job]:
    return {j.key: j for j in instance.jobs}


def nodes_by_name(instance: PlacementInstance) -> Mapping[str, Node]:
    """The instance's nodes by name, worked out once per instance."""
    return instance.derived(_nodes_by_name)


def _nodes_by_name(instance: PlacementInstance) -> dict[str, Node]:
    return {n.name: n for n in instance.nodes}


def wait_ranks(instance: PlacementInstance) -> Mapping[str, float]:
    """Each waiting job's place in wait order as a share in (0, 1]: 1 for the first (the
    highest priority, then the earliest submitted: preemption.wait_order), down to 1/n for
    the last of n. Ranked over the whole instance (`basis`), so the part an incremental
    solve decides ranks alike; worked out once per instance."""
    if instance.basis is not None:
        return wait_ranks(instance.basis)
    return instance.derived(_wait_ranks)


def _wait_ranks(instance: PlacementInstance) -> dict[str, float]:
    waiting = sorted((j for j in instance.jobs if j.key not in instance.current), key=wait_order)
    n = len(waiting)
    return {j.key: (n - i) / n for i, j in enumerate(waiting)}


def wait_order_bonus(instance: PlacementInstance, job: Job, replicas: int) -> float:
    """A small term: what starting `replicas` replicas of a waiting job adds for its place in
    wait order (WAIT_ORDER_SHARE per GPU for the first, less for each later one; nothing for
    a running job). Among plans that run as many GPUs of each class, the one that starts the
    jobs waiting longest scores higher: the MILP orders equal work as greedy, Kueue's
    BestEffortFIFO and Slurm's age factor do. Every solver is scored by it (`_terms`), the
    MILP carries it on each job's value (formulation.add_placement)."""
    rank = wait_ranks(instance).get(job.key)
    return 0.0 if rank is None else WAIT_ORDER_SHARE * rank * gpu_value(job, replicas)


def _small_terms_bound(instance: PlacementInstance) -> float:
    """The most the small terms (level 3) can add up to in the instance."""
    policy = instance.policy
    jobs = jobs_by_key(instance)
    total = 1.0 + sum(wait_order_bonus(instance, j, j.replicas) for j in instance.jobs)
    for key in sorted(instance.current):
        job = jobs.get(key)
        if job is not None:
            lost = 3600.0 * 1e9  # the most either term can grow to
            total += move_penalty(job, lost, policy) + preemption_penalty(job, lost, policy)
    total += policy.fragmentation_weight * len(instance.nodes)
    for job in instance.jobs:
        if job.topology is not None and job.topology.mode is TopologyMode.PREFERRED:
            total += PREFERRED_TOPOLOGY_SHARE * gpu_value(job, job.replicas)
    if policy.fairness_weight:
        # The most the fairness term can cost: every queue with nothing at all.
        rate = fairness_penalty_per_share(instance)
        total += rate * sum(t.share for t in instance_fair_targets(instance).values())
    return total


def weights(instance: PlacementInstance) -> Weights:
    """The weights of levels 1 and 2 for this instance: each priority class's smallest step
    (one replica) is worth more than all lower classes and the small terms can add up to;
    the same again above that for GPUs within nominal quota. Where that needs a range of
    weights wider than WEIGHT_RANGE (large instances, many classes), the levels are spaced
    evenly inside it instead. With `priorityWeight: 0` every class weighs the same.
    Worked out once per instance (a solve scores many plans)."""
    if instance.basis is not None:
        return weights(instance.basis)
    return instance.derived(_weights)


def _weights(instance: PlacementInstance) -> Weights:
    capacity = sum(n.gpus for n in instance.nodes if n.schedulable) or 1
    total: dict[int, float] = defaultdict(float)
    # The smallest step in milli-GPU (x / GPU_MILLI is monotone: the least milli gives the
    # least step, the same float as the least of the steps).
    least: dict[int, int] = {}
    least_gpu = 0  # of the jobs that ask for GPUs; 0: none does
    flat = not instance.policy.priority_weight
    for job in instance.jobs:
        p = 0 if flat else job.priority
        total[p] += gpu_value(job, job.replicas)
        milli = job.resources.gpu_milli
        one = milli or CPU_JOB_VALUE_MILLI
        if one < least.get(p, one + 1):
            least[p] = one
        if milli and (not least_gpu or milli < least_gpu):
            least_gpu = milli
    below = _small_terms_bound(instance)
    running: dict[int, float] = {}
    for p in sorted(total):
        running[p] = MARGIN * below / gpus_from_milli(least[p])
        below += running[p] * min(total[p], capacity)
    scale = MARGIN * below / (gpus_from_milli(least_gpu) if least_gpu else 1.0)
    base = min(running.values(), default=1.0)
    nominal = {p: scale * w / base for p, w in running.items()}
    lexicographic = True
    if max(nominal.values(), default=1.0) > WEIGHT_RANGE:
        lexicographic = False
        ranks = sorted(running)
        rho = WEIGHT_RANGE ** (1.0 / (2 * len(ranks) + 1))
        running = {p: rho ** (i + 1) for i, p in enumerate(ranks)}
        nominal = {p: rho ** (len(ranks) + i + 1) for i, p in enumerate(ranks)}
    if not instance.policy.priority_weight:
        flat_running = running.get(0, 1.0)
        flat_nominal = nominal.get(0, scale)
        ps = {j.priority for j in instance.jobs}
        return Weights(
            dict.fromkeys(ps, flat_running), dict.fromkeys(ps, flat_nominal), lexicographic
        )
    return Weights(running, nominal, lexicographic)


def move_penalty(job: Job, lost_seconds: float, policy: Policy) -> float:
    """A small term: what moving a running job costs, a restart of each replica (a tenth of
    its GPUs) and the work lost since its last checkpoint (GPU-hours, squashed below 1 as
    for a preemption), times `moveCost`. Whether a job may move at all is the rule's
    (engine/placement/moves.py), never this price's."""
    hours = lost_seconds / 3600.0
    return policy.move_cost * (0.1 * gpu_value(job, job.replicas) + hours / (1.0 + hours))


def lost_gpu_seconds(job: Job, placement: Placement, now: str) -> float:
    """Work lost if the job stops now: GPU-seconds since its last checkpoint (or its start)."""
    if not placement.started_at or not now:
        return 0.0
    try:
        elapsed = (
            datetime.fromisoformat(now) - datetime.fromisoformat(placement.started_at)
        ).total_seconds()
    except ValueError:
        return 0.0
    elapsed = max(0.0, elapsed)
    if job.checkpoint_interval_minutes is not None:
        elapsed = min(elapsed, job.checkpoint_interval_minutes * 60.0)
    return gpus_from_milli(elapsed * placement.gpu_milli)


def preemption_penalty(job: Job, lost_seconds: float, policy: Policy) -> float:
    """A small term: what stopping the job costs besides its value, growing with the work
    lost since its checkpoint (GPU-hours, squashed below 1 so that it orders victims and
    never outweighs a priority class). A service's replica above its minimum holds no work
    to lose and costs least: within its priority class it is the first victim, as in
    engine.placement.preemption.victim_order."""
    if surplus(job):
        return policy.preemption_cost * SURPLUS_SHARE * gpu_value(job, job.replicas)
    hours = lost_seconds / 3600.0
    return policy.preemption_cost * (0.1 * gpu_value(job, job.replicas) + hours / (1.0 + hours))


def topology_spread_penalty(job: Job, policy: Policy) -> float:
    """The small term of a preferred topology: what spreading over several domains costs."""
    return PREFERRED_TOPOLOGY_SHARE * gpu_value(job, job.smallest_gang)


def compact_unit(job: Job, policy: Policy) -> float:
    """What one more node costs a gang; one more domain at level rank i costs 2**i of it.
    A share of one replica's GPUs, whatever its priority: compactness is the second
    criterion, compared only between plans of equal score (never a priority level)."""
    gang = gang_topology(job)
    if not gang.compact or job.replicas < 2:
        return 0.0
    return policy.compactness_weight * gang.share * gpu_value(job, 1)


def compactness_penalty(job: Job, span: Span, policy: Policy) -> float:
    """The soft cost of a gang's span: per level, each domain beyond the first, weighted by level."""
    unit = compact_unit(job, policy)
    if not unit:
        return 0.0
    return unit * sum((1 << rank) * (used - 1) for rank, used in enumerate(span.used) if used > 1)


_TREES: dict[int, tuple[tuple[Node, ...], tuple[str, ...] | None, Tree]] = {}


def instance_tree(instance: PlacementInstance) -> Tree:
    """The instance's tree, built once per node list and topology levels (what the tree is
    made of): plans are scored many times a solve, and successive solves hand over the
    same node tuple."""
    levels = instance.cluster.topology_levels if instance.cluster is not None else None
    found = _TREES.get(id(instance.nodes))
    if found is not None and found[0] is instance.nodes and found[1] == levels:
        return found[2]
    if len(_TREES) > 8:
        _TREES.clear()
    tree = Tree.of(instance.cluster, instance.nodes)
    _TREES[id(instance.nodes)] = (instance.nodes, levels, tree)
    return tree


def _node_gpu_milli(instance: PlacementInstance) -> dict[str, int]:
    return {n.name: milli_from_gpus(n.gpus) for n in instance.nodes}


def node_fragmentation(capacity_milli: int, used_milli: int) -> float:
    """The share of a node's GPUs stranded next to work: 0 for an empty or full node."""
    if capacity_milli <= 0 or used_milli <= 0 or used_milli >= capacity_milli:
        return 0.0
    return 1.0 - used_milli / capacity_milli


def quota_exempt(job: Job, outcome_status: OutcomeStatus) -> bool:
    """A non-preemptible job that stays where it is is not charged to quota (check.py agrees)."""
    return outcome_status is OutcomeStatus.KEPT and not job.preemptible


# -- fairness: weighted dominant resource shares --------------------------------------------


def instance_capacity(instance: PlacementInstance) -> Mapping[str, int]:
    """`capacity_vector` of the instance's nodes, worked out once per instance."""
    return instance.derived(_instance_capacity)


def _instance_capacity(instance: PlacementInstance) -> dict[str, int]:
    return capacity_vector(instance.nodes)


def capacity_vector(nodes: Iterable[Node]) -> dict[str, int]:
    cap = {"gpu": 0, "cpu": 0, "memory": 0}
    for n in nodes:
        if n.schedulable:
            cap["gpu"] += milli_from_gpus(n.gpus)
            cap["cpu"] += n.cpu_milli
            cap["memory"] += n.memory_mib
    return cap


def demand_vector(job: Job, replicas: int) -> tuple[int, int, int]:
    """What `replicas` replicas of the job take, in RESOURCES' order."""
    r = job.resources
    return replicas * r.gpu_milli, replicas * r.cpu_milli, replicas * r.memory_mib


def job_demand(job: Job, replicas: int) -> dict[str, int]:
    return dict(zip(RESOURCES, demand_vector(job, replicas), strict=True))


@dataclass(frozen=True, slots=True)
class FairTarget:
    """A queue's weighted max-min fair dominant share, and which resource is dominant."""

    queue: str
    resource: str
    share: float


def fair_targets(
    queues: Sequence[Queue], jobs: Sequence[Job], capacity: Mapping[str, int]
) -> dict[str, FairTarget]:
    """Weighted max-min fairness over dominant shares (DRF), capped by each queue's demand.

    Each queue grows its dominant share at the rate of its weight, consuming every
    resource in the proportion of its demand, until its demand is met or a
    resource runs out (progressive filling).
    """
    # Each queue's demand in RESOURCES' order (integers: no dict per job).
    summed: dict[str, list[int]] = {q.name: [0, 0, 0] for q in queues}
    for job in jobs:
        acc = summed.get(job.queue)
        if acc is not None:
            gpu, cpu, memory = demand_vector(job, job.replicas)
            acc[0] += gpu
            acc[1] += cpu
            acc[2] += memory
    demand = {name: dict(zip(RESOURCES, acc, strict=True)) for name, acc in summed.items()}
    weight = {q.name: max(q.weight, 1e-9) for q in queues}
    dominant: dict[str, tuple[str, float]] = {}
    for q, d in demand.items():
        shares = [(d[r] / capacity[r], r) for r in RESOURCES if capacity[r] > 0]
        if not shares:
            continue
        share, res = max(shares)
        if share > 0:
            dominant[q] = (res, share)
    if not dominant:
        return {}

    def use(level: float) -> dict[str, float]:
        total = {r: 0.0 for r in RESOURCES}
        for q, (_, ds) in dominant.items():
            s = min(ds, weight[q] * level)
            for r in RESOURCES:
                total[r] += s / ds * demand[q][r]
        return total

    def fits(level: float) -> bool:
        used = use(level)
        return all(used[r] <= capacity[r] * (1 + 1e-12) for r in RESOURCES)

    low, high = 0.0, max(ds / weight[q] for q, (_, ds) in dominant.items())
    if fits(high):
        low = high
    else:
        for _ in range(60):
            middle = (low + high) / 2
            if fits(middle):
                low = middle
            else:
                high = middle
    return {q: FairTarget(q, res, min(ds, weight[q] * low)) for q, (res, ds) in dominant.items()}


def fairness_penalty_per_share(instance: PlacementInstance) -> float:
    """What one unit of dominant share below target costs: `fairnessWeight` per GPU of the
    cluster, so one GPU short of a fair share costs `fairnessWeight` (a moved GPU costs a
    tenth of `moveCost`). A small term: fairness decides between queues within a priority
    class and within nominal quotas, never above them; with `priorityWeight: 0` every class
    weighs the same and fairness orders queues whatever their jobs' priorities."""
    if not instance.policy.fairness_weight:
        return 0.0
    gpus = gpus_from_milli(instance_capacity(instance)["gpu"])
    return instance.policy.fairness_weight * max(gpus, 1.0)


def usage_weights(queues: Sequence[Queue], usage: Mapping[str, float]) -> dict[str, float]:
    """Each queue's weight for fair shares, lowered by its recent usage as Slurm's fair-share
    factor does: weight * 2^(-usage / share), where `usage` is the queue's decayed usage as a
    share of the cluster (engine/fairshare.py) and `share` its weight's share of all weights.
    A queue that used exactly its share lately counts half; one that used nothing, whole."""
    total = sum(max(q.weight, 0.0) for q in queues) or 1.0
    out = {}
    for q in queues:
        share = max(q.weight, 1e-9) / total
        out[q.name] = max(q.weight, 1e-9) * 2.0 ** (-max(0.0, usage.get(q.name, 0.0)) / share)
    return out


def instance_fair_targets(instance: PlacementInstance) -> Mapping[str, FairTarget]:
    """The instance's fair dominant shares, each queue weighted by its share and its recent
    usage (computed once per instance: plans are scored many times a solve)."""
    return instance.derived(_instance_fair_targets)


def _instance_fair_targets(instance: PlacementInstance) -> dict[str, FairTarget]:
    queues: Sequence[Queue] = instance.queues
    if instance.usage:
        adjusted = usage_weights(instance.queues, instance.usage)
        queues = [replace(q, weight=adjusted[q.name]) for q in instance.queues]
    return fair_targets(queues, instance.jobs, instance_capacity(instance))


# -- scoring a whole plan -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectiveTerms:
    value: float = 0.0
    nominal_bonus: float = 0.0
    moves: float = 0.0
    preemptions: float = 0.0
    fragmentation: float = 0.0
    fairness: float = 0.0
    topology: float = 0.0
    wait_order: float = 0.0  # a bonus: starting the jobs waiting longest (wait_order_bonus)
    # Second criterion, not in `total`: among plans of equal score, the tighter wins
    # (topology.py; weighted by level, see compactness_penalty).
    compactness: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.value
            + self.nominal_bonus
            - self.moves
            - self.preemptions
            - self.fragmentation
            - self.fairness
            - self.topology
            + self.wait_order
        )


def objective_terms(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> ObjectiveTerms:
    """Every term of the objective for a plan, computed from the plan alone."""
    return _terms(instance, outcomes, spans=True)


def _terms(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome], spans: bool
) -> ObjectiveTerms:
    """The objective's terms; the second criterion (compactness: every gang's span) only
    with `spans`, as it is no part of the score."""
    jobs = jobs_by_key(instance)
    nodes = nodes_by_name(instance)
    policy = instance.policy
    w = weights(instance)
    value = moves = preemptions = topology = compactness = waited = 0.0
    tree = instance_tree(instance) if spans else None
    node_used: dict[str, int] = defaultdict(int)
    quota_used: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    # Per queue, job_demand of its running replicas in RESOURCES' order (integers).
    queue_use: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    worth = w.value
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None:
            continue
        status = o.status
        if status in RUNNING_STATUSES:
            count = len(o.replicas)
            value += worth(job, count)
            if o.job not in instance.current:
                waited += wait_order_bonus(instance, job, count)
            for replica in o.replicas:
                node_used[replica.node] += replica.gpu_milli * len(replica.gpus)
            if o.flavor is not None and not quota_exempt(job, status):
                quota_used[(job.queue, o.flavor)][job.priority] += count * job.resources.gpu_milli
            use = queue_use[job.queue]
            gpu, cpu, memory = demand_vector(job, count)
            use[0] += gpu
            use[1] += cpu
            use[2] += memory
            topo = job.topology
            if topo is not None and topo.mode is TopologyMode.PREFERRED and topo.level:
                domains = {nodes[r.node].domain(topo.level) for r in o.replicas if r.node in nodes}
                if len(domains) > 1:
                    topology += topology_spread_penalty(job, policy)
            if tree is not None and count > 1 and policy.compactness_weight:
                span = span_of(tree, (r.node for r in o.replicas))
                compactness += compactness_penalty(job, span, policy)
            if status is OutcomeStatus.MOVED:
                was = instance.current.get(o.job)
                lost = lost_gpu_seconds(job, was, instance.now) if was is not None else 0.0
                moves += move_penalty(job, lost, policy)
        elif status is OutcomeStatus.PREEMPTED:
            preemptions += preemption_penalty(job, o.lost_gpu_seconds, policy)
    bonus = 0.0
    queues = {q.name: q for q in instance.queues}
    for (queue_name, flavor), by_priority in quota_used.items():
        queue = queues.get(queue_name)
        fq = queue.quota(flavor) if queue else None
        if fq is None:
            continue
        above = 0
        for priority, rate in w.nominal_steps(by_priority):
            above += by_priority[priority]
            bonus += gpus_from_milli(rate * min(above, fq.nominal))
    fragmentation = 0.0
    if policy.fragmentation_weight:
        gpu_milli = instance.derived(_node_gpu_milli)
        for name, used in node_used.items():
            capacity_milli = gpu_milli.get(name)
            if capacity_milli is not None:
                fragmentation += node_fragmentation(capacity_milli, used)
        fragmentation *= policy.fragmentation_weight
    fairness = 0.0
    if policy.fairness_weight:
        capacity = instance_capacity(instance)
        rate = fairness_penalty_per_share(instance)
        for target in instance_fair_targets(instance).values():
            used = queue_use[target.queue][RESOURCES.index(target.resource)]
            fairness += rate * max(0.0, target.share - used / capacity[target.resource])
    return ObjectiveTerms(
        value, bonus, moves, preemptions, fragmentation, fairness, topology, waited, compactness
    )


def plan_compactness(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> float:
    """The plan's second criterion: what its gangs' spans cost (lower is tighter)."""
    jobs = jobs_by_key(instance)
    tree = instance_tree(instance)
    cost = 0.0
    for o in outcomes:
        job = jobs.get(o.job)
        if job is not None and o.running and len(o.replicas) > 1:
            cost += compactness_penalty(
                job, span_of(tree, (r.node for r in o.replicas)), instance.policy
            )
    return cost


def plan_objective(instance: PlacementInstance, outcomes: Sequence[JobOutcome]) -> float:
    """Score any plan, the same way for every solver."""
    return _terms(instance, outcomes, spans=False).total


def broken_soft_constraints(
    instance: PlacementInstance, outcomes: Sequence[JobOutcome]
) -> tuple[str, ...]:
    """Soft rules the plan breaks, named like constraints: topology__job__level, fairness__queue."""
    nodes = nodes_by_name(instance)
    jobs = jobs_by_key(instance)
    broken: list[str] = []
    queue_used: dict[str, dict[str, int]] = defaultdict(lambda: {r: 0 for r in RESOURCES})
    for o in outcomes:
        job = jobs.get(o.job)
        if job is None or not o.running:
            continue
        for r, v in job_demand(job, len(o.replicas)).items():
            queue_used[job.queue][r] += v
        topo = job.topology
        if topo is not None and topo.mode is TopologyMode.PREFERRED and topo.level:
            domains = {nodes[r.node].domain(topo.level) for r in o.replicas if r.node in nodes}
            if len(domains) > 1:
                broken.append(f"topology__{job.key}__{topo.level}")
    if instance.policy.fairness_weight:
        capacity = instance_capacity(instance)
        for target in instance_fair_targets(instance).values():
            share = queue_used[target.queue][target.resource] / capacity[target.resource]
            if target.share - share > 1e-6:
                broken.append(f"fairness__{target.queue}")
    return tuple(broken)


# -- fragmentation as FGD measures it (trace-driven, online placement) -----------------------

WorkloadShape = tuple[float, int, int, int, int, frozenset[str]]


def workload_fragmentation(
    flavor: str | None,
    gpus: tuple[int, ...],
    cpu_step: int,
    memory_step: int,
    shapes: tuple[WorkloadShape, ...],
) -> float:
    """The milli-GPU of one node that the workload's pods could not use, weighted by how
    often each pod shape occurs (FGD, USENIX ATC'23): all of it for a pod that does not
    fit at all, else the GPUs too small for its share (or not whole, for whole-GPU pods).

    `gpus` is the free milli-GPU per GPU, sorted; CPU and memory are given as steps:
    how many of the workload's distinct demands they cover; each shape is
    (share, CPU step needed, memory step needed, GPUs, milli-GPU per GPU, models).
    """
    total = sum(gpus)
    if total == 0:
        return 0.0
    whole = gpus.count(GPU_MILLI)
    top = gpus[-1]
    fragment = 0.0
    for share, cpu_need, memory_need, count, milli, models in shapes:
        if flavor not in models or cpu_step <= cpu_need or memory_step <= memory_need:
            fragment += share * total
        elif milli >= GPU_MILLI:
            fragment += share * (total if whole < count else total - whole * GPU_MILLI)
        elif top < milli:
            fragment += share * total
        else:
            fragment += share * sum(g for g in gpus if g < milli)
    return fragment


def stranded_gpu(
    free_gpu_milli: int,
    free_cpu_milli: int,
    free_memory_mib: int,
    gpu_per_cpu: float,
    gpu_per_memory: float,
) -> float:
    """The milli-GPU of one node that its free CPU or memory cannot feed: what is left
    after the free CPU and memory are spent at the workload's own ratio of GPU to CPU and
    to memory (milli-GPU per milli-CPU, per MiB). FGD's measure sees only the next pod;
    this sees the node being filled to the end: CPU-heavy pods on a node strand its GPUs."""
    if free_gpu_milli <= 0:
        return 0.0
    fed = min(free_cpu_milli * gpu_per_cpu, free_memory_mib * gpu_per_memory)
    return max(0.0, free_gpu_milli - fed)
