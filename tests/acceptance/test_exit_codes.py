"""Exit codes that say what happened (gitsched/exit_codes.py): a failure is never 0."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gitsched.exit_codes import EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OK
from tests.support.cluster_repo import ANA, ClusterRepo, gitsched, job_yaml, read_events


def test_reconcile_exits_1_while_the_tip_stays_rejected(reconciled: ClusterRepo) -> None:
    reconciled.write(
        "teams/ml/jobs/bad.yaml", job_yaml("bad").replace("replicas: 1", "replicas: 0")
    )
    bad = reconciled.commit("ml: a job with no replicas", author=ANA)

    first = gitsched("reconcile", "--once", reconciled.path, expect=EXIT_INVALID)
    assert f"REJECTED {bad[:12]}" in first.stdout

    again = gitsched("reconcile", "--once", reconciled.path, expect=EXIT_INVALID)
    assert "up to date: no new commits" in again.stdout
    assert f"the newest commit {bad[:12]} ml: a job with no replicas stays REJECTED" in again.stdout

    reconciled.write("teams/ml/jobs/bad.yaml", job_yaml("bad", gpu=4))
    reconciled.commit("ml: fix the job", author=ANA)
    gitsched("reconcile", "--once", reconciled.path, expect=EXIT_OK)
    again = gitsched("reconcile", "--once", reconciled.path, expect=EXIT_OK)
    assert "REJECTED" not in again.stdout


def test_a_seq_past_the_end_of_the_log_is_not_found(reconciled: ClusterRepo) -> None:
    last = read_events(reconciled.log_path)[-1].seq
    for command in ("state", "audit at"):
        args = (*command.split(), "--repo", reconciled.path)
        gitsched(*args, "--seq", str(last), expect=EXIT_OK)
        run = gitsched(*args, "--seq", str(last + 1), expect=EXIT_NOT_FOUND)
        assert f"--seq {last + 1} is past the end of the log (its last seq is {last})" in run.stderr
        assert run.stdout == ""


@pytest.mark.parametrize(
    ("option", "known", "unknown", "what"),
    [
        ("--job", "ml/train", "ml/trian", "job 'ml/trian'"),
        ("--job", "train", "nope", "job 'nope'"),
        ("--node", "h100-01", "h100-99", "node 'h100-99'"),
        ("--team", "ml", "ops", "team or queue 'ops'"),
        ("--gpu-flavor", "h100-80g", "b200", "GPU flavor 'b200'"),
    ],
)
def test_history_of_something_the_log_never_saw_is_not_found(
    reconciled: ClusterRepo, option: str, known: str, unknown: str, what: str
) -> None:
    history = ("audit", "history", "--repo", reconciled.path, option)
    gitsched(*history, known, expect=EXIT_OK)
    run = gitsched(*history, unknown, expect=EXIT_NOT_FOUND)
    assert run.stderr == f"gitsched: the log never saw {what}\n"


def test_a_node_that_ran_nothing_is_an_empty_answer_not_an_error(reconciled: ClusterRepo) -> None:
    run = gitsched(
        "audit", "history", "--repo", reconciled.path, "--node", "h100-04", "--format", "json"
    )
    assert run.returncode == EXIT_OK and run.json() == []


def test_answers_from_a_log_with_a_broken_chain_exit_1(reconciled: ClusterRepo) -> None:
    # No audit view yet: the first evidence query builds it and checks the chain as it
    # folds. (Behind a view's checked offset, only `log verify` re-reads the whole chain:
    # tests/unit/test_audit_verification.py.)
    db = sqlite3.connect(reconciled.log_path)
    with db:
        [data] = db.execute("SELECT data FROM events WHERE seq = 5").fetchone()
        forged = json.dumps({**json.loads(data), "forged": True})
        db.execute("UPDATE events SET data = ? WHERE seq = 5", (forged,))
    db.close()

    for command in ("state", "audit changes", "audit compliance"):
        run = gitsched(*command.split(), "--repo", reconciled.path, expect=EXIT_INVALID)
        assert run.stdout == "", command
        assert "seq 5" in run.stderr and "hash" in run.stderr, run

    run = gitsched("log", "verify", "--repo", reconciled.path, expect=EXIT_INVALID)
    assert "seq 5" in run.stdout + run.stderr, run

    page = reconciled.path / "report.html"
    run = gitsched("audit", "report", "--repo", reconciled.path, "-o", page, expect=EXIT_INVALID)
    assert "the log's hash chain is broken at seq 5" in run.stderr
