"""Time limits and reservations in a real git repository (docs/time.md).

Commits an hour apart: the cluster fills; a high-priority 8-GPU job that cannot start gets
a reservation from the moment the running jobs reach their limits, a job that would delay
it waits, a job that ends in time starts; the next commit, later than those limits, is
decided after the jobs that reached them are stopped. `plan` predicts every commit's
events exactly, with the solver greedy and HiGHS; bad limits are rejected, located.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gitsched.engine import events as ev
from gitsched.engine.model import ReplicaPlacement
from gitsched.eventlog.codec import encode
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

Event = tuple[str, str, str, str, bytes]


def limited(name: str, minutes: int | None, **kw: Any) -> str:
    text = job_yaml(name, **kw)
    return text + (f"  timeLimitMinutes: {minutes}\n" if minutes is not None else "")


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_reservation_holds_a_long_job_starts_a_short_one_and_limits_stop_jobs(
    tmp_path: Path, solver: str
) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(
        {
            **MINIMAL_CLUSTER,
            "policies/default.yaml": POLICY_YAML.replace("name: greedy", f"name: {solver}")
            + "  preemption: {enabled: false}\n",
        }
    )
    repo.commit("Bootstrap")  # 09:00
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        reconciler.run_once()
        # 10:00: four nodes of 8 GPUs; w1 and w4 reach their limits at 11:30.
        repo.write("teams/ml/jobs/w1.yaml", limited("w1", 90))
        repo.write("teams/ml/jobs/w2.yaml", limited("w2", None))
        repo.write("teams/ml/jobs/w3.yaml", limited("w3", None))
        repo.write("teams/ml/jobs/w4.yaml", limited("w4", 90, gpu=4))
        fill, _ = planned_then_reconciled(repo, event_log, reconciler, "fill the cluster")
        assert len(of(fill, "PlacementDecided")) == 4

        # 11:00: big cannot start; long (10 h) would delay it, short (20 min) would not.
        repo.write("teams/ml/jobs/big.yaml", limited("big", 60, priority="high"))
        repo.write("teams/ml/jobs/long.yaml", limited("long", 600, gpu=4))
        repo.write("teams/ml/jobs/short.yaml", limited("short", 20, gpu=4))
        events, plan = planned_then_reconciled(repo, event_log, reconciler, "big, long and short")
        [decided] = of(events, "ReservationsDecided")
        [reservation] = decided["reservations"]
        assert reservation["job"] == "ml/big"
        assert reservation["start"] == "2025-11-16T11:30:00.000000Z"
        pending = {e["job"]: e for e in of(events, "JobPending")}
        assert pending["ml/big"]["constraint"] == "reservation"
        assert pending["ml/big"]["reason"].startswith("reserved from 2025-11-16 11:30 UTC on")
        assert pending["ml/long"]["constraint"] == "backfill"
        assert [p["job"] for p in of(events, "PlacementDecided")] == ["ml/short"]
        state = reconciler.run_once().state
        assert state.reservations[0].nodes == tuple(reservation["nodes"])
        # `plan` (text and JSON) and `state` say when big is expected to start.
        assert [r.job for r in plan.reservations] == ["ml/big"]
        shown = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()
        assert shown["pending"]["ml/big"]["expected_start"] == reservation["start"]
        assert shown["pending"]["ml/long"]["expected_start"] is None
        assert [r["job"] for r in shown["reservations"]] == ["ml/big"]
        assert shown["placements"]["ml/short"]["limit_reached_at"] == "2025-11-16T11:20:00.000000Z"
        text = gitsched("state", "--repo", repo.path, expect=0).stdout
        assert "EXPECTED START" in text

        # 12:00: short stopped at 11:20, w1 and w4 at 11:30, before the commit is decided.
        events, plan = planned_then_reconciled(repo, event_log, reconciler, "an hour later")
        stopped = [(e["job"], e["at"]) for e in of(events, "JobTimedOut")]
        assert stopped == [
            ("ml/short", "2025-11-16T11:20:00.000000Z"),
            ("ml/w1", "2025-11-16T11:30:00.000000Z"),
            ("ml/w4", "2025-11-16T11:30:00.000000Z"),
        ]
        placed = {p["job"] for p in of(events, "PlacementDecided")}
        assert placed == {"ml/big", "ml/long"}
        assert events[0][2] == "gitsched"  # the time limits' events, not the commit's author
        # `plan` says why they stop.
        [w1] = [e for e in plan.effects if e.job == "ml/w1"]
        assert w1.reason.startswith("reached its time limit of 90 min at 2025-11-16T11:30")

    history = gitsched(
        "audit", "history", "--repo", repo.path, "--job", "ml/w1", "--format", "json", expect=0
    ).json()
    [row] = history
    # Stopped at 11:30, when its 90 minutes from 10:00 ran out, not when the next commit came.
    assert (row["start"], row["end"]) == (
        "2025-11-16T10:00:00.000000Z",
        "2025-11-16T11:30:00.000000Z",
    )
    assert (row["state"], row["end_kind"]) == ("TIMEOUT", "timed_out")
    assert "time limit of 90 min" in row["end_reason"]


def test_bad_time_limits_are_rejected_with_file_line_and_field(bootstrapped: ClusterRepo) -> None:
    bootstrapped.write(
        "teams/ml/queue.yaml",
        queue_yaml(extra="  timeLimits: {defaultMinutes: 600, maxMinutes: 300}\n"),
    )
    bootstrapped.write("teams/ml/jobs/zero.yaml", limited("zero", 0))
    bootstrapped.write("teams/ml/jobs/greedy.yaml", limited("greedy", 500))
    bootstrapped.write("policies/default.yaml", POLICY_YAML + "  backfill: {reservations: -1}\n")
    bad = bootstrapped.commit("limits")
    gitsched("reconcile", "--once", bootstrapped.path, expect=EXIT_INVALID)
    events = read_events(bootstrapped.log_path)
    [rejected] = of_type(events, "CommitRejected")
    assert rejected.cause == bad
    found = {(e["file"], e["path"]) for e in rejected.data["errors"]}
    assert found == {
        ("policies/default.yaml", "$.spec.backfill.reservations"),
        ("teams/ml/jobs/zero.yaml", "$.spec.timeLimitMinutes"),
        ("teams/ml/jobs/greedy.yaml", "$.spec.timeLimitMinutes"),
        ("teams/ml/queue.yaml", "$.spec.timeLimits.defaultMinutes"),
    }
    assert all(e["line"] for e in rejected.data["errors"])
    assert not of_type(events, "JobSubmitted")


def test_audit_compliance_finds_a_start_that_delays_a_reservation(tmp_path: Path) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(
        {
            **MINIMAL_CLUSTER,
            "policies/default.yaml": POLICY_YAML + "  preemption: {enabled: false}\n",
        }
    )
    repo.commit("Bootstrap")
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        reconciler.run_once()
        for name, limit, gpu in (("w1", 90, 8), ("w2", None, 8), ("w3", None, 8), ("w4", 90, 4)):
            repo.write(f"teams/ml/jobs/{name}.yaml", limited(name, limit, gpu=gpu))
        planned_then_reconciled(repo, event_log, reconciler, "fill the cluster")
        repo.write("teams/ml/jobs/big.yaml", limited("big", 60, priority="high"))
        repo.write("teams/ml/jobs/long.yaml", limited("long", 600, gpu=4))
        repo.write("teams/ml/jobs/short.yaml", limited("short", 20, gpu=4))
        events, _ = planned_then_reconciled(repo, event_log, reconciler, "big, long and short")
        [decided] = of(events, "ReservationsDecided")
        [reservation] = decided["reservations"]

    clean = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json", expect=0)
    [check] = [c for c in clean.json()["checks"] if c["check"] == "reservations"]
    # ml/short started while the reservation was held: judged, and within the rule.
    assert (check["status"], check["violations"], check["checked"]) == ("PASS", 0, 1)

    # A solver that ignored the reservation: ml/long (10 h) on the reserved node at 11:00.
    node = reservation["nodes"][0]
    forged = ev.PlacementDecided(
        job="ml/long",
        flavor="h100-80g",
        replicas=(ReplicaPlacement(node, (0, 1, 2, 3), 1000),),
        action="admitted",
        reason="admitted",
        solve_id="forged/solve",
        at="2025-11-16T11:00:00.000000Z",
    )
    with SQLiteEventLog(repo.log_path) as event_log:
        event_log.append(
            [encode(forged, id="forged/solve/0", actor="solver", cause="forged")],
            expected_last_seq=event_log.last_seq(),
        )
    found = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json", expect=1)
    [violation] = [v for v in found.json()["violations"] if v["check"] == "reservations"]
    assert violation["subject"] == "ml/long"
    assert f"reserved for ml/big from {reservation['start']}" in violation["message"]
