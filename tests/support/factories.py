"""Small builders for domain objects, so tests read as scenarios."""

from __future__ import annotations

from hypothesis import strategies as st

from gitsched.engine.core import (
    DesiredState,
)
from gitsched.engine.model import (
    ClusterSpec,
    CommitInfo,
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
from gitsched.engine.units import GPU_MILLI

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


@st.composite
def instances(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    n_nodes = draw(st.integers(1, 8))
    nodes = [
        node(
            f"n{i}",
            flavor=draw(flavors),
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            nvlink=f"d{i // 2}",
            rack=f"r{i // 4}",
            isolation=draw(
                st.sampled_from([Isolation.SHARED, Isolation.SHARED, Isolation.DEDICATED])
            ),
            region=draw(st.sampled_from(["eu", "us"])),
        )
        for i in range(n_nodes)
    ]
    queues = [
        queue(
            name,
            cohort=draw(st.sampled_from([None, "c"])),
            quotas={
                f: (
                    draw(st.integers(0, 24)),
                    draw(st.one_of(st.none(), st.integers(0, 16))),
                    draw(st.one_of(st.none(), st.integers(0, 8))),
                )
                for f in ("h100", "a100")
            },
        )
        for name in ("qa", "qb")
    ]
    jobs = []
    for i in range(draw(st.integers(0, 12))):
        replicas = draw(st.integers(1, 4))
        jobs.append(
            job(
                f"j{i}",
                queue=draw(st.sampled_from(["qa", "qb"])),
                replicas=replicas,
                min_replicas=draw(st.one_of(st.none(), st.integers(1, replicas))),
                gpu=draw(st.sampled_from([0, 0.25, 0.5, 1, 2, 4, 8])),
                priority=draw(st.sampled_from([100, 500, 900])),
                flavors=tuple(draw(st.lists(flavors, max_size=2, unique=True))),
                topology=draw(st.sampled_from([None, "node", "nvlink", "rack"])),
                preemptible=draw(st.booleans()),
                isolation=draw(
                    st.sampled_from([Isolation.SHARED, Isolation.SHARED, Isolation.DEDICATED])
                ),
                residency=tuple(draw(st.lists(st.sampled_from(["eu", "us"]), max_size=1))),
                submitted_at=str(i),
            )
        )
    return instance(nodes, queues, jobs)


def commit(n: int) -> CommitInfo:
    return CommitInfo(
        f"{n:040x}", "Ana", "ana@example.com", f"2026-11-20T10:{n % 60:02d}:00+00:00", f"commit {n}"
    )


def desired(jobs=(), nodes=None, queues=None, policy=None) -> DesiredState:  # type: ignore[no-untyped-def]
    nodes = nodes if nodes is not None else [node("n1"), node("n2")]
    queues = queues if queues is not None else [queue("q")]
    return DesiredState(
        cluster=CLUSTER,
        policy=policy or Policy(),
        nodes={n.name: n for n in nodes},
        queues={q.name: q for q in queues},
        jobs={j.key: j for j in jobs},
    )


flavors = st.sampled_from(["h100", "a100"])
