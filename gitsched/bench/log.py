"""`gitsched bench log`: append and replay throughput of each log backend (BENCHMARKS.md §3).

Synthetic but realistic events are appended through the real `EventLog.append`
one commit at a time, as the reconciler appends them: a commit of N jobs is one
transaction of 2N + 2 events (N JobSubmitted, CommitApplied, then the solve's N
PlacementDecided and SolveCompleted, encoded through eventlog.codec), acks=all and
idempotence on Kafka. Jobs also finish (N JobFinished in the commits after the
first LIVE jobs), so the cluster holds about LIVE jobs at any time, as a real one
does, whatever the length of the log. Then a fresh instance reads them all back
and decodes them, as `gitsched state` would; another folds them; and a restart
(the reconciler's verified fold) is timed from the first event and from a
snapshot taken SNAPSHOT_EVERY events behind the head, as the reconciler keeps them.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from gitsched.engine.errors import GitschedError
from gitsched.engine.events import (
    CommitApplied,
    Event,
    JobFinished,
    JobSubmitted,
    PlacementDecided,
    SolveCompleted,
)
from gitsched.engine.model import CommitInfo, Job, ReplicaPlacement, Resources, TopologyRequirement
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLog, EventLogError
from gitsched.eventlog.codec import decode, encode
from gitsched.eventlog.collector import collector_paused
from gitsched.eventlog.envelope import NewEvent
from gitsched.eventlog.replay import replay, snapshot
from gitsched.options import fail, format_option
from gitsched.reconciler.loop import SNAPSHOT_EVERY
from gitsched.render import table

# The targets of issue #3, on one machine.
APPEND_TARGET = {"kafka": 20_000}
REPLAY_TARGET = 100_000
TEAMS = ("vision", "nlp", "speech", "fraud", "search", "ads")
FLAVORS = ("h100-80g", "a100-80g", "l40s-48g")


@dataclass(frozen=True, slots=True)
class Result:
    log: str
    backend: str
    events: int
    batch: int
    append_s: float
    append_per_s: float
    append_p50_ms: float
    append_p99_ms: float
    replay_s: float
    replay_per_s: float
    fold_s: float
    fold_per_s: float
    live_jobs: int
    restart_s: float  # the reconciler's start: a verified fold from the first event
    snapshot_seq: int  # where the snapshot was taken (SNAPSHOT_EVERY behind the head)
    snapshot_bytes: int
    restart_from_snapshot_s: float  # the same start from that snapshot: load, check, tail


def synthetic_commits(
    events: int, jobs: int, run: str, seed: int = 7, live: int | None = None
) -> Iterator[list[NewEvent]]:
    """`events` events, one list per commit of `jobs` jobs (the last one cut short).

    With `live`, each commit also finishes the jobs of the commit `live // jobs` before
    it, so about `live` jobs are in the cluster at any time.
    """
    rng = random.Random(seed)
    made = 0
    number = 0
    submitted: list[list[str]] = []
    while made < events:
        sha = f"{rng.getrandbits(160):040x}"
        at = f"2026-01-{1 + number % 28:02d}T{number % 24:02d}:00:00.000000Z"
        commit = CommitInfo(
            sha=sha,
            author="Ana Souza",
            author_email="ana@vision.example",
            committed_at=at,
            subject="vision: a sweep of fine-tunes on H100, one NVLink domain each",
            approvers=("Priya Raman <priya@platform.example>",),
        )
        solve_id = f"{sha}/solve"
        names = [f"job-{number}-{i}" for i in range(jobs)]
        teams = [rng.choice(TEAMS) for _ in names]
        changed: list[Event] = [
            _job(rng, team, name, at) for team, name in zip(teams, names, strict=True)
        ]
        submitted.append([f"{team}/{name}" for team, name in zip(teams, names, strict=True)])
        if live is not None and len(submitted) > max(1, live // jobs):
            changed.extend(JobFinished(job=key) for key in submitted.pop(0))
        changed.append(CommitApplied(commit=commit, changes=len(changed)))
        solved: list[Event] = [
            _placement(rng, team, name, solve_id, at)
            for team, name in zip(teams, names, strict=True)
        ]
        solved.append(_solve(rng, solve_id, jobs))
        batch = [
            encode(e, id=f"bench/{run}/{sha}/{i}", actor=commit.actor, cause=sha)
            for i, e in enumerate(changed)
        ] + [
            encode(e, id=f"bench/{run}/{solve_id}/{i}", actor="solver", cause=sha)
            for i, e in enumerate(solved)
        ]
        batch = batch[: events - made]
        yield batch
        made += len(batch)
        number += 1


def _job(rng: random.Random, team: str, name: str, at: str) -> JobSubmitted:
    replicas = rng.choice((1, 2, 4, 8))
    return JobSubmitted(
        Job(
            name=name,
            queue=team,
            replicas=replicas,
            resources=Resources(gpu_milli=8000, cpu_milli=160_000, memory_mib=1_843_200),
            priority_class="normal",
            priority=500,
            gpu_flavors=(rng.choice(FLAVORS),),
            topology=TopologyRequirement("nvlink") if replicas <= 2 else None,
            checkpoint_interval_minutes=30,
            file=f"teams/{team}/jobs/{name}.yaml",
            submitted_at=at,
        )
    )


def _placement(
    rng: random.Random, team: str, name: str, solve_id: str, at: str
) -> PlacementDecided:
    rack = rng.choice("abcd")
    replicas = tuple(
        ReplicaPlacement(
            node=f"h100-{rack}-{rng.randrange(1, 33):02d}", gpus=tuple(range(8)), gpu_milli=8000
        )
        for _ in range(rng.choice((1, 2, 4)))
    )
    return PlacementDecided(
        job=f"{team}/{name}",
        flavor="h100-80g",
        replicas=replicas,
        action=rng.choice(("placed", "kept", "moved")),
        reason="fits quota; nvlink domain nvl-a-03 keeps the gang together",
        solve_id=solve_id,
        at=at,
    )


def _solve(rng: random.Random, solve_id: str, decisions: int) -> SolveCompleted:
    return SolveCompleted(
        solve_id=solve_id,
        solver="highs",
        status="optimal",
        objective=round(rng.uniform(100, 1000), 3),
        bound=None,
        gap=0.0,
        seconds=round(rng.uniform(0.01, 2), 4),
        variables=decisions * 40,
        constraints=decisions * 25,
        placed=decisions,
        kept=0,
        moved=0,
        preempted=0,
        pending=0,
    )


def measure(url: str, events: int, jobs: int, live: int, snapshot_dir: Path) -> Result:
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    batch = 0
    with open_log(url) as event_log:
        if event_log.last_seq() != 0:
            raise GitschedError(f"{url} is not empty: bench log appends only to a new, empty log")
        last_seq = 0
        for chunk in synthetic_commits(events, jobs, run, live=live):
            batch = max(batch, len(chunk))
            began = time.perf_counter()
            stored = event_log.append(chunk, expected_last_seq=last_seq)
            latencies.append(time.perf_counter() - began)
            last_seq = stored[-1].seq
    appended = sum(latencies)
    # A new instance, as a restarted `gitsched state` would be: nothing cached.
    with open_log(url, create=False) as event_log:
        began = time.perf_counter()
        replayed = _replay(event_log)
        replay_s = time.perf_counter() - began
    if replayed != events:
        raise GitschedError(f"{url}: replay read {replayed} events, {events} were appended")
    # The same again, folded into the cluster state: what `gitsched state` or a
    # restarted reconciler does.
    with open_log(url, create=False) as event_log:
        began = time.perf_counter()
        folded = replay(event_log).last_seq
        fold_s = time.perf_counter() - began
    if folded != events:
        raise GitschedError(f"{url}: the fold reached seq {folded}, {events} were appended")
    restart_s, snapshot_seq, snapshot_bytes, from_snapshot_s = _restarts(url, events, snapshot_dir)
    ordered = sorted(latencies)
    return Result(
        log=url,
        backend=url.split(":", 1)[0],
        events=events,
        batch=batch,
        append_s=appended,
        append_per_s=events / appended,
        append_p50_ms=statistics.median(ordered) * 1000,
        append_p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
        replay_s=replay_s,
        replay_per_s=events / replay_s,
        fold_s=fold_s,
        fold_per_s=events / fold_s,
        live_jobs=live,
        restart_s=restart_s,
        snapshot_seq=snapshot_seq,
        snapshot_bytes=snapshot_bytes,
        restart_from_snapshot_s=from_snapshot_s,
    )


def _restarts(url: str, events: int, snapshot_dir: Path) -> tuple[float, int, int, float]:
    """A restarted reconciler's verified fold, from the first event and from a snapshot.

    One pass serves both the full figure and the snapshot: the fold stops at the
    snapshot's seq, which is kept, then goes on to the head.
    """
    at = max(events - SNAPSHOT_EVERY, events // 2)
    with open_log(url, create=False, snapshot_dir=snapshot_dir) as event_log:
        began = time.perf_counter()
        part = replay(event_log, until_seq=at, verify=True, use_snapshots=False)
        full = replay(event_log, since=part, verify=True)
        restart_s = time.perf_counter() - began
        snapshot(event_log, part)
    with open_log(url, create=False, snapshot_dir=snapshot_dir) as event_log:
        began = time.perf_counter()
        resumed = replay(event_log, verify=True)
        from_snapshot_s = time.perf_counter() - began
        store = event_log.snapshots()
        size = store.infos()[0].size_bytes if store is not None else 0
    if resumed.from_snapshot != at or resumed.state != full.state:
        raise GitschedError(
            f"{url}: the restart from the snapshot at seq {at} did not give the full fold's state"
        )
    return restart_s, at, size, from_snapshot_s


def _replay(event_log: EventLog) -> int:
    """Read and decode every event, as `replay` does before it folds them."""
    count = 0
    with collector_paused():
        for stored in event_log.read(0):
            decode(stored)
            count += 1
    return count


def _delete_topic(url: str) -> None:
    """Best effort: the bench's own topic is litter once it is measured."""
    from gitsched.eventlog.kafka import delete_log_topic

    try:
        delete_log_topic(url)
    except EventLogError as e:
        click.echo(f"gitsched: could not delete the bench topic of {url}: {e}", err=True)


def _verdict(result: Result) -> str:
    misses = []
    append_target = APPEND_TARGET.get(result.backend)
    if append_target is not None and result.append_per_s < append_target:
        misses.append(f"append < {append_target:,}")
    if result.replay_per_s < REPLAY_TARGET:
        misses.append(f"replay < {REPLAY_TARGET:,}")
    return "; ".join(misses) if misses else "met"


@click.command()
@click.option(
    "--log",
    "logs",
    multiple=True,
    help="A new, empty log to measure (repeatable). Default: a temporary SQLite file, "
    "and a fresh Kafka topic when --kafka is given.",
)
@click.option(
    "--kafka",
    envvar="GITSCHED_KAFKA",
    show_envvar=True,
    help="HOST:PORT of a Kafka broker: also measure a fresh topic on it (deleted afterwards).",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["sqlite", "kafka"]),
    help="Measure only these backends when no --log is given (repeatable). Default: sqlite, "
    "and kafka when --kafka is given; kafka needs --kafka (or GITSCHED_KAFKA).",
)
@click.option(
    "--events",
    default=100_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Events to append to each log, then replay.",
)
@click.option(
    "--jobs",
    default=50,
    show_default=True,
    type=click.IntRange(min=1),
    help="Jobs per commit: one commit is one append (one transaction) of 2 x JOBS + 2 events,"
    " plus JOBS JobFinished once LIVE_JOBS are running.",
)
@click.option(
    "--live-jobs",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Jobs in the cluster at any time: older commits' jobs finish as new ones come.",
)
@format_option("text", "json")
def command(
    logs: tuple[str, ...],
    kafka: str | None,
    backends: tuple[str, ...],
    events: int,
    jobs: int,
    live_jobs: int,
    fmt: str,
) -> None:
    """Append and replay throughput of each log backend, side by side.

    Appends EVENTS synthetic events one commit at a time, as the reconciler does
    (a commit of JOBS jobs and its placement decisions: one transaction of
    2 x JOBS + 2 events; acks=all and idempotence on Kafka), then replays them all
    through a new instance (read + decode), and folds them into the cluster state
    through another (FOLD: what `gitsched state` does), and times a restarted
    reconciler's verified fold from the first event (RESTART) and from a snapshot
    SNAPSHOT_EVERY events behind the head (FROM SNAPSHOT: what it does when the
    reconciler has kept them). About LIVE_JOBS jobs are in the cluster at any time.
    Targets (issue #3): Kafka appends >= 20,000 events/s, replay >= 100,000 events/s.
    """
    if logs and backends:
        fail("--backend picks the logs bench makes itself: give it or --log, not both")
    if "kafka" in backends and not kafka:
        fail("--backend kafka needs a broker: --kafka HOST:PORT (or GITSCHED_KAFKA)")
    wanted = set(backends) or ({"sqlite", "kafka"} if kafka else {"sqlite"})
    owned_topics: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gitsched-bench-log-") as scratch:
        urls = list(logs)
        if not urls:
            if "sqlite" in wanted:
                urls.append(f"sqlite:///{Path(scratch, 'bench.db')}")
            if kafka and "kafka" in wanted:
                topic_url = f"kafka://{kafka}/gitsched-bench-{uuid.uuid4().hex[:12]}"
                urls.append(topic_url)
                owned_topics.append(topic_url)
        results = []
        try:
            for url in urls:
                results.append(measure(url, events, jobs, live_jobs, Path(scratch, "snapshots")))
        except (GitschedError, EventLogError) as e:
            fail(str(e))
        finally:
            for url in owned_topics:
                _delete_topic(url)
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "cpus": os.cpu_count(),
                    "results": [{**asdict(r), "targets": _verdict(r)} for r in results],
                },
                indent=2,
            )
        )
        return
    click.echo(
        table(
            [
                "BACKEND",
                "EVENTS",
                "BATCH",
                "APPEND EV/S",
                "APPEND P50 MS",
                "APPEND P99 MS",
                "REPLAY EV/S",
                "FOLD EV/S",
                "RESTART S",
                "FROM SNAPSHOT S",
                "TARGETS",
            ],
            [
                [
                    r.backend,
                    f"{r.events:,}",
                    str(r.batch),
                    f"{r.append_per_s:,.0f}",
                    f"{r.append_p50_ms:.2f}",
                    f"{r.append_p99_ms:.2f}",
                    f"{r.replay_per_s:,.0f}",
                    f"{r.fold_per_s:,.0f}",
                    f"{r.restart_s:.2f}",
                    f"{r.restart_from_snapshot_s:.2f}",
                    _verdict(r),
                ]
                for r in results
            ],
        )
    )
