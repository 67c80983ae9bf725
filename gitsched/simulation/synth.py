"""Seeded synthetic clusters and workloads for the solve-time benchmarks (BENCHMARKS.md §2).

Pure: the same size and seed give the same instance, byte for byte, so a figure
in the README can be re-run. Shapes follow what GPU clusters run: most jobs are
small, a few gangs are large, and almost every size is a power of two.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from gitsched.engine import events as ev
from gitsched.engine.model import (
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    Isolation,
    Job,
    Node,
    Placement,
    Policy,
    PriorityClass,
    Queue,
    Resources,
    TopologyMode,
    TopologyRequirement,
)
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.engine.state import ClusterState, fold
from gitsched.engine.units import GPU_MILLI

NOW = "2026-11-22T12:00:00+00:00"
NODE_GPUS = 8
RACK_NODES = 16  # H100 racks; a GB200 rack is one NVL72 domain of 9 eight-GPU nodes
NVL72_NODES = 9
BLOCK_RACKS = 4
LEVELS = ("nvlink", "rack", "block")
GREEDY_NODES = 2000  # larger sizes place their running third part by part


@dataclass(frozen=True, slots=True)
class SynthSize:
    name: str
    nodes: int
    jobs: int
    queues: int


SIZES = {
    "S": SynthSize("S", 64, 300, 4),
    "M": SynthSize("M", 512, 2000, 12),
    "L": SynthSize("L", 1250, 5000, 24),
    # Ten and twenty times L: the sizes the decomposed solve (engine.placement.decompose) is for.
    "XL": SynthSize("XL", 12_500, 50_000, 96),
    "XXL": SynthSize("XXL", 25_000, 100_000, 192),
}

PRIORITIES = (PriorityClass("low", 100), PriorityClass("normal", 500), PriorityClass("high", 900))

CLUSTER = ClusterSpec(
    name="synth",
    topology_levels=LEVELS,
    gpu_flavors=(GpuFlavor("h100", "H100", 80), GpuFlavor("gb200", "GB200", 192)),
    priority_classes=PRIORITIES,
    default_priority_class="normal",
)


def synth_nodes(count: int, rng: random.Random) -> list[Node]:
    """Two thirds H100 (NVLink inside the node), one third GB200 (NVL72 racks of 9 nodes)."""
    nodes: list[Node] = []
    gb200 = (count // 3) // NVL72_NODES * NVL72_NODES
    h100 = count - gb200
    for i in range(h100):
        rack = i // RACK_NODES
        nodes.append(
            Node(
                name=f"h{i:04d}",
                flavor="h100",
                gpus=NODE_GPUS,
                cpu_milli=192_000,
                memory_mib=2048 * 1024,
                topology={
                    "nvlink": f"h{i:04d}",
                    "rack": f"hr{rack:03d}",
                    "block": f"hb{rack // BLOCK_RACKS:02d}",
                },
                region="eu" if rack % 4 != 3 else "us",
            )
        )
    for i in range(gb200):
        rack = i // NVL72_NODES
        nodes.append(
            Node(
                name=f"g{i:04d}",
                flavor="gb200",
                gpus=NODE_GPUS,
                cpu_milli=144_000,
                memory_mib=1536 * 1024,
                topology={
                    "nvlink": f"gr{rack:03d}",
                    "rack": f"gr{rack:03d}",
                    "block": f"gb{rack // BLOCK_RACKS:02d}",
                },
                region="eu" if rack % 4 != 3 else "us",
            )
        )
    # A few dedicated nodes for regulated work: the last H100 rack's first four nodes.
    last_rack = (h100 - 1) // RACK_NODES * RACK_NODES
    return [
        replace(n, isolation=Isolation.DEDICATED) if last_rack <= i < last_rack + 4 else n
        for i, n in enumerate(nodes)
    ]


def synth_queues(count: int, nodes: list[Node], rng: random.Random) -> list[Queue]:
    """Queues in cohorts of four; nominal quotas add up to the cluster, limits vary."""
    capacity: dict[str, int] = {}
    for n in nodes:
        if n.flavor is not None and n.isolation is Isolation.SHARED:
            capacity[n.flavor] = capacity.get(n.flavor, 0) + n.gpus * GPU_MILLI
    weights = [rng.choice((1.0, 1.0, 2.0, 3.0)) for _ in range(count)]
    total = sum(weights)
    queues: list[Queue] = []
    for i, weight in enumerate(weights):
        quotas = []
        for flavor, cap in sorted(capacity.items()):
            nominal = int(cap * weight / total) // GPU_MILLI * GPU_MILLI
            borrowing = rng.choice((None, nominal, nominal // 2, 0))
            lending = rng.choice((None, None, nominal // 2))
            quotas.append(FlavorQuota(flavor, nominal, borrowing, lending))
        queues.append(
            Queue(
                name=f"team{i:02d}",
                team=f"team{i:02d}",
                cohort=f"cohort{i // 4}" if i % 7 != 6 else None,
                weight=weight,
                quotas=tuple(quotas),
            )
        )
    return queues


def _shape(rng: random.Random) -> tuple[int, int, str | None, TopologyMode]:
    """(replicas, milli-GPU per replica, topology level, mode); about 4.6 GPUs a job on average."""
    roll = rng.random()
    if roll < 0.20:  # notebooks and inference: a share of one GPU
        return 1, rng.choice((250, 500)), None, TopologyMode.REQUIRED
    if roll < 0.70:  # single-replica jobs
        gpus = rng.choices((1, 2, 4, 8), weights=(50, 25, 15, 10))[0]
        return 1, gpus * GPU_MILLI, None, TopologyMode.REQUIRED
    if roll < 0.92:  # small gangs
        replicas = rng.choice((2, 4))
        gpus = rng.choices((1, 2, 4, 8), weights=(40, 30, 20, 10))[0]
        level = rng.choice((None, "nvlink", "rack", "rack"))
        mode = rng.choice((TopologyMode.REQUIRED, TopologyMode.REQUIRED, TopologyMode.PREFERRED))
        return replicas, gpus * GPU_MILLI, level, mode
    if roll < 0.995:  # training gangs of whole nodes
        replicas = rng.choice((2, 4, 4, 8))
        level = rng.choice(("nvlink", "rack", "rack", "block", None))
        return replicas, 8 * GPU_MILLI, level, TopologyMode.REQUIRED
    replicas = rng.choice((16, 32, 64))  # the large pre-training runs
    gpus = rng.choice((1, 2, 8))
    return replicas, gpus * GPU_MILLI, rng.choice(("block", None)), TopologyMode.REQUIRED


def synth_jobs(count: int, queues: list[Queue], rng: random.Random) -> list[Job]:
    jobs: list[Job] = []
    for i in range(count):
        queue = rng.choice(queues)
        replicas, milli, level, mode = _shape(rng)
        pc = rng.choices(PRIORITIES, weights=(3, 5, 2))[0]
        flavors: tuple[str, ...] = rng.choice(((), ("h100",), ("gb200",), ()))
        if level == "nvlink" and replicas * milli > NODE_GPUS * GPU_MILLI:
            flavors = ("gb200",)
        elastic = replicas >= 4 and rng.random() < 0.15
        isolation = (
            Isolation.DEDICATED if replicas == 1 and rng.random() < 0.004 else Isolation.SHARED
        )
        gpus = max(1, milli // GPU_MILLI)
        jobs.append(
            Job(
                name=f"job{i:05d}",
                queue=queue.name,
                replicas=replicas,
                min_replicas=replicas // 2 if elastic else None,
                resources=Resources(
                    gpu_milli=milli,
                    cpu_milli=gpus * rng.choice((8_000, 12_000, 16_000)),
                    memory_mib=gpus * rng.choice((64, 96, 128)) * 1024,
                ),
                priority_class=pc.name,
                priority=pc.value,
                gpu_flavors=("h100",) if isolation is Isolation.DEDICATED else flavors,
                topology=TopologyRequirement(level, mode) if level else None,
                preemptible=rng.random() < 0.85,
                checkpoint_interval_minutes=rng.choice((None, 30, 60, 120)),
                isolation=isolation,
                residency=("eu",) if rng.random() < 0.1 else (),
                submitted_at=f"2026-11-{1 + i * 20 // count:02d}T{(i * 7) % 24:02d}:00:00+00:00",
            )
        )
    return jobs


def synth_instance(size: str, seed: int, policy: Policy | None = None) -> PlacementInstance:
    """The instance of BENCHMARKS.md §2 for `size` (S, M, L, XL, XXL); the first third of
    jobs already run.

    The running jobs were placed by the greedy baseline, as a cluster that has
    been scheduled by a Kueue-like scheduler looks (XL and XXL: part by part).
    """
    from gitsched.engine.placement.greedy import GreedyPlacer

    spec = SIZES[size]
    rng = random.Random(f"synth-{size}-{seed}")
    nodes = synth_nodes(spec.nodes, rng)
    queues = synth_queues(spec.queues, nodes, rng)
    jobs = synth_jobs(spec.jobs, queues, rng)
    policy = policy or Policy()
    early = PlacementInstance(
        CLUSTER, tuple(nodes), tuple(queues), tuple(jobs[: len(jobs) // 3]), {}, policy, NOW
    )
    placed: dict[str, Placement] = {}
    if spec.nodes <= GREEDY_NODES:
        placed = GreedyPlacer().solve(early).placements()
    else:
        # Greedy takes time in jobs x nodes (minutes on XL): place each part of the
        # decomposed solve's cut, whose quota shares add up to the whole's.
        from gitsched.engine.placement.decompose import PART_NODES, partition

        for part in partition(early, -(-spec.nodes // PART_NODES)).parts:
            placed.update(GreedyPlacer().solve(part).placements())
        placed = {j.key: placed[j.key] for j in early.jobs if j.key in placed}
    current = {
        key: replace(
            p, started_at=f"2026-11-22T{rng.randrange(0, 12):02d}:{rng.randrange(60):02d}:00+00:00"
        )
        for key, p in placed.items()
    }
    return PlacementInstance(
        cluster=CLUSTER,
        nodes=tuple(nodes),
        queues=tuple(queues),
        jobs=tuple(jobs),
        current=current,
        policy=policy,
        now=NOW,
    )


def folded_state(instance: PlacementInstance) -> ClusterState:
    """The cluster `instance` describes, as the reconciler's folded state: the events that
    would have configured it (policy, cluster, nodes, queues, jobs, the running jobs'
    placements as solve "synth") folded from an empty state. The one way a synthetic
    instance becomes state, so the bench and the determinism probe decide on the same."""
    setup: list[ev.Event] = [ev.PolicyChanged(instance.policy)]
    if instance.cluster is not None:
        setup.append(ev.ClusterConfigured(instance.cluster))
    setup += [ev.NodeRegistered(n) for n in instance.nodes]
    setup += [ev.QueueConfigured(q) for q in instance.queues]
    setup += [ev.JobSubmitted(j) for j in instance.jobs]
    setup += [
        ev.PlacementDecided(k, p.flavor, p.replicas, "admitted", "admitted", "synth", p.started_at)
        for k, p in sorted(instance.current.items())
    ]
    return fold(setup, ClusterState())


def with_new_jobs(instance: PlacementInstance, count: int, seed: int) -> PlacementInstance:
    """The same cluster a moment later: `count` more jobs submitted, nothing else changed."""
    rng = random.Random(f"synth-new-{seed}")
    fresh = synth_jobs(count, list(instance.queues), rng)
    fresh = [
        replace(j, name=f"new{i:04d}", submitted_at="2026-11-22T12:00:00+00:00")
        for i, j in enumerate(fresh)
    ]
    return replace(instance, jobs=(*instance.jobs, *fresh))
