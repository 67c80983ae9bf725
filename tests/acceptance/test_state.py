"""`gitsched state --seq/--at`: the cluster as it was at an earlier point of the log."""

from __future__ import annotations

import pytest

from gitsched.engine.model import utc_time
from tests.support.cluster_repo import ANA, ClusterRepo, gitsched, job_yaml, read_events


@pytest.fixture
def two_runs(bootstrapped: ClusterRepo) -> tuple[ClusterRepo, int, str]:
    """Bootstrap reconciled in one run, a job submitted an hour later and reconciled in a
    later run; with the seq of the first run's last event and the first commit's time."""
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    first = read_events(bootstrapped.log_path)
    bootstrapped.write("teams/ml/jobs/train.yaml", job_yaml("train"))
    bootstrapped.commit("ml: train", author=ANA)
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    commit = next(e for e in reversed(first) if e.type == "CommitApplied")
    return bootstrapped, first[-1].seq, utc_time(commit.data["commit"]["committed_at"])


def test_state_at_a_seq_is_before_the_job_was_submitted(
    two_runs: tuple[ClusterRepo, int, str],
) -> None:
    repo, seq, _ = two_runs
    events = read_events(repo.log_path)
    submitted = next(e for e in events if e.type == "JobSubmitted")

    earlier = gitsched("state", "--repo", repo.path, "--seq", seq, "--format", "json").json()
    just_before = gitsched(
        "state", "--repo", repo.path, "--seq", submitted.seq - 1, "--format", "json"
    ).json()
    now = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()

    assert earlier["seq"] == seq and just_before["seq"] == submitted.seq - 1
    assert "ml/train" not in earlier["placements"] and "ml/train" not in earlier["pending"]
    assert "ml/train" not in just_before["placements"]
    assert now["seq"] == events[-1].seq
    assert "ml/train" in now["placements"]
    assert earlier["nodes"] == now["nodes"]
    text = gitsched("state", "--repo", repo.path, "--seq", seq, expect=0).stdout
    assert text.startswith(f"cluster test at seq {seq}: 4 nodes, 0/32 GPUs allocated, 0 jobs")
    empty = gitsched("state", "--repo", repo.path, "--seq", 0, "--format", "json", expect=0)
    assert empty.json()["seq"] == 0 and empty.json()["nodes"] == {}


def test_state_at_a_time_is_before_the_job_was_submitted(
    two_runs: tuple[ClusterRepo, int, str],
) -> None:
    repo, seq, time = two_runs

    at_time = gitsched("state", "--repo", repo.path, "--at", time, "--format", "json", expect=0)
    assert at_time.json()["seq"] == seq
    assert at_time.json()["placements"] == {}
    same_moment = time.replace("Z", "+00:00")
    assert (
        gitsched("state", "--repo", repo.path, "--at", same_moment, "--format", "json").json()[
            "seq"
        ]
        == seq
    )
    before_everything = gitsched(
        "state", "--repo", repo.path, "--at", "2000-01-01T00:00:00", "--format", "json", expect=0
    ).json()
    assert before_everything["seq"] == 0 and before_everything["cluster"] is None
    far_future = gitsched(
        "state", "--repo", repo.path, "--at", "2999-01-01T00:00:00Z", "--format", "json"
    ).json()
    assert "ml/train" in far_future["placements"]


def test_state_usage_errors(two_runs: tuple[ClusterRepo, int, str]) -> None:
    repo, seq, time = two_runs
    both = gitsched("state", "--repo", repo.path, "--seq", seq, "--at", time, expect=2)
    assert "not both" in both.stderr
    garbage = gitsched("state", "--repo", repo.path, "--at", "yesterday", expect=2)
    assert "is not an ISO-8601 time" in garbage.stderr
    gitsched("state", "--repo", repo.path, "--seq", "five", expect=2)
