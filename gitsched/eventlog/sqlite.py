"""The embedded default log: one SQLite file, one table, `seq` as primary key.

A write is one IMMEDIATE transaction that first checks the expected last seq,
so two writers can never interleave; WAL mode lets readers run alongside.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import orjson

from gitsched.eventlog.base import (
    Clock,
    ConcurrencyConflict,
    DuplicateEvent,
    EventLog,
    LogConfigurationError,
    LogCorrupted,
    LogUnavailable,
    already_imported,
    check_import,
    utc_now,
)
from gitsched.eventlog.envelope import (
    GENESIS_HASH,
    ChainChecker,
    NewEvent,
    StoredEvent,
    canonical_json,
    format_time,
    seal_batch,
    stored_hash_holds,
)
from gitsched.eventlog.snapshot import SQLiteSnapshotStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq            INTEGER PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE,
    type           TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    data           TEXT NOT NULL,
    time           TEXT NOT NULL,
    actor          TEXT NOT NULL,
    cause          TEXT NOT NULL,
    prev_hash      TEXT NOT NULL,
    hash           TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_COLUMNS = "seq, id, type, schema_version, data, time, actor, cause, prev_hash, hash"
FORMAT_VERSION = "1"


def sqlite_path_from_url(url: str) -> Path:
    """`sqlite:///relative.db` or `sqlite:////abs/path.db`, as SQLAlchemy spells them."""
    parsed = urlparse(url)
    if parsed.scheme != "sqlite" or parsed.netloc:
        raise LogConfigurationError(
            f"not a SQLite log URL: {url!r} (expected sqlite:///relative/path.db or sqlite:////absolute/path.db)"
        )
    path = unquote(parsed.path)
    if not path.startswith("/") or path == "/":
        raise LogConfigurationError(f"SQLite log URL has no path: {url!r}")
    # urlparse keeps the leading slash: '/rel.db' is relative, '//abs.db' is absolute.
    return Path(path[1:])


def _row_to_event(row: tuple[Any, ...]) -> StoredEvent:
    # The columns' types are the table's (INTEGER and TEXT): no conversion needed,
    # and replay reads every row through here.
    seq, id_, type_, version, data, time, actor, cause, prev_hash, digest = row
    try:
        payload = orjson.loads(data)
    except (TypeError, ValueError) as e:
        raise LogCorrupted(
            f"seq {seq}: the stored data is not JSON: the row was changed", seq=seq
        ) from e
    return StoredEvent(seq, id_, type_, version, payload, time, actor, cause, prev_hash, digest)


class SQLiteEventLog(EventLog):
    # read(check_content=True) checks each row on the data's stored bytes.
    reads_checked = True

    def __init__(
        self, path: str | Path, *, clock: Clock = utc_now, busy_timeout_s: float = 30.0
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._snapshots: SQLiteSnapshotStore | None = None
        deadline = time.monotonic() + busy_timeout_s
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(
                    self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
                )
                self._create()
                break
            except sqlite3.OperationalError as e:
                # Two processes creating one new log race for the WAL switch, which
                # SQLite answers with "locked" at once, without its busy handler.
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise LogUnavailable(f"cannot open SQLite log {self.path}: {e}") from e
                self._db.close()
                time.sleep(0.05)
            except (sqlite3.Error, OSError) as e:
                raise LogUnavailable(f"cannot open SQLite log {self.path}: {e}") from e

    def _create(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.execute(
            "INSERT OR IGNORE INTO log_meta(key, value) VALUES ('format_version', ?)",
            (FORMAT_VERSION,),
        )

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = utc_now) -> SQLiteEventLog:
        return cls(sqlite_path_from_url(url), clock=clock)

    def __repr__(self) -> str:
        return f"SQLiteEventLog({str(self.path)!r})"

    def append(self, events: Sequence[NewEvent], *, expected_last_seq: int) -> list[StoredEvent]:
        if not events:
            return []
        ids = [e.id for e in events]
        if len(set(ids)) != len(ids):
            raise DuplicateEvent("the batch repeats an event id: every event needs its own id")
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise LogUnavailable(f"SQLite log {self.path} is locked: {e}") from e
        try:
            existing = self._find_locked([e.id for e in events])
            if existing:
                self._db.execute("ROLLBACK")
                if len(existing) == len(events):
                    return [existing[e.id] for e in events]
                missing = [e.id for e in events if e.id not in existing]
                raise DuplicateEvent(
                    f"{len(existing)} of {len(events)} events are already in the log; "
                    f"missing: {', '.join(missing[:5])}"
                )
            last_seq, last_hash = self._tail_locked()
            if last_seq != expected_last_seq:
                self._db.execute("ROLLBACK")
                raise ConcurrencyConflict(expected_last_seq, last_seq)
            stored = seal_batch(
                list(events),
                first_seq=last_seq + 1,
                time=format_time(self._clock()),
                prev_hash=last_hash,
            )
            self._insert(stored)
            self._db.execute("COMMIT")
            return stored
        except sqlite3.Error as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise LogUnavailable(f"append to SQLite log {self.path} failed: {e}") from e
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def import_events(
        self, stored: Sequence[StoredEvent], *, expected_last_seq: int
    ) -> list[StoredEvent]:
        if not stored:
            return []
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise LogUnavailable(f"SQLite log {self.path} is locked: {e}") from e
        try:
            done = already_imported(stored, self._find_locked([e.id for e in stored]))
            if done is not None:
                self._db.execute("ROLLBACK")
                return done
            last_seq, last_hash = self._tail_locked()
            check_import(
                stored, last_seq=last_seq, last_hash=last_hash, expected_last_seq=expected_last_seq
            )
            self._insert(stored)
            self._db.execute("COMMIT")
            return list(stored)
        except sqlite3.Error as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise LogUnavailable(f"import into SQLite log {self.path} failed: {e}") from e
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _tail_locked(self) -> tuple[int, str]:
        row = self._db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)

    def _insert(self, stored: Sequence[StoredEvent]) -> None:
        self._db.executemany(
            f"INSERT INTO events({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    s.seq,
                    s.id,
                    s.type,
                    s.schema_version,
                    canonical_json(s.data).decode("utf-8"),
                    s.time,
                    s.actor,
                    s.cause,
                    s.prev_hash,
                    s.hash,
                )
                for s in stored
            ],
        )

    def read(
        self,
        after_seq: int = 0,
        *,
        until_seq: int | None = None,
        skip_data_of: Collection[str] = (),
        check_content: bool = False,
    ) -> Iterator[StoredEvent]:
        upper = until_seq if until_seq is not None else 2**62
        skip = frozenset(skip_data_of)
        cursor = self._db.execute(
            f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND seq <= ? ORDER BY seq",
            (after_seq, upper),
        )
        if check_content:
            yield from self._checked(cursor)
            return
        loads = orjson.loads
        while rows := cursor.fetchmany(4096):
            if skip:
                for row in rows:
                    if row[2] in skip:
                        seq, id_, type_, version, _, time_, actor, cause, prev_hash, digest = row
                        yield StoredEvent(
                            seq, id_, type_, version, {}, time_, actor, cause, prev_hash, digest
                        )
                    else:
                        yield _row_to_event(row)
                continue
            # The replay's inner loop: _row_to_event inlined, its error path kept.
            try:
                for seq, id_, type_, version, data, time_, actor, cause, prev_hash, digest in rows:
                    yield StoredEvent(
                        seq,
                        id_,
                        type_,
                        version,
                        loads(data),
                        time_,
                        actor,
                        cause,
                        prev_hash,
                        digest,
                    )
            except (TypeError, ValueError):
                for row in rows:
                    _row_to_event(row)  # raises LogCorrupted naming the row
                raise

    def _checked(self, cursor: sqlite3.Cursor) -> Iterator[StoredEvent]:
        """The rows' events, each checked against the one before it (seq, link) and
        its content against its hash, hashed on the data's stored bytes.

        The first one's link is the caller's to check (it knows what precedes it).
        """
        expected = -1
        link = ""
        while rows := cursor.fetchmany(4096):
            for row in rows:
                event = _row_to_event(row)
                if (expected >= 0 and (event.seq != expected or event.prev_hash != link)) or (
                    not stored_hash_holds(event, row[4].encode())
                ):
                    checker = ChainChecker(
                        expect_first_seq=event.seq if expected < 0 else expected,
                        prev_hash=event.prev_hash if expected < 0 else link,
                    )
                    broken = checker.check(event)
                    if broken is not None:
                        raise LogCorrupted(
                            f"the log was altered at seq {broken.seq}: {broken.reason}; "
                            "run `gitsched log verify`",
                            seq=broken.seq,
                        )
                expected, link = event.seq + 1, event.hash
                yield event

    def last_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def find(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        return self._find_locked(event_ids)

    def _find_locked(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        found: dict[str, StoredEvent] = {}
        ids = list(event_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._db.execute(
                f"SELECT {_COLUMNS} FROM events WHERE id IN ({marks})", chunk
            ):
                event = _row_to_event(row)
                found[event.id] = event
        return found

    def snapshots(self) -> SQLiteSnapshotStore:
        if self._snapshots is None:
            self._snapshots = SQLiteSnapshotStore(self._db)
        return self._snapshots

    def close(self) -> None:
        self._db.close()
