"""The CLI tells the truth (issue 31, items 3 and 6): what a rejection's message points
to judges it, `validate` outside a cluster repo says so, `state` takes PATH, and
`audit changes` fits 120 columns."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    H,
    gitsched,
    job_yaml,
    queue_yaml,
)

OWNED_POLICY = (
    H
    + """kind: Policy
metadata:
  name: default
spec:
  solver: {name: greedy}
  approval: {requireOwnerApproval: true}
"""
)


def test_a_rejection_names_a_command_that_judges_it(bootstrapped: ClusterRepo):
    repo = bootstrapped
    repo.write_all({"policies/default.yaml": OWNED_POLICY, "teams/ml/OWNERS": "ana@ml.example\n"})
    repo.commit("ml: owners")
    gitsched("reconcile", "--once", repo.path, expect=0)
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=40))
    repo.commit("ml: nominal 40, unapproved")  # by Priya, who owns nothing
    gitsched("reconcile", "--once", repo.path, expect=1)

    again = gitsched("reconcile", "--once", repo.path, expect=1)
    assert "stays REJECTED" in again.output
    assert "validate --rev HEAD" not in again.output  # validate does not judge approvals
    assert "`gitsched plan HEAD` judges the approvals again" in again.output
    assert "[approval]" in again.output  # the findings themselves, from the log
    # And the command named does judge them.
    plan = gitsched("plan", repo.path, "HEAD", "--format", "json")
    (ml,) = plan.json()["approvals"]["teams"]
    assert ml["team"] == "ml" and ml["satisfied"] is False
    # validate, which reads files only, still says the files are valid.
    gitsched("validate", repo.path, "--rev", "HEAD", expect=0)


def test_a_file_rejection_still_points_to_validate(bootstrapped: ClusterRepo):
    repo = bootstrapped
    repo.write("teams/ml/jobs/bad.yaml", job_yaml("bad").replace("replicas: 1", "replicas: x"))
    repo.commit("ml: a bad job")
    gitsched("reconcile", "--once", repo.path, expect=1)
    again = gitsched("reconcile", "--once", repo.path, expect=1)
    assert "`gitsched validate --rev HEAD` checks the files again" in again.output
    assert "teams/ml/jobs/bad.yaml" in again.output
    gitsched("validate", repo.path, "--rev", "HEAD", expect=1)


def test_validate_outside_a_cluster_repo_says_so(tmp_path: Path):
    folder = tmp_path / "project"
    (folder / ".venv" / "lib").mkdir(parents=True)
    (folder / ".venv" / "lib" / "x.yaml").write_text("a: 1\n")
    (folder / "ci.yaml").write_text("jobs: {}\n")
    run = gitsched("validate", folder, expect=2)
    assert "no cluster.yaml here" in run.output
    assert run.output.count("\n") <= 2
    assert "no cluster.yaml here" in gitsched("validate", cwd=folder, expect=2).output


def test_state_takes_the_repo_as_path_like_every_command(bootstrapped: ClusterRepo):
    repo = bootstrapped
    gitsched("reconcile", "--once", repo.path, expect=0)
    by_path = gitsched("state", repo.path, "--format", "json", expect=0).json()
    by_option = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()
    assert by_path == by_option
    assert by_path["last_commit"] == repo.head()
    assert (
        gitsched("state", repo.path, expect=0).stdout
        == gitsched("state", cwd=repo.path, expect=0).stdout
    )


def test_audit_changes_text_fits_120_columns(bootstrapped: ClusterRepo):
    repo = bootstrapped
    gitsched("reconcile", "--once", repo.path, expect=0)
    long = "a-team-with-a-rather-long-name-" + "x" * 30
    repo.write(f"teams/{long}/queue.yaml", queue_yaml("longq", nominal=8))
    for i in range(6):
        repo.write(f"teams/{long}/jobs/job-{i}-with-a-long-name.yaml", job_yaml(f"job-{i}-long"))
    repo.commit("a long team with six jobs, " + "and a long subject " * 5, author=ANA)
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=16))
    repo.commit("ml: nominal 16")
    gitsched("reconcile", "--once", repo.path, expect=0)

    text = gitsched("audit", "changes", "--repo", repo.path, expect=0).stdout
    lines = text.rstrip("\n").split("\n")
    assert len(lines) >= 4
    assert max(len(line) for line in lines) <= 120, text
    assert "APPROVAL" in lines[0] and "CAUSED" in lines[0]
    wide = gitsched("audit", "changes", "--repo", repo.path, "--wide", expect=0).stdout
    assert max(len(line) for line in wide.split("\n")) > 120
    assert "COMMITTER" in wide.split("\n")[0]
    rows = gitsched("audit", "changes", "--repo", repo.path, "--format", "json", expect=0).json()
    assert any(long in r["target"] or long == r["team"] for r in rows)
