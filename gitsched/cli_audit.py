"""`gitsched audit ...`: questions an auditor asks, answered from the log.

Every query first brings the audit view (a SQLite file next to the log) up to
date from its stored offset, then answers with indexed SQL: no query replays the
log. `audit rebuild` replays it from 0 into an empty view.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from gitsched.audit import changes as changes_query
from gitsched.audit import compliance as compliance_query
from gitsched.audit import fairshare as fairshare_query
from gitsched.audit import history as history_query
from gitsched.audit import pointintime
from gitsched.audit import solves as solves_query
from gitsched.audit import usage as usage_query
from gitsched.audit import waits as waits_query
from gitsched.audit.catchup import CatchUp, ChainBroken, Progress, open_view, verify_view
from gitsched.audit.catchup import rebuild as rebuild_view
from gitsched.audit.services import HEADERS as service_headers
from gitsched.audit.services import service_history
from gitsched.audit.store import AuditStore
from gitsched.audit.verify import Verification
from gitsched.audit.window import period, read_page, seqs_between
from gitsched.cli_log import verify_command as log_verify
from gitsched.config import DEFAULT_LOG_DIR, resolve_log_url
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode_all
from gitsched.eventlog.envelope import format_time
from gitsched.eventlog.sqlite import sqlite_path_from_url
from gitsched.exit_codes import EXIT_ERROR, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OK
from gitsched.options import (
    broken_chain_message,
    cell,
    emit_rows,
    fail,
    format_option,
    log_option,
    open_event_log,
    parse_time,
    point_in_time,
    user_errors,
)
from gitsched.render import fit_table, table

AUDIT_DB_FILE = "audit.db"
# Below this many events to fold, a query just does it; above, it shows a progress bar.
PROGRESS_FROM = 50_000


def default_db_path(log_url: str, repo: str) -> Path:
    """`X/audit.db` beside a `sqlite:///X/log.db` log; `REPO/.gitsched/audit.db` for Kafka."""
    if log_url.startswith("sqlite:"):
        return sqlite_path_from_url(log_url).parent / AUDIT_DB_FILE
    return Path(repo) / DEFAULT_LOG_DIR / AUDIT_DB_FILE


def db_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        "db_path",
        envvar="GITSCHED_AUDIT_DB",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="Audit view file (a cache folded from the log) [default: audit.db beside a SQLite log]",
    )(f)


def repo_opt(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--repo", default=".", show_default=True, help="Cluster repo whose default log to read."
    )(f)


def since_until(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--until", help="End of the period (ISO-8601, UTC if no zone).")(f)
    return click.option("--since", help="Start of the period (ISO-8601, UTC if no zone).")(f)


def _progress_bar() -> tuple[Progress, Callable[[], None]]:
    bar: Any = None
    done = 0

    def update(n: int, total: int) -> None:
        nonlocal bar, done
        if bar is None:
            if total < PROGRESS_FROM:
                return
            bar = click.progressbar(
                length=total, label=f"audit: folding {total:,} events", file=sys.stderr
            )
            bar.__enter__()
        bar.update(n - done)
        done = n

    def close() -> None:
        if bar is not None:
            bar.__exit__(None, None, None)

    return update, close


@contextmanager
def view(
    log_url: str | None, repo: str, db_path: str | None, *, verify: bool = False
) -> Iterator[tuple[EventLog, AuditStore]]:
    """The log and its audit view, caught up: what every query starts from.

    With `verify`, the hash chain is verified (links and content) from where the view
    last verified it to the head, and a broken one exits 1: for the answers an auditor
    files as evidence (changes, compliance, report). `gitsched log verify` checks the
    whole chain from the first event. Lookups (history, at, usage) answer from the
    view, whose offset hash must still match.
    """
    url = resolve_log_url(log_url, repo)
    path = Path(db_path) if db_path else default_db_path(url, repo)
    with user_errors(), open_event_log(log_url, repo) as event_log:
        progress, close = _progress_bar()
        try:
            store, _ = open_view(event_log, path, progress=progress, verify=verify)
        except ChainBroken as e:
            # Evidence from a broken chain is a "no" (exit 1); a lookup cannot answer (2).
            fail(
                broken_chain_message(e.broken.seq, e.broken.reason),
                EXIT_INVALID if verify else EXIT_ERROR,
            )
        finally:
            close()
        try:
            yield event_log, store
        finally:
            store.close()


@click.group()
def audit() -> None:
    """Questions an auditor asks, answered from the log.

    Queries read an audit view: SQLite tables folded from the log, kept beside it
    (audit.db) and brought up to date before every answer.

    \b
    Environment variables:
      GITSCHED_AUDIT_DB   audit view file
    """


# -- rebuild --------------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
def rebuild(log_url: str | None, repo: str, db_path: str | None) -> None:
    """Replay the whole log from 0 into an empty audit view (the old one stays until done)."""
    url = resolve_log_url(log_url, repo)
    path = Path(db_path) if db_path else default_db_path(url, repo)
    with user_errors(), open_event_log(log_url, repo) as event_log:
        progress, close = _progress_bar()
        try:
            result: CatchUp = rebuild_view(event_log, path, progress=progress)
        except ChainBroken as e:
            fail(broken_chain_message(e.broken.seq, e.broken.reason), EXIT_INVALID)
        finally:
            close()
    click.echo(
        f"rebuilt {path}: {result.applied:,} events in {result.seconds:.2f} s "
        f"({result.rate:,.0f} events/s), at seq {result.last_seq}"
    )


# -- history --------------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
@click.option("--job", help="A job, as QUEUE/NAME or NAME.")
@click.option("--node", help="A node name.")
@click.option("--team", help="A team, or its queue.")
@click.option("--gpu-flavor", "flavor", help="A GPU flavor.")
@click.option("--service", help="An inference service, as TEAM/NAME: its replica counts.")
@since_until
@format_option("text", "csv", "json")
def history(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    job: str | None,
    node: str | None,
    team: str | None,
    flavor: str | None,
    service: str | None,
    since: str | None,
    until: str | None,
    fmt: str,
) -> None:
    """Every placement interval: where a job ran, from when to when, and why (like sacct).
    With --service: the service's desired and current replicas after each event about it."""
    if service is not None:
        _service_history(log_url, repo, service, since, until, fmt)
        return
    if not any((job, node, team, flavor)):
        fail("give one of --job, --node, --team, --gpu-flavor, --service")
    since_ts = parse_time(since, "--since").timestamp() if since else None
    until_ts = parse_time(until, "--until").timestamp() if until else None
    with view(log_url, repo, db_path) as (_, store):
        intervals = history_query.query(
            store, job=job, node=node, team=team, flavor=flavor, since=since_ts, until=until_ts
        )
        missing = None
        waiting: list[dict[str, Any]] = []
        if not intervals:
            missing = history_query.missing_subject(
                store, job=job, node=node, team=team, flavor=flavor
            )
            if job is not None and missing is None and not (node or team or flavor):
                waiting = history_query.never_placed(store, job)
    if missing is not None:
        fail(f"the log never saw {missing}", EXIT_NOT_FOUND)
    if waiting and not since and not until:
        # A job that never ran has no interval: its answer is its wait, not an empty table.
        if fmt == "json":
            click.echo(json.dumps(waiting, indent=2))
        elif fmt == "text":
            click.echo(history_query.never_placed_text(waiting))
        else:
            emit_rows(waiting, list(waiting[0]), fmt)
        return
    emit_rows([i.to_dict() for i in intervals], history_query.HEADERS, fmt)


def _service_history(
    log_url: str | None, repo: str, service: str, since: str | None, until: str | None, fmt: str
) -> None:
    """A service's replica counts over time, folded from the log (audit/services.py)."""
    since_at = parse_time(since, "--since") if since else None
    until_at = parse_time(until, "--until") if until else None
    with user_errors(), open_event_log(log_url, repo) as event_log:
        rows = service_history(decode_all(event_log.read(0)), service)
    if rows is None:
        fail(f"the log never saw service {service}", EXIT_NOT_FOUND)
    kept = [
        r
        for r in rows
        if (since_at is None or parse_time(r["time"], "time") >= since_at)
        and (until_at is None or parse_time(r["time"], "time") <= until_at)
    ]
    emit_rows(kept, service_headers, fmt)


# -- at -------------------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
@point_in_time
@format_option("text", "csv", "json")
def at(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    at_time: str | None,
    seq: int | None,
    fmt: str,
) -> None:
    """The cluster exactly as it was at a time or after an event (--at TIME | --seq N):
    placements, queues, pending."""
    if (at_time is None) == (seq is None):
        fail("give --at TIME or --seq N (one of them)")
    when: str | None = None
    with view(log_url, repo, db_path) as (event_log, store):
        if at_time is not None:
            when = format_time(parse_time(at_time))
            n = pointintime.seq_at_time(store, when)
        else:
            assert seq is not None
            last_seq = store.offset()[0]
            if seq > last_seq:
                fail(
                    f"--seq {seq} is past the end of the log (its last seq is {last_seq})",
                    EXIT_NOT_FOUND,
                )
            n = seq
            event = next(iter(event_log.read(n - 1, until_seq=n)), None) if n else None
            when = event.time if event else None
        state = pointintime.cluster_at(store, n)
    state["time"] = when
    if fmt == "json":
        click.echo(json.dumps(state, indent=2))
        return
    rows = _at_rows(state)
    if fmt == "csv":
        emit_rows(
            rows, ["section", "name", "queue", "flavor", "nodes", "gpus", "since", "detail"], "csv"
        )
        return
    commit = state["commit"]
    click.echo(
        f"cluster {state['cluster'] or '-'} at seq {state['seq']} ({state['time'] or 'start'}): "
        f"{state['gpus_used']:g}/{state['gpus_total']} GPUs allocated, "
        f"{len(state['placements'])} running, {len(state['pending'])} pending"
    )
    if commit:
        click.echo(f"last commit {commit['sha'][:12]} {commit['subject']} ({commit['author']})")
    for section, headers in (
        ("placement", ["name", "queue", "flavor", "nodes", "gpus", "since"]),
        ("pending", ["name", "queue", "since", "detail"]),
        ("queue", ["name", "detail"]),
        ("node", ["name", "flavor", "gpus", "detail"]),
    ):
        chosen = [r for r in rows if r["section"] == section]
        if not chosen:
            continue
        click.echo("")
        click.echo(
            {"placement": "Placements", "pending": "Pending", "queue": "Queues", "node": "Nodes"}[
                section
            ]
        )
        click.echo(
            table(
                [h.upper() for h in headers],
                [[_cell(r.get(h)) for h in headers] for r in chosen],
            )
        )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _quota_text(quotas: dict[str, dict[str, float | None]]) -> str:
    parts = []
    for flavor, q in sorted(quotas.items()):
        text = f"{flavor} {q['nominal']:g}"
        if q["borrowingLimit"] is not None:
            text += f" +{q['borrowingLimit']:g}"
        if q["lendingLimit"] is not None:
            text += f" (lends {q['lendingLimit']:g})"
        parts.append(text)
    return "; ".join(parts)


def _at_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in state["placements"]:
        rows.append(
            {
                "section": "placement",
                "name": p["job"],
                "queue": p["queue"],
                "flavor": p["flavor"],
                "nodes": p["nodes"],
                "gpus": f"{p['gpus']:g}",
                "since": p["since"],
                "detail": f"{p['replicas']} replica(s)",
            }
        )
    for p in state["pending"]:
        rows.append(
            {
                "section": "pending",
                "name": p["job"],
                "queue": p["job"].split("/", 1)[0],
                "since": p["since"],
                "detail": p["reason"],
            }
        )
    for q in state["queues"]:
        cohort = f"cohort {q['cohort']}: " if q["cohort"] else ""
        rows.append(
            {"section": "queue", "name": q["name"], "detail": cohort + _quota_text(q["quotas"])}
        )
    for n in state["nodes"]:
        rows.append(
            {
                "section": "node",
                "name": n["name"],
                "flavor": n["flavor"],
                "gpus": n["gpus"],
                "detail": f"{n['state']}, {n['isolation']}, {n['region'] or 'no region'}",
            }
        )
    return rows


# -- usage ----------------------------------------------------------------------------------


def _period(store: AuditStore, since: str | None, until: str | None) -> tuple[float, float]:
    """--since and --until, defaulted as `gitsched.audit.window.period` says (usage and report alike)."""
    start, end = period(
        store,
        parse_time(since, "--since").timestamp() if since else None,
        parse_time(until, "--until").timestamp() if until else None,
        time.time(),
    )
    if start > end:
        fail("--since is after --until")
    return start, end


def _iso(ts: float) -> str:
    return format_time(datetime.fromtimestamp(ts, UTC))


@audit.command()
@log_option
@repo_opt
@db_option
@click.option(
    "--by", type=click.Choice(usage_query.BY), default="team", show_default=True, help="Group by."
)
@since_until
@format_option("text", "csv", "json")
def usage(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    by: str,
    since: str | None,
    until: str | None,
    fmt: str,
) -> None:
    """GPU-hours used against quota, borrowed and lent, and idle (like sreport)."""
    with view(log_url, repo, db_path) as (_, store):
        start, end = _period(store, since, until)
        rows = usage_query.usage(store, by=by, since=start, until=end)
    if fmt == "json":
        click.echo(
            json.dumps({"by": by, "since": _iso(start), "until": _iso(end), "rows": rows}, indent=2)
        )
        return
    if fmt == "text":
        click.echo(f"GPU-hours by {by}, {_iso(start)} .. {_iso(end)}")
    emit_rows(rows, usage_query.HEADERS[by], fmt)


@audit.command()
@log_option
@repo_opt
@db_option
@click.option(
    "--by", type=click.Choice(waits_query.BY), default="queue", show_default=True, help="Group by."
)
@since_until
@format_option("text", "csv", "json")
def waits(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    by: str,
    since: str | None,
    until: str | None,
    fmt: str,
) -> None:
    """How long jobs waited to run: count, mean, p50, p95, p99 and max wait per queue,
    priority class or size, of the admissions that started in the period."""
    with view(log_url, repo, db_path) as (_, store):
        start, end = _period(store, since, until)
        result = waits_query.waits(store, by=by, since=start, until=end)
    if fmt == "json":
        click.echo(
            json.dumps({"by": by, "since": _iso(start), "until": _iso(end), **result}, indent=2)
        )
        return
    rows = [*result["rows"], result["all"]]
    if fmt == "text":
        click.echo(f"Waits by {by}, {_iso(start)} .. {_iso(end)} (seconds)")
    emit_rows(rows, waits_query.HEADERS, fmt)


@audit.command()
@log_option
@repo_opt
@db_option
@since_until
@click.option(
    "--every-hours",
    type=click.FloatRange(min=0.01),
    default=24.0,
    show_default=True,
    help="One sample of every queue this often.",
)
@format_option("text", "csv", "json")
def fairshare(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    since: str | None,
    until: str | None,
    every_hours: float,
    fmt: str,
) -> None:
    """Each queue's decayed GPU usage against its fair share, over time."""
    with view(log_url, repo, db_path) as (_, store):
        start, end = _period(store, since, until)
        times = fairshare_query.sample_times(start, end, every_hours * 3600.0)
        rows = fairshare_query.fair_share_over_time(store, times)
    if fmt == "json":
        click.echo(json.dumps({"since": _iso(start), "until": _iso(end), "rows": rows}, indent=2))
        return
    if fmt == "text":
        click.echo(
            f"Usage (decayed) against fair share, {_iso(start)} .. {_iso(end)}, "
            f"every {every_hours:g} h"
        )
    emit_rows(rows, fairshare_query.HEADERS, fmt)


def paging(f: Callable[..., Any]) -> Callable[..., Any]:
    """--since/--until (fact times), --after-seq and --limit: a page of a whole-log listing."""
    f = click.option(
        "--limit",
        type=click.IntRange(min=1),
        help="At most this many rows; a note on stderr says when more follow.",
    )(f)
    f = click.option(
        "--after-seq",
        type=click.IntRange(min=0),
        default=0,
        help="Only what the log recorded after this seq (the next page: the note's seq).",
    )(f)
    return since_until(f)


def _seq_range(
    store: AuditStore, since: str | None, until: str | None, after_seq: int
) -> tuple[int, int]:
    """The seqs `after < seq <= upto` of [--since, --until) (fact times) after --after-seq."""
    start = parse_time(since, "--since").timestamp() if since else None
    end = parse_time(until, "--until").timestamp() if until else None
    if start is not None and end is not None and start > end:
        fail("--since is after --until")
    after, upto = seqs_between(store, start, end)
    return max(after, after_seq), upto


def _more_note(what: str, shown: int, last_seq: int) -> None:
    click.echo(
        f"note: only the first {shown} {what} are shown (--limit); more follow: "
        f"rerun with --after-seq {last_seq}",
        err=True,
    )


@audit.command("solves")
@log_option
@repo_opt
@db_option
@click.option(
    "--fallbacks", is_flag=True, help="Only the solves where greedy's plan replaced the MILP's."
)
@paging
@format_option("text", "csv", "json")
def solves_command(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    fallbacks: bool,
    since: str | None,
    until: str | None,
    after_seq: int,
    limit: int | None,
    fmt: str,
) -> None:
    """Every solve: solver, status, whose plan was applied and why, gap and bound.

    All of them by default; --since/--until (when decided), --after-seq and --limit read
    a page, at the cost of the page."""
    with view(log_url, repo, db_path) as (_, store):
        after, upto = _seq_range(store, since, until, after_seq)
        rows, more = read_page(
            lambda a, u, n: solves_query.solves(
                store, fallbacks_only=fallbacks, after_seq=a, until_seq=u, limit=n
            ),
            after,
            upto,
            limit,
            lambda r: int(r["seq"]),
        )
    if fmt == "json":
        doc: dict[str, Any] = {"rows": rows}
        if limit is not None:
            doc["truncated"] = more
        click.echo(json.dumps(doc, indent=2))
    else:
        emit_rows(rows, solves_query.HEADERS, fmt)
    if more:
        _more_note("solves", len(rows), rows[-1]["seq"])


# -- changes --------------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
@click.option("--team", help="Only changes to this team's queue and jobs.")
@paging
@format_option("text", "csv", "json")
@click.option(
    "--wide",
    is_flag=True,
    help="Text: every column in full (default: fit 120 columns; --format json has all).",
)
def changes(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    team: str | None,
    since: str | None,
    until: str | None,
    after_seq: int,
    limit: int | None,
    fmt: str,
    wide: bool,
) -> None:
    """Every change of queues, priorities and policies: who, approved by whom, when, and what it caused.

    All of them by default; --since/--until (when merged), --after-seq and --limit
    read a page, at the cost of the page. The text table fits 120 columns, long cells
    cut with "..."; --wide shows them in full, --format json every detail."""
    with view(log_url, repo, db_path, verify=True) as (_, store):
        after, upto = _seq_range(store, since, until, after_seq)
        rows, more = read_page(
            lambda a, u, n: changes_query.changes(
                store, team=team, after_seq=a, until_seq=u, limit=n
            ),
            after,
            upto,
            limit,
            lambda r: int(r["applied_seq"]),
        )
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        shown = [
            {k: v for k, v in r.items() if k != "effects"}
            | {"commit": r["commit"][:12], "approval": changes_query.approval_text(r["approval"])}
            for r in rows
        ]
        if fmt == "text" and not wide:
            click.echo(_changes_text(rows))
        else:
            emit_rows(shown, changes_query.HEADERS, fmt)
    if more:
        _more_note("changes", len(rows), rows[-1]["applied_seq"])


# The columns of `audit changes`' 120-column table: a person's reading of each change
# (`--wide` and `--format json` keep the rest: committer, approvers, applied time).
_CHANGES_NARROW = ("applied_seq", "commit", "kind", "target", "change", "author", "approval",
                   "merged", "caused")  # fmt: skip


def _approval_short(approval: dict[str, Any] | None) -> str:
    """The verdict and who counted, without the marks and keys `--wide` shows."""
    if approval is None:
        return "-"
    if approval["status"] == "bootstrap":
        return "bootstrap"
    counted = [a["approver"] for a in approval.get("approvals", ()) if a.get("counted")]
    return str(approval["status"]) + (": " + ", ".join(counted) if counted else "")


def _changes_text(rows: list[dict[str, Any]]) -> str:
    headers = [
        "SEQ",
        "COMMIT",
        "KIND",
        "TARGET",
        "CHANGE",
        "AUTHOR",
        "APPROVAL",
        "MERGED",
        "CAUSED",
    ]
    shown = []
    for r in rows:
        cells = {k: cell(r.get(k)) for k in _CHANGES_NARROW}
        cells["approval"] = _approval_short(r.get("approval"))
        cells["commit"] = cells["commit"][:8]
        if "(merged by" not in cells["author"]:
            cells["author"] = cells["author"].split(" <", 1)[0]  # the name; the e-mail in --wide
        cells["merged"] = cells["merged"][:16].replace("T", " ")
        shown.append([cells[k] for k in _CHANGES_NARROW])
    # Times, names and verdicts stay whole; the free text (change, effects) is cut first.
    return fit_table(headers, shown, floor=[3, 8, 10, 8, 14, 12, 14, 16, 14])


# -- compliance -----------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
@paging
@format_option("text", "csv", "json")
def compliance(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    since: str | None,
    until: str | None,
    after_seq: int,
    limit: int | None,
    fmt: str,
) -> None:
    """Compliance checks with evidence. Exit 1 when any check finds a violation.

    Over the whole log by default; --since/--until (when the violation happened),
    --after-seq and --limit list a page of the violations (the checks still count all
    of them in the range, and JSON says `truncated`)."""
    with view(log_url, repo, db_path, verify=True) as (event_log, store):
        after, upto = _seq_range(store, since, until, after_seq)
        paged = since is not None or until is not None or after_seq > 0
        result = compliance_query.compliance(
            store,
            since_seq=after,
            until_seq=upto if paged else None,
            limit=limit,
        )
        compliance_query.describe(event_log, result["violations"])
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    elif fmt == "csv":
        emit_rows(
            [dict(v, evidence=_evidence_text(v["evidence"])) for v in result["violations"]],
            compliance_query.HEADERS,
            "csv",
        )
    else:
        click.echo(f"compliance over {result['events']:,} events")
        click.echo(
            table(
                ["CHECK", "STATUS", "CHECKED", "VIOLATIONS", "RULE"],
                [
                    [
                        c["check"],
                        c["status"],
                        f"{c['checked']} {c['checked_what']}",
                        c["violations"],
                        c["description"],
                    ]
                    for c in result["checks"]
                ],
            )
        )
        if result["violations"]:
            click.echo("")
            click.echo(
                table(
                    ["CHECK", "SEQ", "TIME", "SUBJECT", "VIOLATION", "EVIDENCE"],
                    [
                        [
                            v["check"],
                            v["seq"],
                            v["time"],
                            v["subject"],
                            v["message"],
                            _evidence_text(v["evidence"]),
                        ]
                        for v in result["violations"]
                    ],
                )
            )
    if result.get("truncated"):
        _more_note("violations", len(result["violations"]), result["violations"][-1]["seq"])
    sys.exit(EXIT_OK if result["ok"] else EXIT_INVALID)


def _evidence_text(evidence: list[Any]) -> str:
    return " ".join(f"{e['seq']}:{e['type']}" if isinstance(e, dict) else str(e) for e in evidence)


# -- verify (moved) ------------------------------------------------------------------------


def _verify_moved(**kwargs: Any) -> None:
    click.echo("note: `gitsched audit verify` moved to `gitsched log verify`", err=True)
    log_verify.callback(**kwargs)  # type: ignore[misc]


# The old name, kept working for scripts that use it; `gitsched log verify` is the command.
audit.add_command(
    click.Command(
        "verify",
        callback=_verify_moved,
        params=list(log_verify.params),
        hidden=True,
        help="Moved: `gitsched log verify`.",
    )
)


# -- report ---------------------------------------------------------------------------------


@audit.command()
@log_option
@repo_opt
@db_option
@since_until
@click.option(
    "--output",
    "-o",
    default="report.html",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the HTML report.",
)
def report(
    log_url: str | None,
    repo: str,
    db_path: str | None,
    since: str | None,
    until: str | None,
    output: str,
) -> None:
    """One self-contained HTML report for an auditor (opens offline).

    Summary, utilisation per team over time, a Gantt chart of placements per node,
    changes with provenance, compliance results. --since and --until default to
    the log's first and last events, as for `audit usage` (one definition of the
    period), so the same log always gives the same report.
    """
    from gitsched.audit.report import render_report

    # Evidence: a chain that breaks while the view catches up is a "no" (exit 1); one
    # that breaks in the tail the view has not checked yet is said on the page as well.
    with view(log_url, repo, db_path, verify=True) as (event_log, store):
        if store.db.execute("SELECT 1 FROM marks LIMIT 1").fetchone() is None:
            fail("the log is empty: nothing to report")
        start, end = _period(store, since, until)
        if start >= end:
            fail("--since must be before --until")
        # The chain verified from where the view last verified it: a broken one is said
        # at the top of the page (`log verify` checks it all from the first event).
        try:
            verify_view(event_log, store)
            checked, head = store.chain_checked()
            verification = Verification(checked, head, None)
        except ChainBroken as e:
            verification = Verification(e.broken.seq - 1, None, e.broken)
        page = render_report(
            store, since=start, until=end, verification=verification, log=event_log
        )
    Path(output).write_text(page, encoding="utf-8")
    click.echo(f"wrote {output} ({len(page) / 2**20:.1f} MiB)")
    if verification.broken is not None:
        # The page says so at its top; the exit code says so to whoever ran it.
        fail(
            broken_chain_message(verification.broken.seq, verification.broken.reason),
            EXIT_INVALID,
        )
