"""`audit fairshare` and `audit solves` read the audit view's rows, not the whole log.

- the rows a view built in steps gives equal those of one rebuilt from 0, and both
  equal a replay of the whole log through the engine's fold (what the commands did
  before they read the view);
- once the view is current, the commands read no event from offset 0: only the one at
  the view's offset (its hash), and after an append only the new ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gitsched import cli_audit
from gitsched.audit import fairshare, solves
from gitsched.audit.catchup import catch_up, rebuild
from gitsched.audit.store import AuditStore, EventList
from gitsched.cli import main
from gitsched.engine.events import SolveCompleted
from gitsched.engine.state import ClusterState, evolve
from gitsched.eventlog.codec import decode
from gitsched.eventlog.envelope import StoredEvent
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.simulation.history import synthetic_events

EVENTS = 3000


def replayed(events: Sequence[StoredEvent], times: Sequence[float]) -> list[dict[str, Any]]:
    """Fair share at each of `times` by folding the whole log, as the command did before:
    a sample reads the state before the first event whose fold's clock passes it."""
    state = ClusterState()
    rows: list[dict[str, Any]] = []
    i = 0
    for event in events:
        after = evolve(state, decode(event))
        while i < len(times) and times[i] < after.clock:
            rows += fairshare.rows_of_state(state, times[i])
            i += 1
        state = after
    for at in times[i:]:
        rows += fairshare.rows_of_state(state, at)
    return rows


def solves_replayed(events: Sequence[StoredEvent]) -> list[tuple[Any, ...]]:
    out = []
    for event in events:
        if event.type == SolveCompleted.type:
            s = decode(event)
            assert isinstance(s, SolveCompleted)
            out.append((event.seq, event.time, event.cause, s.solver, s.plan_source, s.gap))
    return out


def sampled(store: AuditStore, every_h: float) -> list[float]:
    first, last = store.db.execute("SELECT MIN(clock), MAX(clock) FROM fairshare_clock").fetchone()
    # from before the first event to past the last: empty, growing and settled states
    return fairshare.sample_times(first - 3600.0, last + 7200.0, every_h * 3600.0)


@pytest.mark.parametrize("seed", [3, 11])
def test_fair_share_after_catch_ups_equals_a_rebuild_from_zero_and_the_replay(
    tmp_path: Path, seed: int
) -> None:
    events = list(synthetic_events(EVENTS, seed, 120.0))
    with AuditStore(tmp_path / "steps.db") as steps:
        for upto in (1, 40, 777, 1500, 2999):
            catch_up(EventList(events), steps, until_seq=upto, batch_events=311)
        catch_up(EventList(events), steps)
        rebuild(EventList(events), tmp_path / "whole.db", batch_events=500)
        with AuditStore(tmp_path / "whole.db") as whole:
            times = sampled(whole, every_h=1.0)
            assert len(times) > 20
            got = fairshare.fair_share_over_time(steps, times)
            assert got == fairshare.fair_share_over_time(whole, times)
            assert got == replayed(events, times)
            # the samples see queues use GPUs, and usage decay: not a table of zeros
            assert any(r["used_gpu_hours_decayed"] > 0 for r in got)
            assert len({r["fair_share_pct"] for r in got}) > 1
            listed = solves.solves(steps)
            assert listed == solves.solves(whole)
            assert [
                (r["seq"], r["time"], r["cause"], r["solver"], r["plan_source"], r["gap_pct"])
                for r in listed
            ] == [
                (seq, t, c, solver, src, None if gap is None else round(100 * gap, 4))
                for seq, t, c, solver, src, gap in solves_replayed(events)
            ]
            assert listed


class CountingLog:
    """Our SQLite `EventLog`, counting what each `read` yields and where it starts."""

    def __init__(self, log: SQLiteEventLog, reads: list[list[int]]) -> None:
        self._log = log
        self.reads = reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def __enter__(self) -> CountingLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._log.close()

    def read(self, after_seq: int = 0, **kwargs: Any) -> Iterator[StoredEvent]:
        record = [after_seq, 0]
        self.reads.append(record)
        for event in self._log.read(after_seq, **kwargs):
            record[1] += 1
            yield event


def test_the_commands_read_no_event_from_zero_once_the_view_is_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = list(synthetic_events(EVENTS, 5, 120.0))
    path = tmp_path / "log.db"
    SQLiteEventLog(path).import_events(events[:2000], expected_last_seq=0)
    reads: list[list[int]] = []

    @contextmanager
    def counted(log_url: str | None, repo: str | None) -> Iterator[CountingLog]:
        yield CountingLog(SQLiteEventLog(path), reads)

    monkeypatch.setattr(cli_audit, "open_event_log", counted)
    runner = CliRunner()

    def run(*args: str) -> str:
        argv = ["audit", *args, "--log", f"sqlite:///{path}", "--db", str(tmp_path / "a.db")]
        result = runner.invoke(main, [*argv, "--repo", str(tmp_path), "--format", "json"])
        assert result.exit_code == 0, result.output
        return result.output

    first = run("fairshare", "--every-hours", "6")  # no view yet: built from 0
    assert [0, 2000] in reads
    for command in (("fairshare", "--every-hours", "6"), ("solves",)):
        reads.clear()
        again = run(*command)
        # only the event at the view's offset, to check it is still the one it read
        assert reads == [[1999, 1]], command
    assert again.count('"seq"') > 0
    reads.clear()
    assert run("fairshare", "--every-hours", "6") == first

    SQLiteEventLog(path).import_events(events[2000:], expected_last_seq=2000)
    reads.clear()
    run("solves")
    assert all(after > 0 for after, _ in reads)
    assert sum(n for _, n in reads) == 1 + (EVENTS - 2000)
