"""Kueue's queueing strategies in a real git repository (docs/time.md, Queueing strategy).

A StrictFIFO queue: its 8-GPU head cannot start, and the 4-GPU job behind it, which would
fit, waits too; `plan` predicts the events exactly, with greedy and HiGHS. Switching the
queue to BestEffortFIFO starts it. A strategy gitsched does not know is rejected, located.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.exit_codes import EXIT_INVALID
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from tests.support.cluster_repo import (
    MINIMAL_CLUSTER,
    POLICY_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
)
from tests.support.plan import of, planned_then_reconciled


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_a_strict_fifo_head_blocks_a_job_that_fits_until_the_queue_is_best_effort(
    tmp_path: Path, solver: str
) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(
        {
            **MINIMAL_CLUSTER,
            "teams/ml/queue.yaml": queue_yaml(extra="  queueingStrategy: StrictFIFO\n"),
            "policies/default.yaml": POLICY_YAML.replace("name: greedy", f"name: {solver}")
            + "  preemption: {enabled: false}\n",
        }
    )
    repo.commit("Bootstrap")
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        reconciler.run_once()
        for name, gpu in (("w1", 8), ("w2", 8), ("w3", 8), ("w4", 4)):
            repo.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, gpu=gpu))
        fill, _ = planned_then_reconciled(repo, event_log, reconciler, "28 of 32 GPUs")
        assert len(of(fill, "PlacementDecided")) == 4

        repo.write("teams/ml/jobs/big.yaml", job_yaml("big", gpu=8))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "big")
        repo.write("teams/ml/jobs/small.yaml", job_yaml("small", gpu=4))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "small")
        assert of(events, "PlacementDecided") == []
        pending = {e["job"]: e for e in of(events, "JobPending")}
        assert pending["ml/small"]["constraint"] == "strict-fifo"
        assert (
            pending["ml/small"]["reason"] == "queue ml is StrictFIFO and ml/big waits ahead of it"
        )

        repo.write("teams/ml/queue.yaml", queue_yaml(extra="  queueingStrategy: BestEffortFIFO\n"))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "best effort")
        assert [p["job"] for p in of(events, "PlacementDecided")] == ["ml/small"]


def test_an_unknown_queueing_strategy_is_rejected_with_file_line_and_field(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/queue.yaml", queue_yaml(extra="  queueingStrategy: LIFO\n"))
    bad = bootstrapped.commit("lifo")
    gitsched("reconcile", "--once", bootstrapped.path, expect=EXIT_INVALID)
    events = read_events(bootstrapped.log_path)
    [rejected] = of_type(events, "CommitRejected")
    assert rejected.cause == bad
    [error] = rejected.data["errors"]
    assert (error["file"], error["path"]) == ("teams/ml/queue.yaml", "$.spec.queueingStrategy")
    assert error["line"] == 8
