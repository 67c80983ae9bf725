"""`audit compliance` re-judges StrictFIFO on the log (issue 30 item 2): no job of a
StrictFIFO queue is admitted while a job ahead of it in that queue's wait order still
waits. A log the reconciler wrote holds; the same log with a hand-appended decision that
starts the job behind the waiting head breaks it, and the audit names both."""

from __future__ import annotations

from pathlib import Path

from gitsched.engine import events as ev
from gitsched.engine.model import ReplicaPlacement
from gitsched.eventlog.codec import encode
from gitsched.eventlog.sqlite import SQLiteEventLog
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


def strict_repo(tmp_path: Path) -> ClusterRepo:
    """28 of 32 GPUs busy; ml/big (8 GPUs) waits at the head of StrictFIFO queue ml, and
    ml/small (4 GPUs), which would fit, waits behind it."""
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(
        {
            **MINIMAL_CLUSTER,
            "teams/ml/queue.yaml": queue_yaml(extra="  queueingStrategy: StrictFIFO\n"),
            "policies/default.yaml": POLICY_YAML + "  preemption: {enabled: false}\n",
        }
    )
    repo.commit("Bootstrap")
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        for name, gpu in (("w1", 8), ("w2", 8), ("w3", 8), ("w4", 4)):
            repo.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, gpu=gpu))
        repo.commit("fill")
        reconciler.run_once()
        repo.write("teams/ml/jobs/big.yaml", job_yaml("big", gpu=8))
        repo.commit("big")
        reconciler.run_once()
        repo.write("teams/ml/jobs/small.yaml", job_yaml("small", gpu=4))
        repo.commit("small")
        reconciler.run_once()
    pending = {e.data["job"]: e.data for e in of_type(read_events(repo.log_path), "JobPending")}
    assert pending["ml/small"]["constraint"] == "strict-fifo"
    return repo


def compliance(repo: ClusterRepo, expect: int) -> dict[str, object]:
    run = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json", expect=expect)
    result: dict[str, object] = run.json()
    return result


def strict_check(result: dict[str, object]) -> dict[str, object]:
    checks = result["checks"]
    assert isinstance(checks, list)
    (check,) = [c for c in checks if c["check"] == "strict-fifo"]
    assert isinstance(check, dict)
    return check


def test_a_log_the_reconciler_wrote_holds_strict_fifo(tmp_path: Path) -> None:
    repo = strict_repo(tmp_path)
    result = compliance(repo, 0)
    check = strict_check(result)
    # the four admissions of the fill, judged; none behind a waiting head
    assert check["status"] == "PASS" and check["checked"] == 4
    # once the head can start (w1 withdrawn), both start in one decision: no violation
    repo.remove("teams/ml/jobs/w1.yaml")
    repo.commit("w1 done")
    gitsched("reconcile", "--once", repo.path, expect=0)
    placed = [e.data["job"] for e in of_type(read_events(repo.log_path), "PlacementDecided")]
    assert placed[-2:] == ["ml/big", "ml/small"]
    check = strict_check(compliance(repo, 0))
    assert check["status"] == "PASS" and check["checked"] == 6


def test_a_hand_appended_start_behind_the_waiting_head_is_a_violation(tmp_path: Path) -> None:
    repo = strict_repo(tmp_path)
    events = read_events(repo.log_path)
    w4 = next(e for e in of_type(events, "PlacementDecided") if e.data["job"] == "ml/w4")
    (replica,) = w4.data["replicas"]
    # a decision no solver made: ml/small on the 4 GPUs w4 left free, ml/big still waiting
    forged = [
        ev.PlacementDecided(
            job="ml/small",
            flavor="h100-80g",
            replicas=(ReplicaPlacement(replica["node"], (4, 5, 6, 7), 1000),),
            action="admitted",
            reason="hand-appended",
            solve_id="forged/solve",
            at="2025-11-16T14:00:00.000000Z",
        ),
        ev.SolveCompleted(
            solve_id="forged/solve",
            solver="greedy",
            status="optimal",
            objective=0.0,
            bound=None,
            gap=None,
            seconds=0.0,
            variables=0,
            constraints=0,
            placed=1,
            kept=4,
            moved=0,
            preempted=0,
            pending=1,
            plan_source="greedy",
        ),
    ]
    with SQLiteEventLog(repo.log_path) as log:
        log.append(
            [
                encode(e, id=f"forged/{i}", actor="solver", cause="forged")
                for i, e in enumerate(forged)
            ],
            expected_last_seq=log.last_seq(),
        )
    result = compliance(repo, 1)
    check = strict_check(result)
    assert check["status"] == "FAIL" and check["checked"] == 5
    violations = result["violations"]
    assert isinstance(violations, list)
    (violation,) = [v for v in violations if v["check"] == "strict-fifo"]
    assert violation["subject"] == "ml/small"
    assert violation["message"] == (
        "job ml/small of StrictFIFO queue ml started while ml/big waited ahead of it"
    )
