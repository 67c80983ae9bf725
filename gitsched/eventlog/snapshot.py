"""Snapshots of the folded state, so a restart replays only the log's tail.

A snapshot is a cache, never the truth. Each one names the event it covers (its seq
and that event's hash, the head of the hash chain there) and carries a digest over
that head, the state's format and its bytes. It is used only when all of these hold:
the log still has that event with that hash, the digest matches, and the format is
this gitsched's. Anything else (a log replaced or truncated behind it, bytes edited,
another version's state) is reported and skipped, and the reader falls back to an
older snapshot or the full replay. The tail after a snapshot is checked link by link
from its head as a full replay would; `gitsched audit verify` still checks the whole.

Where they live: the SQLite log keeps them in a table of its own file; a Kafka log's
reader keeps them in a local folder (a per-reader cache needs no broker settings for
multi-megabyte records, and a lost folder costs one full replay, nothing else).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gitsched.engine.snapshot import STATE_FORMAT, SnapshotDecodeError, decode_state, encode_state
from gitsched.engine.state import ClusterState
from gitsched.eventlog.base import EventLog, LogUnavailable, SnapshotInfo, SnapshotStore
from gitsched.eventlog.collector import collector_paused

log = logging.getLogger(__name__)

# Snapshots kept per log: the newest few, so one bad file never forces a full replay.
KEEP = 3


def snapshot_digest(head_hash: str, state_format: str, body: bytes) -> str:
    h = hashlib.sha256()
    h.update(head_hash.encode())
    h.update(b"\0")
    h.update(state_format.encode())
    h.update(b"\0")
    h.update(body)
    return h.hexdigest()


class SQLiteSnapshotStore(SnapshotStore):
    """A table beside the events, in the log's own file (not in the hash chain)."""

    _SCHEMA = """
    CREATE TABLE IF NOT EXISTS snapshots (
        seq          INTEGER PRIMARY KEY,
        head_hash    TEXT NOT NULL,
        last_time    TEXT NOT NULL,
        state_format TEXT NOT NULL,
        digest       TEXT NOT NULL,
        body         BLOB NOT NULL
    )
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._db.execute(self._SCHEMA)

    def save(self, info: SnapshotInfo, body: bytes) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO snapshots"
                "(seq, head_hash, last_time, state_format, digest, body)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    info.seq,
                    info.head_hash,
                    info.last_time,
                    info.state_format,
                    info.digest,
                    body,
                ),
            )
            self._db.execute(
                "DELETE FROM snapshots WHERE seq NOT IN "
                "(SELECT seq FROM snapshots ORDER BY seq DESC LIMIT ?)",
                (KEEP,),
            )
            self._db.execute("COMMIT")
        except sqlite3.Error as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise LogUnavailable(f"cannot store a snapshot: {e}") from e

    def infos(self) -> list[SnapshotInfo]:
        rows = self._db.execute(
            "SELECT seq, head_hash, last_time, state_format, digest, length(body)"
            " FROM snapshots ORDER BY seq DESC"
        ).fetchall()
        return [SnapshotInfo(*row) for row in rows]

    def body(self, seq: int) -> bytes | None:
        row = self._db.execute("SELECT body FROM snapshots WHERE seq = ?", (seq,)).fetchone()
        return bytes(row[0]) if row else None


class FileSnapshotStore(SnapshotStore):
    """One file per snapshot in a folder: `<seq>.snapshot`, with a small header.

    The header is one line of tab-separated fields (the SnapshotInfo without its
    size), the state's bytes follow. Written to a temporary name and renamed, so a
    reader never sees half a file.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:020d}.snapshot"

    def save(self, info: SnapshotInfo, body: bytes) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            header = "\t".join(
                (
                    str(info.seq),
                    info.head_hash,
                    info.last_time,
                    info.state_format,
                    info.digest,
                )
            )
            target = self._path(info.seq)
            partial = target.with_suffix(".partial")
            with partial.open("wb") as out:
                out.write(header.encode() + b"\n")
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            partial.replace(target)
            for old in sorted(self.directory.glob("*.snapshot"), reverse=True)[KEEP:]:
                old.unlink(missing_ok=True)
        except OSError as e:
            raise LogUnavailable(f"cannot store a snapshot in {self.directory}: {e}") from e

    def _read(self, path: Path) -> tuple[SnapshotInfo, bytes] | None:
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        header, _, body = raw.partition(b"\n")
        fields = header.decode("utf-8", "replace").split("\t")
        if len(fields) != 5 or not fields[0].isdigit():
            return None
        seq, head_hash, last_time, state_format, digest = fields
        return SnapshotInfo(int(seq), head_hash, last_time, state_format, digest, len(body)), body

    def infos(self) -> list[SnapshotInfo]:
        found = []
        for path in sorted(self.directory.glob("*.snapshot"), reverse=True):
            read = self._read(path)
            if read is not None:
                found.append(read[0])
        return found

    def body(self, seq: int) -> bytes | None:
        read = self._read(self._path(seq))
        return read[1] if read else None


@dataclass(frozen=True, slots=True)
class Loaded:
    """A snapshot that passed every check, decoded."""

    info: SnapshotInfo
    state: ClusterState


def write_snapshot(
    store: SnapshotStore,
    state: ClusterState,
    *,
    seq: int,
    head_hash: str,
    last_time: str,
) -> SnapshotInfo:
    """Store `state` as the state after event `seq` (whose hash is `head_hash`)."""
    body = encode_state(state)
    info = SnapshotInfo(
        seq=seq,
        head_hash=head_hash,
        last_time=last_time,
        state_format=STATE_FORMAT,
        digest=snapshot_digest(head_hash, STATE_FORMAT, body),
        size_bytes=len(body),
    )
    store.save(info, body)
    return info


def check_snapshot(event_log: EventLog, info: SnapshotInfo, body: bytes | None) -> str | None:
    """Why the snapshot (`info`, with its bytes `body`) must not be used; None when it may."""
    if info.state_format != STATE_FORMAT:
        return f"written for state format {info.state_format}, this gitsched reads {STATE_FORMAT}"
    head = next(iter(event_log.read(info.seq - 1, until_seq=info.seq)), None)
    if head is None:
        return (
            f"the log has no event at seq {info.seq} (it ends at {event_log.last_seq()}): "
            "the log was replaced or cut short since the snapshot was written"
        )
    if head.hash != info.head_hash:
        return (
            f"the log's event at seq {info.seq} has hash {head.hash[:12]}, the snapshot was "
            f"folded to {info.head_hash[:12]}: the log was replaced since it was written"
        )
    if body is None:
        return "its bytes are gone"
    if snapshot_digest(info.head_hash, info.state_format, body) != info.digest:
        return "its bytes do not match its digest: the snapshot was altered"
    return None


def usable_snapshots(
    store: SnapshotStore, *, until_seq: int | None = None
) -> Iterator[SnapshotInfo]:
    """Snapshots a read up to `until_seq` could start from, newest first."""
    for info in store.infos():
        if until_seq is None or info.seq <= until_seq:
            yield info


def load_snapshot(
    event_log: EventLog,
    store: SnapshotStore,
    *,
    until_seq: int | None = None,
    problems: list[str] | None = None,
) -> Loaded | None:
    """The newest snapshot that passes every check, for a read up to `until_seq`.

    Each snapshot skipped is logged as a warning and, when `problems` is given,
    added to it as one line naming its seq and the reason.
    """
    for info in usable_snapshots(store, until_seq=until_seq):
        body = store.body(info.seq)
        reason = check_snapshot(event_log, info, body)
        state = None
        if reason is None and body is not None:
            try:
                with collector_paused():
                    state = decode_state(body)
            except SnapshotDecodeError as e:
                reason = f"its bytes cannot be decoded: {e}"
        if state is None:
            line = f"snapshot at seq {info.seq} ignored: {reason}"
            log.warning("%s", line)
            if problems is not None:
                problems.append(line)
            continue
        return Loaded(info, state)
    return None
