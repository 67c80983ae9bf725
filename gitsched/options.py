"""Options, output and error handling shared by every gitsched command."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from gitsched.config import resolve_log_url, snapshot_dir
from gitsched.engine.errors import GitschedError
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog, EventLogError
from gitsched.exit_codes import EXIT_ERROR
from gitsched.render import table

LOG_OPTION_HELP = (
    "Event log URL: sqlite:///relative.db, sqlite:////absolute.db or kafka://host:port/topic "
    "[default: REPO/.gitsched/log.db]"
)


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"gitsched: {message}", err=True)
    sys.exit(code)


def broken_chain_message(seq: int, reason: str) -> str:
    return (
        f"the log's hash chain is broken at seq {seq}: {reason}; what it says cannot be"
        " trusted (`gitsched log verify` names the break)"
    )


@contextmanager
def user_errors() -> Iterator[None]:
    """Our own errors become one line and exit 2; anything else is a bug and keeps its traceback."""
    try:
        yield
    except (GitschedError, EventLogError) as e:
        fail(str(e))


def log_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--log", "log_url", envvar="GITSCHED_LOG", show_envvar=True, help=LOG_OPTION_HELP
    )(f)


# One --format vocabulary across the CLI: text (for people; the default), csv, json,
# markdown, yaml where a command offers them. Earlier spellings stay accepted.
FORMAT_ALIASES = {"table": "text"}


class FormatChoice(click.Choice):  # type: ignore[type-arg]
    """A format name, or an earlier spelling of one (`table` is `text`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(FORMAT_ALIASES.get(value, value), param, ctx)


def format_option(*choices: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--format",
        "fmt",
        type=FormatChoice(choices),
        default=choices[0],
        show_default=True,
        help="Output format.",
    )


def open_event_log(log_url: str | None, repo: str | None) -> EventLog:
    """An existing log, for commands that only read: a mistyped path is an error, not an empty cluster."""
    return open_log(resolve_log_url(log_url, repo), create=False, snapshot_dir=snapshot_dir(repo))


def repo_path(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--repo PATH`, the convention of every command, for commands that also take the
    repo as their first argument (the earlier spelling): `repo_of` picks one."""
    f = click.option(
        "--repo",
        "repo_opt",
        type=click.Path(exists=True, file_okay=False),
        help="The cluster repo (default: the current directory); also accepted as PATH.",
    )(f)
    return click.argument("path", required=False, type=click.Path(exists=True, file_okay=False))(f)


def repo_of(path: str | None, repo_opt: str | None) -> str:
    if path is not None and repo_opt is not None and path != repo_opt:
        fail(f"give the repo once: PATH {path!r} or --repo {repo_opt!r}")
    return path or repo_opt or "."


def repo_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--repo", default=".", show_default=True, help="Cluster repo whose default log to read."
    )(f)


def emit_rows(rows: list[dict[str, Any]], headers: list[str], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    elif fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=headers, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: (" ".join(v) if isinstance(v, list) else v) for k, v in row.items()}
            )
        click.echo(buffer.getvalue().rstrip("\n"))
    else:
        click.echo(
            table([h.upper() for h in headers], [[cell(r.get(h)) for h in headers] for r in rows])
        )


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


class LazyGroup(click.Group):
    """A command group whose subcommands live in their own modules, imported when used.

    `lazy` maps a command name to "module:attribute"; a module that is not there
    (an optional part not installed) simply does not list its command.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def _load(self, name: str) -> click.Command | None:
        import importlib
        import importlib.util

        module_name, attribute = self.lazy[name].split(":")
        if importlib.util.find_spec(module_name) is None:
            return None
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n in self.lazy if self._load(n) is not None)
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)


def point_in_time(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--at TIME | --seq N`: one spelling of a moment in the log for `state` and `audit at`."""
    f = click.option(
        "--seq", type=click.IntRange(min=0), metavar="N", help="Right after event N (its seq)."
    )(f)
    return click.option(
        "--at", "at_time", metavar="TIME", help="At this time (ISO-8601, UTC if no zone)."
    )(f)


def parse_time(text: str, option: str = "--at") -> datetime:
    """An ISO-8601 time as the CLI reads every one: `Z` or an offset, UTC if no zone."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} {text!r} is not an ISO-8601 time (e.g. 2025-11-16 or 2025-11-16T10:00:00Z)")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
