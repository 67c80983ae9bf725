"""What a job file may do: an emptied file is an error (deleting it withdraws the job),
and a team submits only to queues it owns."""

from __future__ import annotations

import pytest

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    gitsched,
    job_yaml,
    log_state,
    of_type,
    queue_yaml,
    read_events,
)


@pytest.mark.parametrize("content", ["", "  \n\t\n", "# nothing here yet\n---\n"])
def test_an_emptied_job_file_is_an_error_and_the_job_stays(
    reconciled: ClusterRepo, content: str
) -> None:
    reconciled.write("teams/ml/jobs/train.yaml", content)

    run = gitsched("validate", reconciled.path, expect=1)
    assert run.stdout.startswith("teams/ml/jobs/train.yaml: $: the file is empty"), run.stdout
    assert "delete the file" in run.stdout

    emptied = reconciled.commit("ml: empty the training job", author=ANA)
    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert f"REJECTED {emptied[:12]}" in run.stdout
    [rejected] = of_type(read_events(reconciled.log_path), "CommitRejected")
    assert [(e["file"], e["code"]) for e in rejected.data["errors"]] == [
        ("teams/ml/jobs/train.yaml", "empty")
    ]
    assert "ml/train" in log_state(reconciled.log_path)["placements"]


def test_deleting_the_file_withdraws_the_job(reconciled: ClusterRepo) -> None:
    reconciled.remove("teams/ml/jobs/train.yaml")
    reconciled.commit("ml: withdraw the training job", author=ANA)
    gitsched("reconcile", "--once", reconciled.path, expect=0)
    assert of_type(read_events(reconciled.log_path), "JobWithdrawn")
    assert "ml/train" not in log_state(reconciled.log_path)["placements"]


def test_a_job_may_not_run_on_another_teams_queue(reconciled: ClusterRepo) -> None:
    reconciled.write("teams/infer/queue.yaml", queue_yaml("infer", nominal=8))
    reconciled.commit("infer: a queue of its own")
    reconciled.write("teams/ml/jobs/sneaky.yaml", job_yaml("sneaky", gpu=8, queue="infer"))
    sneaky = reconciled.commit("ml: run on infer's quota", author=ANA)

    run = gitsched("validate", reconciled.path, expect=1)
    assert run.stdout.startswith(
        "teams/ml/jobs/sneaky.yaml:8:3: $.spec.queue: job 'sneaky' of team 'ml' names queue"
        " 'infer', which team 'infer' owns (teams/infer/queue.yaml)"
    ), run.stdout

    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert f"REJECTED {sneaky[:12]}" in run.stdout
    [rejected] = of_type(read_events(reconciled.log_path), "CommitRejected")
    assert [(e["file"], e["line"], e["path"], e["code"]) for e in rejected.data["errors"]] == [
        ("teams/ml/jobs/sneaky.yaml", 8, "$.spec.queue", "ownership")
    ]
    assert "ml/sneaky" not in log_state(reconciled.log_path)["placements"]
