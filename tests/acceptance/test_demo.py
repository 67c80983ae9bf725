"""`gitsched demo`: a new user's first command must build, reconcile and explain a real cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.cluster_repo import Run, assert_chain_intact, git, gitsched, read_events


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    directory = tmp_path_factory.mktemp("demo") / "cluster"
    return directory, gitsched("demo", directory, expect=0)


def test_demo_builds_a_real_git_history_with_several_authors(demo: tuple[Path, Run]) -> None:
    directory, _ = demo
    assert int(git(directory, "rev-list", "--count", "main")) >= 10
    authors = set(git(directory, "log", "--format=%ae", "main").split())
    assert len(authors) >= 3
    assert git(directory, "status", "--porcelain") == "", "the demo leaves a clean work tree"


def test_demo_output_names_the_rejected_commit_with_file_and_line(demo: tuple[Path, Run]) -> None:
    _, run = demo
    rejected = re.search(r"^REJECTED (\w+) .*\n((?:\s+\S.*\n)+)", run.stdout, re.MULTILINE)
    assert rejected, run.stdout
    errors = [line.strip() for line in rejected.group(2).splitlines()]
    assert errors
    for line in errors:
        assert re.match(r"teams/\w+/jobs/[\w-]+\.yaml:\d+:\d+: \$\.spec\.\S+: ", line), line


def test_demo_shows_placements_and_a_pending_job_with_its_reason(demo: tuple[Path, Run]) -> None:
    directory, run = demo
    assert "\nPlacements\n" in run.stdout
    assert "\nPending\n" in run.stdout
    state = gitsched("state", "--repo", directory, "--format", "json", expect=0).json()
    assert state["placements"]
    assert state["pending"]
    for job, pending in state["pending"].items():
        assert pending["reason"].strip(), f"{job} is pending without a reason"
        assert job in run.stdout and pending["reason"][:40] in run.stdout


def test_demo_log_verifies_and_a_second_demo_run_appends_nothing(demo: tuple[Path, Run]) -> None:
    directory, _ = demo
    verified = gitsched("audit", "verify", "--repo", directory, expect=0)
    assert verified.stdout.startswith("ok: ")
    before = read_events(directory / ".gitsched" / "log.db")
    assert_chain_intact(before)

    again = gitsched("demo", directory, expect=0)

    assert "0 events appended" in again.stdout
    assert read_events(directory / ".gitsched" / "log.db") == before


def test_the_commands_the_demo_suggests_work(demo: tuple[Path, Run]) -> None:
    directory, run = demo
    suggested = re.search(r"gitsched validate \S+ --rev (\S+)", run.stdout)
    assert suggested, run.stdout
    rev = suggested.group(1)
    invalid = gitsched("validate", directory, "--rev", rev, expect=1)
    assert "vit-sweep.yaml:" in invalid.stdout
    history = gitsched(
        "audit", "history", "--repo", directory, "--job", "nlp/moe-gang", "--format", "json"
    )
    assert history.returncode == 0 and history.json(), history


def test_demo_ends_by_saying_how_to_open_the_console(demo: tuple[Path, Run]) -> None:
    directory, run = demo
    tail = run.stdout.strip().splitlines()[-1]
    assert f"gitsched console --repo {directory}" in tail
    assert "http://127.0.0.1:8080/" in tail
