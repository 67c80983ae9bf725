"""Small builders for domain objects, so tests read as scenarios."""

from __future__ import annotations

from engine.model import (
    GPU_MILLI,
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
from engine.placement.plan import PlacementInstance

CLUSTER = ClusterSpec(
    name="test",
    topology_levels=("nvlink", "rack"),
    gpu_flavors=(GpuFlavor("h100", "H100", 80), GpuFlavor("a100", "A100", 80)),
    priority_classes=(
        PriorityClass("low", 100),
        PriorityClass("normal", 500),
        PriorityClass("high", 900),
    ),
    default_priority_class="normal",
)


def node(
    name: str,
    *,
    flavor: str | None = "h100",
    gpus: int = 8,
    nvlink: str | None = None,
    rack: str = "r1",
    isolation: Isolation = Isolation.SHARED,
    region: str | None = "eu",
    cpu: int = 128,
    memory_gib: int = 1024,
) -> Node:
    topology = {"rack": rack}
    if nvlink:
        topology["nvlink"] = nvlink
    return Node(
        name=name,
        flavor=flavor,
        gpus=gpus,
        cpu_milli=cpu * 1000,
        memory_mib=memory_gib * 1024,
        topology=topology,
        region=region,
        isolation=isolation,
    )


def queue(
    name: str,
    *,
    cohort: str | None = None,
    quotas: dict[str, tuple[float, float | None, float | None]] | None = None,
) -> Queue:
    """quotas: flavor -> (nominal, borrowing_limit, lending_limit) in GPUs."""
    spec = (
        quotas
        if quotas is not None
        else {"h100": (1000.0, None, None), "a100": (1000.0, None, None)}
    )

    def milli(v: float | None) -> int | None:
        return None if v is None else round(v * GPU_MILLI)

    return Queue(
        name=name,
        team=name,
        cohort=cohort,
        quotas=tuple(
            FlavorQuota(f, round(n * GPU_MILLI), milli(b), milli(lend))
            for f, (n, b, lend) in spec.items()
        ),
    )


def job(
    name: str,
    *,
    queue: str = "q",
    replicas: int = 1,
    gpu: float = 1,
    priority: int = 500,
    flavors: tuple[str, ...] = (),
    topology: str | None = None,
    mode: TopologyMode = TopologyMode.REQUIRED,
    preemptible: bool = True,
    isolation: Isolation = Isolation.SHARED,
    residency: tuple[str, ...] = (),
    min_replicas: int | None = None,
    submitted_at: str = "",
    cpu: float = 1,
) -> Job:
    return Job(
        name=name,
        queue=queue,
        replicas=replicas,
        min_replicas=min_replicas,
        resources=Resources(
            gpu_milli=round(gpu * GPU_MILLI), cpu_milli=round(cpu * 1000), memory_mib=1024
        ),
        priority_class="x",
        priority=priority,
        gpu_flavors=flavors,
        topology=TopologyRequirement(topology, mode) if topology else None,
        preemptible=preemptible,
        isolation=isolation,
        residency=residency,
        submitted_at=submitted_at,
    )


def instance(
    nodes: list[Node],
    queues: list[Queue],
    jobs: list[Job],
    current: dict[str, Placement] | None = None,
    policy: Policy | None = None,
) -> PlacementInstance:
    return PlacementInstance(
        cluster=CLUSTER,
        nodes=tuple(nodes),
        queues=tuple(queues),
        jobs=tuple(jobs),
        current=current or {},
        policy=policy or Policy(),
        now="2026-11-22T12:00:00+00:00",
    )
