"""The `gitsched` command. Exit codes: gitsched/exit_codes.py (0 ok, 1 no, 2 error, 3 not found)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from gitsched import __version__
from gitsched.cli_audit import audit
from gitsched.config import resolve_log_url, snapshot_dir
from gitsched.engine.errors import TemporaryError
from gitsched.engine.placement.explain import NEVER_RUNS
from gitsched.eventlog import open_log
from gitsched.eventlog.base import LogCorrupted, LogUnavailable
from gitsched.eventlog.envelope import format_time
from gitsched.eventlog.replay import replay
from gitsched.exit_codes import EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OK
from gitsched.findings import Finding
from gitsched.options import (
    LazyGroup,
    fail,
    format_option,
    log_option,
    open_event_log,
    parse_time,
    point_in_time,
    repo_of,
    repo_path,
    user_errors,
)
from gitsched.policies.approval import APPROVAL_CODE
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import SNAPSHOT_EVERY, Reconciler, ReconcileReport
from gitsched.reconciler.specs import load_commit, load_worktree
from gitsched.render import printable, state_text, state_to_dict


@click.group(
    cls=LazyGroup,
    lazy={
        "plan": "gitsched.cli_plan:plan",
        "bench": "gitsched.bench:bench",
        "log": "gitsched.cli_log:log",
        "inventory": "gitsched.cli_inventory:inventory",
        "serve": "gitsched.serve:serve",
        "telemetry": "gitsched.cli_telemetry:telemetry",
        "console": "gitsched.console.command:console",
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


def _errors_text(errors: tuple[Finding, ...]) -> str:
    files = len({e.file for e in errors})
    lines = [e.format() for e in errors]
    lines.append(f"{len(errors)} error(s) in {files} file(s)")
    return "\n".join(lines)


@main.command()
@repo_path
@click.option("--rev", help="Validate this commit instead of the files on disk.")
@format_option("text", "json")
def validate(path: str | None, repo_opt: str | None, rev: str | None, fmt: str) -> None:
    """Check every file of a cluster repo against the schemas and policies.

    Reports every error at once with file, line and JSON path, and warns about
    what is valid but can never run. Exit 0 valid, 1 invalid, 2 usage or internal error.
    """
    path = repo_of(path, repo_opt)
    with user_errors():
        if rev:
            repo = GitRepo(path)
            loaded = load_commit(repo, repo.resolve(rev))
        else:
            if not (Path(path) / "cluster.yaml").is_file():
                # Not a cluster repo: walking it (venvs and all) would report every YAML file.
                fail(
                    f"no cluster.yaml here ({Path(path).resolve()}): not a cluster repo; pass "
                    "the repo's folder (gitsched validate PATH)"
                )
            loaded = load_worktree(Path(path))
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "valid": not loaded.errors,
                    "errors": [e.to_dict() for e in loaded.errors],
                    "warnings": [w.to_dict() for w in loaded.warnings],
                },
                indent=2,
            )
        )
    elif loaded.errors:
        click.echo(_errors_text(loaded.errors))
    else:
        click.echo(f"valid: {len(loaded.documents)} documents")
    for warning in loaded.warnings if fmt != "json" else ():
        click.echo(f"warning: {warning.format()}")
    sys.exit(EXIT_INVALID if loaded.errors else EXIT_OK)


# -- reconcile ------------------------------------------------------------------------------


def report_text(report: ReconcileReport) -> str:
    lines = []
    for outcome in report.commits:
        c = outcome.commit
        subject, author = printable(c.subject), printable(c.author)
        if outcome.applied:
            lines.append(f"applied  {c.sha[:12]} {subject} ({author}, {outcome.events} events)")
        else:
            lines.append(
                f"REJECTED {c.sha[:12]} {subject} ({author}): {len(outcome.errors)} error(s)"
            )
            lines.extend(f"    {f.format()}" for f in outcome.errors)
    if not report.commits:
        lines.append("up to date: no new commits")
        newest = report.state.last_commit
        if report.newest_rejected and newest is not None:
            lines.extend(_stays_rejected(report))
    if any(outcome.applied for outcome in report.commits):
        # What validate and plan warn of, said where the commit lands as well.
        for job, pending in sorted(report.state.pending.items()):
            if pending.constraint.startswith(NEVER_RUNS):
                lines.append(f"warning: job {job} {pending.reason}")
    lines.append(f"{report.events_appended} event(s) appended; log at seq {report.last_seq}")
    return "\n".join(lines)


def _stays_rejected(report: ReconcileReport) -> list[str]:
    """The newest commit's rejection as the log records it, and the command that judges
    it again: `validate` reads files only (it runs with no log, before a commit exists),
    so an approval finding, judged against the log's last good commit, is `plan`'s."""
    newest = report.state.last_commit
    assert newest is not None
    errors = report.state.last_rejection
    approval = any(e.code == APPROVAL_CODE for e in errors)
    again = (
        "`gitsched plan HEAD` judges the approvals again"
        if approval
        else "`gitsched validate --rev HEAD` checks the files again"
    )
    return [
        f"the newest commit {newest.sha[:12]} {printable(newest.subject)} stays REJECTED"
        f" ({len(errors)} error(s), below; {again}); the cluster runs the last good commit"
        " until a new commit fixes it",
        *(f"    {f.format()}" for f in errors),
    ]


@main.command()
@repo_path
@click.option("--branch", default="main", show_default=True, help="Branch to follow.")
@log_option
@click.option(
    "--once", is_flag=True, help="One pass, then exit (default: keep watching the branch)."
)
@click.option(
    "--interval", default=10.0, show_default=True, help="Seconds between passes when watching."
)
@click.option(
    "--heartbeat",
    default=300.0,
    show_default=True,
    help="When watching: seconds without news after which one line says it is still"
    " watching (0: never).",
)
@click.option("--solver", help="Override the Policy's solver (greedy, highs, cbc, cpsat).")
@click.option(
    "--snapshot-every",
    envvar="GITSCHED_SNAPSHOT_EVERY",
    show_envvar=True,
    default=SNAPSHOT_EVERY,
    show_default=True,
    type=click.IntRange(min=0),
    help="Snapshot the folded state after this many new events, so a restart replays at "
    "most that many (0: never).",
)
def reconcile(
    path: str | None,
    repo_opt: str | None,
    branch: str,
    log_url: str | None,
    once: bool,
    interval: float,
    heartbeat: float,
    solver: str | None,
    snapshot_every: int,
) -> None:
    """Apply the branch's new commits to the log, then place every job.

    Exit 1 while the branch's newest commit stands rejected, else 0.
    """
    path = repo_of(path, repo_opt)
    url = resolve_log_url(log_url, path)
    with user_errors():
        repo = GitRepo(path)
        current = repo.checked_out_branch()
        if current not in (None, branch) and not repo.has_revision(branch):
            fail(
                f"unknown revision {branch!r} in {path}: no such branch; its checked-out"
                f" branch is {current!r}: pass --branch {current}"
            )
        with open_log(url, snapshot_dir=snapshot_dir(path)) as event_log:
            reconciler = Reconciler(
                repo, event_log, branch=branch, solver=solver, snapshot_every=snapshot_every
            )
            if once:
                report = reconciler.run_once()
                click.echo(report_text(report))
                sys.exit(EXIT_INVALID if report.newest_rejected else EXIT_OK)
            _watch(reconciler, interval, heartbeat)


def heartbeat_text(report: ReconcileReport, branch: str, idle_s: float) -> str:
    """One line for a watcher with nothing new to say, so its log shows it is alive."""
    newest = report.state.last_commit
    at = f"{newest.sha[:12]}" if newest is not None else "no commit yet"
    line = (
        f"{format_time(datetime.now(UTC))} watching {branch}: no new commits for"
        f" {idle_s:.0f} s; at {at}, log seq {report.last_seq}"
    )
    if report.newest_rejected:
        line += "; the newest commit stays REJECTED"
    return line


def _watch(reconciler: Reconciler, interval: float, heartbeat: float) -> None:
    stopping = False
    last_news = time.monotonic()

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
            last_news = time.monotonic()
        elif heartbeat > 0 and time.monotonic() - last_news >= heartbeat:
            click.echo(heartbeat_text(report, reconciler.branch, time.monotonic() - last_news))
            last_news = time.monotonic()
        deadline = time.monotonic() + interval
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)


# -- state ----------------------------------------------------------------------------------


@main.command()
@repo_path
@log_option
@point_in_time
@format_option("text", "json")
def state(
    path: str | None,
    repo_opt: str | None,
    log_url: str | None,
    at_time: str | None,
    seq: int | None,
    fmt: str,
) -> None:
    """The cluster state folded from the log, now or at an earlier point (--at TIME | --seq N).

    The repo (whose default log is read) as PATH or --repo, as validate, reconcile and plan."""
    repo = repo_of(path, repo_opt)
    if seq is not None and at_time is not None:
        fail("give --at TIME or --seq N, not both")
    until_time = format_time(parse_time(at_time)) if at_time else None
    with user_errors(), open_event_log(log_url, repo) as event_log:
        last_seq = event_log.last_seq()
        if seq is not None and seq > last_seq:
            fail(
                f"--seq {seq} is past the end of the log (its last seq is {last_seq})",
                EXIT_NOT_FOUND,
            )
        try:
            replayed = replay(event_log, until_seq=seq, until_time=until_time, verify=True)
        except LogCorrupted as e:
            fail(str(e), EXIT_INVALID)
    for problem in replayed.snapshot_problems:
        click.echo(f"gitsched: warning: {problem}", err=True)
    if fmt == "json":
        click.echo(json.dumps(state_to_dict(replayed.state, replayed.last_seq), indent=2))
    else:
        click.echo(state_text(replayed.state, replayed.last_seq))


main.add_command(audit)


# -- demo -----------------------------------------------------------------------------------


@main.command()
@click.argument("directory", type=click.Path(file_okay=False), default="gitsched-demo")
@click.option("--force", is_flag=True, help="Replace DIRECTORY if it exists.")
@format_option("text", "json")
def demo(directory: str, force: bool, fmt: str) -> None:
    """Create a demo cluster repo with a realistic history, reconcile it and show the result.

    Its commits are dated just before it is created (recorded in its DEMO.md). --format
    json prints one document: the commits, each solve's raw objective and bound, and the
    pull request's state."""
    from gitsched.demo import run_demo

    summary: dict[str, object] = {}
    with user_errors():
        code = run_demo(
            Path(directory),
            force=force,
            echo=click.echo if fmt == "text" else (lambda _: None),
            summary=summary,
        )
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2))
    sys.exit(code)
