"""A thin adapter over the `git` command line: commits, trailers and tree contents.

We shell out rather than bind libgit2 so any repository git can read works,
and file contents are read from git objects, never from a checkout.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gitsched.engine.errors import PermanentError, TemporaryError
from gitsched.engine.model import CommitInfo

APPROVAL_TRAILERS = ("Approved-by", "Reviewed-by")
# What git calls whitespace (its isspace): not Python's, which also counts \x1c-\x1f.
_GIT_SPACE = " \t\n\r"


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
        value = raw.strip(_GIT_SPACE)
        if value and value not in people:
            people.append(value)
    return tuple(people)


@dataclass(frozen=True, slots=True)
class Ident:
    """An author or committer line: name, e-mail and the time with its offset."""

    name: str = ""
    email: str = ""
    iso_time: str = ""


@dataclass(frozen=True, slots=True)
class CommitObject:
    """A commit object as git stores it, read by gitsched itself: every byte of the
    message is data. `problem` says why it could not be read, when it could not."""

    sha: str
    tree: str = ""
    parents: tuple[str, ...] = ()
    author: Ident = Ident()
    committer: Ident = Ident()
    message: bytes = b""
    subject: str = ""
    problem: str | None = None


_IDENT = re.compile(rb"^(?P<name>[^<]*)<(?P<email>[^>]*)> (?P<time>\d+) (?P<tz>[+-]\d{4})$")
_HEX_SHA = re.compile(rb"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _ident(line: bytes, encoding: str) -> Ident | None:
    match = _IDENT.match(line)
    if match is None:
        return None
    tz = match["tz"].decode()
    sign = -1 if tz[0] == "-" else 1
    offset = timedelta(hours=int(tz[1:3]), minutes=int(tz[3:5])) * sign
    try:
        when = datetime.fromtimestamp(int(match["time"]), timezone(offset))
    except (OverflowError, OSError, ValueError):
        return None
    return Ident(
        _text(match["name"].rstrip(b" "), encoding),
        _text(match["email"], encoding),
        when.isoformat(),
    )


def _text(raw: bytes, encoding: str) -> str:
    try:
        return raw.decode(encoding, "replace")
    except LookupError:  # an encoding header naming no codec Python knows
        return raw.decode("utf-8", "replace")


def _subject(message: str) -> str:
    """git's %s: the first paragraph, its lines joined by spaces (git's format_subject)."""
    lines = message.split("\n")
    while lines and not lines[0].strip(_GIT_SPACE):
        lines.pop(0)
    subject: list[str] = []
    for line in lines:
        line = line.rstrip(_GIT_SPACE)
        if not line:
            break
        subject.append(line)
    return " ".join(subject)


def parse_commit_object(sha: str, raw: bytes | None) -> CommitObject:
    """Headers up to the first empty line (a header's continuation lines start with a
    space), then the message, all bytes."""
    if raw is None:
        return CommitObject(sha, problem="the object is missing or not a commit")
    head, sep, message = raw.partition(b"\n\n")
    if not sep:
        head, message = raw.rstrip(b"\n"), b""
    tree = b""
    parents: list[str] = []
    author_line = committer_line = None
    encoding = "utf-8"
    for line in head.split(b"\n"):
        if line.startswith(b" "):
            continue  # a multi-line header's continuation (gpgsig, mergetag)
        key, _, value = line.partition(b" ")
        if key == b"tree" and not tree:
            tree = value
        elif key == b"parent":
            parents.append(value.decode("ascii", "replace"))
        elif key == b"author" and author_line is None:
            author_line = value
        elif key == b"committer" and committer_line is None:
            committer_line = value
        elif key == b"encoding":
            encoding = value.decode("ascii", "replace").strip() or "utf-8"
    author = _ident(author_line, encoding) if author_line is not None else None
    committer = _ident(committer_line, encoding) if committer_line is not None else None
    text = _text(message, encoding)
    problem = None
    if not _HEX_SHA.match(tree):
        problem = "its tree header is missing or malformed"
    elif author is None:
        problem = "its author line is missing or malformed (name <e-mail> time offset)"
    elif committer is None:
        problem = "its committer line is missing or malformed (name <e-mail> time offset)"
    return CommitObject(
        sha,
        tree.decode("ascii", "replace"),
        tuple(parents),
        author or Ident(),
        committer or Ident(),
        message,
        _subject(text),
        problem,
    )


def _may_name_approvers(commit: CommitObject) -> bool:
    lowered = commit.message.lower()
    return any(key.lower().encode() in lowered for key in APPROVAL_TRAILERS)


def _people_of(trailer_lines: Iterable[str]) -> tuple[str, ...]:
    """The approvers among 'Key: value' trailer lines (keys matched as git does: any case)."""
    keys = {key.lower() for key in APPROVAL_TRAILERS}
    values: list[str] = []
    for line in trailer_lines:
        key, sep, value = line.partition(":")
        if sep and key.strip(_GIT_SPACE).lower() in keys:
            values.append(value)
    return parse_trailer_people(values)


class GitRepo:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Commits read but not readable (malformed objects): sha -> why. The reconciler
        # rejects each like any bad commit and goes on.
        self.unreadable: dict[str, str] = {}
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
        """Commits of a range on the first-parent line, oldest first.

        A commit gitsched cannot read (a malformed object) is still listed, with what could
        be read of it, and its reason kept in `unreadable`, so the reconciler rejects it by
        sha and goes on with the commits after it."""
        shas = self.rev_list("--first-parent", "--reverse", revision_range)
        objects = [
            parse_commit_object(sha, raw)
            for sha, raw in zip(shas, self.read_commit_objects(shas), strict=True)
        ]
        approvers = self.approvers_of(objects)
        found: list[CommitInfo] = []
        for parsed in objects:
            sha = parsed.sha
            if parsed.problem is not None:
                self.unreadable[sha] = parsed.problem
            found.append(
                CommitInfo(
                    sha,
                    parsed.author.name,
                    parsed.author.email,
                    parsed.committer.iso_time,
                    parsed.subject,
                    approvers[sha],
                    parsed.author.iso_time,
                    parsed.committer.name,
                    parsed.committer.email,
                )
            )
        return found

    def rev_list(self, *args: str) -> list[str]:
        """The shas `git rev-list` selects: hex only, one a line, nothing a commit's
        author wrote."""
        return self._run("rev-list", *args, "--").split()

    def read_commit_objects(self, shas: Sequence[str]) -> list[bytes | None]:
        """Raw commit objects through `git cat-file --batch`: each framed by its size,
        so no byte of a message can be read as a separator. None for one that is not
        a commit."""
        if not shas:
            return []
        out = self._run_bytes("cat-file", "--batch", input=("\n".join(shas) + "\n").encode())
        objects: list[bytes | None] = []
        pos = 0
        for _ in shas:
            header_end = out.index(b"\n", pos)
            parts = out[pos:header_end].split()
            if len(parts) < 3:  # "<sha> missing"
                objects.append(None)
                pos = header_end + 1
                continue
            size = int(parts[2])
            start = header_end + 1
            objects.append(out[start : start + size] if parts[1] == b"commit" else None)
            pos = start + size + 1
        return objects

    def approvers(self, commit: CommitObject) -> tuple[str, ...]:
        """The Approved-by and Reviewed-by trailers of a commit's message, as git parses
        trailers (`git interpret-trailers --parse`, the message given as data on stdin);
        git is asked only when the message names one of the keys at all."""
        if not _may_name_approvers(commit):
            return ()
        out = self._run_bytes(
            "-c", "trailer.separators=:", "interpret-trailers", "--parse", input=commit.message
        )
        # Lines end with "\n" alone; an unfolded trailer holds no newline, and every other
        # byte (\x1e, \x1f, \r, ...) belongs to the value.
        return _people_of(out.decode("utf-8", "replace").split("\n"))

    def approvers_of(self, commits: Sequence[CommitObject]) -> dict[str, tuple[str, ...]]:
        """`approvers` of many commits, by sha, with one git process: git's own trailer
        parser through `git log -z`, each trailer its own NUL-ended token. No message can
        hold a NUL that git prints, and each record must read as expected (its sha, then
        tokens tagged T, then E): a record that does not is asked of
        `git interpret-trailers` on its own."""
        found: dict[str, tuple[str, ...]] = {c.sha: () for c in commits}
        asked = [c for c in commits if _may_name_approvers(c)]
        if len(asked) <= 2:
            found.update({c.sha: self.approvers(c) for c in asked})
            return found
        keys = ",".join(f"key={k}" for k in APPROVAL_TRAILERS)
        out = self._run_bytes(
            "-c", "trailer.separators=:", "log", "--no-walk=unsorted", "--stdin", "-z",
            f"--format=%H%x00T%(trailers:{keys},unfold,separator=%x00T)%x00E",
            input=("\n".join(c.sha for c in asked) + "\n").encode(),
        )  # fmt: skip
        tokens = out.decode("utf-8", "replace").split("\0")
        at = 0
        for i, commit in enumerate(asked):
            lines: list[str] = []
            in_step = at < len(tokens) and tokens[at] == commit.sha
            at += 1
            while in_step and at < len(tokens) and tokens[at].startswith("T"):
                lines.append(tokens[at][1:])
                at += 1
            if not in_step or at >= len(tokens) or tokens[at] != "E":
                # Out of step: this one and the rest, one by one.
                found.update({c.sha: self.approvers(c) for c in asked[i:]})
                break
            at += 1
            found[commit.sha] = _people_of(lines)
        return found

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
    shas = repo.rev_list(*revisions)
    # With a pathspec, a commit that changes no file is left out; merges are never authors.
    changing = set(
        repo._run(
            "log", "--no-merges", "--full-history", "--format=%H", *revisions, "--", "."
        ).split()
    )
    objects = [
        parse_commit_object(sha, raw)
        for sha, raw in zip(shas, repo.read_commit_objects(shas), strict=True)
    ]
    approvers = repo.approvers_of(objects)
    found: list[ChangeCommit] = []
    for parsed in objects:
        found.append(
            ChangeCommit(
                parsed.sha,
                parsed.parents,
                parsed.tree,
                parsed.author.email.lower(),
                approvers[parsed.sha],
                parsed.sha in changing,
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
