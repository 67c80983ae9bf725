"""Trace-driven placement (engine/placement/trace.py) on tiny hand-made traces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import Node
from engine.placement.check import check_plan
from engine.placement.objective import stranded_gpu
from engine.placement.trace import (
    TracePod,
    Workload,
    allocation_bound,
    as_plan,
    commit_order,
    packing_functions,
    run_batch,
    run_online,
)

SIZES = [50, 110, 160, 190, 230, 320, 470, 500, 530, 650, 810, 1000]


def pod(name: str, milli: int, gpus: int = 1, cpu: int = 1000, memory: int = 1024) -> TracePod:
    return TracePod(name, cpu, memory, gpus if milli else 0, milli)


def nodes(count: int, gpus: int = 1, model: str = "T4") -> list[Node]:
    return [Node(f"n{i}", model, gpus, 64_000, 262_144) for i in range(count)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SIZES), min_size=1, max_size=12))
def test_packing_functions_never_value_one_gpu_above_1000(items: list[int]) -> None:
    """Dual feasibility: whatever fits on one GPU is worth at most one GPU, for every function."""
    fitting: list[int] = []
    for s in items:
        if sum(fitting) + s <= 1000:
            fitting.append(s)
    for f in packing_functions(SIZES):
        assert sum(f[s] for s in fitting) <= 1000
        assert f[1000] == 1000


def test_bound_counts_the_gpu_an_810_share_strands() -> None:
    """Four 810 shares kept on four GPUs: no plan that keeps them reaches 100%, whatever the
    whole-GPU pods waiting; the pooled LP alone would say 100%."""
    cluster = nodes(4)
    shares = [pod(f"s{i}", 810) for i in range(4)]
    arrivals = shares + [pod(f"w{i}", 1000) for i in range(4)]
    assert allocation_bound(cluster, arrivals, "highs") == 1.0
    kept = allocation_bound(cluster, arrivals, "highs", keep=shares)
    assert kept <= 0.81 + 1e-9
    run = run_online(cluster, shares, Workload.of(arrivals, {"T4"}), "fgd", 1.0)
    assert run.allocation <= kept + 1e-9


def test_bound_is_above_what_online_places() -> None:
    pods = [pod(f"p{i}", s) for i, s in enumerate([810, 160, 470, 470, 650, 320, 1000, 230])]
    cluster = nodes(2, gpus=2)
    run = run_online(cluster, pods, Workload.of(pods, {"T4"}), "fgd", 1.0)
    placed = [pods[k] for k in run.cluster.placed]
    assert allocation_bound(cluster, pods, "highs", keep=placed) >= run.allocation - 1e-9


def test_a_small_share_fills_the_hole_an_810_left() -> None:
    """FGD's measure: a 160 share goes next to the 810 (leaving 30), not onto a whole GPU."""
    pods = [pod("big", 810), pod("small", 160)]
    workload = Workload.of([*pods, pod("w", 1000)], {"T4"})
    run = run_online(nodes(2), pods, workload, "fgd", 1.0)
    assert run.cluster.placed[0][0] == run.cluster.placed[1][0]
    assert run.allocation == (810 + 160) / 2000


def test_balanced_keeps_cpu_next_to_free_gpus_where_fgd_does_not() -> None:
    """A CPU-only pod, then four 1-GPU pods of 4 CPU. FGD's measure sees only the next pod:
    the CPU pod leaving 4 CPU on the small node costs nothing yet, so it goes there (first by
    index) and strands a GPU. The stranded-GPU term sends it to the node with CPU to spare."""
    cluster = [Node("small", "T4", 2, 12_000, 65_536), Node("large", "T4", 2, 40_000, 65_536)]
    pods = [TracePod("cpu", 8000, 1024, 0, 0)] + [pod(f"g{i}", 1000, cpu=4000) for i in range(4)]
    workload = Workload.of(pods, {"T4"})
    assert workload.gpu_per_cpu == 0.25
    fgd = run_online(cluster, pods, workload, "fgd", 1.0)
    balanced = run_online(cluster, pods, workload, "balanced", 1.0)
    assert fgd.cluster.placed[0][0] == 0 and fgd.allocation == 0.75
    assert balanced.cluster.placed[0][0] == 1 and balanced.allocation == 1.0
    assert stranded_gpu(2000, 4000, 65_536, 0.25, 1.0) == 1000.0
    assert stranded_gpu(2000, 32_000, 65_536, 0.25, 1.0) == 0.0


def test_batch_places_the_larger_pod_of_a_commit_first() -> None:
    """One GPU, a commit of an 810 share then a whole-GPU pod: online takes the share on
    arrival and the whole pod waits; a commit sees both and places the whole pod."""
    pods = [pod("share", 810), pod("whole", 1000)]
    workload = Workload.of(pods, {"T4"})
    online = run_online(nodes(1), pods, workload, "fgd", 1.0)
    batch = run_batch(nodes(1), pods, workload, 1.0, "highs", commit=2)
    assert online.allocation == 0.81
    assert batch.allocation == 1.0
    assert batch.pending == [0]  # the share waits: nothing is left that it fits
    instance, plan = as_plan(batch)
    assert check_plan(instance, plan) == []


def test_commit_order_is_most_gpus_then_largest_share_then_constrained() -> None:
    eight = TracePod("eight", 8000, 1, 8, 1000)
    one = TracePod("one", 8000, 1, 1, 1000)
    share = TracePod("share", 1000, 1, 1, 500)
    pinned = TracePod("pinned", 1000, 1, 1, 500, ("V100",))
    cpu = TracePod("cpu", 32_000, 1, 0, 0)
    ordered = sorted([cpu, share, pinned, one, eight], key=commit_order)
    assert [p.name for p in ordered] == ["eight", "one", "pinned", "share", "cpu"]
