"""A cluster repo with an auditable history, for the audit acceptance tests.

Real git commits under fixed authors and dates. `build_audit_log` reconciles
after every commit with a clock fixed at the commit's date plus a minute, so the
log (and every audit answer) is the same on every run; `gitsched_cli` runs
`python -m gitsched` the way an operator would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.support.cluster_repo import git

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0

H = "apiVersion: gitsched.io/v1\n"
EPOCH = datetime(2025, 11, 16, 9, 0, tzinfo=UTC)
STEP = timedelta(hours=1)

PRIYA = ("Priya Raman", "priya@platform.example")
ANA = ("Ana Souza", "ana@ml.example")
LI = ("Li Wei", "li@cv.example")
DEV = ("Dev Patel", "dev@risk.example")

CLUSTER = (
    H
    + """kind: Cluster
metadata:
  name: audit-test
spec:
  topologyLevels: [nvlink, rack]
  gpuFlavors:
    - {name: h100-80g, model: H100, memoryGiB: 80}
  priorityClasses:
    - {name: low, value: 100}
    - {name: normal, value: 500}
    - {name: high, value: 900}
  defaultPriorityClass: normal
"""
)


def node(name: str, nvlink: str, *, state: str = "Ready", dedicated: bool = False) -> str:
    region = "eu-central" if dedicated else "eu-west"
    return (
        H
        + f"""kind: Node
metadata:
  name: {name}
spec:
  flavor: h100-80g
  gpus: 8
  cpu: 192
  memoryGiB: 2048
  topology: {{nvlink: {nvlink}, rack: rack-a}}
  region: {region}
  isolation: {"dedicated" if dedicated else "shared"}
  state: {state}
"""
    )


def inventory(failed: Sequence[str] = ()) -> str:
    docs = [
        node(f"gpu-{i}", f"nvl-{(i + 1) // 2}", state="Failed" if f"gpu-{i}" in failed else "Ready")
        for i in range(1, 5)
    ]
    docs.append(node("sec-1", "nvl-s", dedicated=True))
    return "---\n".join(docs)


POLICY = (
    H
    + """kind: Policy
metadata:
  name: default
spec:
  solver: {name: greedy}
"""
)


def queue(
    name: str, nominal: int, *, cohort: str | None = None, borrowing: int | None = None
) -> str:
    lines = [H + "kind: Queue", "metadata:", f"  name: {name}", "spec:"]
    if cohort:
        lines.append(f"  cohort: {cohort}")
    quota = f"flavor: h100-80g, nominal: {nominal}"
    if borrowing is not None:
        quota += f", borrowingLimit: {borrowing}"
    lines += ["  quotas:", f"    - {{{quota}}}"]
    return "\n".join(lines) + "\n"


def job(
    name: str,
    *,
    replicas: int = 1,
    gpu: int = 8,
    priority: str = "normal",
    preemptible: bool = True,
    extra: str = "",
) -> str:
    return (
        H
        + f"""kind: Job
metadata:
  name: {name}
spec:
  replicas: {replicas}
  resources: {{gpu: {gpu}, cpu: 16, memoryGiB: 128}}
  gpuFlavors: [h100-80g]
  priorityClass: {priority}
  preemptible: {"true" if preemptible else "false"}
{extra}"""
    )


@dataclass
class Step:
    author: tuple[str, str]
    message: str
    write: Mapping[str, str]
    remove: Sequence[str] = ()
    trailers: Sequence[tuple[str, str]] = ()


# Ten commits: quotas and OWNERS created (bootstrap: no owners before), jobs admitted, a job borrowing from
# its cohort, a reclaim that preempts, a node failure, a self-approved quota raise,
# a withdrawal and a properly approved quota cut.
HISTORY: tuple[Step, ...] = (
    Step(
        PRIYA,
        "Bootstrap: cluster, nodes, policy and the ml, cv and risk queues",
        {
            "cluster.yaml": CLUSTER,
            "inventory/nodes.yaml": inventory(),
            "policies/default.yaml": POLICY,
            "teams/ml/queue.yaml": queue("ml", 16, cohort="research", borrowing=16),
            "teams/cv/queue.yaml": queue("cv", 16, cohort="research"),
            "teams/risk/queue.yaml": queue("risk", 8),
            "teams/ml/OWNERS": "ana@ml.example\n",
            "teams/cv/OWNERS": "li@cv.example\n",
        },
    ),
    Step(
        ANA,
        "ml: 2x8 training gang in one NVLink domain",
        {
            "teams/ml/jobs/train.yaml": job(
                "train",
                replicas=2,
                priority="low",
                extra="  topology: {level: nvlink, mode: required}\n",
            )
        },
    ),
    Step(LI, "cv: evaluation on one node", {"teams/cv/jobs/eval.yaml": job("eval")}),
    Step(
        ANA,
        "ml: a sweep that borrows from cv",
        {"teams/ml/jobs/sweep.yaml": job("sweep", priority="low")},
    ),
    Step(
        DEV,
        "risk: scorer on the dedicated node in eu-central",
        {
            "teams/risk/jobs/scorer.yaml": job(
                "scorer",
                priority="high",
                preemptible=False,
                extra="  isolation: dedicated\n  residency: [eu-central]\n",
            )
        },
    ),
    Step(
        LI,
        "cv: serving, high priority, reclaims cv's quota",
        {"teams/cv/jobs/serve.yaml": job("serve", priority="high", preemptible=False)},
    ),
    Step(PRIYA, "gpu-3 failed: mark it", {"inventory/nodes.yaml": inventory(failed=("gpu-3",))}),
    Step(
        PRIYA,
        "ml: raise the borrowing limit to 24",
        {"teams/ml/queue.yaml": queue("ml", 16, cohort="research", borrowing=24)},
        trailers=(("Approved-by", "Priya Raman <priya@platform.example>"),),
    ),
    Step(LI, "cv: withdraw the evaluation", {}, remove=("teams/cv/jobs/eval.yaml",)),
    Step(
        PRIYA,
        "cv: nominal 16 -> 8",
        {"teams/cv/queue.yaml": queue("cv", 8, cohort="research")},
        trailers=(("Approved-by", "Li Wei <li@cv.example>"),),
    ),
)


def commit_step(repo: Path, step: Step, when: datetime) -> str:
    for rel, content in step.write.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    for rel in step.remove:
        git(repo, "rm", "-q", rel)
    message = step.message
    if step.trailers:
        message += "\n\n" + "\n".join(f"{k}: {v}" for k, v in step.trailers)
    stamp = f"@{int(when.timestamp())} +0000"
    env = {
        "GIT_AUTHOR_NAME": step.author[0],
        "GIT_AUTHOR_EMAIL": step.author[1],
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_NAME": step.author[0],
        "GIT_COMMITTER_EMAIL": step.author[1],
        "GIT_COMMITTER_DATE": stamp,
    }
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", message, env=env)
    return git(repo, "rev-parse", "HEAD").strip()


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "commit.gpgsign", "false")
    (path / ".gitignore").write_text(".gitsched/\n")
    return path


def build_audit_log(path: Path, steps: Sequence[Step] = HISTORY) -> Path:
    """Commit `steps` one by one, reconciling after each at commit time + 1 minute."""
    from gitsched.eventlog.sqlite import SQLiteEventLog
    from gitsched.reconciler.git import GitRepo
    from gitsched.reconciler.loop import Reconciler

    repo = init_repo(path)
    log_path = repo / ".gitsched" / "log.db"
    for i, step in enumerate(steps):
        when = EPOCH + i * STEP
        commit_step(repo, step, when)
        moment = when + timedelta(minutes=1)
        with SQLiteEventLog(log_path, clock=lambda m=moment: m) as event_log:
            Reconciler(GitRepo(repo), event_log).run_once()
    return repo


@dataclass
class Run:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        import json

        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (
            f"gitsched {' '.join(self.args)} -> {self.returncode}\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"
        )


def gitsched_cli(
    *args: str | Path, expect: int | None = 0, env: Mapping[str, str] | None = None
) -> Run:
    """`python -m gitsched ARGS`: never a traceback, never a hang."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GITSCHED_")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])
    )
    full_env.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "gitsched", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=full_env,
        timeout=TIMEOUT_S,
        check=False,
    )
    run = Run(tuple(map(str, args)), done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in run.stderr, f"a user saw a traceback:\n{run}"
    if expect is not None:
        assert run.returncode == expect, str(run)
    return run
