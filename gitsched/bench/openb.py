"""`gitsched bench openb`: placement quality on the Alibaba openb trace (BENCHMARKS.md §1).

Reads a node list and a pod list in the openb CSV format, draws the arrivals per seed
as the FGD paper does, places them with gitsched's own placer (simulation.trace drives
the reconciler's solve through the event fold) and with the greedy baseline (the same
greedy, blind to the learned job shapes: plain best fit) in the same run, checks every final plan with check.py, and prints the GPU allocation ratio
per seed, the mean, the curve over arrived demand, and two upper bounds: one for any
plan of the arrivals, one for any plan that keeps running the pods running before
re-optimisation (allocation_bound with `keep`). Re-optimisation starts from the batch
plan: arrivals handled as gitsched handles them, in commits, then the full re-solve.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click

from gitsched.engine.model import Node
from gitsched.engine.placement.check import check_plan
from gitsched.options import fail, format_option
from gitsched.render import table
from gitsched.simulation.bound import allocation_bound
from gitsched.simulation.trace import (
    TracePod,
    TraceRun,
    as_plan,
    reoptimise,
    run_batch,
    run_online,
    sample_arrivals,
)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
PUBLISHED = "fgd_expected_allocation.csv"


def read_nodes(path: Path) -> list[Node]:
    rows = _rows(path, NODE_COLUMNS)
    return [
        Node(
            name=r["sn"],
            flavor=r["model"] or None,
            gpus=_int(r, "gpu", path),
            cpu_milli=_int(r, "cpu_milli", path),
            memory_mib=_int(r, "memory_mib", path),
        )
        for r in rows
    ]


def read_pods(path: Path) -> list[TracePod]:
    rows = _rows(path, POD_COLUMNS)
    pods = []
    for r in rows:
        num_gpu, milli = _int(r, "num_gpu", path), _int(r, "gpu_milli", path)
        if num_gpu > 1 and milli < 1000:
            fail(f"{path}: pod {r['name']}: {num_gpu} GPUs at {milli} milli each is not supported")
        spec = (r.get("gpu_spec") or "").strip()
        pods.append(
            TracePod(
                name=r["name"],
                cpu_milli=_int(r, "cpu_milli", path),
                memory_mib=_int(r, "memory_mib", path),
                num_gpu=num_gpu,
                gpu_milli=milli if num_gpu else 0,
                models=tuple(m for m in spec.split("|") if m),
            )
        )
    return pods


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                fail(f"{path}: missing column(s) {', '.join(missing)}")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        fail(f"{path}: {e}")
    if not rows:
        fail(f"{path}: no rows")
    return rows


def _int(row: dict[str, str], column: str, path: Path) -> int:
    try:
        return int(float(row[column] or 0))
    except ValueError:
        fail(f"{path}: {column}={row[column]!r} is not a number")


def published_fgd(pods_path: Path, demand: float) -> float | None:
    """FGD's published mean for this trace (fgd_expected_allocation.csv next to the pods)."""
    table_path = pods_path.parent / PUBLISHED
    column = str(round(demand * 100))
    if not table_path.exists():
        return None
    values = []
    with table_path.open(newline="") as f:
        for r in csv.DictReader(f):
            same = r.get("workload") == pods_path.stem and r.get("sc_policy", "").endswith("FGD")
            if same and r.get(column):
                values.append(float(r[column]))
    return statistics.mean(values) if values else None


def _one_seed(args: tuple[Any, ...]) -> dict[str, Any]:
    nodes, pods, seed, demand, mode, solver, commit, budget, time_limit = args
    capacity = sum(n.gpus for n in nodes) * 1000
    arrivals = sample_arrivals(pods, capacity, demand, random.Random(seed).randrange)
    ours, kept, start = _run(nodes, arrivals, demand, mode, solver, commit, budget, time_limit)
    base = run_online(nodes, arrivals, demand, learn=False)
    partial, whole = ours.log.free_split()
    problems = []
    for name, run in (("gitsched", ours), ("greedy", base)):
        instance, plan = as_plan(run)
        found = check_plan(instance, plan)
        problems += [f"{name}: {p}" for p in found[:5]]
    return {
        "seed": seed,
        "arrivals": len(arrivals),
        "gitsched": ours.allocation,
        "free_in_shared_gpus": partial / ours.log.capacity_milli,
        "free_whole_gpus": whole / ours.log.capacity_milli,
        "start": start,
        "greedy": base.allocation,
        "bound": allocation_bound(nodes, arrivals, "highs"),
        "bound_kept": allocation_bound(nodes, arrivals, "highs", keep=kept),
        "moves": ours.moves,
        "lost_gpu_hours": round(ours.lost_gpu_seconds / 3600, 3),
        "solves": ours.solves,
        "seconds": ours.seconds,
        "greedy_seconds": base.seconds,
        "curve": ours.curve,
        "greedy_curve": base.curve,
        "problems": problems,
    }


def _run(
    nodes: list[Node],
    arrivals: list[TracePod],
    demand: float,
    mode: str,
    solver: str,
    commit: int,
    budget: float,
    time_limit: float,
) -> tuple[TraceRun, list[TracePod], float]:
    """The run, the pods it had running before any re-optimisation (a re-optimisation
    moves them but never stops them: the kept bound holds for every plan that keeps them),
    and the allocation before it."""
    if mode == "online" and solver == "greedy":
        run = run_online(nodes, arrivals, demand)
        return run, _running(run), run.allocation
    # Arrivals in commits (online: of one pod), each solved as the reconciler solves one.
    size = 1 if mode == "online" else commit
    run = run_batch(nodes, arrivals, demand, solver, size, time_limit)
    kept, start = _running(run), run.allocation
    if mode == "reoptimise":
        run = reoptimise(run, solver, budget)
    return run, kept, start


def _running(run: TraceRun) -> list[TracePod]:
    return [run.arrivals[k] for k in run.placed]


def scale_cpu(pods: list[TracePod], factor: float) -> list[TracePod]:
    """The trace with every pod asking `factor` times its CPU: a variant where CPU, not
    GPU, runs out first."""
    if factor == 1.0:
        return pods
    return [dataclasses.replace(p, cpu_milli=round(p.cpu_milli * factor)) for p in pods]


@click.command("openb")
@click.option(
    "--pods",
    "pods_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Pod list (openb_pod_list_*.csv format).",
)
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Node list [default: openb_node_list_gpu_node.csv next to --pods].",
)
@click.option(
    "--demand", default=1.3, show_default=True, help="Arrivals stop at this share of GPU capacity."
)
@click.option("--seeds", default=10, show_default=True, help="How many seeds.")
@click.option("--first-seed", default=42, show_default=True)
@click.option(
    "--mode",
    type=click.Choice(["online", "batch", "reoptimise"]),
    default="online",
    show_default=True,
)
@click.option(
    "--solver",
    type=click.Choice(["highs", "cbc", "cpsat", "greedy"]),
    default=None,
    help="The Policy's solver for commits [default: greedy online (one solve per pod), "
    "highs for batch and re-optimise].",
)
@click.option("--commit", default=100, show_default=True, help="Batch mode: pods per commit.")
@click.option(
    "--time-limit",
    default=10.0,
    show_default=True,
    help="Batch mode: the Policy's time limit per commit's solve, seconds.",
)
@click.option(
    "--budget", default=30.0, show_default=True, help="Re-optimise: the full solve's time limit."
)
@click.option(
    "--cpu-scale",
    default=1.0,
    show_default=True,
    help="Multiply every pod's CPU request (a CPU-heavy variant of the trace).",
)
@click.option("--jobs", default=1, show_default=True, help="Seeds run in parallel processes.")
@format_option("text", "json")
def command(
    pods_path: Path,
    nodes_path: Path | None,
    demand: float,
    seeds: int,
    first_seed: int,
    mode: str,
    solver: str | None,
    commit: int,
    time_limit: float,
    budget: float,
    cpu_scale: float,
    jobs: int,
    fmt: str,
) -> None:
    """GPU allocation ratio on an openb trace: gitsched's placer against greedy best fit."""
    nodes_path = nodes_path or pods_path.parent / "openb_node_list_gpu_node.csv"
    if not nodes_path.exists():
        fail(f"{nodes_path}: no node list (give --nodes)")
    nodes = read_nodes(nodes_path)
    if seeds < 1 or demand <= 0 or commit < 1 or cpu_scale <= 0:
        fail("--seeds, --demand, --commit and --cpu-scale must be positive")
    pods = scale_cpu(read_pods(pods_path), cpu_scale)
    solver = solver or ("greedy" if mode == "online" else "highs")
    work = [
        (nodes, pods, first_seed + i, demand, mode, solver, commit, budget, time_limit)
        for i in range(seeds)
    ]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_one_seed, work))
    else:
        results = [_one_seed(w) for w in work]
    summary = _summary(results, pods_path, demand, mode, solver, cpu_scale)
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(_text(summary))
    if any(r["problems"] for r in results):
        fail(
            "check.py found problems in a plan: "
            + "; ".join(p for r in results for p in r["problems"])
        )


def _mean_curve(curves: list[list[float]]) -> list[float]:
    length = min((len(c) for c in curves), default=0)
    return [round(100 * statistics.mean(c[i] for c in curves), 2) for i in range(length)]


def _summary(
    results: list[dict[str, Any]],
    pods_path: Path,
    demand: float,
    mode: str,
    solver: str,
    cpu_scale: float,
) -> dict[str, Any]:
    def pct(x: float) -> float:
        return round(100 * x, 2)

    ours = statistics.mean(r["gitsched"] for r in results)
    base = statistics.mean(r["greedy"] for r in results)
    bound = statistics.mean(r["bound"] for r in results)
    kept = statistics.mean(r["bound_kept"] for r in results)
    fgd = published_fgd(pods_path, demand)
    return {
        "trace": pods_path.stem,
        "mode": mode,
        "solver": solver,
        "demand": demand,
        "cpu_scale": cpu_scale,
        "seeds": [
            {
                "seed": r["seed"],
                "arrivals": r["arrivals"],
                "gitsched": pct(r["gitsched"]),
                "free_in_shared_gpus": pct(r["free_in_shared_gpus"]),
                "free_whole_gpus": pct(r["free_whole_gpus"]),
                "start": pct(r["start"]),
                "greedy": pct(r["greedy"]),
                "bound": pct(r["bound"]),
                "bound_kept": pct(r["bound_kept"]),
                "moves": r["moves"],
                "lost_gpu_hours": r["lost_gpu_hours"],
                "solves": r["solves"],
                "seconds": round(r["seconds"], 1),
                "greedy_seconds": round(r["greedy_seconds"], 1),
            }
            for r in results
        ],
        "mean": {
            "gitsched": pct(ours),
            "free_in_shared_gpus": pct(statistics.mean(r["free_in_shared_gpus"] for r in results)),
            "free_whole_gpus": pct(statistics.mean(r["free_whole_gpus"] for r in results)),
            "start": pct(statistics.mean(r["start"] for r in results)),
            "greedy": pct(base),
            "bound": pct(bound),
            # FGD's published mean is for the trace as published (cpu_scale 1).
            "fgd_published": fgd,
            "vs_fgd": None if fgd is None else round(pct(ours) - fgd, 2),
            "vs_greedy": round(pct(ours) - pct(base), 2),
            "vs_bound": round(pct(ours) - pct(bound), 2),
            "bound_kept": pct(kept),
            "vs_bound_kept": round(pct(ours) - pct(kept), 2),
        },
        "curve": {
            "step": "1% of cluster GPU capacity arrived",
            "gitsched": _mean_curve([r["curve"] for r in results]),
            "greedy": _mean_curve([r["greedy_curve"] for r in results]),
        },
        "checked": not any(r["problems"] for r in results),
    }


def _text(s: dict[str, Any]) -> str:
    rows = [
        (
            x["seed"],
            x["arrivals"],
            x["gitsched"],
            x["greedy"],
            x["bound"],
            x["bound_kept"],
            x["moves"],
            x["lost_gpu_hours"],
            x["seconds"],
        )
        for x in s["seeds"]
    ]
    m = s["mean"]
    rows.append(("mean", "", m["gitsched"], m["greedy"], m["bound"], m["bound_kept"], "", "", ""))
    head = (
        f"{s['trace']}: mode {s['mode']}, solver {s['solver']}, demand {s['demand']:.0%}"
        + (f", CPU x{s['cpu_scale']:g}" if s["cpu_scale"] != 1.0 else "")
        + "; GPU allocation ratio, %"
    )
    columns = [
        "seed",
        "pods",
        "gitsched",
        "greedy",
        "bound",
        "kept bound",
        "moves",
        "GPU-h lost",
        "s",
    ]
    lines = [head, table(columns, rows)]
    fgd = m["fgd_published"]
    lines.append(
        "bound: any plan of the arrivals; kept bound: any plan that keeps running every pod "
        "running before re-optimisation"
    )
    lines.append(
        f"gitsched leaves {m['free_in_shared_gpus']:.2f}% of GPU free beside shares on part-used "
        f"GPUs and {m['free_whole_gpus']:.2f}% in whole free GPUs"
    )
    lines.append(
        f"gitsched - greedy: {m['vs_greedy']:+.2f}; gitsched - bound: {m['vs_bound']:+.2f}; "
        f"gitsched - kept bound: {m['vs_bound_kept']:+.2f}"
        + (f"; gitsched - FGD (published {fgd:.2f}): {m['vs_fgd']:+.2f}" if fgd is not None else "")
    )
    curve = s["curve"]
    points = [
        (i + 1, g, b)
        for i, (g, b) in enumerate(zip(curve["gitsched"], curve["greedy"], strict=False))
    ]
    marks = [p for p in points if p[0] % 10 == 0 or p[0] == len(points)]
    lines.append(
        "curve (arrived demand %: gitsched / greedy): "
        + ", ".join(f"{a}: {g}/{b}" for a, g, b in marks)
    )
    lines.append("every plan checked by check.py: " + ("ok" if s["checked"] else "PROBLEMS"))
    return "\n".join(lines)
