"""A thin adapter over the `git` command line: commits, trailers and tree contents.

We shell out rather than bind libgit2 so any repository git can read works,
and file contents are read from git objects, never from a checkout.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import PermanentError, TemporaryError
from engine.model import CommitInfo

APPROVAL_TRAILERS = ("Approved-by", "Reviewed-by")
_FIELD = "\x1f"
_RECORD = "\x1e"


class GitError(PermanentError):
    """git refused: not a repository, unknown revision, rewritten history."""


@dataclass(frozen=True, slots=True)
class TreeEntry:
    path: str
    mode: str
    object_type: str
    sha: str
    size: int | None

    @property
    def is_symlink(self) -> bool:
        return self.mode == "120000"

    @property
    def is_submodule(self) -> bool:
        return self.object_type == "commit"


def parse_trailer_people(values: Iterable[str]) -> tuple[str, ...]:
    people: list[str] = []
    for raw in values:
        value = raw.strip()
        if value and value not in people:
            people.append(value)
    return tuple(people)


class GitRepo:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise GitError(f"{self.path} is not a directory")
        top = self._run("rev-parse", "--show-toplevel", check_repo=True).strip()
        self.root = Path(top)

    def _run(self, *args: str, input: bytes | None = None, check_repo: bool = False) -> str:
        return self._run_bytes(*args, input=input, check_repo=check_repo).decode("utf-8", "replace")

    def _run_bytes(self, *args: str, input: bytes | None = None, check_repo: bool = False) -> bytes:
        try:
            done = subprocess.run(
                ["git", "-C", str(self.path), *args],
                input=input,
                capture_output=True,
                check=False,
            )
        except FileNotFoundError as e:
            raise TemporaryError("git is not installed or not on PATH") from e
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip()
            if check_repo:
                raise GitError(f"{self.path} is not a git repository: {message}")
            raise GitError(f"git {' '.join(args[:2])} failed: {message}")
        return done.stdout

    def resolve(self, rev: str) -> str:
        try:
            return self._run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except GitError as e:
            # --quiet leaves git's stderr empty, so say what went wrong ourselves.
            raise GitError(
                f"unknown revision {rev!r} in {self.root}: no such branch, tag or commit"
            ) from e

    def has_revision(self, rev: str) -> bool:
        try:
            self.resolve(rev)
        except GitError:
            return False
        return True

    def checked_out_branch(self) -> str | None:
        """The branch HEAD points at ('master' in many older repos), or None when detached."""
        try:
            return self._run("symbolic-ref", "--quiet", "--short", "HEAD").strip() or None
        except GitError:
            return None

    def is_ancestor(self, older: str, newer: str) -> bool:
        done = subprocess.run(
            ["git", "-C", str(self.path), "merge-base", "--is-ancestor", older, newer],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def commits(self, revision_range: str) -> list[CommitInfo]:
        """Commits of a range on the first-parent line, oldest first."""
        fmt = _FIELD.join(
            [
                "%H",
                "%an",
                "%ae",
                "%cI",
                "%s",
                "%(trailers:key=Approved-by,valueonly,separator=%x1d)",
                "%(trailers:key=Reviewed-by,valueonly,separator=%x1d)",
            ]
        )
        out = self._run(
            "log", "--first-parent", "--reverse", f"--format={fmt}{_RECORD}", revision_range, "--"
        )
        commits: list[CommitInfo] = []
        for record in out.split(_RECORD):
            record = record.strip("\n")
            if not record:
                continue
            sha, name, email, date, subject, approved, reviewed = record.split(_FIELD)
            approvers = parse_trailer_people([*approved.split("\x1d"), *reviewed.split("\x1d")])
            commits.append(CommitInfo(sha, name, email, date, subject, approvers))
        return commits

    def commits_since(self, branch: str, last_applied: str | None) -> list[CommitInfo]:
        head = self.resolve(branch)
        if last_applied is None:
            return self.commits(head)
        if not self.has_revision(last_applied):
            raise GitError(
                f"the log's last applied commit {last_applied[:12]} is not in this repository: "
                "wrong repository, or history was rewritten"
            )
        if not self.is_ancestor(last_applied, head):
            raise GitError(
                f"the log's last applied commit {last_applied[:12]} is not an ancestor of {branch}: "
                "history was rewritten (force-push); gitsched never rewrites its log"
            )
        return self.commits(f"{last_applied}..{head}")

    def tree(self, rev: str) -> list[TreeEntry]:
        out = self._run_bytes("ls-tree", "-r", "-z", "--long", "--full-tree", rev)
        entries: list[TreeEntry] = []
        for raw in out.split(b"\0"):
            if not raw:
                continue
            meta, _, path = raw.partition(b"\t")
            mode, object_type, sha, size = meta.decode().split()
            entries.append(
                TreeEntry(
                    path=path.decode("utf-8", "surrogateescape"),
                    mode=mode,
                    object_type=object_type,
                    sha=sha,
                    size=None if size == "-" else int(size),
                )
            )
        return entries

    def read_blobs(self, shas: Sequence[str]) -> dict[str, bytes]:
        """Contents of many blobs in one `git cat-file --batch`."""
        if not shas:
            return {}
        unique = list(dict.fromkeys(shas))
        out = self._run_bytes("cat-file", "--batch", input=("\n".join(unique) + "\n").encode())
        blobs: dict[str, bytes] = {}
        pos = 0
        for sha in unique:
            header_end = out.index(b"\n", pos)
            header = out[pos:header_end].decode()
            parts = header.split()
            if len(parts) < 3:
                raise GitError(f"cannot read object {sha}: {header}")
            size = int(parts[2])
            start = header_end + 1
            blobs[sha] = out[start : start + size]
            pos = start + size + 1
        return blobs
