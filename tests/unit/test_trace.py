"""Trace-driven placement (simulation/trace.py) on tiny hand-made traces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import Node
from engine.placement.check import check_plan
from engine.placement.objective import stranded_gpu
from simulation.trace import (
    TraceCluster,
    TracePod,
    TraceRun,
    Workload,
    allocation_bound,
    as_plan,
    commit_order,
    gpu_configurations,
    packing_functions,
    place_in_order,
    reoptimise,
    run_batch,
    run_online,
    starved_windows,
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SIZES[:-1]), min_size=1, max_size=8, unique=True))
def test_every_fitting_multiset_lies_under_a_maximal_configuration(sizes: list[int]) -> None:
    """What the configuration rows rest on: whatever shares fit one GPU, some listed
    configuration holds at least as many of every size, and each listed one fits and is
    maximal."""
    configurations = gpu_configurations(sizes, 100_000)
    smallest = min(sizes)
    for c in configurations:
        assert sum(c) <= 1000 and 1000 - sum(c) < smallest

    def fitting(start: int, left: int) -> list[list[int]]:
        out = [[]]
        for j in range(start, len(sizes)):
            if sizes[j] <= left:
                out += [[sizes[j], *rest] for rest in fitting(j, left - sizes[j])]
        return out

    for multiset in fitting(0, 1000):
        assert any(all(c.count(s) >= multiset.count(s) for s in multiset) for c in configurations)


def _best_allocation(cluster: list[Node], arrivals: list[TracePod], keep: int) -> int | None:
    """The most milli-GPU any plan places, by exhaustive search: every pod unplaced or on
    some node's GPUs (a share on one GPU, a whole-GPU pod on a set of whole free GPUs),
    CPU and memory per node; the first `keep` pods must be placed (None: impossible)."""
    gpu = [[1000] * n.gpus for n in cluster]
    cpu = [n.cpu_milli for n in cluster]
    memory = [n.memory_mib for n in cluster]
    best: list[int | None] = [None]

    def place(k: int, total: int) -> None:
        if k == len(arrivals):
            if best[0] is None or total > best[0]:
                best[0] = total
            return
        p = arrivals[k]
        if k >= keep:
            place(k + 1, total)
        for i in range(len(cluster)):
            if cpu[i] < p.cpu_milli or memory[i] < p.memory_mib:
                continue
            if p.num_gpu == 0:
                options: list[tuple[int, ...]] = [()]
            elif p.gpu_milli < 1000:
                options = [(g,) for g, f in enumerate(gpu[i]) if f >= p.gpu_milli]
            else:
                free = [g for g, f in enumerate(gpu[i]) if f == 1000]
                options = [tuple(free[: p.num_gpu])] if len(free) >= p.num_gpu else []
            for gpus in options:
                cpu[i] -= p.cpu_milli
                memory[i] -= p.memory_mib
                for g in gpus:
                    gpu[i][g] -= p.gpu_milli
                place(k + 1, total + p.total_gpu_milli)
                cpu[i] += p.cpu_milli
                memory[i] += p.memory_mib
                for g in gpus:
                    gpu[i][g] += p.gpu_milli

    place(0, 0)
    return best[0]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([110, 160, 230, 320, 470, 650, 810, 1000]), st.integers(1, 2)),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.integers(1, 3), min_size=1, max_size=2),
    st.integers(0, 6),
    st.sampled_from([4000, 8000, 16_000]),
)
def test_bound_is_above_every_plan_that_keeps_the_kept_pods(
    shapes: list[tuple[int, int]], gpus: list[int], keep: int, node_cpu: int
) -> None:
    """Validity of allocation_bound (the pooled LP with packing and configuration rows):
    never below the exact optimum of the same small instance, with and without pods that
    must stay placed."""
    arrivals = [
        pod(f"p{k}", milli, gpus=count if milli == 1000 else 1, cpu=2000 * count)
        for k, (milli, count) in enumerate(shapes)
    ]
    cluster = [Node(f"n{i}", "T4", g, node_cpu, 65_536) for i, g in enumerate(gpus)]
    capacity = 1000 * sum(gpus)
    keep = min(keep, len(arrivals))
    best = _best_allocation(cluster, arrivals, keep)
    assert best is not None or keep > 0
    if best is not None:
        bound = allocation_bound(cluster, arrivals, "highs", keep=arrivals[:keep])
        assert bound * capacity >= best - 1e-6
    free = _best_allocation(cluster, arrivals, 0)
    assert free is not None
    assert allocation_bound(cluster, arrivals, "highs") * capacity >= free - 1e-6


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


def test_free_capacity_splits_into_remainders_beside_shares_and_whole_gpus() -> None:
    pods = [pod("big", 810), pod("small", 160), pod("half", 500)]
    run = run_online(nodes(2), pods, Workload.of(pods, {"T4"}), "fgd", 1.0)
    partial, whole = run.cluster.free_split()
    # 810 + 160 share a GPU (30 left), the 500 takes the other (500 left): none is whole.
    assert (partial, whole) == (30 + 500, 0)
    assert run.cluster.allocated_milli + partial + whole == run.cluster.capacity_milli
    assert TraceCluster.of(nodes(2), run.cluster.workload).free_split() == (0, 2 * 1000)


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


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from([160, 230, 250, 300, 400, 470, 500, 650, 1000]), min_size=1, max_size=9
    )
)
def test_a_commit_places_at_least_what_either_order_places(sizes: list[int]) -> None:
    """One commit of every pod: the batch plan holds at least as much GPU as placing the
    commit hardest first, and as placing it in arrival order (it keeps the better, and
    its windows only add)."""
    pods = [pod(f"p{k}", s) for k, s in enumerate(sizes)]
    cluster = nodes(1, gpus=2)
    workload = Workload.of(pods, {"T4"})
    placed = []
    for order in (sorted(range(len(pods)), key=lambda k: (commit_order(pods[k]), k)), None):
        c = TraceCluster.of(cluster, workload)
        place_in_order(c, pods, order if order is not None else list(range(len(pods))))
        placed.append(c.allocated_milli)
    batch = run_batch(cluster, pods, workload, 1.0, "highs", commit=len(pods))
    assert batch.cluster.allocated_milli >= max(placed)
    instance, plan = as_plan(batch)
    assert check_plan(instance, plan) == []


def test_reoptimise_moves_a_cpu_heavy_pod_off_a_gpu_that_waits_on_cpu() -> None:
    """Node a holds a 300 share that takes 6 of its 8 CPUs: its free 700 waits on CPU. Node
    b holds a 700 share and has CPU to spare. A waiting 700 share of 3 CPUs fits neither;
    moving the 300 share to b lets it in on a. The window is a with b, the node with room."""
    cluster = [Node(name, "T4", 1, 8000, 65_536) for name in ("a", "b")]
    pods = [pod("x", 300, cpu=6000), pod("y", 700, cpu=1000), pod("w", 700, cpu=3000)]
    state = TraceCluster.of(cluster, Workload.of(pods, {"T4"}))
    state.place(0, pods[0], 0, (0,))
    state.place(1, pods[1], 1, (0,))
    assert starved_windows(state, [pods[2]]) == [[0, 1]]
    run = reoptimise(TraceRun(pods, state, [], pending=[2]), "highs", 10.0)
    assert run.allocation == (300 + 700 + 700) / 2000
    assert run.pending == [] and run.moves == 1
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []


def test_reoptimise_moves_a_share_to_another_gpu_to_make_room() -> None:
    """One node, two GPUs: 300 + 300 on one and 400 on the other. A waiting 700 fits
    neither hole (400, 600); moving one 300 next to the 400 opens 700 on the first."""
    cluster = nodes(1, gpus=2)
    pods = [pod("a", 300), pod("b", 300), pod("c", 400), pod("w", 700)]
    state = TraceCluster.of(cluster, Workload.of(pods, {"T4"}))
    state.place(0, pods[0], 0, (0,))
    state.place(1, pods[1], 0, (0,))
    state.place(2, pods[2], 0, (1,))
    run = reoptimise(TraceRun(pods, state, [], pending=[3]), "highs", 10.0)
    assert run.allocation == 1700 / 2000
    assert run.pending == [] and run.moves == 1
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([110, 230, 320, 470, 650, 810, 1000]), st.integers(1, 2)),
        min_size=2,
        max_size=10,
    ),
    st.lists(st.integers(1, 3), min_size=1, max_size=2),
)
def test_reoptimise_keeps_every_running_pod_and_never_loses_gpu(
    shapes: list[tuple[int, int]], gpus: list[int]
) -> None:
    """Whatever the arrivals: every pod running before re-optimisation still runs, the
    allocation does not drop, nor pass the exact optimum of keeping them, and the plan
    passes the checker."""
    arrivals = [
        pod(f"p{k}", milli, gpus=count if milli == 1000 else 1, cpu=3000 * count)
        for k, (milli, count) in enumerate(shapes)
    ]
    cluster = [Node(f"n{i}", "T4", g, 8000, 65_536) for i, g in enumerate(gpus)]
    run = run_online(cluster, arrivals, Workload.of(arrivals, {"T4"}), "fgd", 1.0)
    running = sorted(run.cluster.placed)
    before = run.cluster.allocated_milli
    order = running + [k for k in range(len(arrivals)) if k not in running]
    best = _best_allocation(cluster, [arrivals[k] for k in order], len(running))
    run = reoptimise(run, "highs", 10.0)
    assert set(running) <= set(run.cluster.placed)
    assert before <= run.cluster.allocated_milli <= (best or 0)
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []
