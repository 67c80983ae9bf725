"""`gitsched bench kube` on the real API server: one JSON document, every pod bound, nothing left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gitsched.cluster.api import KubeApi
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from tests.support.cluster_repo import gitsched
from tests.support.kube import ENV_VAR

SCRIPTS_KUBE = Path(__file__).resolve().parents[2] / "scripts" / "kube"

pytestmark = pytest.mark.kube


def test_bench_kube_binds_every_pod_and_cleans_up(kube_api: KubeApi) -> None:
    before = {n["metadata"]["name"] for n in kube_api.list("nodes").items}
    run = gitsched(
        "bench", "kube", "--kubeconfig", os.environ[ENV_VAR], "--nodes", "4", "--format", "json"
    )
    assert run.returncode == 0, str(run)
    (result,) = run.json()
    assert (result["nodes"], result["pods"], result["gangs"], result["jobs"]) == (4, 4, 0, 4)
    # No Policy in the repo: the built-in one decides (the product's default, the MILP).
    assert result["solver"] == policy_of(default_policy()).solver == "highs"
    assert result["commit_to_all_bound_s"] > 0 and result["pods_bound_per_s"] > 0
    # A solve of 4 jobs rounds to 0 ms; deciding (reading the files, appending) does not.
    assert 0 <= result["solve_s"] <= result["commit_to_decided_s"]
    assert 0 < result["commit_to_decided_s"] < result["commit_to_all_bound_s"]
    assert 0 < result["actuation_p50_s"] <= result["actuation_p99_s"]
    assert result["peak_rss_mib"] > 0
    # Every job is new: nothing runs that could move, and nothing is lost.
    assert (result["moved"], result["lost_gpu_hours"]) == (0, 0.0)
    assert {n["metadata"]["name"] for n in kube_api.list("nodes").items} == before


def test_bench_kube_beside_kube_scheduler_binds_the_same_pods_both_ways(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    binary = SCRIPTS_KUBE.parent.parent / ".cache" / "kube" / "bin" / "kube-scheduler"
    if not binary.exists():
        build = subprocess.run(
            [str(SCRIPTS_KUBE), "build-scheduler"], capture_output=True, text=True
        )
        assert build.returncode == 0, build.stderr
        binary = Path(build.stdout.strip())
    before = {n["metadata"]["name"] for n in kube_api.list("nodes").items}
    run = gitsched(
        "bench",
        "kube",
        "--kubeconfig",
        os.environ[ENV_VAR],
        "--nodes",
        "4",
        "--gang",
        "2",
        "--fill",
        "1",
        "--solver",
        "greedy",
        "--kube-scheduler",
        str(binary),
        "--format",
        "json",
    )
    assert run.returncode == 0, str(run)
    (result,) = run.json()
    assert (result["pods"], result["gangs"], result["jobs"], result["solver"]) == (
        4,
        1,
        3,
        "greedy",
    )
    ks = result["kube_scheduler"]
    assert ks["pods"] == 4 and ks["pods_bound_per_s"] > 0 and ks["peak_rss_mib"] > 0
    assert 0 <= ks["latency_p50_s"] <= ks["latency_p99_s"]
    assert result["pods_per_s_ratio"] == round(
        result["pods_bound_per_s"] / ks["pods_bound_per_s"], 2
    )
    # Its pods, gitsched's and the nodes are gone again; no kube-scheduler is left running.
    assert {n["metadata"]["name"] for n in kube_api.list("nodes").items} == before
    assert not [
        p for p in kube_api.list("pods").items if p["metadata"]["namespace"].startswith("bench-")
    ]
