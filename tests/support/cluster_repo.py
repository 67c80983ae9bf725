"""Real git repositories and the real `gitsched` command, for acceptance tests.

Every test builds its cluster repo with `git init` and commits made under fixed
authors and dates, then drives `python -m gitsched` in a subprocess, the way an
operator or a CI job would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gitsched.eventlog.envelope import StoredEvent, verify_chain
from gitsched.eventlog.replay import replay
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.render import state_to_dict

PROJECT_ROOT = Path(__file__).resolve().parents[2]


COMMAND_TIMEOUT_S = 60.0


H = "apiVersion: gitsched.io/v1\n"


CLUSTER_YAML = (
    H
    + """kind: Cluster
metadata:
  name: test
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


# Four 8-GPU nodes, two per NVLink domain: a 3x8 gang cannot fit in one domain.
POOL_YAML = (
    H
    + """kind: NodePool
metadata:
  name: h100-pool
spec:
  count: 4
  namePrefix: h100-
  template: {flavor: h100-80g, gpus: 8, cpu: 192, memoryGiB: 2048, region: eu-west}
  topology: {rack: rack-a}
  domains:
    - {level: nvlink, nodesPerDomain: 2, namePrefix: nvl-}
"""
)


POLICY_YAML = (
    H
    + """kind: Policy
metadata:
  name: default
spec:
  solver: {name: greedy}
"""
)


def queue_yaml(name: str = "ml", nominal: float = 32, extra: str = "") -> str:
    return (
        H
        + f"""kind: Queue
metadata:
  name: {name}
spec:
  quotas:
    - {{flavor: h100-80g, nominal: {nominal:g}}}
{extra}"""
    )


def job_yaml(
    name: str,
    *,
    replicas: int = 1,
    gpu: float = 8,
    queue: str | None = None,
    flavors: Sequence[str] = ("h100-80g",),
    topology: str | None = None,
    priority: str | None = None,
) -> str:
    lines = [
        H + "kind: Job",
        "metadata:",
        f"  name: {name}",
        "spec:",
        f"  replicas: {replicas}",
        f"  resources: {{gpu: {gpu:g}, cpu: 8, memoryGiB: 64}}",
    ]
    if queue is not None:
        lines.append(f"  queue: {queue}")
    if flavors:
        lines.append(f"  gpuFlavors: [{', '.join(flavors)}]")
    if topology is not None:
        lines.append(f"  topology: {{level: {topology}, mode: required}}")
    if priority is not None:
        lines.append(f"  priorityClass: {priority}")
    return "\n".join(lines) + "\n"


MINIMAL_CLUSTER = {
    "cluster.yaml": CLUSTER_YAML,
    "inventory/pool.yaml": POOL_YAML,
    "teams/ml/queue.yaml": queue_yaml(),
    "policies/default.yaml": POLICY_YAML,
}


PRIYA = ("Priya Raman", "priya@platform.example")


ANA = ("Ana Souza", "ana@ml.example")


LI = ("Li Wei", "li@ml.example")


# 2025-11-16T09:00:00Z; each commit is an hour after the one before.
EPOCH = 1_763_283_600


def git(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"git {' '.join(args)} failed: {done.stderr}"
    return done.stdout


class ClusterRepo:
    """A cluster repo on disk with a real git history that tests add commits to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0
        path.mkdir(parents=True, exist_ok=True)
        git(path, "init", "-q", "-b", "main")
        git(path, "config", "commit.gpgsign", "false")
        (path / ".gitignore").write_text(".gitsched/\n")

    @property
    def log_path(self) -> Path:
        return self.path / ".gitsched" / "log.db"

    def write(self, rel: str, content: str | bytes) -> ClusterRepo:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
        return self

    def write_all(self, files: Mapping[str, str | bytes]) -> ClusterRepo:
        for rel, content in files.items():
            self.write(rel, content)
        return self

    def symlink(self, rel: str, target: str) -> ClusterRepo:
        link = self.path / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
        return self

    def remove(self, rel: str) -> ClusterRepo:
        git(self.path, "rm", "-q", rel)
        return self

    def commit(
        self,
        message: str,
        *,
        author: tuple[str, str] = PRIYA,
        trailers: Sequence[tuple[str, str]] = (),
        allow_empty: bool = False,
    ) -> str:
        """Commit everything in the work tree; return the new commit's sha."""
        if trailers:
            message += "\n\n" + "\n".join(f"{key}: {value}" for key, value in trailers)
        when = f"@{EPOCH + self.commits * 3600} +0000"
        self.commits += 1
        env = {
            "GIT_AUTHOR_NAME": author[0],
            "GIT_AUTHOR_EMAIL": author[1],
            "GIT_AUTHOR_DATE": when,
            "GIT_COMMITTER_NAME": author[0],
            "GIT_COMMITTER_EMAIL": author[1],
            "GIT_COMMITTER_DATE": when,
        }
        git(self.path, "add", "-A")
        args = ["commit", "-q", "--no-verify", "-m", message]
        if allow_empty:
            args.append("--allow-empty")
        git(self.path, *args, env=env)
        return self.head()

    def head(self, rev: str = "HEAD") -> str:
        return git(self.path, "rev-parse", rev).strip()

    def bootstrap(self) -> str:
        """The minimal valid cluster: one NodePool, one queue, the greedy solver."""
        self.write_all(MINIMAL_CLUSTER)
        return self.commit("Bootstrap the cluster")

    def copy_to(self, path: Path) -> ClusterRepo:
        """An independent copy, history and log included."""
        shutil.copytree(self.path, path, symlinks=True)
        copy = ClusterRepo.__new__(ClusterRepo)
        copy.path, copy.commits = path, self.commits
        return copy


@dataclass
class Run:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (
            f"gitsched {' '.join(self.args)} -> {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def gitsched_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GITSCHED_LOG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def start_gitsched(
    *args: str | Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gitsched", *map(str, args)],
        cwd=cwd or PROJECT_ROOT,
        env=gitsched_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], args: Sequence[str | Path]) -> Run:
    try:
        stdout, stderr = process.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"gitsched {' '.join(map(str, args))} hung for {COMMAND_TIMEOUT_S}s: {stderr}")
    run = Run(tuple(map(str, args)), process.returncode, stdout, stderr)
    assert "Traceback" not in run.stderr, f"a user saw a traceback:\n{run}"
    return run


def gitsched(
    *args: str | Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    expect: int | None = None,
) -> Run:
    """Run `python -m gitsched ARGS`; never a traceback, never a hang."""
    run = finish(start_gitsched(*args, cwd=cwd, env=env), args)
    if expect is not None:
        assert run.returncode == expect, str(run)
    return run


def read_events(log_path: Path) -> list[StoredEvent]:
    with SQLiteEventLog(log_path) as event_log:
        return list(event_log.read(0))


def log_state(log_path: Path, *, until_seq: int | None = None) -> dict[str, Any]:
    """What `gitsched state --format json` would print, without starting a process."""
    with SQLiteEventLog(log_path) as event_log:
        replayed = replay(event_log, until_seq=until_seq)
    return state_to_dict(replayed.state, replayed.last_seq)


def assert_chain_intact(events: Sequence[StoredEvent]) -> None:
    assert verify_chain(events) is None, verify_chain(events)
    ids = [e.id for e in events]
    assert len(ids) == len(set(ids)), "duplicate event ids in the log"


def of_type(events: Sequence[StoredEvent], *types: str) -> list[StoredEvent]:
    return [e for e in events if e.type in types]
