"""One convention across the CLI: `--repo PATH` names the cluster repo everywhere, and
`--format` speaks one vocabulary (text, csv, json, markdown, yaml), earlier spellings kept."""

from __future__ import annotations

from collections.abc import Iterator

import click

from gitsched.cli import main
from tests.support.cluster_repo import ClusterRepo, gitsched

FORMATS = {"text", "csv", "json", "markdown", "yaml"}


def commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), command


def option(command: click.Command, flag: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and flag in p.opts), None)


def test_every_format_option_speaks_one_vocabulary() -> None:
    for name, command in commands(main):
        found = option(command, "--format")
        if found is None:
            continue
        assert isinstance(found.type, click.Choice), name
        assert set(found.type.choices) <= FORMATS, (name, found.type.choices)
        assert found.default == found.type.choices[0], name


def test_every_command_that_reads_a_repo_takes_repo() -> None:
    # Those with a PATH argument (the earlier spelling) and those that read a repo's
    # log; bench commands make logs of their own, and plan is run below.
    readers = {
        name: command
        for name, command in commands(main)
        if any(isinstance(p, click.Argument) and p.name == "path" for p in command.params)
        or (option(command, "--log") is not None and not name.startswith(("bench", "plan")))
    }
    assert {"validate", "reconcile", "state", "audit history", "log info"} <= set(readers)
    assert [n for n, c in readers.items() if option(c, "--repo") is None] == []


def test_repo_as_an_option_or_as_the_first_argument(reconciled: ClusterRepo) -> None:
    path = str(reconciled.path)
    assert gitsched("validate", "--repo", path, expect=0).stdout == "valid: 5 documents\n"
    assert gitsched("validate", path, expect=0).stdout == "valid: 5 documents\n"
    gitsched("reconcile", "--once", "--repo", path, expect=0)
    for args in (("plan", "--repo", path, "HEAD"), ("plan", path, "HEAD")):
        assert "Plan: no changes." in gitsched(*args, expect=0).stdout
    both = gitsched("validate", path, "--repo", str(reconciled.path.parent), expect=2)
    assert "give the repo once" in both.stderr


def test_table_is_still_understood_as_text(reconciled: ClusterRepo) -> None:
    history = ("audit", "history", "--team", "ml", "--repo", reconciled.path)
    assert (
        gitsched(*history, "--format", "table", expect=0).stdout
        == gitsched(*history, "--format", "text", expect=0).stdout
    )
