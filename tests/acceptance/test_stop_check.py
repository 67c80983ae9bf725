"""The reconciler's check before a step that stops running jobs: when the cluster's side
says a job it would stop has ended, that is in the log first and the step is decided again
from it (the daemon's side of it runs on a real API server in tests/kube/test_stop_races.py)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from gitsched.engine import events as ev
from gitsched.eventlog.codec import decode, encode
from gitsched.eventlog.replay import Replayed
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler, stopped_jobs
from tests.support.cluster_repo import ClusterRepo, job_yaml


def _events(path: Path) -> list[ev.Event]:
    with SQLiteEventLog(path) as log:
        return [decode(e) for e in log.read(0)]


def test_a_commit_that_would_preempt_a_job_that_ended_is_decided_after_its_end(
    bootstrapped: ClusterRepo, tmp_path: Path
) -> None:
    # batch fills the pool's four nodes and runs (the cluster said so).
    bootstrapped.write("teams/ml/jobs/batch.yaml", job_yaml("batch", replicas=4, priority="low"))
    bootstrapped.commit("ml: batch")
    with SQLiteEventLog(bootstrapped.log_path) as log:
        placed = Reconciler(GitRepo(bootstrapped.path), log).run_once().state
        started = ev.JobStarted(
            job="ml/batch", placement_at=placed.placements["ml/batch"].started_at
        )
        log.append(
            [encode(started, id="cluster/started", actor="test", cause="test")],
            expected_last_seq=log.last_seq(),
        )
    # urgent needs every node: with batch running, the commit preempts it.
    bootstrapped.write("teams/ml/jobs/urgent.yaml", job_yaml("urgent", replicas=4, priority="high"))
    bootstrapped.commit("ml: urgent")
    unchecked = tmp_path / "unchecked.db"
    shutil.copy(bootstrapped.log_path, unchecked)

    # Without the check (as `plan` and `reconcile` run, with no cluster): batch is preempted.
    with SQLiteEventLog(unchecked) as log:
        Reconciler(GitRepo(bootstrapped.path), log).run_once()
    assert [e.job for e in _events(unchecked) if isinstance(e, ev.JobPreempted)] == ["ml/batch"]

    # With it: batch's pods had Succeeded by the time the decision was to be appended.
    asked: list[frozenset[str]] = []

    def ended(tip: Replayed, stopping: frozenset[str]) -> str | None:
        asked.append(stopping)
        if len(asked) > 1:
            return None
        finished = ev.JobFinished(job="ml/batch", at="2025-11-16T11:30:00.000000Z")
        stored = log.append(
            [encode(finished, id="cluster/finished", actor="test", cause="test")],
            expected_last_seq=tip.last_seq,
        )
        return f"cluster/{stored[-1].seq}"

    with SQLiteEventLog(bootstrapped.log_path) as log:
        report = Reconciler(GitRepo(bootstrapped.path), log, check_stopped=ended).run_once()
    assert asked == [frozenset({"ml/batch"})]  # asked once; the second decision stops nothing
    events = _events(bootstrapped.log_path)
    assert not [e for e in events if isinstance(e, ev.JobPreempted)]
    order = [
        (type(e).__name__, e.job)
        for e in events
        if isinstance(e, ev.JobFinished | ev.PlacementDecided)
    ]
    assert order.index(("JobFinished", "ml/batch")) < order.index(("PlacementDecided", "ml/urgent"))
    assert report.state.ended["ml/batch"] == "finished"
    assert "ml/urgent" in report.state.placements
    assert [c.applied for c in report.commits] == [True]


def test_stopped_jobs_are_the_running_jobs_whose_placement_goes(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/jobs/a.yaml", job_yaml("a"))
    bootstrapped.write("teams/ml/jobs/b.yaml", job_yaml("b"))
    bootstrapped.commit("ml: a and b")
    with SQLiteEventLog(bootstrapped.log_path) as log:
        state = Reconciler(GitRepo(bootstrapped.path), log).run_once().state
    a = state.placements["ml/a"]
    # Placed but not started: stopping it loses no work, so it is not asked about.
    gone = replace(state, placements=state.placements.delete("ml/a"))
    assert stopped_jobs(state, gone) == frozenset()
    running = replace(state, started=state.started.set("ml/a", a.started_at))
    assert stopped_jobs(running, running) == frozenset()
    assert stopped_jobs(running, replace(running, placements=gone.placements)) == {"ml/a"}
    # Moved: another placement of the same job stops the one that runs.
    moved = replace(a, started_at="2025-11-16T12:00:00.000000Z")
    assert stopped_jobs(
        running, replace(running, placements=state.placements.set("ml/a", moved))
    ) == {"ml/a"}
