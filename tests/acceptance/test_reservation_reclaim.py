"""A queue below its nominal quota reclaims past a borrowing job's reservation, through the
CLI (docs/time.md, "Reservations and reclaim"): `plan` predicts the reconcile exactly,
with greedy and HiGHS, and `audit compliance` judges the start by the same rule.

Four 8-GPU nodes, cohort research: train and svc have 16 GPUs nominal each. train fills
the cluster at 10:00 (borrowing svc's 16), t1 with a 3 h limit; at 11:00 train's big
(8 GPUs) gets a reservation from 13:00 on t1's node, all of it borrowed; at 12:00 svc
asks for one GPU with no limit: it reclaims from train and starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from tests.support.cluster_repo import (
    CLUSTER_YAML,
    POLICY_YAML,
    POOL_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    queue_yaml,
)
from tests.support.plan import of, planned_then_reconciled


def limited(name: str, minutes: int | None, **kw: object) -> str:
    text = job_yaml(name, **kw)  # type: ignore[arg-type]
    return text + (f"  timeLimitMinutes: {minutes}\n" if minutes is not None else "")


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_a_queue_below_nominal_reclaims_past_a_borrowing_reservation(
    tmp_path: Path, solver: str
) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            # The Kueue-minded choice: a borrowing reservation yields to reclaim (the built-in
            # policy keeps every reservation: tests/unit/test_reservation_reclaim.py).
            "policies/default.yaml": POLICY_YAML.replace("name: greedy", f"name: {solver}")
            + "  backfill: {reservations: 1, yieldToReclaim: true}\n",
            "teams/train/queue.yaml": queue_yaml("train", 16, extra="  cohort: research\n"),
            "teams/svc/queue.yaml": queue_yaml("svc", 16, extra="  cohort: research\n"),
        }
    )
    repo.commit("Bootstrap")  # 09:00
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        reconciler.run_once()
        for name, limit in (("t1", 180), ("t2", None), ("t3", None), ("t4", None)):
            repo.write(f"teams/train/jobs/{name}.yaml", limited(name, limit))
        fill, _ = planned_then_reconciled(repo, event_log, reconciler, "train fills the cluster")
        assert len(of(fill, "PlacementDecided")) == 4

        repo.write("teams/train/jobs/big.yaml", limited("big", 60))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "train's big waits")
        [decided] = of(events, "ReservationsDecided")
        [reservation] = decided["reservations"]
        assert reservation["job"] == "train/big"
        assert reservation["start"] == "2025-11-16T13:00:00.000000Z"
        assert reservation["borrowed_milli"] == 8000

        repo.write("teams/svc/jobs/r0.yaml", job_yaml("r0", gpu=1))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "svc asks for 1")
        stopped = of(events, "JobPreempted")
        assert [(p["rule"], p["preempted_by"]) for p in stopped] == [("reclaim", "svc/r0")]
        assert stopped[0]["job"].startswith("train/t")  # a borrowing training job
        assert "svc/r0" in {p["job"] for p in of(events, "PlacementDecided")}

    out = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()
    assert out["ok"] is True, out["violations"]
    [check] = [c for c in out["checks"] if c["check"] == "reservations"]
    assert check["status"] == "PASS" and check["checked"] >= 1
