"""A rebuild's writer process: usage accounting, the engine's fold and SQLite's inserts on a
second core.

`gitsched.audit.catchup.rebuild` reads and folds the log in its own process (the log may be any
backend), with a `DeferredUsage` that records what usage accounting needs and a
`DeferredClusterFold` that passes on the events the engine's fold reads, and sends
each batch here as a marshal frame on stdin. This process replays those calls into
the `UsageLedger`, those events into the `ClusterFold`, and applies the batch to the rebuild's private file, offset
included, one transaction a batch; the fold's final state comes last, then the
indexes. A file it leaves unfinished is thrown away by `rebuild`, as one the fold
leaves is.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from gitsched.audit.projection.cluster_fold import ClusterFold, DeferredClusterFold
from gitsched.audit.projection.ledger import DeferredUsage, Usage, UsageLedger
from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import ProjectionState
from gitsched.audit.store import AuditError, AuditStore, checked_meta, offset_meta

# A batch on the wire: its lists and dicts in this order (marshal keeps tuples and dicts).
_FIELDS = Batch.__slots__
_HEADER = 8
# Version 2 writes no back-references: larger frames, but no table of every object the
# batch holds twice (most strings and times, shared with the fold's state), which
# costs the folding process more than the bytes do.
_MARSHAL_VERSION = 2
_READY, _DONE = b"ready\n", b"done\n"


class WriterUnavailable(AuditError):
    """The writer process did not start: `rebuild` writes in its own process instead."""


class WriterProcess:
    """The folding side: a `Sink` whose `apply` hands the batch to the writer and goes on.

    The file is private to this rebuild, so no other writer can move its offset and
    `apply` never waits for an answer; a writer that failed is found at the next batch
    or at `finish`."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._offset: tuple[int, str | None] = (0, None)
        self._checked = False  # whether the batches so far were verified as they were read
        self._started = False
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gitsched.audit.writer", self.path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._errors,
                env=env,
            )
        except (OSError, ValueError) as e:
            self._errors.close()
            raise WriterUnavailable(f"cannot start the audit view's writer process: {e}") from e
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._pipe: IO[bytes] = self._proc.stdin
        self._answers: IO[bytes] = self._proc.stdout

    def __enter__(self) -> WriterProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._proc.poll() is None:
            self._proc.kill()  # the fold failed: its half-written file is thrown away
        self._proc.wait()
        self._answers.close()
        if not self._pipe.closed:
            with contextlib.suppress(BrokenPipeError):
                self._pipe.close()
        self._errors.close()

    def offset(self) -> tuple[int, str | None]:
        return self._offset

    def chain_checked(self) -> tuple[int, str | None]:
        return self._offset if self._checked else (0, None)

    def mark_checked(self, seq: int, digest: str) -> None:
        raise AuditError("a rebuild's file is verified batch by batch, never after the fact")

    def load_state(self) -> ProjectionState:
        return ProjectionState()

    def usage(self, state: ProjectionState) -> Usage:
        return DeferredUsage()

    def cluster(self, state: ProjectionState) -> DeferredClusterFold:
        return DeferredClusterFold()

    def apply(
        self, batch: Batch, state: ProjectionState, expected_offset: int, *, chain_checked: bool
    ) -> bool:
        self._wait_started()
        rows = tuple(getattr(batch, name) for name in _FIELDS)
        offset = (state.seq, state.hash, state.max_time, state.checked)
        self._send(("batch", expected_offset, rows, offset, chain_checked))
        self._offset = (state.seq, state.hash)
        self._checked = chain_checked
        return True

    def finish(self, state: ProjectionState | None) -> None:
        """Send the fold's final state, then wait while the writer commits it."""
        self._wait_started()
        self._send(("finish", None if state is None else state.to_json()))
        with contextlib.suppress(BrokenPipeError):
            self._pipe.close()
        answer = self._answers.read()
        if self._proc.wait() != 0 or answer != _DONE:
            raise self._failure(AuditError)

    def _wait_started(self) -> None:
        """The writer says it has opened the file; by the first batch it has long had time to."""
        if not self._started:
            if self._answers.readline() != _READY:
                self._proc.wait()
                raise self._failure(WriterUnavailable)
            self._started = True

    def _send(self, frame: tuple[Any, ...]) -> None:
        payload = marshal.dumps(frame, _MARSHAL_VERSION)
        try:
            self._pipe.write(len(payload).to_bytes(_HEADER, "little"))
            self._pipe.write(payload)
            self._pipe.flush()
        except BrokenPipeError:
            self._proc.wait()
            raise self._failure(AuditError) from None

    def _failure(self, kind: type[AuditError]) -> AuditError:
        self._errors.seek(0)
        text = self._errors.read().decode(errors="replace").strip()
        last = text.splitlines()[-1] if text else f"exit status {self._proc.returncode}"
        return kind(f"the audit view's writer process failed writing {self.path}: {last}")


def _frames(stream: IO[bytes]) -> Iterator[Any]:
    while len(header := stream.read(_HEADER)) == _HEADER:
        yield marshal.loads(stream.read(int.from_bytes(header, "little")))


def main(path: str) -> int:
    """The writing side: apply frames until `finish`; without one, leave the file unfinished."""
    gc.disable()  # rows are flat tuples: nothing for the collector to find
    usage = ProjectionState()  # the ledger's part of the fold's state
    ledger = UsageLedger(usage)
    view = ProjectionState()  # the offset the folding process has reached, with the ledger's
    cluster = ClusterFold()  # the engine's fold, on this core (`DeferredClusterFold`)
    with AuditStore(path, bulk=True) as store:
        sys.stdout.buffer.write(_READY)
        sys.stdout.buffer.flush()
        for frame in _frames(sys.stdin.buffer):
            if frame[0] == "batch":
                _, expected, rows, (view.seq, view.hash, view.max_time, view.checked), verified = (
                    frame
                )
                batch = Batch()
                for name, value in zip(_FIELDS, rows, strict=True):
                    setattr(batch, name, value)
                ledger.replay(batch)
                ledger.snapshot_open(batch)
                cluster.replay(batch)
                view.take_usage(usage)
                meta = offset_meta(view, with_state=False)
                if verified:
                    meta += checked_meta(view.seq, view.hash)
                if not store.write(batch, meta, expected):
                    raise AuditError(f"{path} was written by another process during its rebuild")
                continue
            _, state = frame
            if state is not None:
                final = ProjectionState.from_json(state)
                final.take_usage(usage)
                final.cluster = cluster.save()
                store.db.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)", offset_meta(final)
                )
            # Indexes after the bulk load, sorted once: kept up row by row they would cost
            # more than they would save of the wait at the end (on a busy machine).
            store.ensure_indexes()
            store.db.execute("PRAGMA journal_mode=WAL")
            store.close()
            sys.stdout.buffer.write(_DONE)
            sys.stdout.buffer.flush()
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
