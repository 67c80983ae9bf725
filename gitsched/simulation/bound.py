"""The upper bound the openb benchmark measures every run against (BENCHMARKS.md §1).

Measurement, not placement: the LP relaxation of placing the arrived pods with nodes of a
kind pooled, tightened by dual feasible functions and the configuration LP of each GPU
pool, so that no placer's ratio can pass it. With `keep`, it bounds every plan that keeps
those pods running (what a re-optimisation that never stops a pod can reach).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from gitsched.engine.model import Node
from gitsched.engine.placement.linear import LinearModel, SolveLimits, solve
from gitsched.engine.units import GPU_MILLI
from gitsched.simulation.trace import ShapeKey, TracePod


def allocation_bound(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    backend: str,
    keep: Sequence[TracePod] = (),
) -> float:
    """An upper bound of the GPU allocation ratio: the LP relaxation of placing the pods on
    the cluster with nodes of a kind pooled (capacity, GPU counts, CPU, memory, and
    floor(GPUs / s) items of s GPUs or more per node), tightened by one row per dual
    feasible function (`packing_functions`): what shares can share a GPU. With `keep`
    (pods that must stay placed, as in re-optimise), it bounds every plan that keeps them.
    """
    kinds: dict[tuple[object, ...], list[Node]] = defaultdict(list)
    for n in nodes:
        kinds[(n.flavor, n.gpus, n.cpu_milli, n.memory_mib)].append(n)
    counts = Counter(p.shape for p in pods)
    kept = Counter(p.shape for p in keep)
    example = {p.shape: p for p in pods}
    functions = packing_functions(sorted({p.gpu_milli for p in pods if p.gpu_milli > 0}))
    lp = LinearModel()
    per_shape: dict[ShapeKey, list[tuple[int, float]]] = defaultdict(list)
    for kid, members in enumerate(kinds.values()):
        node, m = members[0], len(members)
        milli, cpu, mem, count = [], [], [], []
        items: dict[int, list[tuple[int, float]]] = defaultdict(list)
        packed: list[list[tuple[int, float]]] = [[] for _ in functions]
        by_size: dict[int, list[tuple[int, float]]] = defaultdict(list)
        whole: list[tuple[int, float]] = []
        for key, pod in example.items():
            if pod.models and node.flavor not in pod.models:
                continue
            if pod.cpu_milli > node.cpu_milli or pod.memory_mib > node.memory_mib:
                continue
            if pod.num_gpu > node.gpus:
                continue
            x = lp.var(
                f"pods__{key}__{kid}", 0, counts[key], cost=pod.total_gpu_milli, integer=False
            )
            per_shape[key].append((x, 1.0))
            milli.append((x, float(pod.total_gpu_milli)))
            cpu.append((x, float(pod.cpu_milli)))
            mem.append((x, float(pod.memory_mib)))
            if pod.num_gpu and (pod.gpu_milli >= GPU_MILLI or pod.gpu_milli > GPU_MILLI // 2):
                count.append((x, float(pod.num_gpu)))
            if pod.gpu_milli >= GPU_MILLI and pod.num_gpu > 1:
                items[pod.num_gpu].append((x, 1.0))
            if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
                by_size[pod.gpu_milli].append((x, 1.0))
            elif pod.num_gpu:
                whole.append((x, float(pod.num_gpu)))
            if pod.num_gpu:
                for f, terms in zip(functions, packed, strict=True):
                    terms.append((x, float(pod.num_gpu * f[min(pod.gpu_milli, GPU_MILLI)])))
        lp.row(f"gpu__{kid}", milli, upper=m * node.gpus * GPU_MILLI)
        lp.row(f"gpus__{kid}", count, upper=m * node.gpus)
        _gpu_configuration_rows(lp, kid, m * node.gpus, by_size, whole)
        lp.row(f"cpu__{kid}", cpu, upper=m * node.cpu_milli)
        lp.row(f"memory__{kid}", mem, upper=m * node.memory_mib)
        for size in items:
            terms = [(c, v * (a // size)) for a in items if a >= size for c, v in items[a]]
            lp.row(f"items__{kid}__{size}", terms, upper=m * (node.gpus // size))
        for j, terms in enumerate(packed):
            lp.row(f"packing__{kid}__{j}", terms, upper=m * node.gpus * GPU_MILLI)
    for key, terms in per_shape.items():
        lp.row(f"arrived__{key}", terms, lower=min(kept[key], counts[key]), upper=counts[key])
    result = solve(lp, backend, SolveLimits(60.0, 0.0, relax=True))
    capacity = sum(n.gpus for n in nodes) * GPU_MILLI
    return min(1.0, (result.objective or capacity) / capacity)


MAX_GPU_CONFIGURATIONS = 20_000


def _gpu_configuration_rows(
    lp: LinearModel,
    kid: int,
    gpus: int,
    by_size: dict[int, list[tuple[int, float]]],
    whole: list[tuple[int, float]],
) -> None:
    """The configuration LP (Gilmore and Gomory) of one pool of GPUs: each GPU is given
    whole, or holds one maximal multiset of the share sizes (`gpu_configurations`); the
    shares of a size placed are at most the slots the chosen multisets offer. Any plan
    induces such a choice (extend each GPU's shares to a maximal multiset), so the rows
    are valid; they imply every dual feasible function row and also see which sizes can
    really sit together. Skipped when the sizes allow too many multisets."""
    sizes = sorted(by_size)
    configurations = gpu_configurations(sizes, MAX_GPU_CONFIGURATIONS)
    if not configurations:
        return
    used = [
        lp.var(f"configuration__{kid}__{j}", 0, gpus, integer=False)
        for j in range(len(configurations))
    ]
    lp.row(f"configurations__{kid}", whole + [(y, 1.0) for y in used], upper=gpus)
    for s in sizes:
        slots = [(y, -float(c.count(s))) for y, c in zip(used, configurations, strict=True)]
        lp.row(f"slots__{kid}__{s}", by_size[s] + [t for t in slots if t[1]], upper=0)


def gpu_configurations(sizes: Sequence[int], limit: int) -> list[tuple[int, ...]]:
    """Every maximal multiset of `sizes` that fits one GPU (no size can be added), in
    non-increasing order; empty when there are none or more than `limit`."""
    ordered = sorted(set(sizes), reverse=True)
    if not ordered:
        return []
    smallest = ordered[-1]
    out: list[tuple[int, ...]] = []
    stack: list[tuple[int, int, tuple[int, ...]]] = [(0, GPU_MILLI, ())]
    while stack:
        start, left, chosen = stack.pop()
        if left < smallest:  # the smallest size is among the ones still allowed
            out.append(chosen)
            if len(out) > limit:
                return []
            continue
        stack.extend(
            (j, left - ordered[j], (*chosen, ordered[j]))
            for j in range(start, len(ordered))
            if ordered[j] <= left
        )
    return out


def packing_functions(sizes: Sequence[int]) -> list[dict[int, int]]:
    """Dual feasible functions (Fekete and Schepers, 2001) on the milli-GPU sizes that occur,
    scaled to milli: any items that share one GPU (sizes summing to 1000 or less) have
    values summing to 1000 or less, so a GPU pool of G GPUs holds items of total value
    at most G * 1000. Two families: U_e (an item above 1000 - e takes the GPU, one below
    e is free, the rest count their size) and u_k (floor((k+1) x) / k, or x where
    (k+1) x is whole). Values are rounded down to whole milli, which keeps them valid."""
    sizes = sorted(set(sizes) | {GPU_MILLI})
    cuts = {GPU_MILLI + 1 - s for s in sizes if s > GPU_MILLI // 2} | {
        s for s in sizes if s <= GPU_MILLI // 2
    }
    functions: list[dict[int, int]] = []
    for e in sorted(c for c in cuts if 0 < c <= GPU_MILLI // 2):
        functions.append({s: GPU_MILLI if s > GPU_MILLI - e else 0 if s < e else s for s in sizes})
    for k in range(1, 7):
        functions.append(
            {
                s: s
                if ((k + 1) * s) % GPU_MILLI == 0
                else ((k + 1) * s // GPU_MILLI) * GPU_MILLI // k
                for s in sizes
            }
        )
    return functions
