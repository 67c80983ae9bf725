"""`gitsched bench kube` on the real API server: one JSON document, every pod bound, nothing left behind."""

from __future__ import annotations

import os

import pytest

from cluster.api import KubeApi
from tests.acceptance.conftest import gitsched
from tests.kube.conftest import ENV_VAR

pytestmark = pytest.mark.kube


def test_bench_kube_binds_every_pod_and_cleans_up(kube_api: KubeApi) -> None:
    before = {n["metadata"]["name"] for n in kube_api.list("nodes").items}
    run = gitsched(
        "bench", "kube", "--kubeconfig", os.environ[ENV_VAR], "--nodes", "4", "--format", "json"
    )
    assert run.returncode == 0, str(run)
    (result,) = run.json()
    assert (result["nodes"], result["pods"], result["gangs"], result["jobs"]) == (4, 4, 0, 4)
    assert result["commit_to_all_bound_s"] > 0 and result["pods_bound_per_s"] > 0
    assert 0 < result["actuation_p50_s"] <= result["actuation_p99_s"]
    assert result["peak_rss_mib"] > 0
    assert {n["metadata"]["name"] for n in kube_api.list("nodes").items} == before
