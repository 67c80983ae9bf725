"""The decomposed solve for very large instances (POP, NSDI'21): the cluster is cut into
parts along its widest topology domains, each part is solved by the MILP placer on its
own sub-instance, and the parts' plans are merged.

Why: one MILP over 100k GPUs and 50k jobs takes minutes to build and longer to solve;
twenty of a twentieth each take a twentieth of the time each, and two run at once.

The cut and how it keeps the merged plan legal: engine/placement/partition.py. The bound
the merged plan's gap is proved against: engine/placement/fluid_bound.py.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context

from gitsched.engine.model import Policy
from gitsched.engine.placement.fluid_bound import fluid_bound as fluid_bound
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import TIME_LIMIT_STATUS, MilpPlacer
from gitsched.engine.placement.objective import plan_objective
from gitsched.engine.placement.partition import _DOMAINS as _DOMAINS
from gitsched.engine.placement.partition import UNITS_PER_PART as UNITS_PER_PART
from gitsched.engine.placement.partition import Partition as Partition
from gitsched.engine.placement.partition import _split as _split
from gitsched.engine.placement.partition import partition as partition
from gitsched.engine.placement.partition import quota_violations as quota_violations
from gitsched.engine.placement.partition import split_quotas as split_quotas
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.placement.preemption import borrowing_reclaimable

# Instances with more schedulable nodes than this are decomposed (L, 1,250 nodes, is not).
DECOMPOSE_NODES = 4000
PART_NODES = 640  # about M's size: solved to 1-2% in a few seconds
INCREMENTAL_PART_JOBS = 50  # changed jobs per part an incremental solve re-decides
MERGE_RESERVE_S = 0.15  # share of the time limit kept for partitioning, merging and the bound
PART_GAP_SHARE = 0.75  # of the policy's gap, asked of each part (the cut costs the rest)


def should_decompose(instance: PlacementInstance) -> bool:
    return sum(1 for n in instance.nodes if n.schedulable) > DECOMPOSE_NODES


def _solve_part(
    args: tuple[PlacementInstance, str, str, tuple[str, ...] | None],
) -> tuple[PlacementPlan, float, float]:
    """One part's plan, the CPU seconds it took (a worker's own: the machine may be shared)
    and the peak memory of its process so far, MiB."""
    sub, backend, mode, changed = args
    began = time.process_time()
    placer = MilpPlacer(backend)
    if mode == "incremental" and changed is not None:
        plan = placer.solve_incremental(sub, changed)
    else:
        plan = placer.solve(sub)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return plan, time.process_time() - began, peak


@dataclass(frozen=True, slots=True)
class DecomposeReport:
    parts: int
    solved_parts: int
    part_nodes: tuple[int, ...]
    part_jobs: tuple[int, ...]
    part_gaps_pct: tuple[float | None, ...]
    phases: tuple[tuple[str, float], ...]
    bound: str  # which bound the gap is against
    fell_back: bool = False
    parts_cpu_seconds: float = 0.0  # the parts' solves, summed
    in_workers: bool = False  # the parts ran in worker processes (their CPU is not this one's)
    worker_peak_rss_mib: float = 0.0


class DecomposedPlacer:
    """The MILP placer over parts of the instance (module docstring); `workers` parts at once."""

    def __init__(self, backend: str, workers: int | None = None, parts: int | None = None) -> None:
        self.backend = backend
        self.parts = parts  # None: one part per PART_NODES schedulable nodes
        self.name = backend
        self.workers = workers if workers is not None else min(2, os.cpu_count() or 1)
        self.last_report: DecomposeReport | None = None
        self._cpu = 0.0
        self._in_workers = False
        self._peak = 0.0

    def parts_for(self, instance: PlacementInstance) -> int:
        if self.parts is not None:
            return self.parts
        schedulable = sum(1 for n in instance.nodes if n.schedulable)
        return max(2, math.ceil(schedulable / PART_NODES))

    def cut(self, instance: PlacementInstance) -> tuple[PlacementInstance, Partition]:
        """The instance as the rules view it whole, and its parts, each with its share of
        the Policy's maxMovesPerSolve: what every solver in parts solves (bench synth's
        greedy baseline too), so that each part's plan is judged by the whole's rules."""
        # The rules' view of the whole first: a part alone cannot judge which
        # non-preemptible jobs its queue's nominal quota protects.
        instance = borrowing_reclaimable(instance)
        count = self.parts_for(instance)
        cut = partition(instance, count)
        policy = instance.policy
        parts = tuple(
            replace(p, policy=replace(p.policy, max_moves_per_solve=_move_share(policy, count, i)))
            for i, p in enumerate(cut.parts)
        )
        return instance, replace(cut, parts=parts)

    def solve(self, instance: PlacementInstance) -> PlacementPlan:
        started = time.perf_counter()
        phases: list[tuple[str, float]] = []
        instance, cut = self.cut(instance)
        count = len(cut.parts)
        phases.append(("partition", round(time.perf_counter() - started, 3)))
        policy = instance.policy
        # The clock sizes only the backstop (it depends on the workers, so on the machine);
        # the node budget, split by size, decides.
        budget = policy.time_limit_s * (1 - MERGE_RESERVE_S) - (time.perf_counter() - started)
        rounds = math.ceil(count / max(1, self.workers))
        # Each part is a MILP solve of its own, with the policy's node budget: a count,
        # so the machine's cores and clock do not change what a part may explore.
        subs = [
            replace(
                p,
                policy=replace(
                    p.policy,
                    time_limit_s=max(1.0, budget / rounds),
                    gap_tolerance=policy.gap_tolerance * PART_GAP_SHARE,
                ),
            )
            for p in cut.parts
        ]
        plans, bound = self._run(
            [(s, self.backend, "full", None) for s in subs],
            lambda: fluid_bound(instance, max(1.0, budget)),
        )
        phases.append(("parts and bound", round(time.perf_counter() - started, 3)))
        return self._merge(instance, cut, plans, list(range(count)), started, phases, bound)

    def solve_incremental(
        self, instance: PlacementInstance, changed: Collection[str]
    ) -> PlacementPlan:
        """The changed jobs go to as few parts as hold them (the parts with the most free
        GPUs); those parts are re-solved incrementally, every other job runs or waits on."""
        instance = borrowing_reclaimable(instance)
        started = time.perf_counter()
        phases: list[tuple[str, float]] = []
        count = self.parts_for(instance)
        asked = set(changed)
        wanted = max(1, math.ceil(len(asked) / INCREMENTAL_PART_JOBS))
        cut = partition(instance, count, active_count=wanted, assign=asked, changed=asked)
        fresh = sorted(asked & cut.jobs.keys())
        active = list(cut.active)
        phases.append(("partition", round(time.perf_counter() - started, 3)))
        args: list[tuple[PlacementInstance, str, str, tuple[str, ...] | None]] = []
        for i, k in enumerate(active):
            # The move cap is shared by the parts re-solved (the others move nothing).
            sub = cut.parts[k]
            share = _move_share(instance.policy, len(active), i)
            sub = replace(sub, policy=replace(sub.policy, max_moves_per_solve=share))
            mine = tuple(key for key in fresh if cut.job_part.get(key) == k)
            args.append((sub, self.backend, "incremental", mine))
        # Here, one after the other: a few parts of ~50 jobs take a few hundred ms each,
        # less than a worker's start (a fresh interpreter importing the engine and HiGHS,
        # ~0.3 CPU-s each, on top of the parts' own time).
        plans, _ = self._run(args, lambda: None, spread=False)
        phases.append(("parts", round(time.perf_counter() - started, 3)))
        solved = dict(zip(active, plans, strict=True))
        # Every other part: its running jobs stay, its waiting jobs wait.
        full: list[PlacementPlan] = []
        for k in range(count):
            if k in solved:
                full.append(solved[k])
                continue
            outcomes = tuple(
                JobOutcome(key, OutcomeStatus.KEPT, run.flavor, run.replicas)
                for key, run in cut.parts[k].current.items()
            )
            full.append(PlacementPlan(outcomes, SolveStats(self.backend, "optimal", 0.0)))
        waiting = tuple(
            JobOutcome(
                key,
                OutcomeStatus.PENDING,
                reason="waits as at the last solve (an incremental solve changes only what changed)",
                constraint=f"incremental__{key}",
            )
            for key in cut.jobs
            if key not in cut.job_part
        )
        full[0] = replace(full[0], outcomes=full[0].outcomes + waiting)
        return self._merge(instance, cut, full, active, started, phases, None, fresh)

    def _run(
        self,
        args: list[tuple[PlacementInstance, str, str, tuple[str, ...] | None]],
        meanwhile: Callable[[], float | None],
        spread: bool = True,
    ) -> tuple[list[PlacementPlan], float | None]:
        """The parts' plans, in part order, `workers` at a time in worker processes (with
        `spread`; else here), and what `meanwhile` returns, worked out here meanwhile."""
        self._in_workers = spread and self.workers > 1 and len(args) > 1
        if not self._in_workers:
            done = [_solve_part(a) for a in args]
            found = meanwhile()
        else:
            with ProcessPoolExecutor(self.workers, mp_context=get_context("forkserver")) as pool:
                futures = [pool.submit(_solve_part, a) for a in args]
                found = meanwhile()
                done = [f.result() for f in futures]
        self._cpu = sum(c for _, c, _ in done)
        self._peak = max((m for _, _, m in done), default=0.0)
        return [p for p, _, _ in done], found

    def _merge(
        self,
        instance: PlacementInstance,
        cut: Partition,
        plans: list[PlacementPlan],
        solved: list[int],
        started: float,
        phases: list[tuple[str, float]],
        bound: float | None,
        changed: Sequence[str] | None = None,
    ) -> PlacementPlan:
        incremental = changed is not None
        outcomes = tuple(o for p in plans for o in p.outcomes)
        fell_back = bool(quota_violations(instance, outcomes, cut.jobs))
        if fell_back:
            # Not expected (the quota split adds up); never hand out a plan that breaks one.
            outcomes = (
                MilpPlacer(self.backend).solve_incremental(instance, changed)
                if changed is not None
                else GreedyPlacer().solve(instance)
            ).outcomes
        objective = plan_objective(instance, outcomes)
        phases.append(("merge", round(time.perf_counter() - started, 3)))
        gap = None if bound is None else max(0.0, (bound - objective) / max(abs(bound), 1e-9))
        status = (
            "optimal" if gap is not None and gap <= instance.policy.gap_tolerance else "feasible"
        )
        if incremental and all(p.stats.status == "optimal" for p in plans):
            status = "optimal"
        if any(p.stats.status == TIME_LIMIT_STATUS for p in plans):
            status = TIME_LIMIT_STATUS  # a part the clock cut short: not reproducible
        self.last_report = DecomposeReport(
            parts=len(cut.parts),
            solved_parts=len(solved),
            part_nodes=tuple(len(p.nodes) for p in cut.parts),
            part_jobs=tuple(len(p.jobs) for p in cut.parts),
            part_gaps_pct=tuple(
                None if (g := plans[k].stats.gap) is None else round(100 * g, 3) for k in solved
            ),
            phases=tuple(phases),
            bound="fluid LP (whole instance, packing dropped)" if not incremental else "none",
            fell_back=fell_back,
            parts_cpu_seconds=round(self._cpu, 2),
            in_workers=self._in_workers,
            worker_peak_rss_mib=round(self._peak, 1),
        )
        return PlacementPlan(
            outcomes,
            SolveStats(
                solver=f"{self.backend}/decomposed",
                status=status,
                objective=objective,
                bound=bound,
                gap=gap,
                seconds=time.perf_counter() - started,
                variables=sum(p.stats.variables for p in plans),
                constraints=sum(p.stats.constraints for p in plans),
                levels=plans[0].stats.levels if plans else "",
            ),
            broken_soft=tuple(s for p in plans for s in p.broken_soft),
        )


def _move_share(policy: Policy, parts: int, index: int) -> int | None:
    """Part `index`'s share of the Policy's maxMovesPerSolve (the parts' shares add up to
    it, the first parts taking one more), so the whole plan keeps the cap (moves.py)."""
    cap = policy.max_moves_per_solve
    if cap is None:
        return None
    return cap // parts + (1 if index < cap % parts else 0)
