"""The log as evidence: tampering is detected, and concurrent reconcilers cannot corrupt it."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.support.cluster_repo import (
    ANA,
    LI,
    ClusterRepo,
    assert_chain_intact,
    finish,
    gitsched,
    job_yaml,
    queue_yaml,
    read_events,
    start_gitsched,
)


def execute(log_path: Path, sql: str, *params: object) -> None:
    db = sqlite3.connect(log_path)
    with db:
        db.execute(sql, params)
    db.close()


def test_an_intact_log_verifies(reconciled: ClusterRepo) -> None:
    events = read_events(reconciled.log_path)
    run = gitsched("log", "verify", "--repo", reconciled.path, expect=0)
    assert run.stdout.startswith(f"ok: {len(events)} events, chain intact")
    assert events[-1].hash in run.stdout


def test_a_changed_event_is_named_by_its_seq(reconciled: ClusterRepo) -> None:
    [fifth] = [e for e in read_events(reconciled.log_path) if e.seq == 5]
    forged = {**fifth.data, "forged": True}
    execute(reconciled.log_path, "UPDATE events SET data = ? WHERE seq = 5", json.dumps(forged))

    run = gitsched("log", "verify", "--repo", reconciled.path, expect=1)

    assert re.match(r"BROKEN at seq 5\b", run.stdout), run
    assert "content does not match its hash: the event was changed" in run.stdout


def test_a_changed_actor_is_detected(reconciled: ClusterRepo) -> None:
    execute(reconciled.log_path, "UPDATE events SET actor = 'mallory' WHERE seq = 3")
    run = gitsched("log", "verify", "--repo", reconciled.path, expect=1)
    assert re.match(r"BROKEN at seq 3\b", run.stdout), run


def test_a_deleted_event_is_reported_as_a_gap(reconciled: ClusterRepo) -> None:
    execute(reconciled.log_path, "DELETE FROM events WHERE seq = 5")

    run = gitsched("log", "verify", "--repo", reconciled.path, expect=1)

    assert re.match(r"BROKEN at seq 5\b", run.stdout), run
    assert "expected seq 5, found 6: events are missing" in run.stdout


def test_a_truncated_log_is_refused_by_reconcile(reconciled: ClusterRepo) -> None:
    execute(reconciled.log_path, "DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events)")
    before = read_events(reconciled.log_path)

    run = gitsched("reconcile", "--once", reconciled.path, expect=2)

    assert "the log was altered" in run.stderr
    assert read_events(reconciled.log_path) == before


def test_a_row_that_is_not_json_is_reported_not_a_traceback(reconciled: ClusterRepo) -> None:
    execute(reconciled.log_path, "UPDATE events SET data = 'not json' WHERE seq = 5")
    run = gitsched("log", "verify", "--repo", reconciled.path)
    assert run.returncode == 1 and "seq 5" in run.stdout


@pytest.fixture(scope="module")
def busy_history(tmp_path_factory: pytest.TempPathFactory) -> ClusterRepo:
    """Nine commits, one of them rejected, none reconciled yet."""
    repo = ClusterRepo(tmp_path_factory.mktemp("busy") / "cluster")
    repo.bootstrap()
    for i in range(6):
        repo.write(f"teams/ml/jobs/job-{i}.yaml", job_yaml(f"job-{i}", replicas=1, gpu=4))
        repo.commit(f"ml: job {i}", author=(ANA, LI)[i % 2])
        if i == 2:
            repo.write("teams/ml/jobs/bad.yaml", job_yaml("bad", gpu=-1))
            repo.commit("ml: a bad job", author=LI)
            repo.remove("teams/ml/jobs/bad.yaml")
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=16))
    repo.commit("ml: quota down to 16")
    return repo


@pytest.fixture(scope="module")
def clean_run_ids(busy_history: ClusterRepo, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    clean = busy_history.copy_to(tmp_path_factory.mktemp("clean") / "cluster")
    gitsched("reconcile", "--once", clean.path, expect=0)
    return [e.id for e in read_events(clean.log_path)]


@pytest.mark.parametrize(
    "log_exists", [False, True], ids=["first-open-of-the-log", "log-already-there"]
)
def test_two_reconcilers_started_together_write_one_clean_log(
    busy_history: ClusterRepo,
    clean_run_ids: list[str],
    tmp_path: Path,
    log_exists: bool,
) -> None:
    repo = busy_history.copy_to(tmp_path / "cluster")
    if log_exists:
        gitsched("reconcile", "--once", repo.path, "--branch", "main~8", expect=0)
    args = ("reconcile", "--once", repo.path)
    processes = [start_gitsched(*args), start_gitsched(*args)]
    runs = [finish(p, args) for p in processes]

    # A reconciler that finds the other one ahead re-reads the log and carries on. The
    # SQLite log may still refuse the second of two *first* opens with "database is
    # locked": that one may stop with exit 2 and one clear line, and nothing half-done.
    codes = sorted(run.returncode for run in runs)
    assert codes in ([0, 0], [0, 0] if log_exists else [0, 2]), [str(run) for run in runs]
    for run in runs:
        if run.returncode == 2:
            assert run.stdout == "" and run.stderr.startswith("gitsched: "), run
            assert len(run.stderr.strip().splitlines()) == 1, run
    events = read_events(repo.log_path)
    assert_chain_intact(events)
    assert [e.id for e in events] == clean_run_ids
    gitsched("log", "verify", "--repo", repo.path, expect=0)
    again = gitsched("reconcile", "--once", repo.path, expect=0)
    assert "0 event(s) appended" in again.stdout
