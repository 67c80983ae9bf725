"""The audit views' SQLite file and its sink: row operations and the offset, one transaction.

Each batch the fold makes (`gitsched.audit.projection`) is applied together with the new
offset, the fold's state and how far the hash chain has been verified, so a crash
never leaves rows without their offset or the reverse. Bringing a view up to date
(`catch_up`, `rebuild`) is `gitsched.audit.catchup`; the view is a cache, never the truth.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

from gitsched.audit.projection.cluster_fold import ClusterFold
from gitsched.audit.projection.ledger import Usage, UsageLedger
from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import ProjectionState
from gitsched.audit.projection.vocabulary import FORMAT_VERSION
from gitsched.engine.errors import GitschedError
from gitsched.engine.snapshot import STATE_FORMAT
from gitsched.eventlog.envelope import StoredEvent

# The view keeps the engine's folded state (fair share, solves): a gitsched whose state
# has another shape (engine.snapshot.STATE_FORMAT) rebuilds the view rather than misread it.
VIEW_FORMAT = f"{FORMAT_VERSION}.{STATE_FORMAT}"

_PLACEMENT_COLUMNS = """
    id INTEGER PRIMARY KEY, job TEXT NOT NULL, name TEXT NOT NULL, queue TEXT NOT NULL,
    team TEXT NOT NULL, user TEXT NOT NULL, flavor TEXT, replicas INTEGER NOT NULL,
    gpu_milli INTEGER NOT NULL, nodes TEXT NOT NULL,
    start_seq INTEGER NOT NULL, start_time TEXT NOT NULL, start_ts REAL NOT NULL,
    start_kind TEXT NOT NULL, start_reason TEXT NOT NULL, start_cause TEXT NOT NULL,
    end_seq INTEGER, end_time TEXT, end_ts REAL, end_kind TEXT, end_reason TEXT, end_cause TEXT,
    queued_time TEXT NOT NULL, priority_class TEXT NOT NULL, attempt INTEGER NOT NULL,
    queued_ts REAL
"""
_VERSION_COLUMNS = """
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL,
    from_seq INTEGER NOT NULL, from_time TEXT NOT NULL, from_ts REAL NOT NULL,
    to_seq INTEGER, to_time TEXT, to_ts REAL, data TEXT NOT NULL
"""
_SEGMENT_COLUMNS = """
    id INTEGER PRIMARY KEY, queue TEXT NOT NULL, team TEXT NOT NULL, cohort TEXT,
    flavor TEXT NOT NULL, from_ts REAL NOT NULL, to_ts REAL, used INTEGER NOT NULL,
    nominal INTEGER NOT NULL, lendable INTEGER NOT NULL, r_from REAL NOT NULL, r_to REAL,
    lent REAL
"""

# Ended intervals, versions and segments are written once, complete; the open ones
# live in open_* (rewritten with every offset), and queries read both.
_TABLES = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS placements ({_PLACEMENT_COLUMNS});
CREATE TABLE IF NOT EXISTS open_placements ({_PLACEMENT_COLUMNS});
CREATE TABLE IF NOT EXISTS placement_nodes (
    node TEXT NOT NULL, placement INTEGER NOT NULL, PRIMARY KEY (node, placement)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions ({_VERSION_COLUMNS});
CREATE TABLE IF NOT EXISTS open_versions ({_VERSION_COLUMNS});
CREATE TABLE IF NOT EXISTS segments ({_SEGMENT_COLUMNS});
CREATE TABLE IF NOT EXISTS open_segments ({_SEGMENT_COLUMNS});
CREATE TABLE IF NOT EXISTS usage_days (
    queue TEXT NOT NULL, team TEXT NOT NULL, flavor TEXT NOT NULL, day INTEGER NOT NULL,
    used INTEGER NOT NULL, quota INTEGER NOT NULL, borrowed INTEGER NOT NULL,
    idle INTEGER NOT NULL, lent INTEGER NOT NULL, PRIMARY KEY (queue, team, flavor, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS user_days (
    user TEXT NOT NULL, team TEXT NOT NULL, flavor TEXT NOT NULL, day INTEGER NOT NULL,
    used INTEGER NOT NULL, started INTEGER NOT NULL, PRIMARY KEY (user, team, flavor, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cohort_rates (
    cohort TEXT NOT NULL, flavor TEXT NOT NULL, from_ts REAL NOT NULL, r_from REAL NOT NULL,
    rate REAL NOT NULL, PRIMARY KEY (cohort, flavor, from_ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS marks (seq INTEGER PRIMARY KEY, time TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    seq INTEGER PRIMARY KEY, sha TEXT NOT NULL, applied INTEGER NOT NULL, author TEXT NOT NULL,
    email TEXT NOT NULL, approvers TEXT NOT NULL, committed_at TEXT NOT NULL,
    applied_time TEXT NOT NULL, subject TEXT NOT NULL, detail INTEGER NOT NULL,
    authored_at TEXT NOT NULL, committer TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY, commit_seq INTEGER NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, target TEXT NOT NULL, team TEXT, summary TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
    commit_seq INTEGER NOT NULL, team TEXT NOT NULL, status TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (commit_seq, team)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS effects (
    commit_seq INTEGER NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, job TEXT NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (commit_seq, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS violations (
    id INTEGER PRIMARY KEY, check_name TEXT NOT NULL, seq INTEGER NOT NULL, time TEXT NOT NULL,
    subject TEXT NOT NULL, message TEXT NOT NULL, evidence TEXT NOT NULL,
    end_seq INTEGER, end_time TEXT
);
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER NOT NULL, tbl INTEGER NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (seq, tbl, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoint_marks (
    seq INTEGER PRIMARY KEY, placement_max INTEGER NOT NULL, version_max INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fairshare_clock (
    clock REAL PRIMARY KEY, seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fairshare_globals (
    seq INTEGER PRIMARY KEY, half_life_hours REAL NOT NULL, capacity_gpus INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fairshare_queues (
    queue TEXT NOT NULL, seq INTEGER NOT NULL, present INTEGER NOT NULL, cohort TEXT,
    weight REAL NOT NULL, gpu_seconds REAL NOT NULL, as_of REAL NOT NULL,
    running_gpu_milli INTEGER NOT NULL, idle_jobs INTEGER NOT NULL, PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS solves (
    seq INTEGER PRIMARY KEY, time TEXT NOT NULL, cause TEXT NOT NULL, solver TEXT NOT NULL,
    status TEXT NOT NULL, plan_source TEXT NOT NULL, fallback TEXT NOT NULL,
    objective REAL NOT NULL, bound REAL, gap REAL, seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS service_counts (
    service TEXT NOT NULL, seq INTEGER NOT NULL, at TEXT NOT NULL, event TEXT NOT NULL,
    desired INTEGER NOT NULL, replicas INTEGER NOT NULL, running INTEGER NOT NULL,
    "min" INTEGER NOT NULL, "max" INTEGER NOT NULL, why TEXT NOT NULL,
    metric_value REAL, target REAL, bound_by TEXT, PRIMARY KEY (service, seq)
) WITHOUT ROWID;
CREATE VIEW IF NOT EXISTS all_placements AS
    SELECT * FROM placements UNION ALL SELECT * FROM open_placements;
CREATE VIEW IF NOT EXISTS all_versions AS
    SELECT * FROM versions UNION ALL SELECT * FROM open_versions;
CREATE VIEW IF NOT EXISTS all_segments AS
    SELECT * FROM segments UNION ALL SELECT * FROM open_segments;
"""

# Made after a rebuild's bulk load, when they cost least; IF NOT EXISTS keeps it idempotent.
_INDEXES = """
CREATE INDEX IF NOT EXISTS placements_job ON placements(job);
CREATE INDEX IF NOT EXISTS open_placements_job ON open_placements(job);
CREATE INDEX IF NOT EXISTS placements_name ON placements(name);
CREATE INDEX IF NOT EXISTS placements_team ON placements(team);
CREATE INDEX IF NOT EXISTS placements_start_ts ON placements(start_ts);
CREATE INDEX IF NOT EXISTS versions_from_ts ON versions(from_ts);
CREATE INDEX IF NOT EXISTS segments_from_ts ON segments(from_ts);
CREATE INDEX IF NOT EXISTS segments_account ON segments(queue, flavor, from_ts);
CREATE INDEX IF NOT EXISTS versions_kind_key ON versions(kind, key);
CREATE INDEX IF NOT EXISTS open_placements_name ON open_placements(name);
CREATE INDEX IF NOT EXISTS marks_time ON marks(time);
CREATE INDEX IF NOT EXISTS changes_commit ON changes(commit_seq);
CREATE INDEX IF NOT EXISTS changes_team ON changes(team);
CREATE INDEX IF NOT EXISTS violations_seq ON violations(seq);
"""


def _values(width: int, rows: int = 1) -> str:
    one = "(" + ",".join("?" * width) + ")"
    return ",".join([one] * rows)


# Narrow rows go in many to a statement: stepping a statement costs more than binding a
# row. At most 999 parameters a statement, the limit of SQLite before 3.32.
_MULTI_ROW = 128

_INSERTS: tuple[tuple[str, str, int, bool], ...] = (
    # batch list, INSERT ... INTO table, row width, many rows a statement
    ("placements", "INSERT INTO placements", 26, False),
    ("placement_nodes", "INSERT INTO placement_nodes", 2, True),
    ("versions", "INSERT INTO versions", 10, True),
    ("segments", "INSERT INTO segments", 13, True),
    ("rates", "INSERT OR REPLACE INTO cohort_rates", 5, False),
    ("marks", "INSERT INTO marks", 2, True),
    ("commits", "INSERT INTO commits", 12, True),
    ("changes", "INSERT INTO changes", 7, False),
    ("approvals", "INSERT INTO approvals", 4, False),
    ("effects", "INSERT INTO effects", 5, False),
    (
        "violations",
        "INSERT INTO violations (id, check_name, seq, time, subject, message, evidence)",
        7,
        False,
    ),
    ("checkpoints", "INSERT INTO checkpoints", 3, True),
    ("checkpoint_marks", "INSERT INTO checkpoint_marks", 3, False),
    ("fairshare_clock", "INSERT INTO fairshare_clock", 2, True),
    ("fairshare_globals", "INSERT INTO fairshare_globals", 3, True),
    ("fairshare_queues", "INSERT INTO fairshare_queues", 9, True),
    ("solves", "INSERT INTO solves", 11, True),
    ("service_counts", "INSERT INTO service_counts", 13, True),
)
_UPDATES: tuple[tuple[str, str], ...] = (
    ("violation_close", "UPDATE violations SET end_seq=?, end_time=? WHERE id=?"),
)
_OPEN: tuple[tuple[str, str, int], ...] = (
    ("open_placements", "open_placements", 26),
    ("open_versions", "open_versions", 10),
    ("open_segments", "open_segments", 13),
)


class AuditError(GitschedError):
    """The audit view cannot answer: it disagrees with the log, or the log cannot be projected."""


class ViewOutdated(AuditError):
    """The view file was written by another version of gitsched: rebuild it."""


class LogReader(Protocol):
    """What the views need of a log: every `EventLog` is one. A reader without
    `reads_checked` ignores `check_content`: its events' hashes are recomputed."""

    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),
        check_content: bool = False,
    ) -> Iterator[StoredEvent]: ...

    def last_seq(self) -> int: ...


class EventList:
    """Stored events already in memory, read like a log (for tests and `build_history`)."""

    def __init__(self, events: Iterable[StoredEvent]) -> None:
        self.events = list(events)

    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),
        check_content: bool = False,
    ) -> Iterator[StoredEvent]:
        upper = until_seq if until_seq is not None else 2**62
        return (e for e in self.events if after_seq < e.seq <= upper)

    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0


class AuditStore:
    """One audit view file. Readers use `db`; only `catch_up` writes."""

    def __init__(self, path: str | Path, *, bulk: bool = False) -> None:
        """`bulk`: a file being built from 0 by `rebuild`, not yet in use: no journal, no
        syncs until it is complete (a crash leaves a file `rebuild` throws away)."""
        self.path = str(path)
        self.bulk = bulk
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(
                self.path, timeout=60.0, isolation_level=None, check_same_thread=False
            )
            if bulk:
                self.db.execute("PRAGMA journal_mode=OFF")
                self.db.execute("PRAGMA synchronous=OFF")
                self.db.execute("PRAGMA cache_size=-262144")
            else:
                if self.path != ":memory:":
                    self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute("PRAGMA cache_size=-65536")
            self.db.executescript(_TABLES)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (VIEW_FORMAT,))
        except sqlite3.Error as e:
            raise AuditError(f"cannot open the audit view {self.path}: {e}") from e
        fmt = self.meta("format")
        if fmt != VIEW_FORMAT:
            self.db.close()
            raise ViewOutdated(
                f"the audit view {self.path} has format {fmt}, this gitsched writes "
                f"{VIEW_FORMAT}: run `gitsched audit rebuild`"
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def offset(self) -> tuple[int, str | None]:
        return int(self.meta("offset") or 0), self.meta("offset_hash")

    def load_state(self) -> ProjectionState:
        text = self.meta("state")
        return ProjectionState() if text is None else ProjectionState.from_json(text)

    def checked(self) -> dict[str, int]:
        text = self.meta("checked")
        return {} if text is None else dict(json.loads(text))

    def chain_checked(self) -> tuple[int, str | None]:
        """How far the log's hash chain (links and content) was verified, and the hash there."""
        return int(self.meta("chain_checked") or 0), self.meta("chain_checked_hash")

    def mark_checked(self, seq: int, digest: str) -> None:
        """The chain was verified up to `seq`, whose hash is `digest` (never moves back)."""
        if seq > self.chain_checked()[0]:
            self.db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", checked_meta(seq, digest)
            )

    def apply(
        self, batch: Batch, state: ProjectionState, expected_offset: int, *, chain_checked: bool
    ) -> bool:
        """Apply `batch` and move the offset to `state.seq` (and the verified chain with it,
        if `chain_checked`); False if another writer moved the offset first."""
        meta = offset_meta(state, with_state=not self.bulk)
        if chain_checked:
            meta += checked_meta(state.seq, state.hash)
        return self.write(batch, meta, expected_offset)

    def write(self, batch: Batch, meta: Iterable[tuple[str, str]], expected_offset: int) -> bool:
        """Apply `batch` and the `meta` rows (the offset, see `offset_meta`) in one transaction."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise AuditError(f"the audit view {self.path} is locked: {e}") from e
        try:
            if self.offset()[0] != expected_offset:
                db.execute("ROLLBACK")
                return False
            for name, insert, width, multi in _INSERTS:
                rows = getattr(batch, name)
                if rows:
                    _insert(db, insert, width, rows, multi)
            for name, sql in _UPDATES:
                rows = getattr(batch, name)
                if rows:
                    db.executemany(sql, rows)
            if batch.usage_days:
                db.executemany(
                    "INSERT INTO usage_days VALUES (?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT (queue, team, flavor, day) DO UPDATE SET "
                    "used = used + excluded.used, quota = quota + excluded.quota, "
                    "borrowed = borrowed + excluded.borrowed, idle = idle + excluded.idle, "
                    "lent = lent + excluded.lent",
                    [(*key, *sums) for key, sums in batch.usage_days.items()],
                )
            if batch.user_days:
                db.executemany(
                    "INSERT INTO user_days VALUES (?,?,?,?,?,?) "
                    "ON CONFLICT (user, team, flavor, day) DO UPDATE SET "
                    "used = used + excluded.used, started = started + excluded.started",
                    [(*key, *sums) for key, sums in batch.user_days.items()],
                )
            for name, table, width in _OPEN:
                db.execute(f"DELETE FROM {table}")
                db.executemany(
                    f"INSERT INTO {table} VALUES ({','.join('?' * width)})", getattr(batch, name)
                )
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta)
            db.execute("COMMIT")
            return True
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def ensure_indexes(self) -> None:
        self.db.executescript(_INDEXES)

    def usage(self, state: ProjectionState) -> Usage:
        """Usage accounting, folded in this process."""
        return UsageLedger(state)

    def cluster(self, state: ProjectionState) -> ClusterFold:
        """The engine's fold, in this process, from where the view left it."""
        return ClusterFold(state.cluster)

    def finish(self, state: ProjectionState | None) -> None:
        """A catch-up is over: the indexes its reads need (the offset is written already), and
        in a bulk build the fold's state, which only its last batch needs to carry."""
        if self.bulk and state is not None:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", offset_meta(state))
        self.ensure_indexes()


def _insert(db: sqlite3.Connection, insert: str, width: int, rows: list[Any], multi: bool) -> None:
    per = min(_MULTI_ROW, 999 // width) if multi else 1
    whole = len(rows) - len(rows) % per
    if per > 1 and whole:
        chunks = zip(*[iter(rows)] * per, strict=False)  # `whole` rows, `per` at a time
        db.executemany(
            f"{insert} VALUES {_values(width, per)}",
            [tuple(chain.from_iterable(chunk)) for chunk in chunks],
        )
    else:
        whole = 0
    db.executemany(f"{insert} VALUES {_values(width)}", rows[whole:] if whole else rows)


def offset_meta(state: ProjectionState, *, with_state: bool = True) -> list[tuple[str, str]]:
    """The meta rows that say how far the view has read; the fold's state too unless told not
    to (a rebuild's private file needs it only with its last batch)."""
    meta = [
        ("offset", str(state.seq)),
        ("offset_hash", state.hash),
        ("max_time", state.max_time),
        ("checked", json.dumps(state.checked, sort_keys=True)),
    ]
    if with_state:
        meta.append(("state", state.to_json()))
    return meta


def checked_meta(seq: int, digest: str) -> list[tuple[str, str]]:
    """The meta rows that say the hash chain was verified, links and content, up to `seq`."""
    return [("chain_checked", str(seq)), ("chain_checked_hash", digest)]


def rows(store: AuditStore, sql: str, params: Any = ()) -> list[sqlite3.Row]:
    cursor = store.db.execute(sql, params)
    cursor.row_factory = sqlite3.Row
    return list(cursor.fetchall())
