"""Bringing an audit view up to date with the log: the fold's driver, above the store and
its writer process (`gitsched.audit.store` <- `gitsched.audit.writer` <- here, one way).

`catch_up` reads the log from the view's offset, folds it (`gitsched.audit.projection`) and
hands each batch to a sink with the new offset. With `verify` it also checks the hash
chain of what it reads, links and content, from where the view last verified it, and
records how far in the same transaction: an auditor's answer costs the tail, not the
whole log (`gitsched log verify` still checks every event from the first).
`rebuild` replays from 0 into an empty file and swaps it in; a long one writes
through `gitsched.audit.writer`, a second process, so that folding and SQLite each have a core.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gitsched.audit.projection.cluster_fold import ClusterFold, DeferredClusterFold
from gitsched.audit.projection.ledger import Usage
from gitsched.audit.projection.projector import Projector
from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import ProjectionError, ProjectionState
from gitsched.audit.store import AuditError, AuditStore, LogReader, ViewOutdated
from gitsched.audit.writer import WriterProcess, WriterUnavailable
from gitsched.eventlog.base import LogCorrupted
from gitsched.eventlog.envelope import GENESIS_HASH, ChainBreak, ChainChecker, StoredEvent

# Events per transaction: large enough that the state saved with each offset costs little.
BATCH_EVENTS = 25_000

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CatchUp:
    applied: int
    seconds: float
    last_seq: int

    @property
    def rate(self) -> float:
        return self.applied / self.seconds if self.seconds > 0 else 0.0


class ChainBroken(AuditError):
    """The log's hash chain breaks in the part a verified catch-up read."""

    def __init__(self, broken: ChainBreak) -> None:
        super().__init__(f"the log's hash chain is broken at seq {broken.seq}: {broken.reason}")
        self.broken = broken


class Sink(Protocol):
    """Where a catch-up's batches go: an `AuditStore`, or a rebuild's writer process."""

    path: str

    def offset(self) -> tuple[int, str | None]: ...

    def chain_checked(self) -> tuple[int, str | None]: ...

    def mark_checked(self, seq: int, digest: str) -> None: ...

    def load_state(self) -> ProjectionState: ...

    def apply(
        self, batch: Batch, state: ProjectionState, expected_offset: int, *, chain_checked: bool
    ) -> bool: ...

    def finish(self, state: ProjectionState | None) -> None: ...

    def usage(self, state: ProjectionState) -> Usage: ...

    def cluster(self, state: ProjectionState) -> ClusterFold | DeferredClusterFold: ...


def _check_offset(log: LogReader, store: Sink, offset: int, offset_hash: str | None) -> None:
    if offset == 0:
        return
    head = log.last_seq()
    if head < offset:
        raise AuditError(
            f"the audit view {store.path} has read {offset} events but the log holds {head}: "
            "it was built from another log; pass --db or run `gitsched audit rebuild`"
        )
    for event in log.read(offset - 1, until_seq=offset):
        if event.hash != offset_hash:
            raise AuditError(
                f"event {offset} of the log is not the one the audit view {store.path} read "
                "(its hash differs): the log was rewritten or the view was built from another "
                "log; run `gitsched log verify`, then `gitsched audit rebuild`"
            )


def _checker(log: LogReader, after: int, digest: str | None) -> ChainChecker:
    """Checks events from `after + 1` on, linking to `digest`; content hashes are
    recomputed unless the log checks them as it reads (`reads_checked`: SQLite and Kafka
    do, on the stored bytes, when read with `check_content`)."""
    return ChainChecker(
        expect_first_seq=after + 1,
        prev_hash=digest or GENESIS_HASH,
        recompute=not getattr(log, "reads_checked", False),
    )


def verify_view(log: LogReader, store: Sink, until: int | None = None) -> None:
    """Verify the chain from where the view last verified it up to `until` (by default its
    offset: what it folded before anyone asked for a verified answer), and record it;
    a break raises `ChainBroken`."""
    if until is None:
        until = store.offset()[0]
    after, digest = store.chain_checked()
    if after >= until:
        return
    checker = _checker(log, after, digest)
    last = digest
    try:
        for event in log.read(after, until_seq=until, check_content=True):
            broken = checker.check(event)
            if broken is not None:
                raise ChainBroken(broken)
            last = event.hash
    except LogCorrupted as e:
        raise ChainBroken(ChainBreak(e.seq or checker.expected, str(e))) from e
    if checker.expected != until + 1 or last is None:
        raise ChainBroken(ChainBreak(checker.expected, "events are missing at the log's end"))
    store.mark_checked(until, last)


def _name_the_break(log: LogReader, until: int) -> None:
    """The view's offset no longer matches the log: if the chain is broken before it, say
    where (a rare path, so the whole chain up to it is read)."""
    checker = _checker(log, 0, GENESIS_HASH)
    try:
        for event in log.read(0, until_seq=until, check_content=True):
            broken = checker.check(event)
            if broken is not None:
                raise ChainBroken(broken)
    except LogCorrupted as e:
        raise ChainBroken(ChainBreak(e.seq or checker.expected, str(e))) from e


def _checked(events: Iterator[StoredEvent], checker: ChainChecker) -> Iterator[StoredEvent]:
    for event in events:
        broken = checker.check(event)
        if broken is not None:
            raise ChainBroken(broken)
        yield event


def catch_up(
    log: LogReader,
    store: Sink,
    *,
    progress: Progress | None = None,
    batch_events: int = BATCH_EVENTS,
    until_seq: int | None = None,
    verify: bool = False,
) -> CatchUp:
    """Fold the events the view has not seen into it; returns how many and how fast.

    With `verify`, the hash chain is verified (links and content) from where the view
    last verified it to the head, and a break raises `ChainBroken`; batches before
    the break are kept, verified."""
    # The fold makes and drops a few small objects per event; collecting young objects
    # every 700 allocations costs a rebuild several percent, for no cycles to find.
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, *thresholds[1:])
    try:
        return _catch_up(log, store, progress, batch_events, until_seq, verify)
    finally:
        gc.set_threshold(*thresholds)


def _catch_up(
    log: LogReader,
    store: Sink,
    progress: Progress | None,
    batch_events: int,
    until_seq: int | None,
    verify: bool,
) -> CatchUp:
    started = time.perf_counter()
    applied = 0
    state: ProjectionState | None = None
    for _ in range(5):
        offset, offset_hash = store.offset()
        try:
            _check_offset(log, store, offset, offset_hash)
        except AuditError:
            if verify:
                _name_the_break(log, offset)
            raise
        if verify:
            verify_view(log, store, offset)
        head = log.last_seq() if until_seq is None else min(until_seq, log.last_seq())
        if offset >= head:
            break
        state = store.load_state()
        projector = Projector(state, store.usage(state), store.cluster(state))
        expected = offset
        total = head - offset
        moved = False
        checker = _checker(log, offset, offset_hash) if verify else None
        try:
            # Every payload is read: the engine's fold (fair share, solves) reads them all.
            events = log.read(offset, until_seq=head, check_content=verify)
            if checker is not None:
                events = _checked(iter(events), checker)
            more = True
            while more:
                batch = Batch()
                more = projector.convert_all(events, batch, batch_events)
                if not batch.events:
                    break
                projector.snapshot_open(batch)
                if not store.apply(batch, state, expected, chain_checked=verify):
                    moved = True
                    break
                applied += batch.events
                expected = state.seq
                if progress is not None:
                    progress(state.seq - offset, total)
        except ProjectionError as e:
            raise AuditError(str(e)) from e
        except LogCorrupted as e:
            if verify:
                raise ChainBroken(ChainBreak(e.seq or state.seq + 1, str(e))) from e
            raise AuditError(f"{e}; run `gitsched log verify`") from e
        if moved:
            continue  # another process advanced the view: start again from its offset
        break
    store.finish(state)
    return CatchUp(applied, time.perf_counter() - started, store.offset()[0])


# Below this many events a rebuild writes in its own process: starting a writer costs more.
WRITER_PROCESS_FROM = 100_000


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def rebuild(
    log: LogReader,
    path: str | Path,
    *,
    progress: Progress | None = None,
    batch_events: int = BATCH_EVENTS,
    writer_process: bool | None = None,
    verify: bool = True,
) -> CatchUp:
    """Replay the whole log into an empty view, then put it in place of the old one.

    Queries go on reading the old view until the new one is complete. `writer_process`:
    whether usage accounting and SQLite's inserts run in a second process
    (`gitsched.audit.writer`) while this one reads and folds the log; by default, when there are
    two cores and a long log to replay. If that process cannot start, this one writes.
    `verify`: check the whole chain on the way, as `catch_up` does, so that evidence
    queries after it verify only what comes next."""
    target = Path(path)
    fresh = target.with_name(f"{target.name}.rebuild-{os.getpid()}")
    if writer_process is None:
        writer_process = _cores() > 1 and log.last_seq() >= WRITER_PROCESS_FROM
    try:
        result: CatchUp | None = None
        if writer_process:
            try:
                with WriterProcess(fresh) as writer:
                    result = catch_up(
                        log, writer, progress=progress, batch_events=batch_events, verify=verify
                    )
            except WriterUnavailable:
                _remove(fresh)
        if result is None:
            with AuditStore(fresh, bulk=True) as store:
                result = catch_up(
                    log, store, progress=progress, batch_events=batch_events, verify=verify
                )
                store.db.execute("PRAGMA journal_mode=WAL")
        with open(fresh, "rb+") as f:
            os.fsync(f.fileno())
        for stale in (Path(f"{target}-wal"), Path(f"{target}-shm")):
            stale.unlink(missing_ok=True)
        os.replace(fresh, target)
    finally:
        _remove(fresh)
    assert result is not None
    return result


def _remove(view: Path) -> None:
    for leftover in (view, Path(f"{view}-wal"), Path(f"{view}-shm")):
        leftover.unlink(missing_ok=True)


def open_view(
    log: LogReader, path: str | Path, *, progress: Progress | None = None, verify: bool = False
) -> tuple[AuditStore, CatchUp]:
    """The audit view at `path`, caught up with the log: what every query starts with.

    A view that does not exist yet is built the way `rebuild` builds one, verified.
    `verify`: see `catch_up`."""
    if str(path) != ":memory:" and not Path(path).exists():
        rebuild(log, path, progress=progress)
    try:
        store = AuditStore(path)
    except ViewOutdated:
        rebuild(log, path, progress=progress)  # the view is a cache: make it anew
        store = AuditStore(path)
    try:
        result = catch_up(log, store, progress=progress, verify=verify)
    except BaseException:
        store.close()
        raise

    return store, result
