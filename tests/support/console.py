"""Helpers of the console's tests: the hostile commit and a probe job on the demo repo."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster_repo import git, gitsched

# The subject of a commit that hostile input comes in with: markup, quotes, and 10 KB.
HOSTILE = "<script>window.__pwned=1</script> \"double\" 'single' <img src=x onerror=alert(1)> "
HOSTILE_NAME = "<script>window.__pwned=2</script>\"'" + "x" * 10_000
# git drops < and > from names; quotes and ampersands stay.
MALLORY = ('Mallory O\'Brien & "co"', "mallory@vision.example")


def log_url(repo: Path) -> str:
    return f"sqlite:///{repo / '.gitsched' / 'log.db'}"


def commit_all(repo: Path, message: str, author: tuple[str, str], when: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": author[0],
        "GIT_AUTHOR_EMAIL": author[1],
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_NAME": author[0],
        "GIT_COMMITTER_EMAIL": author[1],
        "GIT_COMMITTER_DATE": when,
    }
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", message, env=env)
    return git(repo, "rev-parse", "HEAD").strip()


def hostile_commit(repo: Path) -> str:
    """A rejected commit: a job whose name is markup, quotes and 10 KB, in a commit whose
    subject and author are markup too; reconciled (exit 1: the newest commit is rejected)."""
    name_yaml = HOSTILE_NAME.replace("'", "''")
    (repo / "teams" / "vision" / "jobs" / "hostile.yaml").write_text(
        "apiVersion: gitsched.io/v1\nkind: Job\nmetadata:\n"
        f"  name: '{name_yaml}'\n"
        "spec:\n  replicas: 1\n  resources: {gpu: 1, cpu: 1, memoryGiB: 1}\n",
        encoding="utf-8",
    )
    sha = commit_all(repo, HOSTILE + "y" * 10_000, MALLORY, "2025-11-17T03:00:00+00:00")
    gitsched("reconcile", "--once", "--repo", repo, expect=1)
    return sha


def probe_job(repo: Path, name: str) -> str:
    """A valid one-GPU job for the fraud team, committed and reconciled."""
    (repo / "teams" / "fraud" / "jobs" / f"{name}.yaml").write_text(
        "apiVersion: gitsched.io/v1\nkind: Job\nmetadata:\n"
        f"  name: {name}\n"
        "spec:\n  replicas: 1\n  resources: {gpu: 1, cpu: 1, memoryGiB: 1}\n"
        "  gpuFlavors: [h100-80g]\n",
        encoding="utf-8",
    )
    return commit_all(
        repo,
        f"fraud: {name}, one H100",
        ("Dev Patel", "dev@fraud.example"),
        "2025-11-17T04:00:00+00:00",
    )
