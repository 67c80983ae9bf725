"""`gitsched bench audit`: projection rate and query latency on a synthetic log (BENCHMARKS.md §3).

The log is `gitsched.simulation.history`'s month of a 1,536-GPU cluster (longer for more
events), appended through the real SQLite `EventLog` and cached under --work-dir
by size and seed. Every query is timed as the CLI runs it: the view caught up
first, and for evidence (changes, compliance) the chain verified from where the
view last verified it.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from gitsched.audit import changes as changes_query
from gitsched.audit import compliance as compliance_query
from gitsched.audit import fairshare, history, pointintime, solves, usage
from gitsched.audit import waits as waits_query
from gitsched.audit.catchup import catch_up, rebuild
from gitsched.audit.store import AuditStore, EventList, checked_meta
from gitsched.audit.verify import verify_log
from gitsched.audit.window import seqs_between
from gitsched.eventlog.codec import decode
from gitsched.eventlog.envelope import GENESIS_HASH
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.options import format_option
from gitsched.render import table
from gitsched.simulation.history import SIMULATION_VERSION, synthetic_log

# How many new events the tail-verification timing gives the view to verify.
TAIL_EVENTS = 1000


# Events whose decoding into `gitsched.engine.events` classes is timed against the fold's own cost.
DECODE_SAMPLE = 50_000


def _decode_against_fold(log: SQLiteEventLog, events: int) -> dict[str, float]:
    """CPU microseconds an event: decoding into typed events (SolveCompleted's aside)
    against the fold and its SQLite writes, in one process (the engine's fold for fair
    share included: a rebuild runs that part in its writer process)."""
    sample = list(log.read(0, until_seq=events))
    started = time.process_time()
    for event in sample:
        if event.type != "SolveCompleted":
            decode(event)
    decode_s = time.process_time() - started
    with AuditStore(":memory:") as scratch:
        started = time.process_time()
        catch_up(EventList(sample), scratch)
        fold_s = time.process_time() - started
    return {
        "decode_cpu_us_per_event": round(decode_s / len(sample) * 1e6, 2),
        "fold_cpu_us_per_event": round(fold_s / len(sample) * 1e6, 2),
    }


def _between(store: AuditStore, since: float, seconds: float) -> tuple[int, int]:
    """The seqs of [since, since + seconds), as `audit changes --since --until` reads them."""
    return seqs_between(store, since, since + seconds)


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return p50 * 1000.0, p99 * 1000.0


@click.command()
@click.option("--events", default=1_000_000, show_default=True, help="Size of the synthetic log.")
@click.option("--seed", default=7, show_default=True, help="Seed of the synthetic cluster.")
@click.option(
    "--work-dir",
    default=".cache/bench-audit",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the synthetic log (cached) and the audit view go.",
)
@click.option("--samples", default=200, show_default=True, help="Runs of each point query.")
@format_option("text", "json")
def command(events: int, seed: int, work_dir: str, samples: int, fmt: str) -> None:
    """Audit views: rebuild rate (events/s) and p50/p99 latency of each query on a synthetic log."""
    directory = Path(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"log-v{SIMULATION_VERSION}-{events}-{seed}.db"
    view_path = directory / f"audit-v{SIMULATION_VERSION}-{events}-{seed}.db"

    def say(text: str) -> None:
        click.echo(text, err=True)

    generated = time.perf_counter()
    cached = log_path.exists() and log_path.with_name(log_path.name + ".done").exists()
    say(f"synthetic log {log_path} ({'cached' if cached else 'generating'})")
    log = synthetic_log(log_path, events, seed, echo=say)
    generation_s = time.perf_counter() - generated
    head = log.last_seq()

    say(f"rebuilding the audit view from 0 ({head:,} events)")
    load_before = os.getloadavg()[0]
    cpu, writer_cpu = time.process_time(), _children_cpu()
    built = rebuild(log, view_path, verify=True)  # as `audit rebuild` does
    cpu, writer_cpu = time.process_time() - cpu, _children_cpu() - writer_cpu
    results: dict[str, Any] = {
        "events": head,
        "seed": seed,
        "log_generation_s": None if cached else round(generation_s, 1),
        "rebuild_s": round(built.seconds, 2),
        "rebuild_events_per_s": round(built.rate),
        # The machine may be shared: CPU time says what the rebuild itself costs, in this
        # process and in the writer process a long rebuild starts (`gitsched.audit.writer`).
        "rebuild_cpu_s": round(cpu, 2),
        "rebuild_writer_cpu_s": round(writer_cpu, 2),
        "rebuild_events_per_cpu_s": round(head / (cpu + writer_cpu)) if cpu > 0 else None,
        "load_average_1m": round(load_before, 2),
        "view_mib": round(view_path.stat().st_size / 2**20, 1),
        "queries": {},
    }
    results.update(_decode_against_fold(log, min(head, DECODE_SAMPLE)))
    store = AuditStore(view_path)
    rng = random.Random(seed)
    jobs = [r[0] for r in store.db.execute("SELECT DISTINCT job FROM placements")]
    nodes = [r[0] for r in store.db.execute("SELECT DISTINCT node FROM placement_nodes")]
    times = [r[0] for r in store.db.execute("SELECT time FROM marks")]
    first_ts, last_ts = (
        datetime.fromisoformat(times[0]).timestamp(),
        datetime.fromisoformat(times[-1]).timestamp(),
    )
    month = 30 * 86400.0

    def timed(
        name: str,
        runs: int,
        one: Callable[[], object],
        *,
        verify: bool = False,
        before: Callable[[], object] | None = None,
    ) -> None:
        took, cpu = [], []
        for _ in range(runs):
            if before is not None:
                before()
            t, c = time.perf_counter(), time.process_time()
            # What every CLI query does first: a no-op when caught up; for evidence, the
            # chain verified from where the view last verified it.
            catch_up(log, store, verify=verify)
            one()
            took.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        p50, p99 = _percentiles(took)
        cpu50, cpu99 = _percentiles(cpu)
        results["queries"][name] = {
            "p50_ms": round(p50, 2),
            "p99_ms": round(p99, 2),
            # On a shared machine the wall time waits for other work; CPU time does not.
            "p50_cpu_ms": round(cpu50, 2),
            "p99_cpu_ms": round(cpu99, 2),
            "runs": runs,
        }

    say("timing queries")
    timed("history --job", samples, lambda: history.query(store, job=rng.choice(jobs)))
    timed("history --node", samples, lambda: history.query(store, node=rng.choice(nodes)))
    timed(
        "history --node (1 day)",
        samples,
        lambda: history.query(
            store,
            node=rng.choice(nodes),
            since=(s := rng.uniform(first_ts, last_ts - 86400)),
            until=s + 86400,
        ),
    )
    timed("at --seq", samples, lambda: pointintime.cluster_at(store, rng.randint(1, head)))
    timed(
        "at TIME",
        samples,
        lambda: pointintime.cluster_at(store, pointintime.seq_at_time(store, rng.choice(times))),
    )
    runs = max(5, samples // 10)
    timed(
        "usage --by team (30 days)",
        runs,
        lambda: usage.by_team(store, last_ts - month, last_ts),
    )
    timed("usage --by user (30 days)", runs, lambda: usage.by_user(store, last_ts - month, last_ts))
    timed(
        "usage --by flavor (30 days)",
        runs,
        lambda: usage.by_flavor(store, last_ts - month, last_ts),
    )
    timed(
        "waits --by queue (1 day)",
        samples,
        lambda: waits_query.waits(
            store, by="queue", since=(s := rng.uniform(first_ts, last_ts - 86400)), until=s + 86400
        ),
    )
    timed(
        "waits --by size (30 days)",
        runs,
        lambda: waits_query.waits(store, by="size", since=last_ts - month, until=last_ts),
    )
    timed("changes", runs, lambda: changes_query.changes(store), verify=True)
    timed(
        "changes (1 day)",
        runs,
        lambda: changes_query.changes(
            store,
            after_seq=(w := _between(store, rng.uniform(first_ts, last_ts - 86400), 86400))[0],
            until_seq=w[1],
        ),
        verify=True,
    )
    timed(
        "changes --limit 100",
        runs,
        lambda: changes_query.changes(store, after_seq=rng.randint(0, head), limit=101),
        verify=True,
    )
    timed("compliance", runs, lambda: compliance_query.compliance(store), verify=True)
    timed(
        "compliance (1 day)",
        runs,
        lambda: compliance_query.compliance(
            store,
            since_seq=(w := _between(store, rng.uniform(first_ts, last_ts - 86400), 86400))[0],
            until_seq=w[1],
        ),
        verify=True,
    )
    timed(
        "compliance --limit 100",
        runs,
        lambda: compliance_query.compliance(store, since_seq=rng.randint(0, head), limit=100),
        verify=True,
    )
    timed(
        "fairshare (30 days, daily)",
        runs,
        lambda: fairshare.fair_share_over_time(
            store, fairshare.sample_times(last_ts - month, last_ts, 86400.0)
        ),
    )
    timed(
        "fairshare (30 days, hourly)",
        runs,
        lambda: fairshare.fair_share_over_time(
            store, fairshare.sample_times(last_ts - month, last_ts, 3600.0)
        ),
    )
    timed("solves", runs, lambda: solves.solves(store))
    timed(
        "solves (1 day)",
        runs,
        lambda: solves.solves(
            store,
            after_seq=(w := _between(store, rng.uniform(first_ts, last_ts - 86400), 86400))[0],
            until_seq=w[1],
        ),
    )
    timed(
        "solves --limit 100",
        runs,
        lambda: solves.solves(store, after_seq=rng.randint(0, head), limit=101),
    )
    tail = min(TAIL_EVENTS, head)
    tail_hash = next(iter(log.read(head - tail - 1, until_seq=head - tail)), None)

    def forget_tail() -> None:
        """As if the last TAIL_EVENTS events had come since the view last verified."""
        store.db.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            checked_meta(head - tail, tail_hash.hash if tail_hash else GENESIS_HASH),
        )

    timed(
        f"compliance ({tail:,} events to verify)",
        runs,
        lambda: compliance_query.compliance(store),
        verify=True,
        before=forget_tail,
    )
    t = time.perf_counter()
    full = verify_log(log)
    results["log_verify_s"] = round(time.perf_counter() - t, 2)
    results["log_verify_ok"] = full.ok
    results["span_days"] = round((last_ts - first_ts) / 86400.0, 1)
    results["intervals"] = store.db.execute("SELECT COUNT(*) FROM placements").fetchone()[0]
    store.close()
    log.close()

    if fmt == "json":
        click.echo(json.dumps(results, indent=2))
        return
    click.echo(
        f"audit views over {results['events']:,} events ({results['span_days']} days, "
        f"{results['intervals']:,} placement intervals, view {results['view_mib']} MiB)"
    )
    click.echo(
        f"rebuild from 0: {results['rebuild_s']} s, {results['rebuild_events_per_s']:,} events/s "
        f"(target >= 50,000); {results['rebuild_cpu_s']} s CPU "
        f"+ {results['rebuild_writer_cpu_s']} s in the writer process, "
        f"{results['rebuild_events_per_cpu_s']:,} events per CPU-second "
        f"(1-minute load average {results['load_average_1m']} on {os.cpu_count()} CPUs)"
    )
    click.echo(
        f"typed events: decoding costs {results['decode_cpu_us_per_event']} µs of CPU an event, "
        f"the fold and its writes {results['fold_cpu_us_per_event']} µs "
        f"(first {min(head, DECODE_SAMPLE):,} events)"
    )
    click.echo("")
    click.echo(
        table(
            ["QUERY", "P50 MS", "P99 MS", "P50 CPU MS", "P99 CPU MS", "RUNS"],
            [
                [n, q["p50_ms"], q["p99_ms"], q["p50_cpu_ms"], q["p99_cpu_ms"], q["runs"]]
                for n, q in results["queries"].items()
            ],
        )
    )
    click.echo(
        f"log verify (the whole chain, once): {results['log_verify_s']} s, "
        + ("intact" if results["log_verify_ok"] else "BROKEN")
    )
    sys.stdout.flush()
