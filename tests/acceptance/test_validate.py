"""`gitsched validate`: every error in every file at once, located by file, line and JSON path."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_repo import (
    MINIMAL_CLUSTER,
    POOL_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    queue_yaml,
)

# Four files, five schema errors: (file, line, column, JSON path).
BROKEN_FILES = {
    "inventory/pool.yaml": POOL_YAML.replace("count: 4", "count: four").replace(
        "gpus: 8", "gpus: 8, gpuz: 1"
    ),
    "teams/ml/queue.yaml": queue_yaml(extra="  colour: blue\n"),
    "teams/ml/jobs/a.yaml": job_yaml("a").replace("replicas: 1", "replicas: -2"),
    "teams/ml/jobs/b.yaml": job_yaml("B_bad"),
}
EXPECTED_ERRORS = [
    ("inventory/pool.yaml", 6, 3, "$.spec.count"),
    ("inventory/pool.yaml", 8, 41, "$.spec.template.gpuz"),
    ("teams/ml/jobs/a.yaml", 6, 3, "$.spec.replicas"),
    ("teams/ml/jobs/b.yaml", 4, 3, "$.metadata.name"),
    ("teams/ml/queue.yaml", 8, 3, "$.spec.colour"),
]


def test_a_valid_repo_is_valid(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write("teams/ml/jobs/train.yaml", job_yaml("train"))
    run = gitsched("validate", bootstrapped.path, expect=0)
    assert run.stdout.strip() == "valid: 5 documents"
    assert gitsched("validate", bootstrapped.path, "--format", "json", expect=0).json() == {
        "valid": True,
        "errors": [],
        "warnings": [],
    }


def test_validate_defaults_to_the_current_directory(bootstrapped: ClusterRepo) -> None:
    gitsched("validate", cwd=bootstrapped.path, expect=0)
    bootstrapped.write("teams/ml/jobs/a.yaml", BROKEN_FILES["teams/ml/jobs/a.yaml"])
    run = gitsched("validate", cwd=bootstrapped.path, expect=1)
    assert "teams/ml/jobs/a.yaml:6:3: $.spec.replicas: " in run.stdout


def test_every_error_in_every_file_is_reported_at_once(repo: ClusterRepo) -> None:
    repo.write_all({**MINIMAL_CLUSTER, **BROKEN_FILES})

    run = gitsched("validate", repo.path, expect=1)

    lines = run.stdout.strip().splitlines()
    assert lines[-1] == "5 error(s) in 4 file(s)"
    assert len(lines) == 6
    for (file, line, column, path), text in zip(EXPECTED_ERRORS, lines, strict=False):
        assert text.startswith(f"{file}:{line}:{column}: {path}: "), text
        assert text.endswith("[schema]")
    assert "found 'four'" in run.stdout
    assert "did you mean 'gpus'?" in run.stdout


def test_every_error_is_reported_as_json(repo: ClusterRepo) -> None:
    repo.write_all({**MINIMAL_CLUSTER, **BROKEN_FILES})

    report = gitsched("validate", repo.path, "--format", "json", expect=1).json()

    assert report["valid"] is False
    found = [(e["file"], e["line"], e["column"], e["path"]) for e in report["errors"]]
    assert found == EXPECTED_ERRORS
    assert all(e["message"] and e["code"] == "schema" for e in report["errors"])


def test_reference_errors_across_files_are_all_reported(repo: ClusterRepo) -> None:
    repo.write_all(MINIMAL_CLUSTER)
    repo.write("teams/ml/jobs/a.yaml", job_yaml("a", queue="nope"))
    repo.write("teams/cv/jobs/b.yaml", job_yaml("b", flavors=["b200"], priority="urgent"))

    report = gitsched("validate", repo.path, "--format", "json", expect=1).json()

    found = {(e["file"], e["line"], e["path"], e["code"]) for e in report["errors"]}
    assert found == {
        ("teams/ml/jobs/a.yaml", 8, "$.spec.queue", "reference"),
        ("teams/cv/jobs/b.yaml", 5, "$.spec", "reference"),
        ("teams/cv/jobs/b.yaml", 8, "$.spec.gpuFlavors[0]", "reference"),
        ("teams/cv/jobs/b.yaml", 9, "$.spec.priorityClass", "reference"),
    }
    messages = " ".join(e["message"] for e in report["errors"])
    assert "queue 'nope'" in messages and "'b200'" in messages and "'urgent'" in messages


def test_rev_validates_a_past_commit_not_the_work_tree(bootstrapped: ClusterRepo) -> None:
    good = bootstrapped.head()
    bootstrapped.write("teams/ml/jobs/a.yaml", BROKEN_FILES["teams/ml/jobs/a.yaml"])
    bootstrapped.commit("a broken job")
    bootstrapped.write("teams/ml/queue.yaml", BROKEN_FILES["teams/ml/queue.yaml"])  # not committed

    at_head = gitsched("validate", bootstrapped.path, "--rev", "HEAD", expect=1)
    assert "teams/ml/jobs/a.yaml:6:3: $.spec.replicas: " in at_head.stdout
    assert "queue.yaml" not in at_head.stdout, "--rev reads git objects, not the work tree"
    assert at_head.stdout.strip().endswith("1 error(s) in 1 file(s)")

    gitsched("validate", bootstrapped.path, "--rev", "HEAD~1", expect=0)
    gitsched("validate", bootstrapped.path, "--rev", good[:10], expect=0)
    on_disk = gitsched("validate", bootstrapped.path, expect=1)
    assert "2 error(s) in 2 file(s)" in on_disk.stdout


def test_an_unknown_revision_is_a_usage_error(bootstrapped: ClusterRepo) -> None:
    run = gitsched("validate", bootstrapped.path, "--rev", "no-such-branch", expect=2)
    assert run.stdout == ""
    assert "unknown revision 'no-such-branch'" in run.stderr


def test_rev_outside_a_git_repository_is_a_usage_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "cluster.yaml").write_text(MINIMAL_CLUSTER["cluster.yaml"])
    run = gitsched("validate", plain, "--rev", "HEAD", expect=2)
    assert "not a git repository" in run.stderr


def test_other_usage_errors_exit_2(bootstrapped: ClusterRepo, tmp_path: Path) -> None:
    missing = gitsched("validate", tmp_path / "missing", expect=2)
    assert "does not exist" in missing.stderr
    gitsched("validate", bootstrapped.path, "--format", "xml", expect=2)
