"""`gitsched plan PATH BASE..HEAD`: a pull request's effect on the cluster, before merge.

Exit codes as `flux diff` (gitsched/exit_codes.py): 0 no change, 1 changes, 2 an
invalid HEAD or any other error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gitsched.config import resolve_log_url
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog, LogConfigurationError
from gitsched.eventlog.sqlite import sqlite_path_from_url
from gitsched.exit_codes import PLAN_CHANGES, PLAN_INVALID, PLAN_NO_CHANGE, plan_exit_code
from gitsched.options import fail, format_option, log_option, repo_of, user_errors
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.plan import parse_range, plan_change
from gitsched.render_plan import RENDERERS, summary_line


def _open_for_reading(url: str, explicit: bool) -> EventLog | None:
    """The log, opened so that reading it changes nothing; None if the default one is absent."""
    if url.startswith("sqlite:"):
        path = sqlite_path_from_url(url)
        if not path.is_file():
            if explicit:
                raise LogConfigurationError(f"no event log at {path}")
            return None
        return open_log(url)
    if url.startswith("kafka:"):
        from gitsched.eventlog.kafka import KafkaEventLog

        try:
            return KafkaEventLog.from_url(url, create_topic=False)
        except ValueError as e:
            raise LogConfigurationError(str(e)) from e
    return open_log(url)


PLAN_HELP = f"""What merging HEAD would do to the cluster, before it is merged.

    \b
    BASE is the state the cluster is in: by default (..HEAD, or just HEAD) the
    last commit the log applied, so the plan starts from the real placements.
    A BASE other than that commit makes the plan stale, and it says so.
    HEAD is the branch under review. Nothing is appended to the log: the plan
    is the reconciler's own step, run over the branch's commits.

    Shows HEAD's validation errors, quota and policy changes per queue, jobs
    admitted, moved, preempted or left pending (with reasons), GPUs and fair
    share per queue, the solve, and the owner approvals still missing.

    Exit {PLAN_NO_CHANGE} no change, {PLAN_CHANGES} changes, {PLAN_INVALID} an invalid HEAD or any other error.
    """


@click.command(help=PLAN_HELP)
@click.argument("arguments", nargs=-1, metavar="[PATH] BASE..HEAD")
@click.option(
    "--repo",
    "repo_opt",
    type=click.Path(exists=True, file_okay=False),
    help="The cluster repo (default: the current directory); also accepted as PATH.",
)
@log_option
@format_option("text", "markdown", "json")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    help="Write the plan to this file (stdout then gets the summary line).",
)
def plan(
    arguments: tuple[str, ...],
    repo_opt: str | None,
    log_url: str | None,
    fmt: str,
    output: str | None,
) -> None:
    if len(arguments) not in (1, 2):
        fail("give BASE..HEAD, and the repo as --repo PATH (or as PATH before it)")
    *given, revisions = arguments
    if given and not Path(given[0]).is_dir():
        fail(f"PATH {given[0]!r} is not a directory")
    path = repo_of(given[0] if given else None, repo_opt)
    url = resolve_log_url(log_url, path)
    with user_errors():
        base, head = parse_range(revisions)
        repo = GitRepo(path)
        event_log = _open_for_reading(url, explicit=log_url is not None)
        name = "the log" if event_log is not None else f"the log at {url}"
        try:
            result = plan_change(repo, event_log, base, head, log_name=name)
        finally:
            if event_log is not None:
                event_log.close()
    rendered = RENDERERS[fmt](result)
    if output:
        try:
            Path(output).write_text(rendered if rendered.endswith("\n") else rendered + "\n")
        except OSError as e:
            fail(f"cannot write {output}: {e.strerror}")
        click.echo(summary_line(result))
    else:
        click.echo(rendered.rstrip("\n"))
    sys.exit(plan_exit_code(result))
