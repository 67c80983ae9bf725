"""The `gitsched` command. Exit codes: 0 ok, 1 invalid or rejected, 2 usage or internal error."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from engine.errors import TemporaryError
from eventlog import open_log
from eventlog.base import LogUnavailable
from eventlog.envelope import format_time
from eventlog.replay import replay
from gitsched import __version__
from gitsched.cli_audit import audit
from gitsched.config import resolve_log_url
from gitsched.options import (
    EXIT_INVALID,
    EXIT_OK,
    LazyGroup,
    fail,
    format_option,
    log_option,
    open_event_log,
    user_errors,
)
from gitsched.render import state_text, state_to_dict
from reconciler.git import GitRepo
from reconciler.loop import Reconciler, ReconcileReport
from reconciler.specs import load_commit, load_worktree
from schemas import SpecError


@click.group(
    cls=LazyGroup,
    lazy={
        "plan": "gitsched.cli_plan:plan",
        "bench": "gitsched.bench:bench",
        "log": "gitsched.cli_log:log",
        "inventory": "gitsched.cli_inventory:inventory",
        "serve": "gitsched.serve:serve",
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="gitsched")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """gitsched: GitOps scheduling for GPU clusters.

    Teams commit job specs and quotas to a git repo; gitsched validates every
    commit, records it in an event-sourced log and places every job.

    \b
    Environment variables:
      GITSCHED_LOG   event log URL (sqlite:///... or kafka://host:port/topic)
    """
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2), format="%(levelname)s %(name)s: %(message)s"
    )
    # kafka-python logs the errors it then raises (a fenced producer, a lost broker);
    # gitsched reports each of those once, in its own words. -v shows them again.
    if verbose == 0:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


# -- validate -------------------------------------------------------------------------------


def _errors_text(errors: tuple[SpecError, ...]) -> str:
    files = len({e.file for e in errors})
    lines = [e.format() for e in errors]
    lines.append(f"{len(errors)} error(s) in {files} file(s)")
    return "\n".join(lines)


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False), default=".")
@click.option("--rev", help="Validate this commit instead of the files on disk.")
@format_option("text", "json")
def validate(path: str, rev: str | None, fmt: str) -> None:
    """Check every file of a cluster repo against the schemas and policies.

    Reports every error at once with file, line and JSON path.
    Exit 0 valid, 1 invalid, 2 usage or internal error.
    """
    with user_errors():
        if rev:
            repo = GitRepo(path)
            loaded = load_commit(repo, repo.resolve(rev))
        else:
            loaded = load_worktree(Path(path))
    if fmt == "json":
        click.echo(
            json.dumps(
                {"valid": not loaded.errors, "errors": [e.to_dict() for e in loaded.errors]},
                indent=2,
            )
        )
    elif loaded.errors:
        click.echo(_errors_text(loaded.errors))
    else:
        click.echo(f"valid: {len(loaded.documents)} documents")
    sys.exit(EXIT_INVALID if loaded.errors else EXIT_OK)


# -- reconcile ------------------------------------------------------------------------------


def report_text(report: ReconcileReport) -> str:
    lines = []
    for outcome in report.commits:
        c = outcome.commit
        if outcome.applied:
            lines.append(f"applied  {c.sha[:12]} {c.subject} ({c.author}, {outcome.events} events)")
        else:
            lines.append(
                f"REJECTED {c.sha[:12]} {c.subject} ({c.author}): {len(outcome.errors)} error(s)"
            )
            lines.extend(f"    {f.format()}" for f in outcome.errors)
    if not report.commits:
        lines.append("up to date: no new commits")
    lines.append(f"{report.events_appended} event(s) appended; log at seq {report.last_seq}")
    return "\n".join(lines)


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False), default=".")
@click.option("--branch", default="main", show_default=True, help="Branch to follow.")
@log_option
@click.option(
    "--once", is_flag=True, help="One pass, then exit (default: keep watching the branch)."
)
@click.option(
    "--interval", default=10.0, show_default=True, help="Seconds between passes when watching."
)
@click.option("--solver", help="Override the Policy's solver (greedy, highs, cbc).")
def reconcile(
    path: str, branch: str, log_url: str | None, once: bool, interval: float, solver: str | None
) -> None:
    """Apply the branch's new commits to the log, then place every job.

    Exit 1 when the newest commit was rejected, else 0.
    """
    url = resolve_log_url(log_url, path)
    with user_errors():
        repo = GitRepo(path)
        with open_log(url) as event_log:
            reconciler = Reconciler(repo, event_log, branch=branch, solver=solver)
            if once:
                report = reconciler.run_once()
                click.echo(report_text(report))
                sys.exit(EXIT_INVALID if report.newest_rejected else EXIT_OK)
            _watch(reconciler, interval)


def _watch(reconciler: Reconciler, interval: float) -> None:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    backoff = 1.0
    while not stopping:
        try:
            report = reconciler.run_once()
        except (TemporaryError, LogUnavailable) as e:
            click.echo(f"gitsched: {e}; retrying in {backoff:.0f}s", err=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 60.0)
            continue
        backoff = 1.0
        if report.commits:
            click.echo(report_text(report))
        deadline = time.monotonic() + interval
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)


# -- state ----------------------------------------------------------------------------------


@main.command()
@log_option
@click.option(
    "--repo", default=".", show_default=True, help="Cluster repo whose default log to read."
)
@click.option("--seq", type=click.IntRange(min=0), help="The state right after this event.")
@click.option("--at", "at_time", help="The state at this time (ISO-8601, UTC if no zone).")
@format_option("text", "json")
def state(log_url: str | None, repo: str, seq: int | None, at_time: str | None, fmt: str) -> None:
    """The cluster state folded from the log, now or at an earlier point."""
    if seq is not None and at_time is not None:
        fail("give --seq or --at, not both")
    until_time = _parse_time(at_time) if at_time else None
    with user_errors(), open_event_log(log_url, repo) as event_log:
        replayed = replay(event_log, until_seq=seq, until_time=until_time)
    if fmt == "json":
        click.echo(json.dumps(state_to_dict(replayed.state, replayed.last_seq), indent=2))
    else:
        click.echo(state_text(replayed.state, replayed.last_seq))


def _parse_time(text: str) -> str:
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--at {text!r} is not an ISO-8601 time (e.g. 2026-11-22T10:00:00Z)")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return format_time(moment)


main.add_command(audit)


# -- demo -----------------------------------------------------------------------------------


@main.command()
@click.argument("directory", type=click.Path(file_okay=False), default="gitsched-demo")
@click.option("--force", is_flag=True, help="Replace DIRECTORY if it exists.")
def demo(directory: str, force: bool) -> None:
    """Create a demo cluster repo with a realistic history, reconcile it and show the result."""
    from gitsched.demo import run_demo

    with user_errors():
        code = run_demo(Path(directory), force=force, echo=click.echo)
    sys.exit(code)
