"""`gitsched telemetry ingest`: a DCGM exporter scrape series into the log, an idle job
flagged and reclaimed, and the owner told why in `plan` and `audit`."""

from __future__ import annotations

import json

from tests.support.cluster_repo import (
    ANA,
    EPOCH,
    POLICY_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
)
from tests.support.telemetry import dcgm_series

RECLAIM = POLICY_YAML + "  idle: {action: reclaim, windowMinutes: 60, graceMinutes: 30}\n"


def test_an_idle_job_is_reclaimed_and_its_owner_sees_why(repo: ClusterRepo) -> None:
    repo.bootstrap()
    repo.write("policies/default.yaml", RECLAIM)
    repo.write("teams/ml/jobs/stuck.yaml", job_yaml("stuck", gpu=8))
    repo.commit("ml: a job that will sit idle", author=ANA)  # placed at EPOCH + 1 h
    gitsched("reconcile", "--once", repo.path, expect=0)
    state = json.loads(gitsched("state", "--repo", repo.path, "--format", "json").stdout)
    (node,) = {r["node"] for r in state["placements"]["ml/stuck"]["replicas"]}

    series = repo.path.parent / "dcgm.prom"
    series.write_text(dcgm_series(node, range(8), EPOCH + 3600, 100, 1))
    run = gitsched("telemetry", "ingest", series, "--repo", repo.path, "--format", "json", expect=0)
    summary = json.loads(run.stdout)
    assert summary["samples"] == 21 * 8 and summary["reports"] == 21
    assert [(i["job"], i["action"]) for i in summary["idle"]] == [("ml/stuck", "reclaim")]
    assert summary["placed_again_at_seq"] is not None

    state = json.loads(gitsched("state", "--repo", repo.path, "--format", "json").stdout)
    assert "ml/stuck" not in state["placements"]
    # Ingesting the same scrape again appends the reports, and flags nothing twice.
    again = json.loads(
        gitsched("telemetry", "ingest", series, "--repo", repo.path, "--format", "json").stdout
    )
    assert again["idle"] == []

    repo.write("teams/ml/jobs/other.yaml", job_yaml("other", gpu=8))
    repo.commit("ml: another job", author=ANA)
    plan = gitsched("plan", repo.path, "main~1..main", expect=None).stdout
    assert "Idle GPUs" in plan and "ml/stuck: idle: its GPUs stayed below 5% utilisation" in plan
    assert "stopped so waiting jobs get its GPUs" in plan

    history = gitsched("audit", "history", "--repo", repo.path, "--job", "ml/stuck").stdout
    assert "idle" in history


def test_a_scrape_without_gpu_utilisation_is_a_clear_error(repo: ClusterRepo) -> None:
    repo.bootstrap()
    gitsched("reconcile", "--once", repo.path, expect=0)
    empty = repo.path.parent / "empty.prom"
    empty.write_text('# TYPE DCGM_FI_DEV_SM_CLOCK gauge\nDCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980\n')
    run = gitsched("telemetry", "ingest", empty, "--repo", repo.path, expect=2)
    assert "no GPU utilisation samples" in run.stderr and "Traceback" not in run.stderr
