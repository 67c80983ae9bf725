"""`gitsched bench synth`: solve time and quality at scale on seeded synthetic clusters
(BENCHMARKS.md §2), the MILP and the greedy baseline side by side, both checked.

The Policy of each size asks for the goal's gap within the goal's time (S: gap 0,
The Policy of each size asks for the goal's gap within the goal's time (S: gap 0,
M: 1% in 10 s, L: 2% in 30 s, XL: 2% in 60 s, XXL: 2% in 120 s); `--incremental`
then adds 50 jobs to the solved cluster and re-solves only what changed. Every solve is
the reconciler's own placement step (`gitsched.reconciler.step.place`) on the state the instance
describes; XL and XXL are solved as the product solves them, in parts
(engine.placement.decompose), and report the peak memory of the process and its workers.
"""

from __future__ import annotations

import json
import math
import random
import resource
import statistics
import time
from dataclasses import replace
from typing import Any

import click

from gitsched.engine.core import placement_instance
from gitsched.engine.model import Policy
from gitsched.engine.placement import solvers
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.decompose import DecomposedPlacer, should_decompose
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.levels import LEVELS
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.objective import plan_objective
from gitsched.engine.placement.plan import (
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.engine.placement.solvers import placer
from gitsched.engine.placement.topology import GangSpan, gang_spans
from gitsched.engine.units import gpus_from_milli
from gitsched.options import fail, format_option
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from gitsched.reconciler.step import place
from gitsched.render import table
from gitsched.simulation.synth import NOW, SIZES, folded_state, synth_instance, with_new_jobs

GOALS = {  # gap, time limit
    "S": (0.0, 60.0),
    "M": (0.01, 10.0),
    "L": (0.02, 30.0),
    "XL": (0.02, 60.0),
    "XXL": (0.02, 120.0),
}
NEW_JOBS = 50
ENGINES = ["highs", "cbc", "cpsat"]  # the MILP's engines (engine.placement.linear.BACKENDS)
_STOPS = (OutcomeStatus.MOVED, OutcomeStatus.PREEMPTED)
BUILTIN = policy_of(default_policy())


def _decomposed_placer(instance: PlacementInstance, solver: str) -> DecomposedPlacer | None:
    """The product's placer over parts, when the step solves `instance` in parts."""
    if solver == "greedy" or not should_decompose(instance):
        return None
    return solvers.DECOMPOSED[solver]


def _phases(solver: str, decomposed: DecomposedPlacer | None = None) -> dict[str, float]:
    chosen = decomposed or placer(solver)
    report = chosen.last_report if isinstance(chosen, MilpPlacer | DecomposedPlacer) else None
    return dict(report.phases) if report else {}


def _span_summary(spans: list[GangSpan]) -> dict[str, Any]:
    """Share of gangs at the tightest span free at decision time, and how many levels wider
    the others sit, on average over all gangs."""
    fitted = [s for s in spans if s.tightest is not None]
    return {
        "gangs": len(fitted),
        "at_tightest_pct": round(100 * sum(s.extra == 0 for s in fitted) / len(fitted), 1)
        if fitted
        else None,
        "mean_extra_levels": round(sum(s.extra for s in fitted) / len(fitted), 3)
        if fitted
        else None,
    }


def _spans(instance: PlacementInstance, plan: PlacementPlan) -> dict[str, Any]:
    """Every gang the plan places or moves: its span against the tightest free span, with
    every other job where the plan puts it (topology.gang_spans)."""
    spans = gang_spans(instance, plan.outcomes)
    return {
        "named": _span_summary([s for s in spans if s.named]),
        "unnamed": _span_summary([s for s in spans if not s.named]),
        "extra_by_job": {s.job: s.extra for s in spans if s.tightest is not None},
    }


def _side(instance: PlacementInstance, plan: PlacementPlan, seconds: float) -> dict[str, Any]:
    counts = plan.counts()
    problems = check_plan(instance, plan)
    return {
        "solver": plan.stats.solver,
        "status": plan.stats.status,
        "objective": round(plan.stats.objective, 2),
        "bound": None if plan.stats.bound is None else round(plan.stats.bound, 2),
        "gap_pct": None if plan.stats.gap is None else round(100 * plan.stats.gap, 3),
        "seconds": round(seconds, 2),
        "variables": plan.stats.variables,
        "constraints": plan.stats.constraints,
        "admitted_gpus": gpus_from_milli(
            sum(r.gpu_milli * len(r.gpus) for o in plan.outcomes if o.running for r in o.replicas)
        ),
        "moves": counts[OutcomeStatus.MOVED],
        # Of which the moves' own (engine/placement/moves.py).
        "move_lost_gpu_hours": round(
            sum(o.lost_gpu_seconds for o in plan.outcomes if o.status is OutcomeStatus.MOVED)
            / 3600,
            3,
        ),
        # Work lost by the running jobs the plan moves or stops (since their last checkpoint).
        "lost_gpu_hours": round(
            sum(o.lost_gpu_seconds for o in plan.outcomes if o.status in _STOPS) / 3600, 3
        ),
        **{s.value: counts[s] for s in OutcomeStatus},
        "checked": not problems,
        "problems": problems[:5],
        "span": _spans(instance, plan),
    }


@click.command("synth")
@click.option("--size", type=click.Choice(sorted(SIZES)), default="S", show_default=True)
@click.option("--seed", default=1, show_default=True)
@click.option("--solver", type=click.Choice(ENGINES), default="highs", show_default=True)
@click.option(
    "--incremental", is_flag=True, help="Add 50 jobs to the solved cluster; re-solve what changed."
)
@click.option("--time-limit", type=float, help="Override the size's time limit (seconds).")
@click.option(
    "--gap", type=float, help="Override the size's gap tolerance (a fraction: 0.01 is 1%)."
)
@click.option(
    "--fairness-weight",
    type=click.FloatRange(min=0),
    help="objective.fairnessWeight [default: the built-in policy's].",
)
@click.option(
    "--max-moves",
    type=click.IntRange(min=0),
    help="preemption.maxMovesPerSolve [default: the built-in policy's].",
)
@click.option(
    "--levels",
    type=click.Choice(LEVELS),
    help="solver.levels: the lexicographic objective as one weighted sum, or level 1 first "
    "then the rest with level 1 held (docs/solver.md) [default: the built-in policy's].",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    help="Run N seeds drawn reproducibly (synth_seeds) instead of --seed, and report the "
    "distribution: median, p90 and worst gap, time and moves.",
)
@click.option(
    "--engines",
    help="With --seeds: run these MILP engines (comma-separated: highs,cbc,cpsat) on the "
    "same seeds, one after another, and report their distributions side by side.",
)
@format_option("text", "json")
def command(
    size: str,
    seed: int,
    solver: str,
    incremental: bool,
    time_limit: float | None,
    gap: float | None,
    fairness_weight: float | None,
    max_moves: int | None,
    levels: str | None,
    seeds: int | None,
    engines: str | None,
    fmt: str,
) -> None:
    """The MILP against greedy on a seeded synthetic cluster: objective, GPUs, gap, time, moves."""
    if engines is not None:
        names = [e.strip() for e in engines.split(",") if e.strip()]
        unknown = sorted(set(names) - set(ENGINES))
        if seeds is None or not names or unknown:
            fail(
                "--engines takes --seeds N and a comma-separated list of "
                + ", ".join(ENGINES)
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        every: dict[str, list[dict[str, Any]]] = {}
        for engine in names:
            every[engine] = [
                _run(
                    size,
                    s,
                    engine,
                    incremental,
                    time_limit,
                    gap,
                    fairness_weight,
                    max_moves,
                    levels,
                )
                for s in synth_seeds(seeds)
            ]
        both = side_by_side(
            size, {engine: distribution(size, engine, runs) for engine, runs in every.items()}
        )
        click.echo(json.dumps(both, indent=2) if fmt == "json" else _side_by_side_text(both))
        _fail_unchecked([r for runs in every.values() for r in runs], incremental)
        return
    if seeds is not None:
        runs = [
            _run(size, s, solver, incremental, time_limit, gap, fairness_weight, max_moves, levels)
            for s in synth_seeds(seeds)
        ]
        summary = distribution(size, solver, runs)
        click.echo(json.dumps(summary, indent=2) if fmt == "json" else _distribution_text(summary))
        _fail_unchecked(runs, incremental)
        return
    result = _run(
        size, seed, solver, incremental, time_limit, gap, fairness_weight, max_moves, levels
    )
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(_text(result))
    _fail_unchecked([result], incremental)


def synth_seeds(count: int) -> list[int]:
    """The seeds `--seeds N` runs: the first N drawn from a fixed generator, so anyone gets
    the same N, and none of them was chosen by hand (seeds 1-3 were tuned on for years)."""
    rng = random.Random("gitsched-synth-seeds")
    drawn: list[int] = []
    while len(drawn) < count:
        s = rng.randrange(1, 100_000)
        if s not in drawn:
            drawn.append(s)
    return drawn


def _fail_unchecked(results: list[dict[str, Any]], incremental: bool) -> None:
    sides = [
        side
        for r in results
        for side in [r["milp"], r["greedy"]]
        + ([r["incremental"]["milp"], r["incremental"]["greedy"]] if incremental else [])
    ]
    if not all(s["checked"] for s in sides):
        fail("check.py found problems: " + "; ".join(p for s in sides for p in s["problems"]))


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(p90, 3),
        "worst": round(ordered[-1], 3),
    }


def distribution(size: str, solver: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of many seeds: median, p90 and worst of the MILP's gap, time, moves and
    GPU-hours lost, and how many solves the clock stopped (not reproducible)."""
    milp = [r["milp"] for r in runs]
    out: dict[str, Any] = {
        "size": size,
        "solver": solver,
        "seeds": [r["seed"] for r in runs],
        "gap_pct": _quantiles([m["gap_pct"] if m["gap_pct"] is not None else 100.0 for m in milp]),
        "seconds": _quantiles([m["seconds"] for m in milp]),
        "moves": _quantiles([float(m["moves"]) for m in milp]),
        "lost_gpu_hours": _quantiles([m["lost_gpu_hours"] for m in milp]),
        "move_lost_gpu_hours": _quantiles([m["move_lost_gpu_hours"] for m in milp]),
        "better_than_greedy_pct": _quantiles([r["better_by_pct"] for r in runs]),
        "time_limit_stops": sum(m["status"] == "time_limit" for m in milp),
        "runs": [
            {
                "seed": r["seed"],
                "status": r["milp"]["status"],
                "gap_pct": r["milp"]["gap_pct"],
                "seconds": r["milp"]["seconds"],
                # CPU seconds of the solve: on a shared machine, what the wall clock hides.
                "cpu_seconds": r.get("milp_cpu_seconds"),
                "moves": r["milp"]["moves"],
                "lost_gpu_hours": r["milp"]["lost_gpu_hours"],
                "move_lost_gpu_hours": r["milp"]["move_lost_gpu_hours"],
                "greedy_moves": r["greedy"]["moves"],
                "better_by_pct": r["better_by_pct"],
            }
            for r in runs
        ],
    }
    if runs and "incremental" in runs[0]:
        inc = [r["incremental"]["milp"] for r in runs]
        out["incremental"] = {
            "gap_pct": _quantiles(
                [m["gap_pct"] if m["gap_pct"] is not None else 100.0 for m in inc]
            ),
            "seconds": _quantiles([m["seconds"] for m in inc]),
            "moves": _quantiles([float(m["moves"]) for m in inc]),
        }
    return out


def side_by_side(size: str, by_engine: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The distributions of several engines on the same seeds, and which engine has the
    lowest p90 gap (ties: the lower p90 time, then the order given)."""
    seeds = {tuple(d["seeds"]) for d in by_engine.values()}
    assert len(seeds) <= 1, "side by side means the same seeds"
    best = min(
        by_engine,
        key=lambda e: (
            by_engine[e]["gap_pct"]["p90"],
            by_engine[e]["seconds"]["p90"],
            list(by_engine).index(e),
        ),
    )
    return {
        "size": size,
        "seeds": list(next(iter(seeds), ())),
        "engines": by_engine,
        "lowest_p90_gap": best,
    }


def _side_by_side_text(d: dict[str, Any]) -> str:
    rows = []
    for engine, dist in d["engines"].items():
        statuses: dict[str, int] = {}
        for r in dist["runs"]:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        rows.append(
            [
                engine,
                dist["gap_pct"]["median"],
                dist["gap_pct"]["p90"],
                dist["gap_pct"]["worst"],
                dist["seconds"]["median"],
                dist["seconds"]["p90"],
                dist["moves"]["median"],
                dist["time_limit_stops"],
                ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())),
            ]
        )
    return "\n".join(
        [
            f"synth {d['size']}, seeds {', '.join(map(str, d['seeds']))}; "
            f"lowest p90 gap: {d['lowest_p90_gap']}",
            table(
                [
                    "engine",
                    "gap % median",
                    "p90",
                    "worst",
                    "s median",
                    "p90",
                    "moved median",
                    "clock stops",
                    "status",
                ],
                rows,
            ),
        ]
    )


def _distribution_text(d: dict[str, Any]) -> str:
    rows = [
        [name, d[key]["median"], d[key]["p90"], d[key]["worst"]]
        for name, key in (
            ("gap %", "gap_pct"),
            ("seconds", "seconds"),
            ("running jobs moved", "moves"),
            ("GPU-hours lost", "lost_gpu_hours"),
            ("of which by moves", "move_lost_gpu_hours"),
            ("vs greedy %", "better_than_greedy_pct"),
        )
    ]
    per_seed = [
        [r["seed"], r["status"], r["gap_pct"], r["seconds"], r["moves"], r["lost_gpu_hours"]]
        for r in d["runs"]
    ]
    return "\n".join(
        [
            f"synth {d['size']}, {d['solver']}, {len(d['seeds'])} seeds "
            f"({d['time_limit_stops']} stopped by the clock: not reproducible)",
            table(["", "median", "p90", "worst"], rows),
            table(["seed", "status", "gap %", "s", "moved", "GPU-h lost"], per_seed),
        ]
    )


def _run(
    size: str,
    seed: int,
    solver: str,
    incremental: bool,
    time_limit: float | None,
    gap: float | None,
    fairness_weight: float | None,
    max_moves: int | None = None,
    levels: str | None = None,
) -> dict[str, Any]:
    goal_gap, goal_time = GOALS[size]
    policy = Policy(
        solver=solver,
        levels=BUILTIN.levels if levels is None else levels,
        gap_tolerance=goal_gap if gap is None else gap,
        time_limit_s=goal_time if time_limit is None else time_limit,
        # The built-in policy's objective, fairness included: what a cluster runs by default.
        fairness_weight=BUILTIN.fairness_weight if fairness_weight is None else fairness_weight,
        # The built-in cap on moves (moves.py) unless asked otherwise.
        max_moves_per_solve=BUILTIN.max_moves_per_solve if max_moves is None else max_moves,
    )
    started = time.perf_counter()
    state = folded_state(synth_instance(size, seed, policy))
    instance = placement_instance(state, NOW)  # what the step's solvers see
    built = time.perf_counter() - started
    decomposed = _decomposed_placer(instance, solver)
    t = time.perf_counter()
    cpu = _cpu_seconds()
    plan = place(state, NOW, solver=solver)
    milp_seconds = time.perf_counter() - t
    milp_cpu = _cpu_seconds() - cpu
    if decomposed and decomposed.last_report and decomposed.last_report.in_workers:
        milp_cpu += decomposed.last_report.parts_cpu_seconds
    phases = _phases(solver, decomposed)
    t = time.perf_counter()
    greedy = _greedy(instance) if decomposed else place(state, NOW, solver="greedy")
    greedy_seconds = time.perf_counter() - t
    spec = SIZES[size]
    result: dict[str, Any] = {
        "size": size,
        "seed": seed,
        "nodes": spec.nodes,
        "gpus": sum(n.gpus for n in instance.nodes),
        "jobs": len(instance.jobs),
        "running": len(instance.current),
        "policy": {
            "fairness_weight": policy.fairness_weight,
            "gap_tolerance_pct": round(100 * policy.gap_tolerance, 6),
            "time_limit_s": policy.time_limit_s,
            "max_moves_per_solve": policy.max_moves_per_solve,
            "levels": policy.levels,
        },
        "generate_seconds": round(built, 2),
        "milp": _side(instance, plan, milp_seconds),
        "greedy": _side(instance, greedy, greedy_seconds),
        "phases_seconds": phases,
        "milp_cpu_seconds": round(milp_cpu, 2),
    }
    if decomposed is not None and decomposed.last_report is not None:
        result["decomposed"] = _decomposed(decomposed)
    result["looser_than_greedy"] = _looser(result["milp"], result["greedy"])
    result["better_by"] = round(plan.stats.objective - greedy.stats.objective, 2)
    result["better_by_pct"] = round(
        100
        * (plan.stats.objective - greedy.stats.objective)
        / max(abs(greedy.stats.objective), 1e-9),
        2,
    )
    if incremental:
        result["incremental"] = _incremental(instance, plan, solver, seed)
    result["peak_rss_mib"] = _peak_rss_mib()
    if decomposed is not None and decomposed.last_report is not None:
        result["peak_rss_mib"]["largest_worker"] = decomposed.last_report.worker_peak_rss_mib
    return result


def _greedy(instance: PlacementInstance) -> PlacementPlan:
    """The greedy baseline; on a decomposed size, greedy in each part of the same cut
    (greedy over the whole takes jobs x nodes: minutes on XL)."""
    if not should_decompose(instance):
        return GreedyPlacer().solve(instance)
    # The parts DecomposedPlacer solves, with their shares of the move cap.
    instance, cut = DecomposedPlacer("greedy").cut(instance)
    outcomes = tuple(o for part in cut.parts for o in GreedyPlacer().solve(part).outcomes)
    stats = SolveStats("greedy/parts", "heuristic", plan_objective(instance, outcomes))
    return PlacementPlan(outcomes, stats)


def _cpu_seconds() -> float:
    """CPU time of this process and its finished workers (the machine may be shared)."""
    own, workers = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _peak_rss_mib() -> dict[str, float]:
    """Peak resident memory of this process and of its largest waited-for child (Linux: KiB;
    the decomposed solve's workers report their own)."""
    return {
        "process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "largest_worker": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }


def _decomposed(placer: DecomposedPlacer) -> dict[str, Any]:
    report = placer.last_report
    assert report is not None
    return {
        "parts": report.parts,
        "workers": placer.workers,
        "part_nodes": list(report.part_nodes),
        "part_jobs": list(report.part_jobs),
        "part_gaps_pct": list(report.part_gaps_pct),
        "bound": report.bound,
        "fell_back": report.fell_back,
    }


def _looser(milp: dict[str, Any], greedy: dict[str, Any]) -> dict[str, int]:
    """Gangs both plans place anew: how many sit wider (more levels above their tightest)
    in the MILP's plan than in greedy's, and how many tighter."""
    a, b = milp["span"]["extra_by_job"], greedy["span"]["extra_by_job"]
    both = a.keys() & b.keys()
    out = {
        "both_placed": len(both),
        "milp_looser": sum(a[k] > b[k] for k in both),
        "milp_tighter": sum(a[k] < b[k] for k in both),
    }
    del milp["span"]["extra_by_job"], greedy["span"]["extra_by_job"]
    return out


def _incremental(
    instance: PlacementInstance, plan: PlacementPlan, solver: str, seed: int
) -> dict[str, Any]:
    """The solved cluster a moment later, 50 jobs more: only they (and what they may preempt) move."""
    running = {k: replace(p, started_at=instance.now) for k, p in plan.placements().items()}
    later = with_new_jobs(replace(instance, current=running), NEW_JOBS, seed)
    later = replace(later, policy=replace(later.policy, time_limit_s=1.0))
    new = frozenset(j.key for j in later.jobs[len(instance.jobs) :])
    state = folded_state(later)
    later = placement_instance(state, instance.now)
    t = time.perf_counter()
    again = place(state, instance.now, new, solver)
    seconds = time.perf_counter() - t
    decomposed = _decomposed_placer(later, solver)
    phases = _phases(solver, decomposed)
    t = time.perf_counter()
    greedy = _greedy(later) if decomposed else place(state, instance.now, new, "greedy")
    greedy_seconds = time.perf_counter() - t
    moved = [o.job for o in again.outcomes if o.status is OutcomeStatus.MOVED]
    stopped = [o.job for o in again.outcomes if o.status is OutcomeStatus.PREEMPTED]
    return {
        "new_jobs": len(new),
        "new_placed": sum(1 for k in new if (o := again.outcome(k)) is not None and o.running),
        "running_moved": len(moved),
        "running_preempted": len(stopped),
        "milp": (milp_side := _side(later, again, seconds)),
        "greedy": (greedy_side := _side(later, greedy, greedy_seconds)),
        "looser_than_greedy": _looser(milp_side, greedy_side),
        "phases_seconds": phases,
        "solved_parts": decomposed.last_report.solved_parts
        if decomposed and decomposed.last_report
        else None,
    }


def _text(r: dict[str, Any]) -> str:
    cols = [
        "",
        "solver",
        "status",
        "objective",
        "bound",
        "gap %",
        "s",
        "GPUs",
        "placed",
        "kept",
        "moved",
        "preempted",
        "pending",
    ]

    def row(name: str, s: dict[str, Any]) -> list[object]:
        return [
            name,
            s["solver"],
            s["status"],
            s["objective"],
            s["bound"] if s["bound"] is not None else "-",
            s["gap_pct"] if s["gap_pct"] is not None else "-",
            s["seconds"],
            s["admitted_gpus"],
            s["placed"],
            s["kept"],
            s["moved"],
            s["preempted"],
            s["pending"],
        ]

    def span_row(name: str, s: dict[str, Any]) -> list[object]:
        out: list[object] = [name]
        for part in ("named", "unnamed"):
            p = s["span"][part]
            out += [
                p["gangs"],
                "-" if p["at_tightest_pct"] is None else p["at_tightest_pct"],
                "-" if p["mean_extra_levels"] is None else p["mean_extra_levels"],
            ]
        return out

    span_cols = [
        "span",
        "gangs (level named)",
        "at tightest %",
        "mean extra levels",
        "gangs (no level)",
        "at tightest %",
        "mean extra levels",
    ]
    looser = r["looser_than_greedy"]
    lines = [
        f"synth {r['size']} seed {r['seed']}: {r['nodes']} nodes, {r['gpus']} GPUs, {r['jobs']} jobs "
        f"({r['running']} running); policy gap {r['policy']['gap_tolerance_pct']:g}%, "
        f"time limit {r['policy']['time_limit_s']:g} s",
        table(cols, [row("milp", r["milp"]), row("greedy", r["greedy"])]),
        f"MILP - greedy: {r['better_by']:+.2f} ({r['better_by_pct']:+.2f}%); phases (s): "
        + ", ".join(f"{k} {v}" for k, v in r["phases_seconds"].items()),
        table(span_cols, [span_row("milp", r["milp"]), span_row("greedy", r["greedy"])]),
        f"gangs both place anew: {looser['both_placed']}; the MILP's sits wider in "
        f"{looser['milp_looser']}, tighter in {looser['milp_tighter']} (span: levels above the "
        "tightest span free with every other job where the plan puts it)",
    ]
    inc = r.get("incremental")
    if inc:
        lines += [
            f"incremental: {inc['new_jobs']} new jobs, {inc['new_placed']} placed; running jobs moved "
            f"{inc['running_moved']}, preempted {inc['running_preempted']}",
            table(cols, [row("milp", inc["milp"]), row("greedy", inc["greedy"])]),
            "phases (s): " + ", ".join(f"{k} {v}" for k, v in inc["phases_seconds"].items()),
        ]
    dec = r.get("decomposed")
    if dec:
        gaps = [g for g in dec["part_gaps_pct"] if g is not None]
        lines.append(
            f"decomposed: {dec['parts']} parts ({min(dec['part_nodes'])}-{max(dec['part_nodes'])} "
            f"nodes), {dec['workers']} at once; part gaps {min(gaps, default=0):g}-"
            f"{max(gaps, default=0):g}%; gap against the {dec['bound']}"
        )
    lines.append(
        f"MILP CPU {r['milp_cpu_seconds']} s; peak RSS {r['peak_rss_mib']['process']} MiB "
        f"(largest worker {r['peak_rss_mib']['largest_worker']} MiB)"
    )
    lines.append(
        "every plan checked by check.py: "
        + ("ok" if all(s["checked"] for s in (r["milp"], r["greedy"])) else "PROBLEMS")
    )
    return "\n".join(lines)
