"""`gitsched bench reconcile`: a real repo of the synthetic cluster, reconciled commit by commit."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cluster_repo import gitsched, read_events


def test_each_commit_of_new_jobs_is_one_append_placed_by_an_incremental_solve(
    tmp_path: Path,
) -> None:
    log = tmp_path / "bench.db"
    run = gitsched(
        "bench", "reconcile", "--size", "S", "--commits", "2", "--jobs", "6",
        "--log", f"sqlite:///{log}", "--format", "json", expect=0,
    )  # fmt: skip

    result = json.loads(run.stdout)
    first, *later = result["passes"]
    assert (first["commit"], first["jobs_added"]) == (0, 300)
    assert [p["jobs_added"] for p in later] == [6, 6]
    assert all(p["solver"] == "highs" and p["seconds"] >= p["solve_seconds"] for p in later)
    assert result["p50_seconds"] > 0 and result["first_commit_seconds"] > 0
    events = read_events(log)
    assert sum(p["events"] for p in result["passes"]) == len(events)
    # The last commit: its 6 jobs, the commit, then the solve's answer for those 6 (placed,
    # or waiting, or a job they preempt), and of the waiting jobs it retried only those it
    # placed (one that still waits keeps its reason): no word about the others.
    last = events[-later[-1]["events"] :]
    submitted = [e.data["job"]["name"] for e in last if e.type == "JobSubmitted"]
    assert sorted(submitted) == [f"new002-{i:03d}" for i in range(6)]
    assert last[6].type == "CommitApplied" and last[-1].type == "SolveCompleted"
    answered = {
        e.data["job"].split("/")[1]: e.type
        for e in last[7:-1]
        if e.type in ("PlacementDecided", "JobPending")
    }
    assert set(submitted) <= answered.keys()
    retried = {job: kind for job, kind in answered.items() if job not in submitted}
    assert set(retried.values()) <= {"PlacementDecided"}
    assert all(e.type in ("PlacementDecided", "JobPending", "JobPreempted") for e in last[7:-1])


def test_a_kept_workdir_is_reused_and_its_commits_go_on_top(tmp_path: Path) -> None:
    args = ("bench", "reconcile", "--size", "S", "--commits", "1", "--jobs", "4")
    args += ("--workdir", str(tmp_path / "work"), "--format", "json")
    first = json.loads(gitsched(*args, expect=0).stdout)
    again = json.loads(gitsched(*args, expect=0).stdout)

    assert first["first_pass"] == "first commit" and again["first_pass"] == "restart"
    assert [p["commit"] for p in first["passes"]] == [0, 1]
    # The restart's pass commits too (a new reconciler reads every file again), untimed.
    assert [(p["commit"], p["jobs_added"]) for p in again["passes"]] == [(2, 4), (3, 4)]
    events = read_events(tmp_path / "work" / "log.db")
    names = sorted(e.data["job"]["name"] for e in events if e.type == "JobSubmitted")
    assert [n for n in names if n.startswith("new")] == [
        f"new{c:03d}-{i:03d}" for c in (1, 2, 3) for i in range(4)
    ]
