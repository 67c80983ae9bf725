"""`gitsched log ...`: the event log itself — what it holds, and moving it between backends."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from gitsched.audit.verify import verify_log
from gitsched.config import resolve_log_url
from gitsched.engine.errors import GitschedError
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog, EventLogError, LogCorrupted
from gitsched.eventlog.copy import CopyProgress, CopyRefused, copy_log
from gitsched.eventlog.replay import replay, snapshot
from gitsched.eventlog.snapshot import check_snapshot
from gitsched.exit_codes import EXIT_INVALID, EXIT_OK
from gitsched.options import (
    emit_rows,
    fail,
    format_option,
    log_option,
    open_event_log,
    repo_option,
    user_errors,
)

# At most one progress line a second: a million-event copy should not print 500 lines.
PROGRESS_EVERY_S = 1.0


@click.group()
def log() -> None:
    """The event log itself: what it holds, and moving it between backends."""


@log.command()
@log_option
@repo_option
@format_option("text", "json")
def info(log_url: str | None, repo: str, fmt: str) -> None:
    """Backend, number of events, last seq and head hash of a log."""
    url = resolve_log_url(log_url, repo)
    with user_errors(), open_log(url, create=False) as event_log:
        last = event_log.last_event()
        first = next(iter(event_log.read(0, until_seq=1)), None)
    facts = {
        "log": url,
        "backend": url.split(":", 1)[0],
        "events": last.seq if last else 0,
        "last_seq": last.seq if last else 0,
        "head_hash": last.hash if last else None,
        "first_time": first.time if first else None,
        "last_time": last.time if last else None,
    }
    if fmt == "json":
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        click.echo(f"{key + ':':<11} {'-' if value is None else value}")


@log.command()
@click.option("--from", "source_url", required=True, help="The log to copy (it is only read).")
@click.option(
    "--to",
    "target_url",
    required=True,
    help="The log to copy into: empty, or an earlier copy of the source (then the copy resumes).",
)
@click.option(
    "--chunk",
    default=2000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Events per write transaction on the target (a commit's events are never split).",
)
def copy(source_url: str, target_url: str, chunk: int) -> None:
    """Copy a whole log to another backend, every envelope byte for byte.

    Seq, id, time and hashes are kept, so `gitsched audit verify` passes on both
    ends and every id a report quotes stays valid. The source's hash chain is
    verified as it is read. A target that already holds events must be the
    start of the source: the copy resumes after them.

    \b
    Exit 0 copied (or nothing left to copy), 1 the source's chain is broken or the
    target is not a copy of the source, 2 usage or other error.
    """
    if source_url == target_url:
        fail("--from and --to name the same log")
    started = time.monotonic()
    last_print = started

    def report(step: CopyProgress) -> None:
        nonlocal last_print
        now = time.monotonic()
        if now - last_print >= PROGRESS_EVERY_S:
            last_print = now
            rate = step.copied / max(now - started, 1e-9)
            click.echo(
                f"copied {step.copied} events (seq {step.at_seq} of {step.source_last_seq}, "
                f"{rate:,.0f} events/s)"
            )

    try:
        with open_log(source_url, create=False) as source, open_log(target_url) as target:
            started = last_print = time.monotonic()
            result = copy_log(source, target, chunk=chunk, progress=report)
            head = target.last_event()
    except (CopyRefused, LogCorrupted) as e:
        fail(str(e), EXIT_INVALID)
    except (GitschedError, EventLogError) as e:
        fail(str(e))
    seconds = time.monotonic() - started
    if result.last_seq and (
        head is None or head.seq != result.last_seq or head.hash != result.head_hash
    ):
        fail(
            f"the target reads back seq {head.seq if head else 0}, "
            f"not the copied seq {result.last_seq}: check it with `gitsched audit verify`"
        )
    resumed = f", resumed after seq {result.resumed_from}" if result.resumed_from else ""
    click.echo(
        f"copied {result.copied} events{resumed} in {seconds:.1f}s: "
        f"{target_url} at seq {result.last_seq}, head {result.head_hash or '-'}; chain verified"
    )
    sys.exit(EXIT_OK)


@log.command("snapshot")
@log_option
@repo_option
@format_option("text", "json")
def snapshot_command(log_url: str | None, repo: str, fmt: str) -> None:
    """Snapshot the folded state at the log's head, so the next start replays only what follows.

    The whole chain is verified on the way (from the newest valid snapshot, if any).
    The reconciler writes one by itself every --snapshot-every events.

    \b
    Exit 0 written, 1 the chain is broken, 2 the log keeps no snapshots or another error.
    """
    try:
        with open_event_log(log_url, repo) as event_log:
            began = time.perf_counter()
            replayed = replay(event_log, verify=True)
            if not snapshot(event_log, replayed):
                fail("the log keeps no snapshots: it is empty, or a Kafka log with no folder")
            seconds = time.perf_counter() - began
            store = event_log.snapshots()
            newest = store.infos()[0] if store is not None else None
    except LogCorrupted as e:
        fail(str(e), EXIT_INVALID)
    except (GitschedError, EventLogError) as e:
        fail(str(e))
    assert newest is not None
    facts = {
        "seq": newest.seq,
        "head_hash": newest.head_hash,
        "size_bytes": newest.size_bytes,
        "state_format": newest.state_format,
        "replayed_from_seq": replayed.from_snapshot,
        "seconds": round(seconds, 3),
    }
    if fmt == "json":
        click.echo(json.dumps(facts, indent=2))
        return
    click.echo(
        f"snapshot at seq {newest.seq} ({newest.size_bytes:,} bytes) written in {seconds:.2f}s"
    )


@log.command("snapshots")
@log_option
@repo_option
@format_option("text", "json")
def snapshots_command(log_url: str | None, repo: str, fmt: str) -> None:
    """The log's snapshots, newest first, each checked against the log as a reader would.

    \b
    Exit 0 when every snapshot may be used (or there are none), 1 when one may not.
    """
    rows = []
    with user_errors(), open_event_log(log_url, repo) as event_log:
        store = event_log.snapshots()
        for info in store.infos() if store is not None else []:
            reason = check_snapshot(event_log, info, store.body(info.seq) if store else None)
            rows.append(
                {
                    "seq": info.seq,
                    "head_hash": info.head_hash,
                    "last_time": info.last_time,
                    "size_bytes": info.size_bytes,
                    "state_format": info.state_format,
                    "usable": reason is None,
                    "problem": reason,
                }
            )
    emit_rows(rows, ["seq", "last_time", "size_bytes", "usable", "problem"], fmt)
    sys.exit(EXIT_OK if all(r["usable"] for r in rows) else EXIT_INVALID)


# -- verify ---------------------------------------------------------------------------------


@log.command("verify")
@log_option
@repo_option
@click.option(
    "--signatures",
    is_flag=True,
    help="Also ask git, in --repo, to verify every signed approval the log records.",
)
@format_option("text", "csv", "json")
def verify_command(log_url: str | None, repo: str, signatures: bool, fmt: str) -> None:
    """Check the hash chain and seq continuity of the whole log. Exit 1 when broken."""
    with user_errors(), open_event_log(log_url, repo) as event_log:
        result = verify_log(event_log)
        signed = _recheck_signatures(event_log, repo) if signatures and result.ok else None
        broken: dict[str, Any] | None = None
        if result.broken is not None:
            b = result.broken
            try:
                event = next(iter(event_log.read(b.seq - 1, until_seq=b.seq)), None)
            except EventLogError:
                event = None  # the broken row cannot even be read: its seq says enough
            broken = {
                "seq": b.seq,
                "id": event.id if event else None,
                "type": event.type if event else None,
                "reason": b.reason,
            }
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "ok": result.ok and not (signed and signed["failed"]),
                    "events": result.events,
                    "head": result.last_hash,
                    "broken": broken,
                    **({"signatures": signed} if signed is not None else {}),
                },
                indent=2,
            )
        )
    elif fmt == "csv":
        emit_rows(
            [
                {
                    "ok": result.ok,
                    "events": result.events,
                    "head": result.last_hash,
                    **{f"broken_{k}": v for k, v in (broken or {}).items()},
                }
            ],
            ["ok", "events", "head", "broken_seq", "broken_id", "broken_type", "broken_reason"],
            "csv",
        )
    elif broken is None:
        click.echo(f"ok: {result.events} events, chain intact, head {result.last_hash}")
    else:
        what = f" ({broken['type']} {broken['id']})" if broken["id"] else ""
        click.echo(f"BROKEN at seq {broken['seq']}{what}: {broken['reason']}")
    if signed is not None and fmt != "json":
        failed = signed["failed"]
        click.echo(
            f"signatures: {signed['checked']} signed approval(s) checked with git, "
            + (f"{len(failed)} FAILED" if failed else "all verify")
        )
        for f in failed:
            click.echo(
                f"  FAILED seq {f['seq']}: {f['approver']}'s approval of team {f['team']} "
                f"on {f['commit'][:12]}, recorded key {f['fingerprint']}: {f['found']}"
            )
    sys.exit(EXIT_OK if result.ok and not (signed and signed["failed"]) else EXIT_INVALID)


def _recheck_signatures(event_log: EventLog, repo: str) -> dict[str, Any]:
    """The log's signed approvals, verified again by git in `repo` (the CLI composes
    the log and git: audit never imports the reconciler)."""
    from gitsched.engine.events import ApprovalChecked
    from gitsched.eventlog.codec import decode
    from gitsched.reconciler.approval import recheck_signatures
    from gitsched.reconciler.git import GitRepo

    recorded = [
        (stored.seq, event)
        for stored in event_log.read(0)
        if stored.type == ApprovalChecked.type
        and isinstance(event := decode(stored), ApprovalChecked)
    ]
    checks = recheck_signatures(GitRepo(repo), recorded)
    return {
        "checked": len(checks),
        "failed": [
            {
                "seq": c.seq,
                "team": c.team,
                "approver": c.approver,
                "commit": c.commit,
                "fingerprint": c.fingerprint,
                "found": c.found.fingerprint or c.found.detail or str(c.found.status),
            }
            for c in checks
            if not c.ok
        ],
    }
