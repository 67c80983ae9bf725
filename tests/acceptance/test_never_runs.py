"""Say what cannot work (issue 31, item 4): a job no node set can ever hold says so in its
pending reason, in `reconcile`'s output and in `plan`; GPUs no queue's nominal quota
covers are a `validate` warning; `audit history` of a job never placed says so."""

from __future__ import annotations

import pytest

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    gitsched,
    job_yaml,
    log_state,
    queue_yaml,
)

WIDE_REASON = (
    "can never run: no node of flavor h100-80g has 16 GPUs (the largest has 8);"
    " the cluster has 32 h100-80g GPUs in all"
)


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_a_job_larger_than_any_node_says_it_can_never_run(bootstrapped: ClusterRepo, solver):
    repo = bootstrapped
    gitsched("reconcile", "--once", repo.path, expect=0)
    base = repo.head()
    repo.write("teams/ml/jobs/wide.yaml", job_yaml("wide", gpu=16))
    repo.write("teams/ml/jobs/gang.yaml", job_yaml("gang", replicas=5))
    repo.write("teams/ml/jobs/fine.yaml", job_yaml("fine"))
    repo.commit("ml: three jobs", author=ANA)

    plan = gitsched("plan", repo.path, f"{base}..HEAD", "--format", "json")
    assert plan.returncode == 1, str(plan)
    run = gitsched("reconcile", "--once", repo.path, "--solver", solver, expect=0)
    assert f"warning: job ml/wide {WIDE_REASON}" in run.stdout
    assert (
        "warning: job ml/gang can never run: its smallest gang needs 40 GPUs and the cluster"
        " has 32 h100-80g GPUs in all"
    ) in run.stdout
    assert "ml/fine" not in run.stdout.split("applied", 1)[1].split("event(s)")[0]
    pending = log_state(repo.log_path)["pending"]
    assert pending["ml/wide"]["reason"] == WIDE_REASON, pending
    assert pending["ml/wide"]["constraint"].startswith("never-runs")
    assert WIDE_REASON in plan.stdout  # plan = reconcile

    history = gitsched("audit", "history", "--job", "wide", "--repo", repo.path, expect=0)
    assert "ml/wide: never placed; pending since 2025-11-16T10:00:00" in history.stdout
    assert WIDE_REASON in history.stdout
    as_json = gitsched(
        "audit", "history", "--job", "wide", "--repo", repo.path, "--format", "json", expect=0
    ).json()
    assert as_json[0]["placed"] is False and as_json[0]["reason"] == WIDE_REASON
    # A job that did run keeps its table.
    ran = gitsched("audit", "history", "--job", "fine", "--repo", repo.path, expect=0)
    assert "never placed" not in ran.stdout and "h100-" in ran.stdout


def test_the_node_set_a_job_may_use_is_its_isolation_and_residency(bootstrapped: ClusterRepo):
    repo = bootstrapped
    repo.write("teams/ml/jobs/iso.yaml", job_yaml("iso") + "  isolation: dedicated\n")
    repo.write("teams/ml/jobs/far.yaml", job_yaml("far") + "  residency: [us-east]\n")
    repo.write("teams/ml/jobs/near.yaml", job_yaml("near", replicas=5) + "  residency: [eu-west]\n")
    repo.commit("ml: jobs no node set they may use can hold", author=ANA)
    validate = gitsched("validate", repo.path, expect=0).stdout
    run = gitsched("reconcile", "--once", repo.path, expect=0).stdout
    for says in (
        "job ml/iso can never run: no dedicated node of flavor h100-80g",
        "job ml/far can never run: no node of flavor h100-80g in us-east",
        "job ml/near can never run: its smallest gang needs 40 GPUs and the cluster has 32"
        " h100-80g GPUs in eu-west in all",
    ):
        assert f"warning: {says}" in run, run
        name = says.split()[1].split("/")[1]
        assert f"job '{name}' {says.split(' ', 2)[2]}" in validate, validate


def test_gpus_no_queue_covers_are_a_validate_warning(bootstrapped: ClusterRepo):
    repo = bootstrapped
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=24))
    repo.commit("ml: nominal 24 of 32")
    run = gitsched("validate", repo.path, expect=0)
    assert "8 h100-80g GPUs of the cluster's 32 are in no queue's nominal quota" in run.stdout, (
        run.stdout
    )
    assert "[gpus-uncovered]" in run.stdout
    repo.write("teams/nlp/queue.yaml", queue_yaml("nlp", nominal=8))
    repo.commit("nlp: the other 8")
    assert "gpus-uncovered" not in gitsched("validate", repo.path, expect=0).stdout
