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
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from audit.history import build_history
from audit.verify import verify_log
from engine import events as ev
from engine.units import gpus_text
from eventlog import open_log
from eventlog.codec import decode_all
from gitsched.config import default_log_url
from gitsched.render import state_text, table
from gitsched.render_plan import plan_text
from reconciler.git import GitRepo
from reconciler.loop import Reconciler
from reconciler.plan import plan_change

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

START = 1_763_283_600  # 2025-11-16T09:00:00Z: the demo's history starts a week before "now".


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


def build_demo_repo(directory: Path) -> list[str]:
    """Write the demo history as real commits, and the open pull request as a branch.

    Returns the subjects of main's commits.
    """
    directory.mkdir(parents=True)
    _git(directory, "init", "-q", "-b", "main")
    (directory / ".gitignore").write_text(".gitsched/\n")
    subjects = []
    for i, commit in enumerate(HISTORY):
        _commit(directory, commit, f"@{START + i * 5400} +0000")
        subjects.append(commit.message.splitlines()[0])
    _git(directory, "checkout", "-q", "-b", PR_BRANCH)
    _commit(directory, PULL_REQUEST, f"@{START + len(HISTORY) * 5400} +0000")
    _git(directory, "checkout", "-q", "main")
    return subjects


def run_demo(directory: Path, *, force: bool, echo: Callable[[str], None]) -> int:
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
        solves = [e for _, e in decode_all(event_log.read(0)) if isinstance(e, ev.SolveCompleted)]
        if solves:
            echo("")
            echo(f"== the {len(solves)} solves (one per commit that changed placement)")
            echo(
                table(
                    ["SOLVE", "SOLVER", "STATUS", "PLAN", "OBJECTIVE", "BOUND", "GAP", "SECONDS"],
                    [
                        [
                            s.solve_id.split("/")[0][:10],
                            s.solver,
                            s.status,
                            s.plan_source + (f" ({s.fallback})" if s.fallback else ""),
                            f"{s.objective:.2f}",
                            "-" if s.bound is None else f"{s.bound:.2f}",
                            "-" if s.gap is None else f"{s.gap * 100:.2f}%",
                            f"{s.seconds:.2f}",
                        ]
                        for s in solves
                    ],
                )
            )
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
        rows = []
        for team in sorted(report.state.queues):
            mine = [p for k, p in report.state.placements.items() if k.startswith(team + "/")]
            ended = [i for i in intervals if i.queue == team and i.end is not None]
            rows.append(
                [
                    team,
                    len(mine),
                    gpus_text(sum(p.gpu_milli for p in mine)),
                    len([i for i in intervals if i.queue == team]),
                    len(ended),
                ]
            )
        echo(table(["TEAM", "RUNNING", "GPUS", "INTERVALS", "ENDED"], rows))
        repo = GitRepo(directory)
        if repo.has_revision(PR_BRANCH):
            echo("")
            echo(f"== open pull request {PR_BRANCH}, not merged")
            plan = plan_change(repo, event_log, "main", PR_BRANCH)
            echo(plan_text(plan))
        echo("")
        echo(f"try: gitsched state --repo {directory}")
        echo(f"     gitsched plan {directory} main..{PR_BRANCH} --format markdown")
        echo(f"     gitsched audit history --repo {directory} --job nlp/moe-gang")
        echo(f"     gitsched validate {directory} --rev main~6")
    return 0
