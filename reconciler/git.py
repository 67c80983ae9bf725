"""A thin adapter over the `git` command line: commits, trailers and tree contents.

We shell out rather than bind libgit2 so any repository git can read works,
and file contents are read from git objects, never from a checkout.
"""

from __future__ import annotations

import subprocess
import tempfile
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
                "%aI",
                "%cn",
                "%ce",
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
            (sha, name, email, date, subject, authored, committer, committer_email, approved,
             reviewed) = record.split(_FIELD)  # fmt: skip
            approvers = parse_trailer_people([*approved.split("\x1d"), *reviewed.split("\x1d")])
            commits.append(
                CommitInfo(
                    sha, name, email, date, subject, approvers, authored, committer, committer_email
                )
            )
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

    def tree(self, rev: str, paths: Sequence[str] | None = None) -> list[TreeEntry]:
        """The files of `rev`'s tree; with `paths`, only those (and what lies under them)."""
        if paths is not None and not paths:
            return []
        # Literal pathspecs: a path with '*' or ':' in its name names that file only.
        selected = () if paths is None else ("--", *paths)
        out = self._run_bytes(
            "--literal-pathspecs", "ls-tree", "-r", "-z", "--long", "--full-tree", rev, *selected
        )
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

    def changed_paths(self, old: str, new: str, most: int) -> list[str] | None:
        """The paths whose entry differs between the trees of commits `old` and `new`
        (added, removed, changed content, mode or type), or None when more than `most`."""
        out = self._run_bytes("diff-tree", "-r", "-z", "--no-renames", "--name-only", old, new)
        paths = [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]
        return paths if len(paths) <= most else None

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


@dataclass(frozen=True, slots=True)
class ChangeCommit:
    """One commit of a change as the approval rule reads it: every parent, not only the first."""

    sha: str
    parents: tuple[str, ...]
    tree: str
    author_email: str
    approvers: tuple[str, ...]
    changes_files: bool  # False for an empty commit (e.g. one that only carries an approval)

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1


def change_commits(repo: GitRepo, *revisions: str) -> list[ChangeCommit]:
    """The commits `revisions` select (e.g. 'SHA^!', or 'MERGE', '^MERGE^1': what a merge brings in)."""
    fmt = _FIELD.join(
        [
            "%H",
            "%P",
            "%T",
            "%ae",
            "%(trailers:key=Approved-by,valueonly,separator=%x1d)",
            "%(trailers:key=Reviewed-by,valueonly,separator=%x1d)",
        ]
    )
    out = repo._run("log", f"--format={fmt}{_RECORD}", *revisions, "--")
    # With a pathspec, a commit that changes no file is left out; merges are never authors.
    changing = set(
        repo._run(
            "log", "--no-merges", "--full-history", "--format=%H", *revisions, "--", "."
        ).split()
    )
    found: list[ChangeCommit] = []
    for record in out.split(_RECORD):
        record = record.strip("\n")
        if not record:
            continue
        sha, parents, tree, email, approved, reviewed = record.split(_FIELD)
        approvers = parse_trailer_people([*approved.split("\x1d"), *reviewed.split("\x1d")])
        found.append(
            ChangeCommit(
                sha, tuple(parents.split()), tree, email.lower(), approvers, sha in changing
            )
        )
    return found


def merge_edits(repo: GitRepo, sha: str) -> bool:
    """Whether a merge commit changes files beyond what its parents bring (conflict
    resolutions, or edits slipped into the merge): `git diff-tree --cc` is empty otherwise."""
    return bool(repo._run("diff-tree", "--cc", "--name-only", "--no-commit-id", sha).strip())


def tree_of(repo: GitRepo, rev: str) -> str:
    return repo._run("rev-parse", f"{rev}^{{tree}}").strip()


def verify_commit(repo: GitRepo, sha: str, allowed_signers: str) -> tuple[bool, str]:
    """`git verify-commit --raw` with SSH signatures checked against `allowed_signers`
    (git's allowed-signers file format, one 'e-mail key' a line): (ok, what git said).
    Offline: ssh-keygen reads only the file and the commit."""
    with tempfile.TemporaryDirectory(prefix="gitsched-signers-") as folder:
        signers = Path(folder) / "allowed_signers"
        signers.write_text(allowed_signers, encoding="utf-8")
        try:
            done = subprocess.run(
                [
                    "git",
                    "-C",
                    str(repo.path),
                    "-c",
                    "gpg.format=ssh",
                    "-c",
                    f"gpg.ssh.allowedSignersFile={signers}",
                    "verify-commit",
                    "--raw",
                    sha,
                ],
                capture_output=True,
                check=False,
            )
        except FileNotFoundError as e:
            raise TemporaryError("git is not installed or not on PATH") from e
    text = (done.stderr + done.stdout).decode("utf-8", "replace").strip()
    return done.returncode == 0, text
