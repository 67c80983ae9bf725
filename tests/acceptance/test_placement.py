"""Placement as a team sees it through the CLI: pending reasons, withdrawals, quota changes."""

from __future__ import annotations

import csv
import io

from gitsched.exit_codes import EXIT_NOT_FOUND
from tests.support.cluster_repo import (
    ANA,
    LI,
    ClusterRepo,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
)


def test_a_gang_wider_than_any_nvlink_domain_stays_pending_with_the_domain_size(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/jobs/gang.yaml", job_yaml("gang", replicas=3, topology="nvlink"))
    sha = bootstrapped.commit("ml: a 3x8 gang in one NVLink domain", author=ANA)

    gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    state = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0).json()
    assert state["placements"] == {}
    pending = state["pending"]["ml/gang"]
    assert pending["constraint"] == "topology__ml/gang__nvlink"
    assert "in one nvlink domain" in pending["reason"]
    assert "the largest free nvlink domain holds 2 of the 3 replicas" in pending["reason"]
    text = gitsched("state", "--repo", bootstrapped.path, expect=0).stdout
    assert "ml/gang" in text.split("\nPending\n", 1)[1]
    [event] = of_type(read_events(bootstrapped.log_path), "JobPending")
    assert (event.cause, event.actor) == (sha, "solver")


def test_withdrawing_a_job_ends_its_placement_interval(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write("teams/ml/jobs/train.yaml", job_yaml("train", replicas=2))
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    running = gitsched(
        "audit", "history", "--repo", bootstrapped.path, "--job", "ml/train", "--format", "json"
    )
    # Not committed yet: the log never saw the job, which a history query calls a typo.
    assert running.returncode == EXIT_NOT_FOUND and "never saw job 'ml/train'" in running.stderr
    bootstrapped.commit("ml: train", author=ANA)
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    [interval] = gitsched(
        "audit", "history", "--repo", bootstrapped.path, "--job", "train", "--format", "json"
    ).json()
    assert (interval["state"], interval["end"], interval["replicas"]) == ("RUNNING", None, 2)
    assert interval["gpus"] == 16

    bootstrapped.remove("teams/ml/jobs/train.yaml")
    withdrawal = bootstrapped.commit("ml: withdraw train", author=ANA)
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)

    [ended] = gitsched(
        "audit", "history", "--repo", bootstrapped.path, "--job", "ml/train", "--format", "json"
    ).json()
    assert ended["state"] != "RUNNING"
    assert f"withdrawn in {withdrawal[:12]}" in ended["end_reason"]
    assert ended["start"] == interval["start"] and ended["end"] >= ended["start"]
    assert ended["end_seq"] > ended["start_seq"]
    by_node = gitsched(
        "audit",
        "history",
        "--repo",
        bootstrapped.path,
        "--node",
        ended["nodes"][0],
        "--format",
        "csv",
    ).stdout
    [row] = csv.DictReader(io.StringIO(by_node))
    assert (row["job"], row["end"], row["state"]) == ("ml/train", ended["end"], ended["state"])
    state = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0).json()
    assert state["placements"] == {} and state["pending"] == {}


def test_a_quota_raise_admits_a_pending_job(repo: ClusterRepo) -> None:
    repo.bootstrap()
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=8))
    repo.write("teams/ml/jobs/big.yaml", job_yaml("big", replicas=2))
    repo.commit("ml: a 2x8 job on a quota of 8", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    before = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()
    assert before["pending"]["ml/big"]["constraint"] == "quota__ml__h100-80g"
    assert "queue ml would use 16 of its 8 h100-80g GPUs" in before["pending"]["ml/big"]["reason"]

    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=16))
    raise_sha = repo.commit(
        "ml: quota 16",
        author=LI,
        trailers=[("Approved-by", "Priya Raman <priya@platform.example>")],
    )
    gitsched("reconcile", "--once", repo.path, expect=0)

    after = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()
    assert after["pending"] == {}
    assert len(after["placements"]["ml/big"]["replicas"]) == 2
    [interval] = gitsched(
        "audit", "history", "--repo", repo.path, "--team", "ml", "--format", "json"
    ).json()
    assert interval["job"] == "ml/big" and interval["start_reason"] == "admitted"
    [placed] = of_type(read_events(repo.log_path), "PlacementDecided")
    assert placed.cause == raise_sha
