"""Helpers of the approval tests: SSH keys, a repo whose commits git signs, and the
CLI calls those tests share."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.cluster_repo import (
    EPOCH,
    PRIYA,
    ClusterRepo,
    H,
    git,
    gitsched,
    of_type,
    queue_yaml,
    read_events,
)

KAI = ("Kai Berg", "kai@ml.example")

LI = ("Li Wei", "li@nlp.example")

MALLORY = ("Mallory", "mallory@elsewhere.example")


def policy(*, owner: bool = True, signed: bool = False) -> str:
    return (
        H
        + f"""kind: Policy
metadata:
  name: default
spec:
  solver: {{name: greedy}}
  approval: {{requireOwnerApproval: {str(owner).lower()}, requireSignedApproval: {str(signed).lower()}}}
"""
    )


@dataclass(frozen=True)
class Key:
    path: Path  # the private key; the public one is path + ".pub"
    public: str  # "ssh-ed25519 AAAA..."
    fingerprint: str  # "SHA256:..." as ssh-keygen -l prints it


def make_key(folder: Path, name: str) -> Key:
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True
    )
    public = " ".join(path.with_suffix(".pub").read_text().split()[:2])
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{path}.pub"], capture_output=True, text=True, check=True
    )
    return Key(path, public, listed.stdout.split()[1])


class SigningRepo(ClusterRepo):
    """A ClusterRepo whose commits and merges may be signed with an SSH key."""

    def _env(self, who: tuple[str, str]) -> dict[str, str]:
        when = f"@{EPOCH + self.commits * 3600} +0000"
        self.commits += 1
        return {
            "GIT_AUTHOR_NAME": who[0],
            "GIT_AUTHOR_EMAIL": who[1],
            "GIT_AUTHOR_DATE": when,
            "GIT_COMMITTER_NAME": who[0],
            "GIT_COMMITTER_EMAIL": who[1],
            "GIT_COMMITTER_DATE": when,
        }

    def signed(
        self,
        message: str,
        key: Key | None,
        *,
        author: tuple[str, str] = PRIYA,
        trailers: Sequence[tuple[str, str]] = (),
        allow_empty: bool = False,
    ) -> str:
        if trailers:
            message += "\n\n" + "\n".join(f"{k}: {v}" for k, v in trailers)
        git(self.path, "add", "-A")
        args = [*_signing(key), "commit", "-q", "--no-verify", "-m", message]
        if allow_empty:
            args.append("--allow-empty")
        git(self.path, *args, env=self._env(author))
        return self.head()

    def merge(self, branch: str, key: Key | None, *, by: tuple[str, str] = PRIYA) -> str:
        git(
            self.path,
            *_signing(key),
            "merge",
            "-q",
            "--no-ff",
            "-m",
            f"Merge branch '{branch}'",
            branch,
            env=self._env(by),
        )
        return self.head()


def _signing(key: Key | None) -> list[str]:
    if key is None:
        return ["-c", "commit.gpgsign=false"]
    return [
        "-c",
        "gpg.format=ssh",
        "-c",
        f"user.signingkey={key.path}",
        "-c",
        "commit.gpgsign=true",
    ]


def owners_line(who: tuple[str, str], key: Key | None) -> str:
    return f"{who[1]} {key.public}\n" if key is not None else f"{who[1]}\n"


def reconcile(repo: ClusterRepo, expect: int) -> list[str]:
    """Reconcile; the messages of the CommitRejected events it appended."""
    before = len(read_events(repo.log_path))
    gitsched("reconcile", "--once", repo.path, expect=expect)
    new = read_events(repo.log_path)[before:]
    return [e["message"] for r in of_type(new, "CommitRejected") for e in r.data["errors"]]


def plan_approvals(repo: ClusterRepo, rng: str) -> list[dict[str, object]]:
    run = gitsched("plan", repo.path, rng, "--format", "json")
    assert run.returncode in (0, 1), str(run)
    approvals: list[dict[str, object]] = run.json()["approvals"]["teams"]
    return approvals


def applied_shas(repo: ClusterRepo) -> list[str]:
    return [e.data["commit"]["sha"] for e in of_type(read_events(repo.log_path), "CommitApplied")]


def raise_ml(repo: ClusterRepo, nominal: float = 40) -> None:
    repo.write("teams/ml/queue.yaml", queue_yaml("ml", nominal))
