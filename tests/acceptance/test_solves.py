"""`audit solves`: whose plan each solve applied, and where greedy's replaced the MILP's."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

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


def test_a_solve_is_listed_at_its_commit_s_time_and_selected_by_it(repo: ClusterRepo) -> None:
    """`decided` is the fact time `--since/--until` select by (the commit's date), beside
    `time`, when the log recorded it (the reconciler's clock)."""
    repo.bootstrap()
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train", gpu=8))
    repo.commit("ml: a job", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    committed = int(
        subprocess.run(
            ["git", "-C", str(repo.path), "log", "-1", "--format=%ct"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    day = datetime.fromtimestamp(committed, UTC)
    rows = json.loads(gitsched("audit", "solves", "--repo", repo.path, "--format", "json").stdout)[
        "rows"
    ]
    assert rows[-1]["decided"] == day.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert rows[-1]["time"] != rows[-1]["decided"]  # recorded now, decided in the past
    since = day.strftime("%Y-%m-%dT%H:%M:%SZ")
    selected = json.loads(
        gitsched(
            "audit", "solves", "--repo", repo.path, "--since", since, "--format", "json"
        ).stdout
    )["rows"]
    assert [r["seq"] for r in selected] == [rows[-1]["seq"]]
