"""Every audit answer, recomputed independently from the raw events of the log.

A seeded random history of commits, with controlled author and committer dates (one
lands exactly on 00:00:00 UTC, and quiet stretches span several days), is committed
to a real git repository and reconciled. A small fold written here, from the rows of
the SQLite log (json, no gitsched code) and the dates the test itself gave git,
recomputes GPU-hours used and quota per team, flavor and UTC day and over windows
whose edges fall between events, each job's placement intervals, and the cluster at
several times; each is compared with the JSON the `gitsched` CLI prints.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gitsched.cli import main
from tests.support.cluster_repo import (
    CLUSTER_YAML,
    POLICY_YAML,
    ClusterRepo,
    git,
    job_yaml,
    queue_yaml,
)

H = "apiVersion: gitsched.io/v1\n"
POOL = (
    H
    + """kind: NodePool
metadata:
  name: pool
spec:
  count: 6
  namePrefix: h100-
  template: {flavor: h100-80g, gpus: 8, cpu: 192, memoryGiB: 2048, region: eu-west}
  topology: {rack: rack-a}
  domains:
    - {level: nvlink, nodesPerDomain: 2, namePrefix: nvl-}
"""
)
TEAMS = ("ml", "cv")
PEOPLE = (("Ana Souza", "ana@ml.example"), ("Li Wei", "li@cv.example"))
MERGER = ("Priya Raman", "priya@platform.example")
DAY = 86_400
# 2025-11-16T00:00:00Z, a midnight.
DAY0 = int(datetime(2025, 11, 16, tzinfo=UTC).timestamp())
# Only what a real log must pass before the audit view's first checkpoint (4096 events).
LONG_LOG_EVENTS = 4096


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class History:
    """What the test committed: each commit's committer date, by sha."""

    repo: ClusterRepo
    dates: dict[str, int] = field(default_factory=dict)


def commit(repo: ClusterRepo, rng: random.Random, when: int, message: str) -> str:
    author = rng.choice(PEOPLE)
    # Written some hours before it was merged, by someone else than who merged it.
    written = when - rng.randrange(0, 6 * 3600)
    git(repo.path, "add", "-A")
    git(
        repo.path,
        "commit",
        "-q",
        "--no-verify",
        "--allow-empty",
        "-m",
        message,
        env={
            "GIT_AUTHOR_NAME": author[0],
            "GIT_AUTHOR_EMAIL": author[1],
            "GIT_AUTHOR_DATE": f"@{written} +0200",
            "GIT_COMMITTER_NAME": MERGER[0],
            "GIT_COMMITTER_EMAIL": MERGER[1],
            "GIT_COMMITTER_DATE": f"@{when} -0500",
        },
    )
    return repo.head()


def build_history(path: Path, seed: int, commits: int, jobs_per_commit: int) -> History:
    """A random history: jobs submitted and withdrawn, quotas changed, at chosen dates."""
    rng = random.Random(seed)
    repo = ClusterRepo(path)
    history = History(repo)
    repo.write("cluster.yaml", CLUSTER_YAML)
    repo.write("inventory/pool.yaml", POOL)
    repo.write("policies/default.yaml", POLICY_YAML)
    for team in TEAMS:
        repo.write(f"teams/{team}/queue.yaml", queue_yaml(team, rng.choice((8, 16, 24))))
    # The bootstrap is merged some minutes before a midnight; one later change lands exactly
    # on a midnight; quiet stretches of one to three days let segments cross several.
    when = DAY0 - rng.randrange(1, 120) * 60
    history.dates[commit(repo, rng, when, "bootstrap")] = when
    midnight_at = rng.randrange(1, commits)
    live: list[str] = []
    serial = 0
    for i in range(1, commits):
        if i == midnight_at:
            when = (when // DAY + 1 + rng.randrange(1, 3)) * DAY
        elif rng.random() < 0.15:
            when += rng.randrange(1, 3) * DAY + rng.randrange(0, DAY)
        else:
            when += rng.randrange(60, 5 * 3600)
        roll = rng.random()
        if roll < 0.2:
            team = rng.choice(TEAMS)
            nominal = rng.choice((0, 4, 8, 12, 16, 24, 32))
            repo.write(f"teams/{team}/queue.yaml", queue_yaml(team, nominal))
            message = f"{team}: quota {nominal}"
        else:
            for path_ in rng.sample(live, k=min(len(live), rng.randrange(0, 1 + len(live) // 3))):
                (repo.path / path_).unlink()
                live.remove(path_)
            for _ in range(rng.randrange(1, jobs_per_commit + 1)):
                serial += 1
                team = rng.choice(TEAMS)
                name = f"j{serial}"
                path_ = f"teams/{team}/jobs/{name}.yaml"
                gpu = rng.choice((0.25, 0.5, 1, 2, 4, 8))
                replicas = rng.choice((1, 1, 2)) if gpu == 8 else 1
                repo.write(path_, job_yaml(name, gpu=gpu, replicas=replicas, queue=team))
                live.append(path_)
            message = f"jobs, {len(live)} live"
        history.dates[commit(repo, rng, when, message)] = when
    return history


# -- the independent fold -----------------------------------------------------------------


@dataclass
class Placement:
    job: str
    team: str
    start: float
    end: float | None
    gpus: float
    nodes: tuple[str, ...]
    queued: float  # since when it waited: its commit, or the end of its last interval


@dataclass
class Fold:
    """Placement intervals and quota stretches, in seconds and GPUs."""

    intervals: list[Placement] = field(default_factory=list)
    # team -> [(from, nominal GPUs)] in time order (one flavor in this cluster)
    quotas: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    events: int = 0
    last: float = 0.0


ENDS = ("PlacementDecided", "JobPreempted", "JobPending", "JobWithdrawn", "JobFinished")


def fold_log(log_path: Path, dates: dict[str, int]) -> Fold:
    """Every event's time is the committer date of the commit that caused it (the test's
    own record); a placement runs from its PlacementDecided until the job is placed again,
    preempted, left pending, withdrawn or finished."""
    out = Fold()
    running: dict[str, Placement] = {}
    waiting: dict[str, float] = {}
    with sqlite3.connect(log_path) as db:
        rows = db.execute("SELECT type, data, cause FROM events ORDER BY seq").fetchall()
    out.events = len(rows)
    for type_, raw, cause in rows:
        t = float(dates[cause])
        out.last = max(out.last, t)
        data = json.loads(raw)
        if type_ == "QueueConfigured":
            queue = data["queue"]
            nominal = sum(q["nominal"] for q in queue["quotas"]) / 1000
            out.quotas.setdefault(queue.get("team") or queue["name"], []).append((t, nominal))
        if type_ == "JobSubmitted":
            waiting[f"{data['job']['queue']}/{data['job']['name']}"] = t
        if type_ not in ENDS:
            continue
        job = data["job"]
        if job in running:
            running.pop(job).end = t
            waiting[job] = t
        if type_ == "PlacementDecided":
            placement = Placement(
                job,
                job.split("/", 1)[0],
                t,
                None,
                sum(r["gpu_milli"] * len(r["gpus"]) for r in data["replicas"]) / 1000,
                tuple(sorted({r["node"] for r in data["replicas"]})),
                waiting[job],
            )
            running[job] = placement
            out.intervals.append(placement)
    return out


def used_gpu_h(fold: Fold, team: str, since: float, until: float) -> float:
    total = 0.0
    for p in fold.intervals:
        if p.team == team:
            total += p.gpus * max(
                0.0, min(until if p.end is None else p.end, until) - max(p.start, since)
            )
    return total / 3600


def quota_gpu_h(fold: Fold, team: str, since: float, until: float) -> float:
    stretches = fold.quotas.get(team, [])
    total = 0.0
    for i, (start, nominal) in enumerate(stretches):
        end = stretches[i + 1][0] if i + 1 < len(stretches) else until
        total += nominal * max(0.0, min(end, until) - max(start, since))
    return total / 3600


def placed_at(fold: Fold, moment: float) -> dict[str, list[str]]:
    """The jobs placed at `moment`: after every event at or before it."""
    return {
        p.job: list(p.nodes)
        for p in fold.intervals
        if p.start <= moment and (p.end is None or p.end > moment)
    }


# -- the CLI ------------------------------------------------------------------------------


class Cli:
    def __init__(self, repo: ClusterRepo) -> None:
        self.repo = repo
        self.runner = CliRunner()

    def json(self, *args: str) -> Any:
        result = self.runner.invoke(
            main, [*args, "--repo", str(self.repo.path), "--format", "json"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def used(self, since: float, until: float) -> dict[str, tuple[float, float]]:
        """used_gpu_h and quota_gpu_h per team over [since, until)."""
        rows = self.json(
            "audit", "usage", "--by", "team", "--since", iso(since), "--until", iso(until)
        )
        return {r["team"]: (r["used_gpu_h"], r["quota_gpu_h"]) for r in rows["rows"]}


def close(got: float, want: float) -> bool:
    """The CLI prints GPU-hours to three decimals."""
    return abs(got - want) <= 0.0006 + 1e-9 * abs(want)


def check(history: History, rng: random.Random) -> Fold:
    repo = history.repo
    result = CliRunner().invoke(main, ["reconcile", "--once", str(repo.path)])
    assert result.exit_code == 0, result.output
    fold = fold_log(repo.log_path, history.dates)
    cli = Cli(repo)
    moments = sorted(set(history.dates.values()))

    # Usage per team and UTC day; the days add up to the whole.
    first_day, last_day = moments[0] // DAY, int(fold.last // DAY) + 1
    daily: dict[str, list[float]] = defaultdict(list)
    for day in range(first_day, last_day + 1):
        got = cli.used(day * DAY, (day + 1) * DAY)
        for team in TEAMS:
            used, quota = got.get(team, (0.0, 0.0))
            want = used_gpu_h(fold, team, day * DAY, (day + 1) * DAY)
            assert close(used, want), (team, iso(day * DAY), used, want)
            want_quota = quota_gpu_h(fold, team, day * DAY, (day + 1) * DAY)
            assert close(quota, want_quota), (team, iso(day * DAY), quota, want_quota)
            daily[team].append(used)
    whole = cli.used(first_day * DAY, (last_day + 1) * DAY)
    for team in TEAMS:
        assert abs(whole.get(team, (0.0, 0.0))[0] - sum(daily[team])) <= 0.0006 * len(daily[team])

    # Windows whose edges fall between events (now and then on one).
    for _ in range(6):
        a, b = sorted(rng.sample(range(len(moments)), 2))
        since = moments[a] + (rng.randrange(1, 3600) if rng.random() < 0.8 else 0)
        until = moments[b] + rng.randrange(1, 7200)
        got = cli.used(since, until)
        for team in TEAMS:
            used = got.get(team, (0.0, 0.0))[0]
            want = used_gpu_h(fold, team, since, until)
            assert close(used, want), (team, iso(since), iso(until), used, want)

    # Each job's placement intervals, and how long it waited for each.
    assert sorted(
        (i["job"], i["start"], i["end"], i["gpus"], tuple(i["nodes"]), i["queued"], i["wait_s"])
        for i in cli.json("audit", "history", "--gpu-flavor", "h100-80g")
    ) == sorted(
        (
            p.job,
            iso(p.start),
            None if p.end is None else iso(p.end),
            p.gpus,
            p.nodes,
            iso(p.queued),
            p.start - p.queued,
        )
        for p in fold.intervals
    )

    # The cluster at several times: on a commit's date, between two, and long after the last.
    times = [rng.choice(moments) for _ in range(3)]
    times += [rng.choice(moments) + rng.randrange(1, 3600) for _ in range(3)]
    times.append(moments[-1] + 30 * DAY)
    for moment in times:
        want_at = placed_at(fold, moment)
        at = cli.json("audit", "at", "--at", iso(moment))
        assert {p["job"]: sorted(p["nodes"]) for p in at["placements"]} == want_at, iso(moment)
        state = cli.json("state", "--at", iso(moment))
        assert {
            job: sorted({r["node"] for r in p["replicas"]})
            for job, p in state["placements"].items()
        } == want_at, iso(moment)
        # One start time per placement: `state` and `audit at` name the same second.
        for p in at["placements"]:
            assert state["placements"][p["job"]]["since"] == p["since"]
    return fold


@pytest.mark.parametrize("seed", range(12))
def test_audit_answers_equal_an_independent_fold_of_the_log(tmp_path: Path, seed: int) -> None:
    history = build_history(tmp_path / "cluster", seed, commits=10, jobs_per_commit=4)
    fold = check(history, random.Random(seed))
    assert fold.intervals


def test_a_log_past_the_first_checkpoint_still_answers_as_the_fold(tmp_path: Path) -> None:
    history = build_history(tmp_path / "cluster", 1000, commits=60, jobs_per_commit=50)
    fold = check(history, random.Random(1000))
    assert fold.events > LONG_LOG_EVENTS
