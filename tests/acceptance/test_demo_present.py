"""The demo lives in the present (issue 31, item 5): its history is dated just before it
is created, so the tour's own merge waits minutes, not a year; its solves read as GPUs
admitted and gap, the raw objective kept for --format json; its plan's two share tables
have two names; and run again after the tour's merge it says the pull request is merged."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.support.cluster_repo import git, gitsched

DAY_S = 86_400


def test_the_demo_and_its_tour_live_in_the_present(tmp_path: Path):
    directory = tmp_path / "gitsched-demo"
    before = time.time()
    first = gitsched("demo", directory, expect=0)

    # Dated relative to its creation, and the moment recorded in the repo.
    created = re.search(r"created-at: (\S+)", (directory / "DEMO.md").read_text())
    assert created is not None
    dates = [int(t) for t in git(directory, "log", "--all", "--format=%ct").split()]
    assert all(before - DAY_S < d <= time.time() for d in dates), dates
    assert git(directory, "status", "--porcelain") == ""

    # The solves as a person reads them; no raw objective value in the text.
    solves = first.stdout.split("== the ", 1)[1].split("\n\n", 1)[0]
    assert "GPUS ADMITTED" in solves and "GAP TO BOUND" in solves
    assert "OBJECTIVE" not in solves
    assert not re.search(r"\d{4,}\.\d\d", solves), solves
    # The plan's two share tables are told apart.
    assert first.stdout.count("FAIR SHARE") == 0
    assert "WEIGHTED SHARE" in first.stdout and "ENTITLED SHARE" in first.stdout
    assert "== open pull request pr/vision-quota, not merged" in first.stdout

    # The tour: merge the pull request now, reconcile.
    git(
        directory, "merge", "-q", "--no-ff", "pr/vision-quota", "-m", "Merge pr/vision-quota",
        "-m", "Approved-by: kai@vision.example",
    )  # fmt: skip
    gitsched("reconcile", "--once", directory, expect=0)
    history = gitsched(
        "audit", "history", "--repo", directory, "--job", "vision/video-gen", "--format", "json",
        expect=0,
    ).json()  # fmt: skip
    assert history and all(0 <= row["wait_s"] < DAY_S for row in history), history

    again = gitsched("demo", directory, expect=0)
    assert "open pull request" not in again.stdout
    assert "== pull request pr/vision-quota: merged into main" in again.stdout
    assert "0 events appended" in again.stdout

    # --format json: one document, with the raw objective and bound of every solve.
    doc = gitsched("demo", directory, "--format", "json", expect=0).json()
    assert doc["pull_request"] == {"branch": "pr/vision-quota", "state": "merged"}
    assert doc["created_at"] == created.group(1)
    assert doc["solves"] == [] or all("objective" in s for s in doc["solves"])
    fresh = gitsched("demo", tmp_path / "other", "--format", "json", expect=0).json()
    assert fresh["solves"] and all(
        {"objective", "bound", "gap", "gpus_admitted"} <= set(s) for s in fresh["solves"]
    )
    assert fresh["pull_request"]["state"] == "open"
