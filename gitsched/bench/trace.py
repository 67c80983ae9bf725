"""`gitsched bench trace`: waits, completion times, utilisation and the scheduler's own
cost over time, on a real job trace (BENCHMARKS.md §5).

A window of the Philly trace (or an openb pod list with its creation and deletion times)
is replayed through the reconciler's own step (simulation.replay) once per policy, on the
same arrivals and the same cluster, and the figures are printed side by side.
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from gitsched.bench.synth import ENGINES
from gitsched.options import fail, format_option
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from gitsched.render import table
from gitsched.simulation.replay import (
    OVERESTIMATE,
    ReplayCluster,
    ReplayPolicy,
    TraceError,
    TraceJob,
    figures,
    policies,
    read_openb_lifetimes,
    read_philly,
    replay,
    size_cluster,
    time_limits,
    wait_cdf,
)
from gitsched.simulation.tail import tail_report

COLUMNS = (
    ("policy", "POLICY", "{}"),
    ("mean_wait_s", "MEAN WAIT", "{:.0f} s"),
    ("p50_wait_s", "P50", "{:.0f} s"),
    ("p99_wait_s", "P99", "{:.0f} s"),
    ("max_wait_s", "MAX", "{:.0f} s"),
    # every wait, the first and each after a preemption
    ("mean_total_wait_s", "MEAN TOTAL", "{:.0f} s"),
    ("p99_total_wait_s", "P99 TOTAL", "{:.0f} s"),
    ("mean_jct_s", "MEAN JCT", "{:.0f} s"),
    ("mean_bounded_slowdown", "SLOWDOWN", "{:.1f}"),
    ("gpu_utilisation_window", "UTIL", "{:.1%}"),
    ("max_wait_32_gpus_or_more_s", "MAX WAIT >=32", "{:.0f} s"),
    ("jain_index_share_over_nominal", "JAIN", "{:.3f}"),
    ("preemptions", "PREEMPT", "{}"),
    ("gpu_hours_lost", "LOST GPU-H", "{:.1f}"),
    ("p50_decision_cpu_s", "CPU P50", "{:.3f} s"),
    ("p99_decision_cpu_s", "CPU P99", "{:.3f} s"),
)


# One replay: the trace, the cluster, the policy, the limits (None: unknown), whether to
# keep every decision for the tail's diagnosis.
Run = tuple[list[TraceJob], ReplayCluster, ReplayPolicy, dict[int, int] | None, bool]


def _one(args: Run) -> dict[str, Any]:
    jobs, cluster, rp, limits, tail = args
    result = replay(jobs, cluster, rp, limits, record=tail)
    out = figures(result)
    if tail:
        out["tail"] = tail_report(result).as_dict()
    out["wait_cdf_s"] = wait_cdf(result)
    out["busy_gpus"] = result.busy
    return out


@click.command("trace")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="A Philly CSV (timestamp,duration,num_gpus,...,cluster) or an openb pod list.",
)
@click.option(
    "--start",
    default=None,
    help="The window's start: Philly, a UTC ISO date or time; openb, days from the trace's start.",
)
@click.option("--days", default=2.0, show_default=True, help="The window's length in days.")
@click.option(
    "--load",
    default=1.0,
    show_default=True,
    help="Offered load the cluster is sized for (the window's GPU-seconds / the cluster's).",
)
@click.option("--seed", default=1, show_default=True, help="Seeds the time limits' over-estimates.")
@click.option(
    "--limits",
    type=click.Choice(["known", "unknown", "both"]),
    default="both",
    show_default=True,
    help="Give jobs time limits (run time x an over-estimate), none, or run both.",
)
@click.option("--policy", "only", multiple=True, help="Run only these policies (by name).")
@click.option(
    "--solver",
    "engine",
    type=click.Choice(ENGINES),
    default=None,
    help="The built-in policy's MILP engine (solver.name); default: the built-in Policy's.",
)
@click.option(
    "--jobs", "workers", default=1, show_default=True, help="Policies run in parallel processes."
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Write utilisation.png and wait-cdf.png here (needs matplotlib: gitsched[plots]).",
)
@click.option(
    "--tail",
    is_flag=True,
    help="Also say what made the wait tail: for the worst 1% of jobs by total wait, "
    "who started ahead of them and their preemptions (keeps every decision: more memory).",
)
@format_option("text", "json")
def command(
    trace_path: Path,
    start: str | None,
    days: float,
    load: float,
    seed: int,
    limits: str,
    only: tuple[str, ...],
    engine: str | None,
    workers: int,
    plot_dir: Path | None,
    tail: bool,
    fmt: str,
) -> None:
    """Waits and utilisation over time: a trace replayed through gitsched's own step,
    once per policy."""
    if days <= 0 or load <= 0 or workers < 1:
        fail("--days, --load and --jobs must be positive")
    try:
        if "creation_time" in trace_path.open(encoding="utf-8").readline():
            try:
                start_day = None if start is None else float(start)
            except ValueError:
                fail(f"--start: an openb window starts at a number of days, not {start!r}")
            jobs = read_openb_lifetimes(trace_path, start_day, days if start else None)
        else:
            jobs = read_philly(trace_path, start, days if start else None)
        cluster = size_cluster(jobs, load)
    except (TraceError, OSError) as e:
        fail(str(e))
    builtin = policy_of(default_policy())
    if engine is not None:
        builtin = replace(builtin, solver=engine)
    chosen = [p for p in policies(builtin) if not only or p.name in only]
    if not chosen:
        fail(f"no such policy: {', '.join(only)}")
    runs: list[tuple[list[TraceJob], ReplayCluster, ReplayPolicy, dict[int, int] | None, bool]] = []
    for known in (True, False) if limits == "both" else (limits == "known",):
        for rp in chosen:
            runs.append((jobs, cluster, rp, time_limits(jobs, seed) if known else None, tail))
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, runs))
    else:
        results = [_one(r) for r in runs]
    summary: dict[str, Any] = {
        "trace": str(trace_path),
        "start": start,
        "days": days,
        "jobs": len(jobs),
        "cluster_gpus": cluster.gpus,
        "nodes": len(cluster.nodes),
        "offered_load": round(cluster.offered_load, 4),
        "overestimate_range": list(OVERESTIMATE),
        "seed": seed,
        "solver": builtin.solver,
        "policies": [
            {k: v for k, v in r.items() if k not in ("wait_cdf_s", "busy_gpus")} for r in results
        ],
    }
    if plot_dir is not None:
        summary["plots"] = _plots(results, cluster.gpus, plot_dir)
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(
        f"{trace_path.name}: {len(jobs)} jobs from {start or 'the start'} over {days:g} days;"
        f" {len(cluster.nodes)} nodes, {cluster.gpus} GPUs, offered load {cluster.offered_load:.2f};"
        f" the built-in policy solves with {builtin.solver}"
    )
    rows = [
        [fmt_.format(r[key]) for key, _, fmt_ in COLUMNS]
        + ["known" if r["limits_known"] else "unknown"]
        for r in results
    ]
    click.echo(table([h for _, h, _ in COLUMNS] + ["LIMITS"], rows))
    for r in results:
        if "tail" in r:
            t = r["tail"]
            limits_text = "limits known" if r["limits_known"] else "limits unknown"
            click.echo(
                f"tail of {r['policy']} ({limits_text}): the worst {t['jobs']} jobs waited"
                f" {t['mean_total_wait_s']:.0f} s on average in all;"
                f" {t['preempted_jobs']} were preempted"
                f" ({t['rewait_share']:.1%} of their queue time after a preemption);"
                f" younger jobs started {t['younger_started']} times while they waited,"
                f" where they fitted: {_counts(t['passed_over_fitting'])};"
                f" held by: {_counts(t['constraint_when_passed'])}"
            )


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _plots(results: list[dict[str, Any]], gpus: int, where: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        fail("--plot needs matplotlib: pip install 'gitsched[plots]'")
    where.mkdir(parents=True, exist_ok=True)

    def label(r: dict[str, Any]) -> str:
        return f"{r['policy']} ({'limits' if r['limits_known'] else 'no limits'})"

    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        points = r["busy_gpus"]
        if not points:
            continue
        t0 = points[0][0]
        xs = [(t - t0) / 3600 for t, _ in points]
        ys = [g / gpus for _, g in points]
        ax.step(xs, ys, where="post", label=label(r), linewidth=0.8)
    ax.set_xlabel("hours from the window's first arrival")
    ax.set_ylabel("GPUs allocated / cluster")
    ax.legend(fontsize=7)
    utilisation = where / "utilisation.png"
    fig.tight_layout()
    fig.savefig(utilisation, dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        waits = r["wait_cdf_s"]
        if waits:
            ax.step(
                [max(w, 1.0) for w in waits],
                [(i + 1) / len(waits) for i in range(len(waits))],
                where="post",
                label=label(r),
                linewidth=0.8,
            )
    ax.set_xscale("log")
    ax.set_xlabel("wait (s, log scale; 0 shown at 1 s)")
    ax.set_ylabel("share of jobs")
    ax.legend(fontsize=7)
    cdf = where / "wait-cdf.png"
    fig.tight_layout()
    fig.savefig(cdf, dpi=90)
    plt.close(fig)
    return [str(utilisation), str(cdf)]
