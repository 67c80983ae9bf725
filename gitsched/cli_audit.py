"""`gitsched audit ...`: questions an auditor asks, answered from the log."""

from __future__ import annotations

import sys

import click

from audit.history import build_history, select
from audit.verify import verify_log
from eventlog.codec import decode_all
from gitsched.options import (
    EXIT_INVALID,
    EXIT_OK,
    emit_rows,
    fail,
    format_option,
    log_option,
    open_event_log,
    user_errors,
)


@click.group()
def audit() -> None:
    """Questions an auditor asks, answered from the log."""


@audit.command()
@log_option
@click.option(
    "--repo", default=".", show_default=True, help="Cluster repo whose default log to read."
)
@click.option("--job", help="A job, as QUEUE/NAME or NAME.")
@click.option("--node", help="A node name.")
@click.option("--team", help="A team's queue.")
@click.option("--gpu-flavor", "flavor", help="A GPU flavor.")
@format_option("table", "csv", "json")
def history(
    log_url: str | None,
    repo: str,
    job: str | None,
    node: str | None,
    team: str | None,
    flavor: str | None,
    fmt: str,
) -> None:
    """Every placement interval: where a job ran, from when to when, and why."""
    if not any((job, node, team, flavor)):
        fail("give one of --job, --node, --team, --gpu-flavor")
    with user_errors(), open_event_log(log_url, repo) as event_log:
        intervals = select(
            build_history(decode_all(event_log.read(0))),
            job=job,
            node=node,
            team=team,
            flavor=flavor,
        )
    headers = [
        "job",
        "nodes",
        "replicas",
        "gpus",
        "flavor",
        "start",
        "end",
        "state",
        "start_reason",
        "end_reason",
    ]
    emit_rows([i.to_dict() for i in intervals], headers, fmt)


@audit.command()
@log_option
@click.option(
    "--repo", default=".", show_default=True, help="Cluster repo whose default log to read."
)
def verify(log_url: str | None, repo: str) -> None:
    """Check the hash chain and seq continuity of the whole log. Exit 1 when broken."""
    with user_errors(), open_event_log(log_url, repo) as event_log:
        result = verify_log(event_log)
    if result.ok:
        click.echo(f"ok: {result.events} events, chain intact, head {result.last_hash}")
        sys.exit(EXIT_OK)
    assert result.broken is not None
    click.echo(f"BROKEN at seq {result.broken.seq}: {result.broken.reason}")
    sys.exit(EXIT_INVALID)
