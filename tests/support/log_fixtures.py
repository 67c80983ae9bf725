"""Logs on both backends, a cluster repo with a long history, and reconcilers that die.

A reconciler is killed in two ways. From outside: a paced reconciler notes the
last seq of each append in a progress file, and the test sends SIGKILL once it
passes a mark (between transactions, or while the next one is being solved). From inside: run as
`python -m tests.support.log_fixtures reconcile ...` with GITSCHED_TEST_DIE
set, the process SIGKILLs itself at an exact point of its N-th write (with the
batch written but not committed, or committed but not yet acknowledged), which
no timing from outside can hit reliably. Either way nothing gets to clean up.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gitsched.eventlog.envelope import StoredEvent
from tests.support.cluster_repo import COMMAND_TIMEOUT_S, Run, finish, gitsched, start_gitsched
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic

# GITSCHED_TEST_DIE="WHEN:N": WHEN is before-commit or after-commit, N counts writes from 1.
DIE_ENV = "GITSCHED_TEST_DIE"
# With DIE_ENV="pace:MS", the file each append writes its last seq to.
PROGRESS_ENV = "GITSCHED_TEST_PROGRESS"
EXTRA_COMMITS = 36
START = 1_763_900_000


# -- the cluster repo -------------------------------------------------------------------------


def _batch_job(i: int, cpu: int = 8) -> str:
    return (
        "apiVersion: gitsched.io/v1\nkind: Job\n"
        f"metadata:\n  name: batch-{i}\nspec:\n"
        "  replicas: 1\n"
        f"  resources: {{gpu: 1, cpu: {cpu}, memoryGiB: 64}}\n"
        "  gpuFlavors: [l40s-48g]\n"
        "  priorityClass: low\n"
    )


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=COMMAND_TIMEOUT_S,
    )


def build_long_history(directory: Path, extra: int = EXTRA_COMMITS) -> Path:
    """The demo repo's twelve commits, then `extra` more: small speech jobs added,
    changed and withdrawn, so every commit is appended and placed."""
    from gitsched.demo import FIXED_CREATED_AT, build_demo_repo

    build_demo_repo(directory, FIXED_CREATED_AT)
    for i in range(extra):
        jobs = directory / "teams" / "speech" / "jobs"
        (jobs / f"batch-{i}.yaml").write_text(_batch_job(i))
        if i % 4 == 3:
            (jobs / f"batch-{i - 3}.yaml").unlink()
        if i % 5 == 4:
            (jobs / f"batch-{i - 1}.yaml").write_text(_batch_job(i - 1, cpu=16))
        _git(directory, "add", "-A")
        when = f"@{START + i * 600} +0000"
        who = {"GIT_AUTHOR_NAME": "Sam Okafor", "GIT_AUTHOR_EMAIL": "sam@speech.example"}
        who |= {"GIT_COMMITTER_NAME": "Sam Okafor", "GIT_COMMITTER_EMAIL": "sam@speech.example"}
        who |= {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        _git(
            directory,
            "-c",
            "commit.gpgsign=false",
            "commit",
            "-q",
            "-m",
            f"speech: batch {i}",
            env=who,
        )
    return directory


# -- logs on both backends --------------------------------------------------------------------


@dataclass
class LogFactory:
    """Fresh logs of one backend: a SQLite file each, or a Kafka topic each (deleted at the end)."""

    backend: str
    scratch: Path
    bootstrap: str = ""
    topics: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._readers: list[Any] = []

    def new_url(self) -> str:
        if self.backend == "sqlite":
            path = self.scratch / f"{unique_topic('log')}.db"
            return f"sqlite:///{path}"
        topic = unique_topic("gitsched-faults")
        self.topics.append(topic)
        return f"kafka://{self.bootstrap}/{topic}"

    def last_seq_reader(self, url: str) -> Callable[[], int]:
        """A cheap way to watch a log grow while another process writes it (never fences it)."""
        if self.backend == "sqlite":
            path = url.removeprefix("sqlite:///")

            def sqlite_last() -> int:
                if not Path(path).exists():
                    return 0
                db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
                try:
                    row = db.execute("SELECT MAX(seq) FROM events").fetchone()
                except sqlite3.OperationalError:
                    return 0  # the table is not there yet
                finally:
                    db.close()
                return int(row[0] or 0)

            return sqlite_last
        from gitsched.eventlog.kafka import KafkaEventLog

        reader = KafkaEventLog.from_url(url, timeout_s=20)
        self._readers.append(reader)
        return reader.last_seq

    def records_written(self, url: str) -> int:
        """Every data record ever written to a Kafka log's topic, aborted transactions included."""
        from kafka import KafkaConsumer, TopicPartition  # type: ignore[import-untyped,unused-ignore]

        partition = TopicPartition(url.rsplit("/", 1)[1], 0)
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap.split(","),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_uncommitted",
        )
        try:
            consumer.assign([partition])
            consumer.seek_to_beginning(partition)
            end = consumer.end_offsets([partition])[partition]
            count = 0
            while consumer.position(partition) < end:
                count += sum(len(batch) for batch in consumer.poll(timeout_ms=1000).values())
            return count
        finally:
            consumer.close()

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        delete_topics(self.bootstrap, self.topics)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def logs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LogFactory]:
    bootstrap = ""
    if request.param == "kafka":
        # Fails (never skips) with instructions when no broker answers.
        bootstrap = bootstrap_from_env()
        check_broker(bootstrap)
    factory = LogFactory(request.param, tmp_path_factory.mktemp(f"logs-{request.param}"), bootstrap)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def long_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read only: reconcile never writes to the repo when --log points elsewhere."""
    return build_long_history(tmp_path_factory.mktemp("long") / "cluster")


# -- what a log says --------------------------------------------------------------------------


def read_log(url: str) -> list[StoredEvent]:
    from gitsched.eventlog import open_log

    with open_log(url, create=False) as event_log:
        return list(event_log.read(0))


def folded_state(url: str) -> dict[str, Any]:
    """`gitsched state --format json` less the times a re-run solve cannot reproduce."""
    state: dict[str, Any] = gitsched("state", "--log", url, "--format", "json", expect=0).json()
    for placement in state["placements"].values():
        placement.pop("since", None)
    return state


@dataclass(frozen=True)
class Outcome:
    """What a finished reconcile left in its log, in the terms a clean run is compared by."""

    ids_and_types: list[tuple[str, str]]
    state: dict[str, Any]

    @staticmethod
    def of(url: str) -> Outcome:
        events = read_log(url)
        return Outcome([(e.id, e.type) for e in events], folded_state(url))


# -- reconcilers that die ---------------------------------------------------------------------


def reconcile_args(repo: Path, url: str) -> tuple[str, ...]:
    return ("reconcile", str(repo), "--once", "--log", url)


def start_dying(
    repo: Path, url: str, die: str, progress: Path | None = None
) -> subprocess.Popen[str]:
    """A reconciler that SIGKILLs itself at `die` (see DIE_ENV), or with `pace:MS`
    one that pauses MS after each append and writes its last seq to `progress`,
    to be killed from outside."""
    from tests.support.cluster_repo import gitsched_env

    extra = {DIE_ENV: die}
    if progress is not None:
        extra[PROGRESS_ENV] = str(progress)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.log_fixtures", *reconcile_args(repo, url)],
        cwd=Path(__file__).resolve().parents[2],
        env=gitsched_env(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_killed(process: subprocess.Popen[str], what: str) -> None:
    try:
        _, stderr = process.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{what} hung")
    assert process.returncode == -signal.SIGKILL, (
        f"{what} was meant to die: {process.returncode} {stderr}"
    )


def _progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0  # not written yet, or caught half-way through a write


def kill_when_seq_passes(
    process: subprocess.Popen[str],
    progress: Path,
    last_seq: Callable[[], int],
    mark: int,
    what: str,
) -> int | None:
    """SIGKILL `process` (started with `progress`) as soon as an append of its takes the
    log past `mark`; the log's last seq after the kill, or None if it finished first.

    The process's own note is watched rather than the log: a reader catching up with
    the log can lag a fast writer by many transactions on a loaded machine, and the
    kill would land after the run's last write."""
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while process.poll() is None:
        if _progress(progress) >= mark:
            process.send_signal(signal.SIGKILL)
            process.communicate()
            return last_seq()
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{what} hung")
        time.sleep(0.01)
    process.communicate()
    return None


def run_to_the_end(repo: Path, url: str) -> Run:
    args = reconcile_args(repo, url)
    return finish(start_gitsched(*args), args)


def _die_at(when: str, n: int) -> None:
    """Patch the log backends so this process kills itself at its n-th write."""
    import gitsched.eventlog.kafka
    import gitsched.eventlog.sqlite

    eventlog = gitsched.eventlog

    writes = 0

    def due() -> bool:
        nonlocal writes
        writes += 1
        return writes == n

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    real_commit = eventlog.kafka.KafkaWriter._commit

    def commit(self: Any, producer: Any, deadline: float) -> None:
        # The batch has been produced and flushed to the broker, inside a transaction.
        if due() and when == "before-commit":
            die()
        real_commit(self, producer, deadline)
        if writes == n and when == "after-commit":
            die()

    eventlog.kafka.KafkaWriter._commit = commit  # type: ignore[method-assign]

    class DyingConnection:
        """The SQLite connection, dying at the n-th COMMIT (rows inserted, not committed)."""

        def __init__(self, db: sqlite3.Connection) -> None:
            self._db = db

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                if due() and when == "before-commit":
                    die()
                result = self._db.execute(sql, *args)
                if writes == n and when == "after-commit":
                    die()
                return result
            return self._db.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._db, name)

    real_init = eventlog.sqlite.SQLiteEventLog.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self._db = DyingConnection(self._db)

    eventlog.sqlite.SQLiteEventLog.__init__ = init  # type: ignore[method-assign]


def clean_outcome(repo: Path, logs: LogFactory) -> Outcome:
    url = logs.new_url()
    run = run_to_the_end(repo, url)
    assert run.returncode == 0, str(run)
    return Outcome.of(url)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True)


def _pace(ms: int, progress: Path) -> None:
    """Patch the log backends so every append notes its last seq in `progress` and
    pauses `ms` after it returns, as a reconciler waiting for the next commit would:
    a watcher gets to see each seq."""
    import gitsched.eventlog.kafka
    import gitsched.eventlog.sqlite

    eventlog = gitsched.eventlog

    for backend in (eventlog.kafka.KafkaEventLog, eventlog.sqlite.SQLiteEventLog):
        real_append = backend.append

        def append(self: Any, *args: Any, _real: Any = real_append, **kwargs: Any) -> Any:
            stored = _real(self, *args, **kwargs)
            if stored:
                progress.write_text(str(stored[-1].seq))
            time.sleep(ms / 1000)
            return stored

        backend.append = append  # type: ignore[method-assign]


if __name__ == "__main__":
    spec = os.environ.get(DIE_ENV, "")
    if spec:
        when, _, count = spec.partition(":")
        assert when in ("before-commit", "after-commit", "pace") and count.isdigit(), spec
        if when == "pace":
            _pace(int(count), Path(os.environ[PROGRESS_ENV]))
        else:
            _die_at(when, int(count))
    from gitsched.cli import main

    main(sys.argv[1:], prog_name="gitsched")
