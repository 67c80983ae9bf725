"""`audit solves`: whose plan each solve applied, and where greedy's replaced the MILP's."""

from __future__ import annotations

import json

from tests.support.cluster_repo import ANA, POLICY_YAML, ClusterRepo, gitsched, job_yaml


def test_the_builtin_policy_solves_with_the_milp_and_audit_lists_each_solve(
    repo: ClusterRepo,
) -> None:
    repo.bootstrap()
    # Drop the pinned greedy: the cluster runs the built-in policy.
    repo.write("policies/default.yaml", POLICY_YAML.replace("  solver: {name: greedy}\n", "  {}\n"))
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train", replicas=2, topology="nvlink"))
    repo.commit("ml: a training gang under the built-in policy", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    rows = json.loads(
        gitsched("audit", "solves", "--repo", repo.path, "--format", "json", expect=0).stdout
    )["rows"]
    # The bootstrap commit pinned greedy: its plan is greedy's, asked for, not a fallback.
    assert [(r["solver"], r["plan_source"], r["fallback"]) for r in rows[:1]] == [
        ("greedy", "greedy", None)
    ]
    assert rows[-1]["solver"] == "highs"
    assert rows[-1]["plan_source"] == "milp" and rows[-1]["fallback"] is None
    assert rows[-1]["bound"] is not None and rows[-1]["gap_pct"] is not None
    fallbacks = json.loads(
        gitsched("audit", "solves", "--fallbacks", "--repo", repo.path, "--format", "json").stdout
    )["rows"]
    assert fallbacks == []
