"""`gitsched log copy`: a log moved between backends keeps every envelope byte for byte."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitsched.demo import FIXED_CREATED_AT, build_demo_repo
from tests.support.cluster_repo import gitsched
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic
from tests.support.log_fixtures import read_log


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo repo reconciled into a SQLite log: (repo, log URL). Copy, never modify."""
    repo = tmp_path_factory.mktemp("demo") / "cluster"
    build_demo_repo(repo, FIXED_CREATED_AT)
    url = f"sqlite:///{repo.parent / 'source.db'}"
    gitsched("reconcile", repo, "--once", "--log", url, expect=0)
    return repo, url


@pytest.fixture
def kafka_topics() -> Iterator[list[str]]:
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    topics: list[str] = []
    yield topics
    delete_topics(bootstrap, topics)


def kafka_url(topics: list[str]) -> str:
    topic = unique_topic("gitsched-copy")
    topics.append(topic)
    return f"kafka://{bootstrap_from_env()}/{topic}"


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def rows(url: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return db.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        db.close()


def copy(source: str, target: str, expect: int | None = 0) -> str:
    run = gitsched("log", "copy", "--from", source, "--to", target, expect=expect)
    return run.output


def verified(url: str) -> str:
    return gitsched("audit", "verify", "--log", url, expect=0).stdout


@pytest.mark.kafka
def test_sqlite_to_kafka_to_sqlite_keeps_every_envelope(
    demo_log: tuple[Path, str], kafka_topics: list[str], tmp_path: Path
) -> None:
    _, source = demo_log
    on_kafka = kafka_url(kafka_topics)
    back = sqlite_url(tmp_path / "back.db")

    original = [e.to_record() for e in read_log(source)]
    out = copy(source, on_kafka)
    assert f"copied {len(original)} events" in out and "chain verified" in out, out
    copy(on_kafka, back)

    assert [e.to_record() for e in read_log(on_kafka)] == original
    assert [e.to_record() for e in read_log(back)] == original
    assert rows(back) == rows(source), "the SQLite rows differ byte for byte"
    assert verified(source) == verified(on_kafka) == verified(back)
    info = gitsched("log", "info", "--log", on_kafka, "--format", "json", expect=0).json()
    assert info["last_seq"] == len(original) and info["head_hash"] == original[-1]["hash"]


@pytest.mark.kafka
def test_a_copy_into_a_prefix_of_the_source_resumes(
    kafka_topics: list[str], tmp_path: Path
) -> None:
    repo = tmp_path / "cluster"
    build_demo_repo(repo, FIXED_CREATED_AT)
    source = sqlite_url(tmp_path / "source.db")
    target = kafka_url(kafka_topics)
    gitsched("reconcile", repo, "--once", "--branch", "main~4", "--log", source, expect=0)
    first = len(read_log(source))
    copy(source, target)
    gitsched("reconcile", repo, "--once", "--log", source, expect=0)

    out = copy(source, target)
    assert f"resumed after seq {first}" in out, out
    assert [e.to_record() for e in read_log(target)] == [e.to_record() for e in read_log(source)]
    assert "copied 0 events" in copy(source, target)


def test_a_target_that_is_not_a_prefix_is_refused(
    demo_log: tuple[Path, str], tmp_path: Path
) -> None:
    repo, source = demo_log
    other = sqlite_url(tmp_path / "other.db")
    gitsched("reconcile", repo, "--once", "--branch", "main~10", "--log", other, expect=0)
    before = rows(other)

    out = copy(source, other, expect=1)
    assert "differs from the source at seq 1" in out, out
    assert rows(other) == before


def test_a_tampered_source_is_refused_naming_the_seq(
    demo_log: tuple[Path, str], tmp_path: Path
) -> None:
    _, clean = demo_log
    source = tmp_path / "tampered.db"
    source.write_bytes(Path(clean.removeprefix("sqlite:///")).read_bytes())
    db = sqlite3.connect(source)
    with db:
        db.execute("UPDATE events SET actor = 'mallory' WHERE seq = 12")
    db.close()
    target = sqlite_url(tmp_path / "target.db")

    out = copy(sqlite_url(source), target, expect=1)
    assert "seq 12" in out and "changed" in out, out
    assert len(out.strip().splitlines()) == 1, out
    copied = read_log(target)
    assert len(copied) < 12
    gitsched("audit", "verify", "--log", target, expect=0)


def test_usage_errors_are_one_line_and_exit_2(demo_log: tuple[Path, str], tmp_path: Path) -> None:
    _, source = demo_log
    same = gitsched("log", "copy", "--from", source, "--to", source, expect=2)
    assert same.stderr.startswith("gitsched: ") and "same log" in same.stderr
    missing = sqlite_url(tmp_path / "nowhere.db")
    run = gitsched(
        "log", "copy", "--from", missing, "--to", sqlite_url(tmp_path / "t.db"), expect=2
    )
    assert "no SQLite log" in run.stderr and not (tmp_path / "nowhere.db").exists()
    bad = gitsched("log", "copy", "--from", source, "--to", "kafka://", expect=2)
    assert bad.stderr.startswith("gitsched: "), str(bad)
