"""`gitsched bench log`: it measures what it says, on both backends, and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cluster_repo import gitsched, read_events
from tests.support.kafka_broker import admin_client, bootstrap_from_env, check_broker


def results(run_stdout: str) -> dict[str, dict[str, object]]:
    return {r["backend"]: r for r in json.loads(run_stdout)["results"]}


def test_one_append_per_commit_of_jobs_and_their_placements(tmp_path: Path) -> None:
    log = tmp_path / "bench.db"
    run = gitsched(
        "bench", "log", "--log", f"sqlite:///{log}", "--events", "230", "--jobs", "10",
        "--format", "json", expect=0,
    )  # fmt: skip

    [sqlite] = results(run.stdout).values()
    assert (sqlite["events"], sqlite["batch"]) == (230, 22)
    for rate in ("append_per_s", "replay_per_s", "fold_per_s"):
        assert float(str(sqlite[rate])) > 0, rate
    events = read_events(log)
    assert len(events) == 230
    # Every commit: 10 JobSubmitted, CommitApplied, 10 PlacementDecided, SolveCompleted, in
    # one transaction; 230 events are ten whole commits and a cut-short eleventh.
    times = [e.time for e in events]
    assert [e.type for e in events[:22]] == (
        ["JobSubmitted"] * 10 + ["CommitApplied"] + ["PlacementDecided"] * 10 + ["SolveCompleted"]
    )
    assert all(len(set(times[i : i + 22])) == 1 for i in range(0, 230, 22))
    # The restart is timed from the first event and from a snapshot half way.
    assert sqlite["snapshot_seq"] == 115 and int(str(sqlite["snapshot_bytes"])) > 0
    assert float(str(sqlite["restart_s"])) > 0 and float(str(sqlite["restart_from_snapshot_s"])) > 0


def test_jobs_finish_so_the_cluster_holds_about_live_jobs(tmp_path: Path) -> None:
    log = tmp_path / "bench.db"
    gitsched(
        "bench", "log", "--log", f"sqlite:///{log}", "--events", "2000", "--jobs", "10",
        "--live-jobs", "30", "--format", "json", expect=0,
    )  # fmt: skip
    state = gitsched("state", "--log", f"sqlite:///{log}", "--format", "json", expect=0).json()
    finished = [e for e in read_events(log) if e.type == "JobFinished"]
    assert finished and len(state["placements"]) <= 40


def test_a_log_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    log = f"sqlite:///{tmp_path / 'bench.db'}"
    gitsched("bench", "log", "--log", log, "--events", "50", expect=0)
    refused = gitsched("bench", "log", "--log", log, "--events", "50", expect=2)
    assert "is not empty" in refused.stderr


@pytest.mark.kafka
def test_kafka_is_measured_on_a_fresh_topic_that_is_deleted_afterwards() -> None:
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    admin = admin_client(bootstrap)
    try:
        before = set(admin.list_topics())
        run = gitsched(
            "bench", "log", "--kafka", bootstrap, "--events", "500", "--jobs", "20",
            "--format", "json", expect=0,
        )  # fmt: skip
        after = set(admin.list_topics())
    finally:
        admin.close()
    measured = results(run.stdout)
    assert set(measured) == {"sqlite", "kafka"}
    assert measured["kafka"]["events"] == 500 and measured["kafka"]["batch"] == 42
    assert not {t for t in after - before if t.startswith("gitsched-bench-")}


@pytest.mark.kafka
def test_backend_kafka_measures_only_a_topic_and_its_restart_from_a_snapshot() -> None:
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    run = gitsched(
        "bench", "log", "--kafka", bootstrap, "--backend", "kafka", "--events", "300",
        "--jobs", "10", "--format", "json", expect=0,
    )  # fmt: skip
    [kafka] = results(run.stdout).values()
    assert (kafka["backend"], kafka["events"], kafka["snapshot_seq"]) == ("kafka", 300, 150)
    assert int(str(kafka["snapshot_bytes"])) > 0
    assert float(str(kafka["restart_s"])) > 0 and float(str(kafka["restart_from_snapshot_s"])) > 0


def test_backend_is_for_the_logs_bench_makes_itself(tmp_path: Path) -> None:
    log = f"sqlite:///{tmp_path / 'bench.db'}"
    refused = gitsched("bench", "log", "--log", log, "--backend", "sqlite", expect=2)
    assert "not both" in refused.stderr
