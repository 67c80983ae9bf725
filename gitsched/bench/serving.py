"""`gitsched bench serving`: an inference service autoscaled over an hour of real LLM
requests, on a cluster that runs a Philly window of training jobs in the same hours
(docs/autoscaling.md, "The serving benchmark").

Static provisioning at peak, HPA's rule, gitsched's autoscaler, and the service held at
its minimum (the reference for training), side by side on the same requests, jobs and
cluster; every placement is the reconciler's step, every count the product's autoscaler.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from gitsched.cluster.autoscaler import Autoscaler, services_of
from gitsched.cluster.prometheus import MetricAnswer, PrometheusClient
from gitsched.engine import events as ev
from gitsched.engine.state import ClusterState
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.options import fail, format_option
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from gitsched.render import table
from gitsched.simulation.replay import TraceError, read_philly
from gitsched.simulation.serving import (
    QUERY,
    SCRAPE_S,
    ReplicaModel,
    ServingConfig,
    ServingResult,
    ServingSetup,
    configurations,
    figures,
    minute_need,
    read_azure,
    run,
    setup,
    training_window,
    with_preroll,
)

DEFAULT_REQUESTS = "../shared/data/azure-llm/AzureLLMInferenceTrace_conv.csv"
DEFAULT_PHILLY = "../shared/data/philly/philly_2017_sep_oct.csv"
_DEFAULT = ReplicaModel()  # the documented assumptions

COLUMNS = (
    ("configuration", "CONFIG", "{}"),
    ("p50_latency_s", "P50 LAT", "{:.1f} s"),
    ("p99_latency_s", "P99 LAT", "{:.1f} s"),
    ("p50_ttft_s", "P50 TTFT", "{:.2f} s"),
    ("p99_ttft_s", "P99 TTFT", "{:.2f} s"),
    ("share_minutes_over_slo", "MIN>SLO", "{:.1%}"),
    ("service_gpu_hours", "SVC GPU-H", "{:.2f}"),
    ("training_gpu_hours_done", "TRAIN GPU-H", "{:.1f}"),
    ("training_mean_wait_s", "TRAIN WAIT", "{:.0f} s"),
    ("replica_hours_pending", "SVC PENDING R-H", "{:.2f}"),
    ("scaling_actions", "SCALINGS", "{}"),
    ("preemptions_training", "PREEMPT", "{}"),
)


class SimulatedPrometheus(PrometheusClient):
    """Prometheus' answer at the simulation's time: the value the run says the service's
    query has then (a scrape at the evaluation time). Never down: the autoscaler's handling
    of outages is tested against a real server (tests/prometheus/)."""

    def __init__(self) -> None:
        super().__init__("http://simulated.invalid:9090")
        self.value = 0.0
        self.at = 0.0

    def query(self, promql: str) -> MetricAnswer:
        return MetricAnswer(promql, self.value, self.at, 1, "")


class ProductAutoscaler:
    """`serve`'s autoscaler (gitsched.cluster.autoscaler.Autoscaler: its windows, its
    decisions by engine/autoscaling.py), appending to a log of its own in memory, asked
    at the run's times with the run's metric: what it appends is what the run folds."""

    def __init__(self) -> None:
        self.prometheus = SimulatedPrometheus()
        self.log = SQLiteEventLog(":memory:")
        self.state: ClusterState | None = None
        self.autoscaler = Autoscaler(
            self.prometheus, lambda: services_of(self.state) if self.state else [], interval_s=0
        )

    def __call__(self, now: float, value: float, state: ClusterState) -> Sequence[ev.Event]:
        self.prometheus.value, self.prometheus.at, self.state = value, now, state
        return self.autoscaler.poll(self.log)


def run_config(s: ServingSetup, config: ServingConfig) -> ServingResult:
    """One configuration's run, with the product's autoscaler when it has a rule."""
    return run(s, config, ProductAutoscaler() if config.autoscaling is not None else None)


def _one(args: tuple[ServingSetup, ServingConfig, float]) -> dict[str, Any]:
    s, config, slo = args
    return figures(run_config(s, config), slo)


@click.command("serving")
@click.option(
    "--requests",
    "requests_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_REQUESTS,
    show_default=True,
    help="An Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens).",
)
@click.option(
    "--philly",
    "philly_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_PHILLY,
    show_default=True,
    help="The Philly job trace the training comes from.",
)
@click.option(
    "--philly-day",
    default=None,
    help="The Philly day (YYYY-MM-DD) whose same hours run beside the requests; default:"
    " the day of the requests' weekday with the most submissions in those hours.",
)
@click.option("--minutes", type=float, default=None, help="Only the requests' first minutes.")
@click.option(
    "--warmup-hours",
    default=3.0,
    show_default=True,
    help="Training submitted this long before the hour runs first, to fill the cluster.",
)
@click.option(
    "--load",
    default=1.0,
    show_default=True,
    help="Offered load the training part of the cluster is sized for (simulation.replay).",
)
@click.option(
    "--preroll-minutes",
    default=10.0,
    show_default=True,
    help="The requests' first minutes replayed before the hour too (unmeasured): the service"
    " starts the hour as the autoscaler left it, not cold at its minimum.",
)
@click.option("--min-replicas", default=2, show_default=True, help="The service's minimum.")
@click.option(
    "--target-share",
    default=0.75,
    show_default=True,
    help="The autoscaling target: this share of a replica's concurrency in flight.",
)
@click.option(
    "--slo-ttft-s",
    default=2.0,
    show_default=True,
    help="A minute meets the SLO when its requests' p99 time to first token is at most this.",
)
@click.option("--prefill-tokens-per-s", default=_DEFAULT.prefill_tokens_per_s, show_default=True)
@click.option(
    "--decode-tokens-per-s",
    default=_DEFAULT.decode_tokens_per_s,
    show_default=True,
    help="Per sequence.",
)
@click.option("--max-concurrency", default=_DEFAULT.max_concurrency, show_default=True)
@click.option("--startup-s", default=_DEFAULT.startup_s, show_default=True)
@click.option("--config", "only", multiple=True, help="Run only these configurations (by name).")
@click.option("--seed", default=1, show_default=True, help="Seeds training's time limits.")
@click.option(
    "--jobs", "workers", default=1, show_default=True, help="Configurations run in parallel."
)
@format_option("text", "json")
def command(
    requests_path: Path,
    philly_path: Path,
    philly_day: str | None,
    minutes: float | None,
    warmup_hours: float,
    load: float,
    preroll_minutes: float,
    min_replicas: int,
    target_share: float,
    slo_ttft_s: float,
    prefill_tokens_per_s: float,
    decode_tokens_per_s: float,
    max_concurrency: int,
    startup_s: float,
    only: tuple[str, ...],
    seed: int,
    workers: int,
    fmt: str,
) -> None:
    """An inference service over an hour of real requests beside training jobs: static at
    peak, HPA's rule and gitsched's autoscaler, side by side."""
    if (
        (minutes is not None and minutes <= 0)
        or warmup_hours < 0
        or preroll_minutes < 0
        or load <= 0
        or min_replicas < 1
        or not 0 < target_share <= 1
        or slo_ttft_s <= 0
        or prefill_tokens_per_s <= 0
        or decode_tokens_per_s <= 0
        or max_concurrency < 1
        or startup_s < 0
        or workers < 1
    ):
        fail(
            "--minutes, --load, --slo-ttft-s and the throughputs must be positive, --min-replicas"
            " and --max-concurrency at least 1, --target-share in (0, 1], the rest >= 0"
        )
    model = ReplicaModel(prefill_tokens_per_s, decode_tokens_per_s, max_concurrency, startup_s)
    try:
        requests = read_azure(requests_path, minutes)
        hour_start = requests[0].arrival_s // 60 * 60
        hour_end = requests[-1].arrival_s // 60 * 60 + 60
        day, training = training_window(
            read_philly(philly_path), hour_start, hour_end, warmup_hours * 3600, philly_day
        )
        configs = configurations(
            requests, model, policy_of(default_policy()), min_replicas, target_share
        )
        peak = configs[0].max_replicas
        served, preroll = with_preroll(requests, preroll_minutes)
        s = setup(served, training, model, 2 * peak, warmup_hours * 3600, load, seed, preroll)
    except (TraceError, OSError) as e:
        fail(str(e))
    chosen = [c for c in configs if not only or c.name in only]
    if not chosen:
        fail(f"no such configuration: {', '.join(only)}")
    args = [(s, c, slo_ttft_s) for c in chosen]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, args))
    else:
        results = [_one(a) for a in args]
    needs = minute_need(requests, model, target_share * model.max_concurrency)
    summary: dict[str, Any] = {
        "requests_trace": str(requests_path),
        "requests": len(requests),
        "philly_trace": str(philly_path),
        "philly_day": day,
        "training_jobs": len(training),
        "warmup_hours": warmup_hours,
        "preroll_minutes": preroll_minutes,
        "cluster_nodes": len(s.nodes),
        "cluster_gpus": sum(n.gpus for n in s.nodes),
        "training_offered_load": round(s.offered_load, 4),
        "replica_model": asdict(model),
        "metric_query": QUERY,
        "scrape_interval_s": SCRAPE_S,
        "target_per_replica": target_share * model.max_concurrency,
        "peak_minute_replicas": max(needs),
        "mean_minute_replicas": round(sum(needs) / len(needs), 3),
        "slo_p99_ttft_s": slo_ttft_s,
        "seed": seed,
        "configurations": results,
    }
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(
        f"{requests_path.name}: {len(requests)} requests; Philly {day}: {len(training)} jobs"
        f" ({warmup_hours:g} h warm-up); {len(s.nodes)} nodes, {summary['cluster_gpus']} GPUs;"
        f" peak minute needs {max(needs)} replicas at {summary['target_per_replica']:g} in"
        f" flight each; SLO: p99 TTFT <= {slo_ttft_s:g} s per minute"
    )
    rows = [[f.format(r[key]) for key, _, f in COLUMNS] for r in results]
    click.echo(table([h for _, h, _ in COLUMNS], rows))
