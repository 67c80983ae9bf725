"""Retries and minimum run time in the cluster repo: valid settings reach the log, and bad
ones (a retry count below 0, a first backoff above its maximum, a negative minimum run
time) are findings with file, line and field, a CommitRejected, and nothing else."""

from __future__ import annotations

from tests.support.cluster_repo import (
    CLUSTER_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
)

RETRY_JOB = (
    job_yaml("train") + "  retry: {maxRetries: 3, backoffSeconds: 30, maxBackoffSeconds: 600}\n"
)
RETRY_QUEUE = queue_yaml(extra="  retry: {maxRetries: 1}\n  preemption: {minRuntimeMinutes: 20}\n")


def test_retry_and_min_runtime_settings_reach_the_log(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write("teams/ml/jobs/train.yaml", RETRY_JOB)
    bootstrapped.write("teams/ml/queue.yaml", RETRY_QUEUE)
    bootstrapped.write(
        "cluster.yaml",
        CLUSTER_YAML.replace(
            "{name: low, value: 100}", "{name: low, value: 100, preemption: {minRuntimeMinutes: 5}}"
        ),
    )
    bootstrapped.write(
        "policies/retries.yaml",
        "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata:\n  name: retries\nspec:\n"
        "  retry: {maxRetries: 2, requeueTimestamp: Eviction}\n",
    )
    bootstrapped.commit("ml: retries")
    gitsched("validate", bootstrapped.path, expect=0)
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    events = read_events(bootstrapped.log_path)
    assert not of_type(events, "CommitRejected")
    (submitted,) = [e for e in of_type(events, "JobSubmitted") if e.data["job"]["name"] == "train"]
    assert submitted.data["job"]["retry"] == {
        "max_retries": 3,
        "backoff_seconds": 30,
        "max_backoff_seconds": 600,
    }
    queue = of_type(events, "QueueConfigured")[-1].data["queue"]
    assert queue["retry"]["max_retries"] == 1 and queue["min_runtime_minutes"] == 20
    policy = of_type(events, "PolicyChanged")[-1].data["policy"]
    assert policy["retry"]["max_retries"] == 2 and policy["requeue_timestamp"] == "Eviction"
    cluster = of_type(events, "ClusterConfigured")[-1].data["cluster"]
    low = next(c for c in cluster["priority_classes"] if c["name"] == "low")
    assert low["min_runtime_minutes"] == 5


def test_bad_retry_and_min_runtime_settings_are_rejected_with_file_line_and_field(
    bootstrapped: ClusterRepo,
) -> None:
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    before = read_events(bootstrapped.log_path)
    bootstrapped.write(
        "teams/ml/jobs/train.yaml",
        job_yaml("train") + "  retry: {maxRetries: -1}\n",
    )
    bootstrapped.write(
        "teams/ml/jobs/slow.yaml",
        job_yaml("slow") + "  retry:\n    backoffSeconds: 600\n    maxBackoffSeconds: 60\n",
    )
    bootstrapped.write(
        "teams/ml/queue.yaml", queue_yaml(extra="  preemption: {minRuntimeMinutes: -5}\n")
    )
    bad = bootstrapped.commit("ml: bad retries")

    report = gitsched("validate", bootstrapped.path, "--format", "json", expect=1).json()
    found = [(e["file"], e["line"], e["path"]) for e in report["errors"]]
    assert found == [
        ("teams/ml/jobs/slow.yaml", 10, "$.spec.retry.backoffSeconds"),
        ("teams/ml/jobs/train.yaml", 9, "$.spec.retry.maxRetries"),
        ("teams/ml/queue.yaml", 8, "$.spec.preemption.minRuntimeMinutes"),
    ]
    messages = {e["path"]: e["message"] for e in report["errors"]}
    assert "more than maxBackoffSeconds (60)" in messages["$.spec.retry.backoffSeconds"]
    assert "at least 0" in messages["$.spec.retry.maxRetries"]

    gitsched("reconcile", "--once", bootstrapped.path, expect=1)
    events = read_events(bootstrapped.log_path)
    # Only the rejection was appended: nothing already in the log changed.
    assert [e.hash for e in events[: len(before)]] == [e.hash for e in before]
    assert [e.type for e in events[len(before) :]] == ["CommitRejected"]
    (rejected,) = of_type(events, "CommitRejected")
    assert rejected.cause == bad
    assert [(e["file"], e["line"], e["path"]) for e in rejected.data["errors"]] == found
