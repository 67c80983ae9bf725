"""`gitsched demo`: a realistic cluster repo with a history, reconciled end to end.

Four teams, 144 GPUs of three flavors in NVLink domains and racks, a dedicated
pair of nodes for regulated work, and twelve commits by five people, one of
them invalid, plus an open pull request whose plan it prints. Everything runs
locally: git, the embedded SQLite log, the built-in policy's MILP placement.
The repo's content is data, the YAML a team would commit, in gitsched/demo_repo/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from gitsched.audit.history import build_history
from gitsched.audit.verify import verify_log
from gitsched.config import default_log_url
from gitsched.engine import events as ev
from gitsched.engine.units import gpus_text
from gitsched.eventlog import open_log
from gitsched.eventlog.codec import decode_all
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from gitsched.render import state_text, table
from gitsched.render_plan import plan_text

# The demo repo is data: gitsched/demo_repo/ holds every file it commits (files/, and the
# later versions of a few in variants/) and history.yaml the commits that write them.
DATA = resources.files("gitsched") / "demo_repo"


@dataclass
class Commit:
    author: tuple[str, str]
    message: str
    write: dict[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()


def _text(source: str) -> str:
    return (DATA / source).read_text(encoding="utf-8")


def _commit_of(entry: dict[str, Any], authors: dict[str, tuple[str, str]]) -> Commit:
    write: dict[str, str] = {}
    for item in entry.get("write", ()):
        if isinstance(item, str):
            write[item] = _text(f"files/{item}")
        else:
            ((path, source),) = item.items()
            write[path] = _text(source)
    return Commit(authors[entry["author"]], entry["message"], write, tuple(entry.get("remove", ())))


def _load() -> tuple[list[Commit], str, Commit]:
    spec = yaml.safe_load(_text("history.yaml"))
    authors = {key: (a["name"], a["email"]) for key, a in spec["authors"].items()}
    history = [_commit_of(entry, authors) for entry in spec["commits"]]
    pr = spec["pull_request"]
    return history, pr["branch"], _commit_of(pr, authors)


def _files(folder: Traversable, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            out.update(_files(entry, f"{prefix}{entry.name}/"))
        else:
            out[prefix + entry.name] = entry.read_text(encoding="utf-8")
    return out


HISTORY, PR_BRANCH, PULL_REQUEST = _load()
# Every file of files/ by kind (tests validate them all).
FILES = _files(DATA / "files")
CLUSTER = FILES["cluster.yaml"]
POLICY = FILES["policies/default.yaml"]
INVENTORY = {p: t for p, t in FILES.items() if p.startswith("inventory/")}
QUEUES = {p: t for p, t in FILES.items() if p.startswith("teams/") and "/jobs/" not in p}
JOBS = {p: t for p, t in FILES.items() if "/jobs/" in p}

# The demo lives in the present: its commits are dated at fixed offsets before the moment
# it is created (CREATED_AT_FILE records that moment), so a merge made on the tour, dated
# now, waits minutes, not a year. One commit every STEP_S seconds; the last one, the pull
# request's, STEP_S before creation.
STEP_S = 5400
CREATED_AT_FILE = "DEMO.md"
# A fixed creation moment, for fixtures that need the same dates on every run (the dates
# the demo had before: its first commit at 2025-11-16T09:00:00Z).
FIXED_CREATED_AT = 1_763_283_600 + 13 * STEP_S


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _commit(directory: Path, commit: Commit, when: str) -> None:
    for rel, content in commit.write.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    for rel in commit.remove:
        (directory / rel).unlink()
    _git(directory, "add", "-A")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": commit.author[0],
        "GIT_AUTHOR_EMAIL": commit.author[1],
        "GIT_COMMITTER_NAME": commit.author[0],
        "GIT_COMMITTER_EMAIL": commit.author[1],
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_DATE": when,
    }
    _git(directory, "-c", "commit.gpgsign=false", "commit", "-q", "-m", commit.message, env=env)


def history_start(created_at: int) -> int:
    """When the demo's first commit is dated, for a demo created at `created_at` (epoch s)."""
    return created_at - (len(HISTORY) + 1) * STEP_S


def _created_note(created_at: int) -> str:
    when = datetime.fromtimestamp(created_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    start = datetime.fromtimestamp(history_start(created_at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        "# gitsched demo\n\n"
        f"created-at: {when}\n\n"
        f"Its commits are dated from {start}, one every {STEP_S // 60} minutes, the pull\n"
        f"request's {STEP_S // 60} minutes before it was created: waits and GPU-hours read\n"
        "as they would on a cluster created today.\n"
    )


def build_demo_repo(directory: Path, created_at: int | None = None) -> list[str]:
    """Write the demo history as real commits, and the open pull request as a branch,
    dated before `created_at` (epoch seconds; default: now, to the minute).

    Returns the subjects of main's commits.
    """
    if created_at is None:
        created_at = int(time.time()) // 60 * 60  # the one clock read: when the repo is made
    start = history_start(created_at)
    directory.mkdir(parents=True)
    _git(directory, "init", "-q", "-b", "main")
    (directory / ".gitignore").write_text(".gitsched/\n")
    (directory / CREATED_AT_FILE).write_text(_created_note(created_at))
    subjects = []
    for i, commit in enumerate(HISTORY):
        _commit(directory, commit, f"@{start + i * STEP_S} +0000")
        subjects.append(commit.message.splitlines()[0])
    _git(directory, "checkout", "-q", "-b", PR_BRANCH)
    _commit(directory, PULL_REQUEST, f"@{start + len(HISTORY) * STEP_S} +0000")
    _git(directory, "checkout", "-q", "main")
    return subjects


def solve_rows(event_log: Any) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The solves as a person reads them (jobs and GPUs admitted, gap to the bound, time)
    and as data, the raw objective and bound included (for --format json)."""
    admitted: dict[str, tuple[int, int]] = {}
    solves: list[ev.SolveCompleted] = []
    for _, e in decode_all(event_log.read(0)):
        if isinstance(e, ev.SolveCompleted):
            solves.append(e)
        elif isinstance(e, ev.PlacementDecided) and e.action == "admitted":
            jobs, milli = admitted.get(e.solve_id, (0, 0))
            gpus = sum(r.gpu_milli * len(r.gpus) for r in e.replicas)
            admitted[e.solve_id] = (jobs + 1, milli + gpus)
    rows, data = [], []
    for s in solves:
        jobs, milli = admitted.get(s.solve_id, (0, 0))
        if s.gap is None:
            gap = "no bound"
        elif s.gap <= 1e-9:
            gap = "0% (optimal)"
        elif s.gap < 1e-4:
            gap = "<0.01%"
        else:
            gap = f"{s.gap * 100:.2f}%"
        rows.append(
            [
                s.solve_id.split("/")[0][:10],
                s.solver + (" -> greedy" if s.fallback else ""),
                s.status,
                str(jobs),
                gpus_text(milli),
                str(s.pending),
                gap,
                f"{s.seconds:.2f}",
            ]
        )
        data.append(
            {
                "solve_id": s.solve_id,
                "solver": s.solver,
                "status": s.status,
                "plan_source": s.plan_source,
                "fallback": s.fallback,
                "jobs_admitted": jobs,
                "gpus_admitted": milli / 1000,
                "pending": s.pending,
                "objective": s.objective,
                "bound": s.bound,
                "gap": s.gap,
                "seconds": s.seconds,
            }
        )
    return rows, data


SOLVE_HEADERS = ["SOLVE", "SOLVER", "STATUS", "ADMITTED", "GPUS ADMITTED", "PENDING",
                 "GAP TO BOUND", "SECONDS"]  # fmt: skip


def _recorded_created_at(directory: Path) -> str | None:
    try:
        note = (directory / CREATED_AT_FILE).read_text(encoding="utf-8")
    except OSError:
        return None
    for line in note.splitlines():
        if line.startswith("created-at: "):
            return line.removeprefix("created-at: ").strip()
    return None


def pull_request_state(repo: GitRepo) -> str:
    """'open', 'merged' (main holds the branch's commit), or 'absent'."""
    if not repo.has_revision(PR_BRANCH):
        return "absent"
    return "merged" if repo.is_ancestor(repo.resolve(PR_BRANCH), repo.resolve("main")) else "open"


def run_demo(
    directory: Path,
    *,
    force: bool,
    echo: Callable[[str], None],
    summary: dict[str, Any] | None = None,
) -> int:
    """Build (unless it exists) and reconcile the demo, telling `echo` what it did;
    `summary`, when given, gets the same as data (what `--format json` prints)."""
    summary = {} if summary is None else summary
    if directory.exists():
        if not force:
            echo(f"{directory} exists: reconciling it again (use --force to start over)")
        else:
            shutil.rmtree(directory)
    if not directory.exists():
        build_demo_repo(directory)
        echo(f"created the demo cluster repo in {directory}/ ({len(HISTORY)} commits by 5 authors)")
    url = default_log_url(directory)
    with open_log(url) as event_log:
        report = Reconciler(GitRepo(directory), event_log).run_once()
        echo("")
        echo(f"== reconcile {directory} -> {url}")
        for outcome in report.commits:
            c = outcome.commit
            mark = "applied " if outcome.applied else "REJECTED"
            echo(f"{mark} {c.sha[:10]} {c.author:<12} {c.subject}")
            for finding in outcome.errors:
                echo(f"           {finding.format()}")
        echo(f"{report.events_appended} events appended")
        rows, solves = solve_rows(event_log)
        if rows:
            echo("")
            echo(f"== the {len(rows)} solves (one per commit that changed placement)")
            echo(table(SOLVE_HEADERS, rows))
        echo("")
        echo(state_text(report.state, report.last_seq))
        echo("")
        echo("== audit summary")
        verification = verify_log(event_log)
        intervals = build_history(decode_all(event_log.read(0)))
        echo(
            f"log: {verification.events} events, hash chain "
            + ("intact" if verification.ok else f"BROKEN at {verification.broken}")
        )
        team_rows: list[list[object]] = []
        for team in sorted(report.state.queues):
            mine = [p for k, p in report.state.placements.items() if k.startswith(team + "/")]
            ended = [i for i in intervals if i.queue == team and i.end is not None]
            team_rows.append(
                [
                    team,
                    len(mine),
                    gpus_text(sum(p.gpu_milli for p in mine)),
                    len([i for i in intervals if i.queue == team]),
                    len(ended),
                ]
            )
        echo(table(["TEAM", "RUNNING", "GPUS", "INTERVALS", "ENDED"], team_rows))
        repo = GitRepo(directory)
        pr_state = pull_request_state(repo)
        if pr_state == "open":
            echo("")
            echo(f"== open pull request {PR_BRANCH}, not merged")
            plan = plan_change(repo, event_log, "main", PR_BRANCH)
            echo(plan_text(plan))
        elif pr_state == "merged":
            last = report.state.last_commit
            applied = last is not None and last.sha == repo.resolve("main")
            echo("")
            echo(
                f"== pull request {PR_BRANCH}: merged into main"
                + (
                    f"; the log has applied main's newest commit {last.sha[:10]} ({last.subject})"
                    if applied and last is not None
                    else "; main's newest commit is not applied yet"
                )
                + (
                    ", which stands REJECTED (gitsched reconcile lists why)"
                    if report.newest_rejected
                    else ""
                )
            )
        echo("")
        echo(f"try: gitsched state --repo {directory}")
        if pr_state == "open":
            echo(f"     gitsched plan {directory} main..{PR_BRANCH} --format markdown")
        echo(f"     gitsched audit history --repo {directory} --job nlp/moe-gang")
        echo(f"     gitsched validate {directory} --rev main~6")
        echo("")
        echo(
            f"see it in a browser: gitsched console --repo {directory}"
            "   (then open http://127.0.0.1:8080/; docs/console.md)"
        )
        summary.update(
            {
                "directory": str(directory),
                "created_at": _recorded_created_at(directory),
                "log": url,
                "commits": [
                    {"sha": o.commit.sha, "subject": o.commit.subject, "applied": o.applied}
                    for o in report.commits
                ],
                "solves": solves,
                "pull_request": {"branch": PR_BRANCH, "state": pr_state},
            }
        )
    return 0
