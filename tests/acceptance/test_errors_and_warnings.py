"""Every error at once, each in the file that has it; and warnings for what is valid but
can never run, in `validate` and in `plan`."""

from __future__ import annotations

from tests.support.cluster_repo import (
    ANA,
    CLUSTER_YAML,
    ClusterRepo,
    H,
    git,
    gitsched,
    job_yaml,
    queue_yaml,
)


def test_schema_and_reference_errors_of_one_file_come_together(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write(
        "teams/ml/jobs/a.yaml",
        job_yaml("a", flavors=["b200"], topology="row", queue="nope").replace(
            "replicas: 1", "replicas: -1"
        ),
    )
    run = gitsched("validate", bootstrapped.path, expect=1)
    assert [line.split(" [")[-1] for line in run.stdout.splitlines()[:-1]] == [
        "schema]",
        "reference]",
        "reference]",
        "reference]",
    ], run.stdout
    assert "$.spec.replicas: must be at least 1" in run.stdout
    assert "$.spec.queue: job 'a' names queue 'nope'" in run.stdout
    assert "$.spec.gpuFlavors[0]: GPU flavor 'b200' is not defined" in run.stdout
    assert "$.spec.topology.level: topology level 'row' is not defined" in run.stdout


def test_a_broken_queue_file_is_named_and_its_jobs_are_not_blamed(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/jobs/a.yaml", job_yaml("a"))
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b", queue="ml"))
    for broken in (
        queue_yaml().replace("nominal: 32", "nominal: lots"),  # breaks its schema
        "kind: Queue\n  spec: [\n",  # not even YAML
    ):
        bootstrapped.write("teams/ml/queue.yaml", broken)
        run = gitsched("validate", bootstrapped.path, expect=1)
        lines = run.stdout.splitlines()
        assert lines[-1] == "1 error(s) in 1 file(s)", run.stdout
        assert lines[0].startswith("teams/ml/queue.yaml:"), run.stdout


TWO_FLAVOR_CLUSTER = CLUSTER_YAML.replace(
    "    - {name: h100-80g, model: H100, memoryGiB: 80}\n",
    "    - {name: h100-80g, model: H100, memoryGiB: 80}\n"
    "    - {name: a100-80g, model: A100, memoryGiB: 80}\n",
)
BIG_QUEUE = (
    H
    + """kind: Queue
metadata:
  name: ml
spec:
  quotas:
    - {flavor: h100-80g, nominal: 64}
    - {flavor: a100-80g, nominal: 8}
"""
)


def test_jobs_that_can_never_run_and_quotas_over_the_cluster_are_warnings(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("cluster.yaml", TWO_FLAVOR_CLUSTER)
    bootstrapped.write("teams/ml/queue.yaml", BIG_QUEUE)
    bootstrapped.commit("ml: quota for A100s, which the cluster does not have yet")
    git(bootstrapped.path, "checkout", "-q", "-b", "pr")
    bootstrapped.write("teams/ml/jobs/wide.yaml", job_yaml("wide", gpu=16))
    bootstrapped.write("teams/ml/jobs/a100.yaml", job_yaml("a100", flavors=["a100-80g"]))
    bootstrapped.write("teams/ml/jobs/huge.yaml", job_yaml("huge", replicas=5))
    bootstrapped.write("teams/ml/jobs/fine.yaml", job_yaml("fine"))
    bootstrapped.commit("ml: four jobs", author=ANA)

    run = gitsched("validate", bootstrapped.path, expect=0)
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: teams/ml/jobs/a100.yaml:8:3: $.spec.gpuFlavors: job 'a100' can never run:"
        " no node has GPU flavor a100-80g [never-fits]",
        "warning: teams/ml/jobs/huge.yaml:6:3: $.spec.replicas: job 'huge' can never run: its"
        " smallest gang needs 40 GPUs and the cluster has 32 h100-80g GPUs in all [never-fits]",
        "warning: teams/ml/jobs/wide.yaml:7:15: $.spec.resources.gpu: job 'wide' can never run:"
        " no node of flavor h100-80g has 16 GPUs (the largest has 8); the cluster has 32"
        " h100-80g GPUs in all [never-fits]",
        "warning: teams/ml/queue.yaml:7:26: $.spec.quotas[0].nominal: queue 'ml' is promised 64"
        " h100-80g GPUs but the cluster has 32: the quota can never be used in full"
        " [quota-over-cluster]",
        "warning: teams/ml/queue.yaml:8:26: $.spec.quotas[1].nominal: queue 'ml' is promised 8"
        " a100-80g GPUs but the cluster has 0: the quota can never be used in full"
        " [quota-over-cluster]",
    ]
    as_json = gitsched("validate", bootstrapped.path, "--format", "json", expect=0).json()
    assert as_json["valid"] is True
    assert [w["code"] for w in as_json["warnings"]] == [
        "never-fits",
        "never-fits",
        "never-fits",
        "quota-over-cluster",
        "quota-over-cluster",
    ]

    plan = gitsched("plan", bootstrapped.path, "main..pr", expect=1)
    assert "Warnings: valid, but can never run as written" in plan.stdout
    assert "job 'wide' can never run" in plan.stdout
    markdown = gitsched("plan", bootstrapped.path, "main..pr", "--format", "markdown", expect=1)
    assert "Warnings (5)" in markdown.stdout
    as_json = gitsched("plan", bootstrapped.path, "main..pr", "--format", "json", expect=1).json()
    assert len(as_json["warnings"]) == 5
