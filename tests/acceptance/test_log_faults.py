"""A reconciler killed at any point, or racing another, leaves the log a clean run leaves.

Each test drives `gitsched reconcile --once` as a real process against a fresh
log — a SQLite file, or a topic on the real Kafka broker (GITSCHED_TEST_KAFKA) —
on a repo with 48 commits, kills it with SIGKILL (between transactions, and
inside them), restarts it until it finishes, and then asks: does `audit verify`
pass, is every event there exactly once, in the order of a clean run, and does
the folded state equal the clean run's?
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gitsched.eventlog.envelope import verify_chain
from tests.support.cluster_repo import finish, gitsched, start_gitsched
from tests.support.log_fixtures import (
    LogFactory,
    Outcome,
    clean_outcome,
    kill_when_seq_passes,
    logs,
    long_history,
    read_log,
    reconcile_args,
    run_to_the_end,
    start_dying,
    wait_killed,
)

__all__ = ["logs", "long_history"]  # fixtures, used by name


@pytest.fixture(scope="module")
def clean(long_history: Path, logs: LogFactory) -> Outcome:
    """One uninterrupted run on a fresh log of the backend under test."""
    outcome = clean_outcome(long_history, logs)
    assert len(outcome.ids_and_types) > 150, "the history is too short to kill a run in it"
    return outcome


def assert_as_clean(url: str, clean: Outcome) -> None:
    verified = gitsched("audit", "verify", "--log", url)
    assert verified.returncode == 0, str(verified)
    events = read_log(url)
    assert verify_chain(events) is None
    ids = [e.id for e in events]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicated, f"events appended twice: {duplicated[:5]}"
    got = [(e.id, e.type) for e in events]
    lost = [pair for pair in clean.ids_and_types if pair not in set(got)]
    assert not lost, f"{len(lost)} events of a clean run are missing, e.g. {lost[:3]}"
    assert got == clean.ids_and_types, "the events are not in the order of a clean run"
    assert Outcome.of(url).state == clean.state


def test_killed_between_transactions_at_several_points(
    long_history: Path, logs: LogFactory, clean: Outcome, tmp_path: Path
) -> None:
    url = logs.new_url()
    last_seq = logs.last_seq_reader(url)
    total = len(clean.ids_and_types)
    marks = [1, total // 4, total // 2, (total * 3) // 4]
    killed_at = []
    for mark in marks:
        # Paced, so a fast writer cannot finish the history before the watcher sees
        # the mark; the SIGKILL still lands wherever the process happens to be.
        progress = tmp_path / f"progress-{mark}"
        process = start_dying(long_history, url, "pace:50", progress)
        seq = kill_when_seq_passes(
            process, progress, last_seq, mark, f"reconcile (to be killed at {mark})"
        )
        if seq is None:
            assert process.returncode == 0
            break
        killed_at.append(seq)
    assert len(killed_at) >= 3, f"the run finished before it could be killed: {killed_at}"
    assert killed_at == sorted(killed_at) and killed_at[-1] < total, killed_at
    final = run_to_the_end(long_history, url)
    assert final.returncode == 0, str(final)
    assert_as_clean(url, clean)


@pytest.mark.parametrize(
    "deaths",
    [
        pytest.param(
            [("before-commit", 2), ("after-commit", 3), ("before-commit", 7), ("after-commit", 5)],
            id="written-not-committed-and-committed-not-acknowledged",
        )
    ],
)
def test_killed_inside_transactions(
    long_history: Path, logs: LogFactory, clean: Outcome, deaths: list[tuple[str, int]]
) -> None:
    url = logs.new_url()
    last_seq = logs.last_seq_reader(url)
    seen = [0]
    for when, n in deaths:
        wait_killed(start_dying(long_history, url, f"{when}:{n}"), f"reconcile dying {when}:{n}")
        seen.append(last_seq())
    assert seen == sorted(seen) and seen[-1] > 0, seen
    final = run_to_the_end(long_history, url)
    assert final.returncode == 0, str(final)
    assert_as_clean(url, clean)
    if logs.backend == "kafka":
        # The batches that died before their commit are on the topic, aborted, unread.
        assert logs.records_written(url) > len(clean.ids_and_types)


def test_two_reconcilers_started_together_end_as_one_clean_run(
    long_history: Path, logs: LogFactory, clean: Outcome
) -> None:
    url = logs.new_url()
    args = reconcile_args(long_history, url)
    processes = [start_gitsched(*args), start_gitsched(*args)]
    runs = [finish(p, args) for p in processes]
    codes = sorted(run.returncode for run in runs)
    # The one that loses the race either re-reads the log and finds its work done
    # (exit 0), or stops with one line saying another writer took over (exit 2).
    assert codes in ([0, 0], [0, 2]), [str(run) for run in runs]
    for run in runs:
        if run.returncode == 2:
            assert run.stdout == "" and run.stderr.startswith("gitsched: "), str(run)
            assert len(run.stderr.strip().splitlines()) == 1, str(run)
            assert any(word in run.stderr for word in ("another writer", "took over", "locked")), (
                str(run)
            )
    assert_as_clean(url, clean)
    again = gitsched(*args, expect=0)
    assert "0 event(s) appended" in again.stdout
