"""Which rows of a period to read, without scanning the whole view.

Intervals (placements, usage segments) get ids in the order they start, and a
checkpoint lists the ids open at its seq. So the intervals overlapping
[since, until) are: those open at the last checkpoint before `since`, plus the
ids started after it and before `until` — a bounded read, like `at`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from gitsched.audit.store import AuditStore
from gitsched.eventlog.envelope import format_time

T = TypeVar("T")

# `checkpoints.tbl` for each interval table.
PLACEMENTS, VERSIONS = 0, 1


@dataclass(frozen=True, slots=True)
class IdWindow:
    """Ids [first, stop) started after the checkpoint and before `until`, and the checkpoint's
    own open ids (`checkpoint_seq`, 0 when none): together, every interval that may overlap."""

    first: int
    stop: int
    checkpoint_seq: int


def iso(ts: float) -> str:
    return format_time(datetime.fromtimestamp(ts, UTC))


def period(
    store: AuditStore, since: float | None, until: float | None, now: float
) -> tuple[float, float]:
    """The period usage and reports cover, one definition for both: from `since`, by
    default the log's first event, to `until`, by default its last event, so the same
    log always gives the same answer; intervals still open end there. An `until` after
    `now` is `now`: nothing is known about the future."""
    # Marks' times rise with their seqs (the fold marks a time only when it passes the
    # last one): the first and last by seq are the first and last by time, two seeks.
    first_row = store.db.execute("SELECT time FROM marks ORDER BY seq LIMIT 1").fetchone()
    last_row = store.db.execute("SELECT time FROM marks ORDER BY seq DESC LIMIT 1").fetchone()
    first = first_row[0] if first_row else None
    last = last_row[0] if last_row else None
    if until is not None:
        end = min(until, now)
    else:
        end = min(datetime.fromisoformat(last).timestamp(), now) if last else now
    start = (
        since
        if since is not None
        else (datetime.fromisoformat(first).timestamp() if first else end)
    )
    return start, end


def seq_before(store: AuditStore, ts: float) -> int:
    """The last seq of the log's prefix whose facts happened at or before `ts` (fact times).

    The first mark after `ts` by time is the first by seq: one index seek, where
    MIN(seq) would read every mark after `ts`."""
    row = store.db.execute(
        "SELECT seq FROM marks WHERE time > ? ORDER BY time LIMIT 1", (iso(ts),)
    ).fetchone()
    if row is None or row[0] is None:
        return store.offset()[0]
    return int(row[0]) - 1


def seqs_between(store: AuditStore, since: float | None, until: float | None) -> tuple[int, int]:
    """(after, upto): the seqs `after < seq <= upto` whose facts happened in [since, until);
    an open end is the log's start or the view's offset. Two index seeks on `marks`."""

    def before(ts: float) -> int:
        row = store.db.execute(
            "SELECT seq FROM marks WHERE time >= ? ORDER BY time LIMIT 1", (iso(ts),)
        ).fetchone()
        return store.offset()[0] if row is None else int(row[0]) - 1

    after = 0 if since is None else before(since)
    upto = store.offset()[0] if until is None else before(until)
    return after, max(after, upto)


def cut_page(rows: list[T], limit: int, seq_of: Callable[[T], int]) -> tuple[list[T], bool] | None:
    """The first `limit` of `rows` (read `limit + 1`, in seq order), ending at a seq
    boundary so that `--after-seq` of the last row shown starts the next page with nothing
    skipped, and whether more follow. None when one seq alone holds more than `limit`
    rows: the caller reads that whole seq as the page."""
    if len(rows) <= limit:
        return rows, False
    last = seq_of(rows[limit - 1])
    if seq_of(rows[limit]) != last:
        return rows[:limit], True
    kept = [r for r in rows[:limit] if seq_of(r) != last]
    return (kept, True) if kept else None


def read_page(
    read: Callable[[int, int, int | None], list[T]],
    after_seq: int,
    until_seq: int,
    limit: int | None,
    seq_of: Callable[[T], int],
) -> tuple[list[T], bool]:
    """A page of a seq-ordered listing: `read(after, upto, limit)` gives the rows of seqs
    `after < seq <= upto`, at most `limit` of them. With a `limit`, the page ends at a seq
    boundary (`cut_page`); where one seq alone holds more than `limit` rows, the page is
    that whole seq. Returns the rows and whether more follow."""
    rows = read(after_seq, until_seq, None if limit is None else limit + 1)
    if limit is None:
        return rows, False
    page = cut_page(rows, limit, seq_of)
    if page is not None:
        return page
    seq = seq_of(rows[0])
    return read(seq - 1, seq, None), bool(read(seq, until_seq, 1))


def first_id_from(store: AuditStore, table: str, column: str, ts: float) -> int:
    """The smallest id in `table` whose start `column` is at or after `ts` (ids follow starts)."""
    # Not MIN(id): that would read every index entry after `ts`; ids follow `column`.
    row = store.db.execute(
        f"SELECT id FROM {table} WHERE {column} >= ? ORDER BY {column}, id LIMIT 1", (ts,)
    ).fetchone()
    if row is not None:
        return int(row[0])
    last = store.db.execute(f"SELECT MAX(id) FROM {table}").fetchone()
    return int(last[0] or 0) + 1


# Per interval table (`checkpoints.tbl`): the table, its start column, and the column of
# `checkpoint_marks` with the last id it had at the checkpoint.
_INTERVALS = {
    PLACEMENTS: ("placements", "start_ts", "placement_max"),
    VERSIONS: ("versions", "from_ts", "version_max"),
}


def interval_window(
    store: AuditStore, tbl: int, since: float | None, until: float | None
) -> IdWindow:
    """The ids of table `tbl` (PLACEMENTS or VERSIONS) that may overlap [since, until): the
    checkpoint's open ids before `since`, and the ids started after it and before `until`."""
    table, start, last_id = _INTERVALS[tbl]
    stop = first_id_from(store, table, start, until) if until is not None else 2**62
    if since is None:
        return IdWindow(1, stop, 0)
    mark = store.db.execute(
        f"SELECT seq, {last_id} FROM checkpoint_marks WHERE seq <= ? ORDER BY seq DESC LIMIT 1",
        (seq_before(store, since),),
    ).fetchone()
    if mark is None:
        return IdWindow(1, stop, 0)
    return IdWindow(int(mark[1]) + 1, stop, int(mark[0]))


def placement_window(store: AuditStore, since: float | None, until: float | None) -> IdWindow:
    return interval_window(store, PLACEMENTS, since, until)
