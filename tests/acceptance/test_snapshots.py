"""Snapshots through the CLI: the reconciler writes them, every reader starts from them,
and one that no longer fits the log is named and skipped, never trusted."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from tests.support.cluster_repo import ANA, ClusterRepo, gitsched, job_yaml, read_events
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic


def _submit(repo: ClusterRepo, *names: str) -> None:
    for name in names:
        repo.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name))
    repo.commit(f"ml: {', '.join(names)}", author=ANA)


def test_the_reconciler_snapshots_and_state_reads_the_same_from_it(
    bootstrapped: ClusterRepo,
) -> None:
    gitsched("reconcile", "--once", "--snapshot-every", "5", bootstrapped.path, expect=0)
    bootstrap_seq = read_events(bootstrapped.log_path)[-1].seq
    assert bootstrap_seq >= 5
    _submit(bootstrapped, "train")
    gitsched("reconcile", "--once", "--snapshot-every", "5", bootstrapped.path, expect=0)
    last = read_events(bootstrapped.log_path)[-1].seq
    assert last - bootstrap_seq < 5  # too few new events for another snapshot

    listed = gitsched(
        "log", "snapshots", "--repo", bootstrapped.path, "--format", "json", expect=0
    ).json()
    assert [(s["seq"], s["usable"]) for s in listed] == [(bootstrap_seq, True)]
    from_snapshot = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0)
    assert from_snapshot.stderr == ""

    with sqlite3.connect(bootstrapped.log_path) as db:
        db.execute("DELETE FROM snapshots")
    full = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0)
    assert from_snapshot.json() == full.json()
    assert "ml/train" in full.json()["placements"]


def test_an_altered_snapshot_is_named_and_the_state_comes_from_the_log(
    bootstrapped: ClusterRepo,
) -> None:
    _submit(bootstrapped, "train", "eval")
    gitsched("reconcile", "--once", bootstrapped.path, expect=0)
    truth = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0).json()
    written = gitsched(
        "log", "snapshot", "--repo", bootstrapped.path, "--format", "json", expect=0
    ).json()
    assert written["seq"] == truth["seq"] and written["size_bytes"] > 0

    with sqlite3.connect(bootstrapped.log_path) as db:
        # Flip one byte of the state, as an editor of the file could.
        body = bytearray(db.execute("SELECT body FROM snapshots").fetchone()[0])
        body[len(body) // 2] ^= 0x01
        db.execute("UPDATE snapshots SET body = ?", (bytes(body),))

    checked = gitsched(
        "log", "snapshots", "--repo", bootstrapped.path, "--format", "json", expect=1
    )
    assert checked.json()[0]["usable"] is False
    assert "altered" in checked.json()[0]["problem"]
    state = gitsched("state", "--repo", bootstrapped.path, "--format", "json", expect=0)
    assert state.json() == truth
    assert f"snapshot at seq {written['seq']} ignored" in state.stderr
    assert "altered" in state.stderr


@pytest.fixture
def kafka_log() -> Iterator[str]:
    """A fresh topic on the test broker (deleted afterwards): fails, never skips, without one."""
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    topic = unique_topic("gitsched-snapshots")
    try:
        yield f"kafka://{bootstrap}/{topic}"
    finally:
        delete_topics(bootstrap, [topic])


@pytest.mark.kafka
def test_on_kafka_snapshots_live_beside_the_repo_and_an_altered_one_is_skipped(
    bootstrapped: ClusterRepo, kafka_log: str
) -> None:
    """A Kafka log's reader keeps its snapshots in REPO/.gitsched/snapshots/TOPIC: the
    reconciler writes them there, `state` starts from them, and one whose bytes were
    edited is named on stderr and the state comes from the log all the same."""
    log = ("--log", kafka_log)
    gitsched("reconcile", "--once", "--snapshot-every", "5", *log, bootstrapped.path, expect=0)
    _submit(bootstrapped, "train", "eval")
    gitsched("reconcile", "--once", *log, bootstrapped.path, expect=0)
    folder = bootstrapped.path / ".gitsched" / "snapshots" / kafka_log.rsplit("/", 1)[1]
    [written] = folder.glob("*.snapshot")

    listed = gitsched(
        "log", "snapshots", *log, "--repo", bootstrapped.path, "--format", "json", expect=0
    ).json()
    assert [s["usable"] for s in listed] == [True]
    from_snapshot = gitsched(
        "state", *log, "--repo", bootstrapped.path, "--format", "json", expect=0
    )
    assert from_snapshot.stderr == ""
    assert from_snapshot.json()["seq"] > listed[0]["seq"]  # the tail was folded too
    assert "ml/train" in from_snapshot.json()["placements"]

    # Flip one byte of the state, as an editor of the file could.
    raw = bytearray(written.read_bytes())
    raw[len(raw) - 10] ^= 0x01
    written.write_bytes(bytes(raw))
    checked = gitsched(
        "log", "snapshots", *log, "--repo", bootstrapped.path, "--format", "json", expect=1
    )
    assert "altered" in checked.json()[0]["problem"]
    state = gitsched("state", *log, "--repo", bootstrapped.path, "--format", "json", expect=0)
    assert state.json() == from_snapshot.json()
    assert f"snapshot at seq {listed[0]['seq']} ignored" in state.stderr

    # Without any snapshot, a full replay of the topic says the same.
    written.unlink()
    full = gitsched("state", *log, "--repo", bootstrapped.path, "--format", "json", expect=0)
    assert full.json() == from_snapshot.json() and full.stderr == ""
