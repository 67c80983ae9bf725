"""`gitsched bench reconcile`: from a git commit to placement on a large cluster, end to end.

BENCHMARKS.md §3 asks how long a commit of 50 jobs on the L cluster takes until
its events are appended and its jobs placed. This builds a real git repository
of the synthetic cluster of `gitsched bench synth` (nodes, queues in cohorts,
jobs as YAML files in team folders), reconciles its first commit (every job
new: a full solve), then commits JOBS new job files at a time and times each
`reconcile` pass of one watching reconciler: reading the commit from git,
validating every file against the schemas and policies, deciding, the
incremental MILP solve, and the one append of the commit with its placement.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
import yaml

from gitsched.engine.errors import GitschedError
from gitsched.engine.model import Isolation, Job, Node, Queue
from gitsched.engine.placement.plan import OutcomeStatus
from gitsched.engine.units import CPU_MILLI, MIB_PER_GIB, gpus_value
from gitsched.eventlog import open_log
from gitsched.eventlog.base import EventLogError
from gitsched.options import fail, format_option
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.render import table
from gitsched.simulation.synth import CLUSTER, SIZES, synth_jobs, synth_nodes, synth_queues

API = "gitsched.io/v1"
# The size's solve time limit and gap, as in bench synth.
GOAL_TIME = {"S": 60.0, "M": 10.0, "L": 30.0, "XL": 60.0, "XXL": 120.0}
GOAL_GAP = {"S": 0.0, "M": 0.01, "L": 0.02, "XL": 0.02, "XXL": 0.02}


@dataclass(frozen=True, slots=True)
class Pass:
    commit: int  # 0: the first commit, every job new
    jobs_added: int
    placed: int  # jobs the pass admitted
    events: int
    seconds: float
    solve_seconds: float
    solver: str
    gap: float | None
    # Running jobs the pass moved, and the work they lost since their last checkpoints.
    moved: int = 0
    lost_gpu_hours: float = 0.0


def _doc(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def _dump(docs: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=None)


def cluster_doc() -> dict[str, Any]:
    return _doc(
        "Cluster",
        CLUSTER.name,
        {
            "topologyLevels": list(CLUSTER.topology_levels),
            "gpuFlavors": [
                {"name": f.name, "model": f.model, "memoryGiB": f.memory_gib}
                for f in CLUSTER.gpu_flavors
            ],
            "priorityClasses": [
                {"name": p.name, "value": p.value} for p in CLUSTER.priority_classes
            ],
            "defaultPriorityClass": CLUSTER.default_priority_class,
        },
    )


def policy_doc(solver: str, time_limit: float, gap: float) -> dict[str, Any]:
    return _doc(
        "Policy",
        "default",
        {
            "solver": {"name": solver, "timeLimitSeconds": time_limit, "gapTolerance": gap},
            # The synthetic pre-training runs ask for up to 64 x 8 GPUs.
            "admission": {"maxGpusPerJob": 1024, "maxReplicasPerJob": 128},
        },
    )


def node_doc(node: Node) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "flavor": node.flavor,
        "gpus": node.gpus,
        "cpu": node.cpu_milli // CPU_MILLI,
        "memoryGiB": node.memory_mib // MIB_PER_GIB,
        "topology": dict(node.topology),
    }
    if node.region:
        spec["region"] = node.region
    if node.isolation is not Isolation.SHARED:
        spec["isolation"] = node.isolation.value
    return _doc("Node", node.name, spec)


def queue_doc(queue: Queue) -> dict[str, Any]:
    quotas = []
    for q in queue.quotas:
        quota: dict[str, Any] = {"flavor": q.flavor, "nominal": gpus_value(q.nominal)}
        if q.borrowing_limit is not None:
            quota["borrowingLimit"] = gpus_value(q.borrowing_limit)
        if q.lending_limit is not None:
            quota["lendingLimit"] = gpus_value(q.lending_limit)
        quotas.append(quota)
    spec: dict[str, Any] = {"weight": queue.weight, "quotas": quotas}
    if queue.cohort:
        spec["cohort"] = queue.cohort
    return _doc("Queue", queue.name, spec)


def job_doc(job: Job) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": job.replicas,
        "resources": {
            "gpu": gpus_value(job.resources.gpu_milli),
            "cpu": job.resources.cpu_milli // CPU_MILLI,
            "memoryGiB": job.resources.memory_mib // MIB_PER_GIB,
        },
        "priorityClass": job.priority_class,
        "preemptible": job.preemptible,
    }
    if job.min_replicas is not None:
        spec["minReplicas"] = job.min_replicas
    if job.gpu_flavors:
        spec["gpuFlavors"] = list(job.gpu_flavors)
    if job.topology is not None:
        spec["topology"] = {"level": job.topology.level, "mode": job.topology.mode.value}
    if job.checkpoint_interval_minutes is not None:
        spec["checkpointIntervalMinutes"] = job.checkpoint_interval_minutes
    if job.isolation is not Isolation.SHARED:
        spec["isolation"] = job.isolation.value
    if job.residency:
        spec["residency"] = list(job.residency)
    return _doc("Job", job.name, spec)


def _write_jobs(root: Path, jobs: Sequence[Job]) -> None:
    for job in jobs:
        path = root / "teams" / job.queue / "jobs" / f"{job.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_dump([job_doc(job)]))


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "commit.gpgsign=false", *args],
        check=True,
        capture_output=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@gitsched.invalid",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@gitsched.invalid",
        },
    )


def _commit(root: Path, message: str) -> None:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "--no-verify", "-m", message)


def build_repo(
    root: Path, size: str, seed: int, solver: str, time_limit: float, gap: float
) -> list[Queue]:
    """The synthetic cluster of `bench synth --size SIZE --seed SEED` as a committed repo."""
    spec = SIZES[size]
    rng = random.Random(f"synth-{size}-{seed}")
    nodes = synth_nodes(spec.nodes, rng)
    queues = synth_queues(spec.queues, nodes, rng)
    jobs = synth_jobs(spec.jobs, queues, rng)
    _git(root.parent, "init", "-q", "-b", "main", str(root))
    (root / "cluster.yaml").write_text(_dump([cluster_doc()]))
    (root / "policies").mkdir()
    (root / "policies" / "default.yaml").write_text(_dump([policy_doc(solver, time_limit, gap)]))
    racks: dict[str, list[Node]] = {}
    for node in nodes:
        racks.setdefault(node.topology["rack"], []).append(node)
    (root / "inventory").mkdir()
    for rack, members in racks.items():
        (root / "inventory" / f"{rack}.yaml").write_text(_dump(node_doc(n) for n in members))
    for queue in queues:
        folder = root / "teams" / queue.name
        folder.mkdir(parents=True)
        (folder / "queue.yaml").write_text(_dump([queue_doc(queue)]))
    _write_jobs(root, jobs)
    _commit(root, f"synth {size} seed {seed}: {len(nodes)} nodes, {len(jobs)} jobs")
    return queues


def new_jobs(queues: list[Queue], count: int, seed: int, commit: int) -> list[Job]:
    rng = random.Random(f"synth-new-{seed}-{commit}")
    return [
        replace(j, name=f"new{commit:03d}-{i:03d}")
        for i, j in enumerate(synth_jobs(count, queues, rng))
    ]


def _pass(reconciler: Reconciler, commit: int, added: int) -> Pass:
    began = time.perf_counter()
    report = reconciler.run_once()
    seconds = time.perf_counter() - began
    if not report.commits or not report.commits[-1].applied:
        errors = report.commits[-1].errors[:3] if report.commits else ()
        raise GitschedError(
            f"commit {commit} was not applied: " + "; ".join(e.format() for e in errors)
        )
    plan = report.plan
    placed = plan.counts()[OutcomeStatus.PLACED] if plan else 0
    return Pass(
        commit=commit,
        jobs_added=added,
        placed=placed,
        events=report.events_appended,
        seconds=seconds,
        solve_seconds=plan.stats.seconds if plan else 0.0,
        solver=plan.stats.solver if plan else "-",
        gap=plan.stats.gap if plan else None,
        moved=plan.counts()[OutcomeStatus.MOVED] if plan else 0,
        lost_gpu_hours=round(
            sum(o.lost_gpu_seconds for o in plan.outcomes if o.status is OutcomeStatus.MOVED)
            / 3600,
            3,
        )
        if plan
        else 0.0,
    )


def _synth_queues(size: str, seed: int) -> list[Queue]:
    """The queues `build_repo` wrote for SIZE and SEED (the same seeded draws)."""
    spec = SIZES[size]
    rng = random.Random(f"synth-{size}-{seed}")
    return synth_queues(spec.queues, synth_nodes(spec.nodes, rng), rng)


def _reused(root: Path, size: str, seed: int) -> int | None:
    """How many commits of new jobs a kept repo of SIZE and SEED holds; None if there is none."""
    if not (root / ".git").is_dir():
        return None
    first = subprocess.run(
        ["git", "-C", str(root), "log", "--reverse", "--format=%s"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    if not first or not first[0].startswith(f"synth {size} seed {seed}:"):
        raise GitschedError(f"{root} holds another cluster: {first[0] if first else 'no commit'}")
    return len(first) - 1


def measure(
    scratch: Path,
    log_url: str | None,
    size: str,
    seed: int,
    commits: int,
    jobs: int,
    solver: str,
    time_limit: float,
    gap: float,
) -> list[Pass]:
    """The passes, the untimed first one first: the first commit, or with a repo and log
    kept in `scratch` from an earlier run, a restart's first commit of JOBS new jobs (a new
    reconciler: every file read again), not counted with the timed ones."""
    root = scratch / "cluster"
    done = _reused(root, size, seed)
    if done is None:
        queues = build_repo(root, size, seed, solver, time_limit, gap)
    else:
        queues = _synth_queues(size, seed)
    url = log_url or f"sqlite:///{scratch / 'log.db'}"
    passes = []
    with open_log(url) as event_log:
        if done is None and event_log.last_seq() != 0:
            raise GitschedError(f"{url} is not empty: bench reconcile needs a new, empty log")
        if done is not None and event_log.last_seq() == 0:
            raise GitschedError(f"{url} is empty: a kept repo needs the log it was reconciled to")
        reconciler = Reconciler(GitRepo(root), event_log)
        if done is None:
            passes.append(_pass(reconciler, 0, SIZES[size].jobs))
        start = done or 0
        restart = 0 if done is None else 1  # a kept repo: one more commit, the restart's
        for commit in range(start + 1, start + commits + 1 + restart):
            _write_jobs(root, new_jobs(queues, jobs, seed, commit))
            _commit(root, f"{jobs} new jobs ({commit})")
            passes.append(_pass(reconciler, commit, jobs))
    return passes


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@click.command("reconcile")
@click.option("--size", type=click.Choice(sorted(SIZES)), default="L", show_default=True)
@click.option("--seed", default=1, show_default=True)
@click.option(
    "--commits",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Commits of new jobs timed after the first commit.",
)
@click.option(
    "--jobs", default=50, show_default=True, type=click.IntRange(min=1), help="New jobs a commit."
)
@click.option("--solver", type=click.Choice(["highs", "cbc", "cpsat", "greedy"]), default="highs")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the repo and the SQLite log here, and reuse them when they are there: the "
    "first pass is then a new reconciler's first commit (untimed) and the timed commits "
    "come on top (XL's repo and first commit take many minutes).",
)
@click.option(
    "--log",
    "log_url",
    help="An empty log to append to (default: a new SQLite file, deleted afterwards).",
)
@format_option("text", "json")
def command(
    size: str,
    seed: int,
    commits: int,
    jobs: int,
    solver: str,
    log_url: str | None,
    workdir: Path | None,
    fmt: str,
) -> None:
    """A commit of JOBS new jobs, from git to placement, on the synthetic SIZE cluster.

    Builds a git repo of `bench synth`'s cluster (one YAML file per job), reconciles
    its first commit, then times COMMITS more passes of one watching reconciler,
    each after a commit of JOBS new job files: git, validation, decision, the
    incremental solve and the append, p50 and p99.
    """
    args = (log_url, size, seed, commits, jobs, solver, GOAL_TIME[size], GOAL_GAP[size])
    try:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            passes = measure(workdir, *args)
        else:
            with tempfile.TemporaryDirectory(prefix="gitsched-bench-reconcile-") as scratch:
                passes = measure(Path(scratch), *args)
    except (GitschedError, EventLogError, subprocess.CalledProcessError) as e:
        fail(str(e))
    timed = [p.seconds for p in passes[1:]]
    summary = {
        "size": size,
        "seed": seed,
        "jobs_per_commit": jobs,
        "solver": solver,
        # With --workdir on a kept repo the first pass is a restart, not the first commit.
        "first_pass": "first commit" if passes[0].commit == 0 else "restart",
        "first_commit_seconds": round(passes[0].seconds, 2),
        "p50_seconds": round(statistics.median(timed), 3),
        "p99_seconds": round(_percentile(timed, 0.99), 3),
        "solve_p50_seconds": round(statistics.median(p.solve_seconds for p in passes[1:]), 3),
    }
    if fmt == "json":
        click.echo(json.dumps({**summary, "passes": [asdict(p) for p in passes]}, indent=2))
        return
    click.echo(
        table(
            [
                "COMMIT",
                "JOBS ADDED",
                "PLACED",
                "MOVED",
                "GPU-H LOST",
                "EVENTS",
                "SECONDS",
                "SOLVE S",
                "SOLVER",
                "GAP %",
            ],
            [
                [
                    f"{p.commit} (restart)"
                    if p is passes[0] and p.commit
                    else "first"
                    if p.commit == 0
                    else str(p.commit),
                    str(p.jobs_added),
                    str(p.placed),
                    str(p.moved),
                    f"{p.lost_gpu_hours:g}",
                    str(p.events),
                    f"{p.seconds:.2f}",
                    f"{p.solve_seconds:.2f}",
                    p.solver,
                    "-" if p.gap is None else f"{100 * p.gap:.2f}",
                ]
                for p in passes
            ],
        )
    )
    click.echo(
        f"commit of {jobs} jobs to placement on {size} ({solver}): "
        f"p50 {summary['p50_seconds']} s, p99 {summary['p99_seconds']} s "
        f"(solve p50 {summary['solve_p50_seconds']} s); {summary['first_pass']} {summary['first_commit_seconds']} s"
    )
