"""The openb simulation (simulation/trace.py, simulation/bound.py) on tiny hand-made
traces: the bound is valid, and the runs are the product's own placement."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.engine.model import Node
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.plan import OutcomeStatus
from gitsched.engine.shapes import SHAPE_WINDOW_JOBS
from gitsched.simulation.bound import allocation_bound, gpu_configurations, packing_functions
from gitsched.simulation.trace import (
    TraceLog,
    TracePod,
    as_plan,
    reoptimise,
    run_batch,
    run_online,
    sample_arrivals,
    trace_policy,
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
    run = run_online(cluster, shares, 1.0)
    assert run.allocation <= kept + 1e-9


def test_free_capacity_splits_into_remainders_beside_shares_and_whole_gpus() -> None:
    pods = [pod("big", 810), pod("small", 160), pod("half", 500)]
    run = run_online(nodes(2), pods, 1.0)
    partial, whole = run.log.free_split()
    # 810 + 160 share a GPU (30 left), the 500 takes the other (500 left): none is whole.
    assert (partial, whole) == (30 + 500, 0)
    assert run.log.allocated_milli + partial + whole == run.log.capacity_milli
    assert TraceLog(nodes(2), trace_policy("greedy")).free_split() == (0, 2 * 1000)


def test_bound_is_above_what_online_places() -> None:
    pods = [pod(f"p{i}", s) for i, s in enumerate([810, 160, 470, 470, 650, 320, 1000, 230])]
    cluster = nodes(2, gpus=2)
    run = run_online(cluster, pods, 1.0)
    placed = [pods[k] for k in run.placed]
    assert placed and allocation_bound(cluster, pods, "highs", keep=placed) >= run.allocation - 1e-9


def _random_trace(seed: int, count: int) -> tuple[list[Node], list[TracePod]]:
    rng = random.Random(seed)
    cluster = [
        Node(
            f"n{i:02d}",
            rng.choice(["T4", "V100"]),
            rng.choice([2, 4, 8]),
            rng.choice([32_000, 96_000]),
            262_144,
        )
        for i in range(16)
    ]
    kinds = [
        TracePod(f"k{j}", rng.choice([2000, 8000, 24_000]), rng.choice([4096, 32_768]),
                 *rng.choice([(1, 160), (1, 500), (1, 810), (1, 1000), (2, 1000), (0, 0)]),
                 models=rng.choice([(), ("T4",), ("V100",)]))
        for j in range(12)
    ]  # fmt: skip
    capacity = 1000 * sum(n.gpus for n in cluster)
    arrivals = sample_arrivals(kinds, capacity, 10.0, rng.randrange)[:count]
    return cluster, arrivals


def test_online_places_each_pod_where_greedys_own_solve_of_the_log_puts_it() -> None:
    """What the benchmark measures is what the reconciler runs: each arrival placed by the
    simulation's kept packing lands where GreedyPlacer.solve of the folded state (every
    running pod kept, the learned shapes in the instance) puts it, also after the shapes
    are published mid-run."""
    cluster, arrivals = _random_trace(5, SHAPE_WINDOW_JOBS + 60)
    run = run_online(cluster, arrivals, 1.0)
    assert run.log.state.shapes, "the learned shapes were published during the run"
    log = TraceLog(cluster, trace_policy("greedy"))
    for k, p in enumerate(arrivals):
        job = p.job(k)
        log.submit([job])
        plan = GreedyPlacer().solve(log.instance())
        outcome = plan.outcome(job.key)
        assert outcome is not None
        assert all(o.status is not OutcomeStatus.MOVED for o in plan.outcomes)
        log.apply(plan)
        ours = run.log.state.placements.get(job.key)
        if outcome.status is OutcomeStatus.PLACED:
            assert ours is not None and ours.replicas == outcome.replicas, k
        else:
            assert ours is None, k
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []


def test_batch_and_reoptimise_run_the_milp_through_the_log_and_never_lose_gpu() -> None:
    cluster, arrivals = _random_trace(7, 90)
    run = run_batch(cluster, arrivals, 1.0, "highs", commit=30, time_limit_s=5.0)
    assert run.solves == 3 and run.allocation > 0
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []
    before, running = run.allocation, set(run.placed)
    again = reoptimise(run, "highs", 5.0)
    assert again.allocation >= before - 1e-9
    assert running <= set(again.placed)  # a re-optimisation moves pods, never stops one
    instance, plan = as_plan(again)
    assert check_plan(instance, plan) == []


def test_arrivals_stop_before_passing_the_demand() -> None:
    pods = [TracePod("a", 1000, 1024, 1, 1000), TracePod("b", 1000, 1024, 1, 500)]
    arrivals = sample_arrivals(pods, 5000, 1.3, random.Random(1).randrange)
    asked = sum(p.total_gpu_milli for p in arrivals)
    assert 6500 - 1000 < asked <= 6500  # the pod drawn next would have passed 130%


def test_online_plans_pass_the_checker_and_keep_whole_gpus_for_whole_pods() -> None:
    cluster = [Node(f"t{i}", "T4", 2, 16_000, 65_536) for i in range(2)]
    cluster.append(Node("v0", "V100", 1, 8_000, 32_768))
    pods = [TracePod("s", 1000, 1024, 1, 500)] * 2 + [TracePod("w", 1000, 1024, 2, 1000)]
    run = run_online(cluster, pods, 1.0)
    instance, plan = as_plan(run)
    assert check_plan(instance, plan) == []
    # Both shares on one GPU, so the two-GPU pod still finds a whole node.
    assert run.placed == [0, 1, 2] and run.allocation == 3000 / 5000
