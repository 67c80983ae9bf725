"""`gitsched bench console`: page latency of the web console on a large cluster.

Builds a real cluster repo of `bench synth`'s generators (NODES nodes, JOBS job files
in team folders, QUEUES queues in cohorts; `gitsched.bench.reconcile`'s writers),
reconciles it with the reconciler's own step (the greedy solver by default: the
point is the console, not the solve), then serves `gitsched console` on it with
uvicorn on a free local port and times REQUESTS requests of each page over HTTP,
one at a time: the overview with its node map, queues, a queue, the job list
filtered and paged, random job pages, changes and compliance, random commit pages.
The first request of each page kind is timed apart (cold: SQLite's page cache and
Jinja's compiled template); the p50 and p99 are of the rest. The tables a snapshot
shares (node map, job rows, queues) are built when it loads, before it is shown, so
a page after the log moved costs what these pages cost.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import click

from gitsched.bench.reconcile import (
    _commit,
    _dump,
    _git,
    _write_jobs,
    cluster_doc,
    node_doc,
    policy_doc,
    queue_doc,
)
from gitsched.engine.errors import GitschedError
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLogError
from gitsched.options import fail, format_option
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.render import table
from gitsched.simulation.synth import synth_jobs, synth_nodes, synth_queues

GOAL_P99_MS = 200.0


def build_repo(root: Path, nodes: int, jobs: int, queues: int, seed: int, solver: str) -> None:
    rng = random.Random(f"console-{nodes}-{jobs}-{queues}-{seed}")
    node_list = synth_nodes(nodes, rng)
    queue_list = synth_queues(queues, node_list, rng)
    job_list = synth_jobs(jobs, queue_list, rng)
    _git(root.parent, "init", "-q", "-b", "main", str(root))
    (root / ".gitignore").write_text(".gitsched/\n")
    (root / "cluster.yaml").write_text(_dump([cluster_doc()]))
    (root / "policies").mkdir()
    (root / "policies" / "default.yaml").write_text(_dump([policy_doc(solver, 60.0, 0.02)]))
    racks: dict[str, list[Any]] = {}
    for node in node_list:
        racks.setdefault(node.topology["rack"], []).append(node)
    (root / "inventory").mkdir()
    for rack, members in racks.items():
        (root / "inventory" / f"{rack}.yaml").write_text(_dump(node_doc(n) for n in members))
    for queue in queue_list:
        folder = root / "teams" / queue.name
        folder.mkdir(parents=True)
        (folder / "queue.yaml").write_text(_dump([queue_doc(queue)]))
    # The jobs arrive in commits of 500 (at most 20 commits), as teams would commit them:
    # the changes page then has commits to list.
    per = max(500, -(-len(job_list) // 20))
    for start in range(0, len(job_list), per):
        _write_jobs(root, job_list[start : start + per])
        _commit(root, f"{len(job_list[start : start + per])} jobs ({start // per + 1})")


def prepare(work: Path, nodes: int, jobs: int, queues: int, seed: int, solver: str) -> Path:
    """The reconciled repo for these numbers, made once and kept in `work`."""
    root = work / f"cluster-{nodes}-{jobs}-{queues}-{seed}-{solver}"
    done = root / ".gitsched" / "bench-console.done"
    if done.exists():
        return root
    if root.exists():
        import shutil

        shutil.rmtree(root)
    root.mkdir(parents=True)
    build_repo(root, nodes, jobs, queues, seed, solver)
    with open_log(f"sqlite:///{root / '.gitsched' / 'log.db'}") as event_log:
        report = Reconciler(GitRepo(root), event_log).run_once()
        rejected = [c for c in report.commits if not c.applied]
        if rejected:
            errors = "; ".join(e.format() for e in rejected[0].errors[:3])
            raise GitschedError(f"the synthetic repo's commit was rejected: {errors}")
    done.write_text("reconciled\n")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(root: Path, requests: int, seed: int) -> dict[str, Any]:
    import http.client

    import uvicorn

    from gitsched.console import views
    from gitsched.console.app import console_app
    from gitsched.console.source import ConsoleSource

    url = f"sqlite:///{root / '.gitsched' / 'log.db'}"
    source = ConsoleSource(
        root, url, plans=False, interval_s=1.0, prepare=views.prepare, first_wait_s=3600.0
    )
    began = time.perf_counter()
    source.start()  # the audit view (built from 0 the first time) and the first snapshot
    load_s = time.perf_counter() - began
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            console_app(root, url, source=source),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        raise GitschedError("the console's server did not start")
    rng = random.Random(seed)
    state = source.snapshot.state
    job_keys = sorted(state.jobs)
    queue_names = sorted(state.queues)
    with source.reading() as store:
        assert store is not None
        shas = [r[0] for r in store.db.execute("SELECT sha FROM commits")]
    teams = sorted({q.team for q in state.queues.values()})
    kinds: dict[str, Any] = {
        "overview": lambda: "/",
        "queues": lambda: "/queues",
        "queue": lambda: f"/queues/{rng.choice(queue_names)}",
        "jobs": lambda: "/jobs",
        "jobs filtered": lambda: f"/jobs?team={rng.choice(teams)}&state=running",
        "jobs, a later page": lambda: f"/jobs?page={min(20, -(-len(job_keys) // 100))}",
        "job": lambda: f"/jobs/{rng.choice(job_keys)}",
        "changes": lambda: "/changes",
        "commit": lambda: f"/commits/{rng.choice(shas)}",
    }
    results: dict[str, Any] = {}
    every: list[float] = []
    # On a shared machine the wall time waits for other work; the CPU time of this process
    # (the server, and the client's few hundred microseconds a request) does not.
    every_cpu: list[float] = []
    load = os.getloadavg()[0]
    try:
        # One kept-alive connection, as a browser tab holds one.
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for name, path in kinds.items():
                took, cpu = [], []
                cold = None
                for i in range(requests + 1):
                    t, c = time.perf_counter(), time.process_time()
                    client.request("GET", path())
                    response = client.getresponse()
                    body = response.read()
                    elapsed = time.perf_counter() - t
                    cpu_s = time.process_time() - c
                    if response.status != 200:
                        raise GitschedError(f"{name}: HTTP {response.status}")
                    if i == 0:
                        cold = elapsed
                    else:
                        took.append(elapsed)
                        cpu.append(cpu_s)
                every += took
                every_cpu += cpu
                results[name] = {
                    "cold_ms": round(1000 * (cold or 0.0), 1),
                    "p50_ms": round(1000 * statistics.median(took), 1),
                    "p99_ms": round(1000 * _p99(took), 1),
                    "cpu_p50_ms": round(1000 * statistics.median(cpu), 1),
                    "cpu_p99_ms": round(1000 * _p99(cpu), 1),
                    "bytes": len(body),
                    "requests": len(took),
                }
        finally:
            client.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        source.stop()
    return {
        "nodes": len(state.nodes),
        "jobs": len(state.jobs),
        "running": len(state.placements),
        "pending": len(state.pending),
        "log_events": source.snapshot.seq,
        "load_s": round(load_s, 2),
        "pages": results,
        "p50_ms": round(1000 * statistics.median(every), 1),
        "p99_ms": round(1000 * _p99(every), 1),
        "cpu_p50_ms": round(1000 * statistics.median(every_cpu), 1),
        "cpu_p99_ms": round(1000 * _p99(every_cpu), 1),
        "load_average_1m": round(load, 2),
        "goal_p99_ms": GOAL_P99_MS,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@click.command("console")
@click.option("--nodes", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--jobs", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option("--queues", default=24, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=1, show_default=True)
@click.option(
    "--requests",
    default=50,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed requests of each page kind (after one cold one).",
)
@click.option("--solver", type=click.Choice(["greedy", "highs", "cbc", "cpsat"]), default="greedy")
@click.option(
    "--work-dir",
    default=".cache/bench-console",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the reconciled repo and its log are made (once) and kept.",
)
@format_option("text", "json")
def command(
    nodes: int,
    jobs: int,
    queues: int,
    seed: int,
    requests: int,
    solver: str,
    work_dir: Path,
    fmt: str,
) -> None:
    """Page latency of `gitsched console`, p50 and p99 per page, on a cluster of NODES nodes
    and JOBS jobs (goal: p99 < 200 ms at 1,000 nodes and 10,000 jobs)."""
    try:
        click.echo(f"preparing {nodes} nodes, {jobs} jobs in {work_dir}", err=True)
        root = prepare(work_dir, nodes, jobs, queues, seed, solver)
        result = measure(root, requests, seed)
    except (GitschedError, EventLogError) as e:
        fail(str(e))
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        table(
            ["PAGE", "COLD MS", "P50 MS", "P99 MS", "CPU P50 MS", "CPU P99 MS", "KB"],
            [
                [
                    name,
                    f"{r['cold_ms']:.1f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    f"{r['cpu_p50_ms']:.1f}",
                    f"{r['cpu_p99_ms']:.1f}",
                    f"{r['bytes'] / 1024:.0f}",
                ]
                for name, r in result["pages"].items()
            ],
        )
    )
    click.echo(
        f"console on {result['nodes']} nodes, {result['jobs']} jobs ({result['running']} running, "
        f"{result['pending']} pending, {result['log_events']} events): p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms over every page (goal p99 < {GOAL_P99_MS:.0f} ms); CPU "
        f"p50 {result['cpu_p50_ms']} ms, p99 {result['cpu_p99_ms']} ms; load {result['load_average_1m']}; "
        f"view and snapshot loaded in {result['load_s']} s"
    )
