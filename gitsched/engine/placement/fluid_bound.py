"""The bound of a decomposed solve (engine/placement/decompose.py): each part's bound bounds
only its part (a job that a part leaves waiting might run elsewhere), so the merged plan's
gap is proved against `fluid_bound`, the LP relaxation of the whole problem with node
packing dropped.
"""

from __future__ import annotations

import math
from collections import defaultdict

from gitsched.engine.placement.linear import LinearModel, SolveLimits, solve
from gitsched.engine.placement.objective import weights
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.engine.placement.running import keep_problem
from gitsched.engine.units import GPU_MILLI, gpus_from_milli


def fluid_bound(instance: PlacementInstance, time_limit_s: float = 30.0) -> float | None:
    """An upper bound on every plan's score: the LP of the whole problem with node packing
    dropped. Valid because every plan maps to a feasible point scoring at least as much:
    x[job, flavor] = replicas run / replicas asked; a flavor's GPUs in use are at most its
    schedulable GPUs (per-node capacity summed); each queue's usage keeps its ceiling and
    the cohort pool (draw >= usage - guaranteed, draw >= 0, summed draws <= pool, as
    QuotaLedger); in-nominal GPUs per priority step are at most the nominal quota and
    the usage at or above that priority (objective.py's bonus: min of the two); the
    value term is linear in replicas; every other term (moves, preemptions,
    fragmentation, fairness, topology) is a penalty >= 0 and is dropped. Quota-exempt
    jobs (non-preemptible and kept) may leave quota rows. A non-preemptible running job
    whose placement may stay as it is (running.keep_problem: its nodes are there and take
    it) runs in every plan check.py accepts (a placer stops a running job only as
    preempted, and check.py rejects that for a non-preemptible job unless a node of it is
    lost), with at least its smallest gang, so its x adds up to at least smallest gang /
    replicas: every such plan's point keeps that row, and the bound stays above every
    plan while no longer handing such a job's GPUs to others (XL: 2.4% lower). None if
    the LP did not solve."""
    w = weights(instance)
    lp = LinearModel()
    cap: dict[str, int] = defaultdict(int)
    for n in instance.nodes:
        if n.schedulable and n.flavor is not None:
            cap[n.flavor] += n.gpus * GPU_MILLI
    flavors = sorted(cap)
    node_of = {n.name: n for n in instance.nodes}
    usage: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    by_priority: dict[tuple[str, str], dict[int, list[tuple[int, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    capacity_terms: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for job in instance.jobs:
        value = w.value(job, job.replicas)
        if not job.resources.gpu_milli:
            lp.var(f"x__{job.key}", 0.0, 1.0, value, integer=False)
            continue
        options = [f for f in (job.gpu_flavors or tuple(flavors)) if f in cap]
        if not options:
            continue
        gang = job.replicas * job.resources.gpu_milli
        cols = [lp.var(f"x__{job.key}__{f}", 0.0, 1.0, value, integer=False) for f in options]
        held = instance.current.get(job.key)
        stays = (
            held is not None
            and not job.preemptible
            and keep_problem(instance, job, held, node_of) is None
        )
        lp.row(
            f"one__{job.key}",
            ((c, 1.0) for c in cols),
            lower=min(len(held.replicas), job.smallest_gang) / job.replicas
            if stays and held
            else 0.0,
            upper=1.0,
        )
        exempt = job.key in instance.current and not job.preemptible
        for f, c in zip(options, cols, strict=True):
            capacity_terms[f].append((c, float(gang)))
            if not exempt:
                usage[(job.queue, f)].append((c, float(gang)))
                by_priority[(job.queue, f)][job.priority].append((c, float(gang)))
    for f in flavors:
        lp.row(f"capacity__{f}", capacity_terms[f], upper=float(cap[f]))
    queues = {q.name: q for q in instance.queues}
    pools: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    pool_size: dict[tuple[str, str], float] = defaultdict(float)
    for (qname, f), terms in sorted(usage.items()):
        queue = queues.get(qname)
        fq = queue.quota(f) if queue else None
        if queue is None or fq is None:
            lp.row(f"noquota__{qname}__{f}", terms, upper=0.0)
            continue
        if queue.cohort is None:
            lp.row(f"nominal__{qname}__{f}", terms, upper=float(fq.nominal))
        else:
            if fq.ceiling is not None:
                lp.row(f"ceiling__{qname}__{f}", terms, upper=float(fq.ceiling))
            draw = lp.var(f"draw__{qname}__{f}", 0.0, math.inf, 0.0, integer=False)
            lp.row(
                f"drawn__{qname}__{f}",
                [*terms, (draw, -1.0)],
                upper=float(fq.guaranteed),
            )
            pools[(queue.cohort, f)].append((draw, 1.0))
        # In-nominal GPUs, filled from the highest priority down (objective.py's bonus).
        steps = w.nominal_steps(by_priority[(qname, f)])
        above: list[tuple[int, float]] = []
        for priority, rate in steps:
            above = above + by_priority[(qname, f)][priority]
            m = lp.var(
                f"innominal__{qname}__{f}__{priority}",
                0.0,
                gpus_from_milli(fq.nominal),
                rate,
                integer=False,
            )
            lp.row(
                f"fill__{qname}__{f}__{priority}",
                [*((c, gpus_from_milli(v)) for c, v in above), (m, -1.0)],
                lower=0.0,
            )
    for q in instance.queues:
        if q.cohort is not None:
            for fq in q.quotas:
                pool_size[(q.cohort, fq.flavor)] += fq.nominal - fq.guaranteed
    for key in sorted(pools):
        lp.row(f"pool__{key[0]}__{key[1]}", pools[key], upper=pool_size[key])
    solution = solve(lp, "highs", SolveLimits(time_limit_s, 0.0, relax=True))
    return solution.bound
