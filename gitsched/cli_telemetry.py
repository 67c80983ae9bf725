"""`gitsched telemetry ...`: GPU utilisation into the log, for idle reclamation.

`ingest` reads a DCGM exporter scrape (a file or its URL) or recorded NVML samples,
aggregates them per node and window, appends them with the idle flags they lead to,
and places again when a flag frees GPUs. `sample` is the node agent's side: NVML
samples of this host, recorded one JSON line each, for `ingest --source nvml`.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import click

from gitsched.engine import events as ev
from gitsched.engine.core import ApplyTelemetry, decide
from gitsched.eventlog.codec import encode
from gitsched.eventlog.replay import replay
from gitsched.exit_codes import EXIT_OK
from gitsched.options import fail, format_option, log_option, open_event_log, user_errors
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.nvml import UtilizationReader
from gitsched.reconciler.telemetry import (
    TelemetryError,
    aggregate,
    parse_dcgm,
    parse_nvml_record,
    read_source,
    record_line,
    sample_nvml,
)

ACTOR = "telemetry"


@click.group()
def telemetry() -> None:
    """GPU utilisation telemetry: ingest it into the log, or sample it on a node."""


@telemetry.command()
@click.argument("source_path", metavar="FILE|URL")
@click.option(
    "--source",
    type=click.Choice(["dcgm", "nvml"]),
    default="dcgm",
    show_default=True,
    help="dcgm: Prometheus text with DCGM_FI_DEV_GPU_UTIL; nvml: `telemetry sample` output.",
)
@click.option(
    "--window-minutes",
    type=click.FloatRange(min=0.1, max=1440),
    default=5.0,
    show_default=True,
    help="Samples are aggregated into one event per node and window of this length.",
)
@click.option(
    "--at",
    "at_text",
    help="Time of samples without a timestamp (ISO-8601 with an offset) [default: now].",
)
@log_option
@click.option(
    "--repo",
    default=".",
    show_default=True,
    help="Cluster repo: its default log, and its reconciler places again after a flag.",
)
@format_option("text", "json")
def ingest(
    source_path: str,
    source: str,
    window_minutes: float,
    at_text: str | None,
    log_url: str | None,
    repo: str,
    fmt: str,
) -> None:
    """Append GPU utilisation from FILE|URL to the log, and flag idle jobs."""
    at = None
    if at_text is not None:
        try:
            moment = datetime.fromisoformat(at_text)
        except ValueError:
            fail(f"--at {at_text!r}: not an ISO-8601 time")
        if moment.tzinfo is None:
            fail(f"--at {at_text!r}: give the time with its offset (e.g. Z or +00:00)")
        at = moment.timestamp()
    with user_errors():
        text = read_source(source_path)
        problems: list[str] = []
        if source == "dcgm":
            if at is None:
                at = datetime.now().timestamp()  # a scrape's time: this is the edge
            samples, problems = parse_dcgm(text, at)
        else:
            samples = parse_nvml_record(text)
        if not samples:
            raise TelemetryError(
                f"{source_path}: no GPU utilisation samples"
                + (f" ({problems[0]})" if problems else "")
            )
        reports = aggregate(samples, window_minutes * 60.0)
        with open_event_log(log_url, repo) as event_log:
            tip = replay(event_log, verify=True)
            events = decide(tip.state, ApplyTelemetry(reports))
            cause = f"{ACTOR}/{tip.last_seq}"
            event_log.append(
                [
                    encode(e, id=f"{cause}/{i}", actor=ACTOR, cause=f"{ACTOR}/{source}")
                    for i, e in enumerate(events)
                ],
                expected_last_seq=tip.last_seq,
            )
            flags = [
                e
                for e in events
                if isinstance(e, ev.JobIdle | ev.JobIdleCleared | ev.WorkspaceSuspended)
            ]
            solved = None
            if flags:
                report = Reconciler(GitRepo(repo), event_log).solve_now(cause)
                solved = report.last_seq
    idle = [
        {"job": e.job, "since": e.since, "until": e.until, "action": e.action}
        for e in flags
        if isinstance(e, ev.JobIdle)
    ]
    busy = [e.job for e in flags if isinstance(e, ev.JobIdleCleared)]
    suspended = [
        {"job": e.job, "since": e.since, "until": e.until, "after_minutes": e.after_minutes}
        for e in flags
        if isinstance(e, ev.WorkspaceSuspended)
    ]
    summary = {
        "samples": len(samples),
        "skipped": problems,
        "reports": len(reports),
        "idle": idle,
        "busy_again": busy,
        "suspended": suspended,  # workspaces idle for their idle.suspendAfterMinutes
        "placed_again_at_seq": solved,
    }
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
        sys.exit(EXIT_OK)
    click.echo(
        f"{len(samples)} samples -> {len(reports)} report(s)"
        + (f"; {len(problems)} line(s) skipped" if problems else "")
    )
    for line in problems[:10]:
        click.echo(f"  skipped {line}")
    for flag in idle:
        click.echo(f"idle: {flag['job']} since {flag['since']} ({flag['action']})")
    for job in busy:
        click.echo(f"busy again: {job}")
    for held in suspended:
        click.echo(f"suspended: {held['job']} idle from {held['since']} to {held['until']}")


@telemetry.command()
@click.option("--node", required=True, help="This node's name in the cluster repo.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="How long to sample.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between samples.",
)
def sample(node: str, seconds: float, interval: float) -> None:
    """Sample this host's GPUs through NVML; print one JSON line per GPU and sample."""
    with user_errors(), UtilizationReader() as reader:
        for s in sample_nvml(node, seconds, interval, reader.read):
            click.echo(record_line(s))
