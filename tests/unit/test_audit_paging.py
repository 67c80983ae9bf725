"""`audit changes`, `audit compliance` and `audit solves` read a page at the cost of the page.

- without paging options the listing is complete, and says nothing on stderr;
- pages of any --limit, each started with the --after-seq the last one's note named,
  add up to the complete listing, nothing skipped or repeated (also where one commit
  changes more things than --limit, or violations share a seq);
- --since/--until keep what happened in [since, until) by fact time.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gitsched.cli import main
from gitsched.simulation.history import synthetic_log


@cache
def built(root: str) -> Path:
    directory = Path(root)
    synthetic_log(directory / "log.db", 6000, 5)
    return directory


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(str(tmp_path_factory.mktemp("paging")))


def run(logdir: Path, *args: str) -> tuple[Any, str]:
    argv = ["audit", *args, "--log", f"sqlite:///{logdir / 'log.db'}", "--db"]
    argv += [str(logdir / "audit.db"), "--repo", str(logdir), "--format", "json"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout), result.stderr


def paged(logdir: Path, command: str, limit: int) -> tuple[list[Any], int]:
    """Every page of `command` at `limit`, following the notes; and how many pages."""
    out: list[Any] = []
    after, pages = 0, 0
    while True:
        doc, err = run(logdir, command, "--limit", str(limit), "--after-seq", str(after))
        pages += 1
        key = {"compliance": "violations", "solves": "rows"}.get(command)
        listed = doc if key is None else doc[key]
        out += listed
        note = re.search(r"rerun with --after-seq (\d+)", err)
        if command != "changes":
            assert doc["truncated"] == (note is not None)
        if note is None:
            return out, pages
        assert len(listed) <= limit or len({seq_of(r) for r in listed}) == 1
        after = int(note.group(1))
        assert after == seq_of(listed[-1])


def seq_of(row: dict[str, Any]) -> int:
    return int(row.get("applied_seq", row.get("seq", 0)))


@pytest.mark.parametrize("limit", [1, 5, 13, 1000])
def test_pages_add_up_to_the_complete_changes(logdir: Path, limit: int) -> None:
    complete, err = run(logdir, "changes")
    assert err == "" and len(complete) == 52
    pages, count = paged(logdir, "changes", limit)
    assert pages == complete
    assert (count > 1) == (limit < 52)


@pytest.mark.parametrize("limit", [1, 4, 1000])
def test_pages_add_up_to_the_complete_violations(logdir: Path, limit: int) -> None:
    complete, err = run(logdir, "compliance")
    assert err == "" and "truncated" not in complete
    pages, count = paged(logdir, "compliance", limit)
    assert pages == complete["violations"]
    assert (count > 1) == (limit < len(complete["violations"]))
    first, _ = run(logdir, "compliance", "--limit", str(limit))
    # the checks count every violation, listed or not
    assert first["checks"] == complete["checks"] and first["ok"] == complete["ok"]


@pytest.mark.parametrize("limit", [1, 300, 5000])
def test_pages_add_up_to_every_solve(logdir: Path, limit: int) -> None:
    complete, err = run(logdir, "solves")
    assert err == "" and "truncated" not in complete and len(complete["rows"]) > 1000
    if limit == 1:  # a page a solve is slow through the CLI: the first pages, then the rest
        first, err = run(logdir, "solves", "--limit", "1")
        assert first["rows"] == complete["rows"][:1] and first["truncated"]
        assert "--after-seq " + str(first["rows"][0]["seq"]) in err
        return
    pages, count = paged(logdir, "solves", limit)
    assert pages == complete["rows"]
    assert (count > 1) == (limit < len(complete["rows"]))


def test_since_and_until_keep_the_changes_merged_in_the_period(logdir: Path) -> None:
    complete, _ = run(logdir, "changes")
    merged = sorted({r["merged"] for r in complete})
    since, until = merged[1], merged[-2]
    window, _ = run(logdir, "changes", "--since", since, "--until", until)
    assert window == [r for r in complete if since <= r["merged"] < until]
    assert 0 < len(window) < len(complete)
