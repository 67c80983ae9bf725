"""From a commit's files to the desired state: layout, parsing, schemas, policies, model.

Every problem in every file is collected and returned, never raised: a commit
is either fully valid (a DesiredState) or rejected with all of its errors.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path, PurePosixPath
from typing import Any, Generic, TypeVar

from gitsched import policies, schemas
from gitsched.engine.core import DesiredState
from gitsched.engine.model import (
    BackfillPolicy,
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    IdleAction,
    IdlePolicy,
    Isolation,
    Job,
    Node,
    NodeState,
    Owner,
    Policy,
    PreemptionScope,
    PriorityClass,
    Queue,
    QueueingStrategy,
    QueueTimeLimits,
    RequeueTimestamp,
    Resources,
    RetryPolicy,
    Spread,
    TopologyMode,
    TopologyRequirement,
    job_key,
)
from gitsched.engine.services import InferenceService, RollingUpdate
from gitsched.engine.units import mib_from_gib, milli_from_cores, milli_from_gpus
from gitsched.findings import Finding
from gitsched.policies.approval import PLATFORM, parse_members, parse_owners
from gitsched.policies.fit import fit_warnings
from gitsched.policies.pod_security import pod_security_policy
from gitsched.reconciler.git import GitError, GitRepo, TreeEntry
from gitsched.schemas import Document, Limits

YAML_SUFFIXES = (".yaml", ".yml")
IGNORED_DIRS = (".git", ".gitsched")
DEFAULT_LIMITS = Limits()
MAX_KEPT_PATHS = 250_000  # paths a SpecCache remembers as spec files or not, about
# A commit that changes at most this many paths is read as a difference from the last one
# read (`git diff-tree`, then `git ls-tree` of those paths); more, and the tree is listed.
MAX_CHANGED_PATHS = 2_000
_COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of the cluster repo as read from git or disk, or why it could not be read."""

    path: str
    content: bytes | None
    problem: Finding | None = None


@dataclass(frozen=True, slots=True)
class LoadedSpecs:
    desired: DesiredState | None
    errors: tuple[Finding, ...]
    documents: tuple[Document, ...] = ()
    owners: Mapping[str, tuple[Owner, ...]] | None = None
    members: Mapping[str, tuple[str, ...]] | None = None

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """Valid, but can never run as written (policies.fit): what `validate` and `plan`
        show, never a reason to reject; worked out when asked, off the reconcile path."""
        if self.desired is None:
            return ()
        return fit_warnings(self.documents, self.desired)


def _parts(path: str) -> list[str]:
    """A repository path's parts, as PurePosixPath gives them (asked of every file of every
    commit: a string split, not a path object, 50,000 times)."""
    return [p for p in path.split("/") if p and p != "."]


@lru_cache(maxsize=8)
def _team_limits(limits: Limits) -> Limits:
    return replace(
        limits,
        max_bytes=min(limits.max_bytes, limits.max_team_file_bytes),
        max_nodes=min(limits.max_nodes, limits.max_team_file_nodes),
    )


def file_limits(path: str, limits: Limits) -> Limits:
    """The limits one file is read under: a team's files (queue, OWNERS, jobs) are small
    by nature and get the team bounds, so a hostile job file costs what a large real one does."""
    return _team_limits(limits) if path.startswith("teams/") else limits


BUDGET_FILE = "(commit)"


def budget_error(files: int, total_bytes: int, limits: Limits) -> Finding | None:
    """The commit's budget, checked before any file of it is parsed: one clear error."""
    if files > limits.max_commit_files:
        what = f"{files} spec files; a commit may hold at most {limits.max_commit_files}"
    elif total_bytes > limits.max_commit_bytes:
        what = (
            f"{total_bytes} bytes of spec files; a commit may hold at most "
            f"{limits.max_commit_bytes}"
        )
    else:
        return None
    return Finding(
        BUDGET_FILE,
        None,
        None,
        "$",
        f"the commit holds {what} (nothing of it was parsed)",
        "over-budget",
    )


def _over_budget(files: Sequence[SourceFile], limits: Limits) -> Finding | None:
    for f in files:
        if f.path == BUDGET_FILE and f.problem is not None:
            return f.problem  # found from the tree's listing, before anything was read
    total = sum(len(f.content) for f in files if f.content is not None)
    return budget_error(len(files), total, limits)


def is_spec_file(path: str) -> bool:
    """Whether gitsched reads this file: YAML and OWNERS files outside hidden folders."""
    parts = _parts(path)
    if not parts or any(p.startswith(".") for p in parts[:-1]):
        return False
    return parts[-1].endswith(YAML_SUFFIXES) or is_owners_file(path) or is_members_file(path)


def is_members_file(path: str) -> bool:
    """teams/<team>/MEMBERS: who may submit the team's jobs (docs/approvals.md)."""
    parts = _parts(path)
    return len(parts) == 3 and parts[0] == "teams" and parts[2] == "MEMBERS"


def is_owners_file(path: str) -> bool:
    """teams/<team>/OWNERS, or OWNERS at the repo root: the platform owners."""
    parts = _parts(path)
    return parts == ["OWNERS"] or (len(parts) == 3 and parts[0] == "teams" and parts[2] == "OWNERS")


def read_commit(
    repo: GitRepo, rev: str, limits: Limits = DEFAULT_LIMITS, cache: SpecCache | None = None
) -> list[SourceFile]:
    """The spec files of a commit, straight from git objects (no checkout), by path."""
    if cache is not None:
        return cache.source_files(repo, rev, limits)
    files = _source_files(repo, repo.tree(rev), limits, repo.read_blobs, is_spec_file)
    return sorted(files, key=lambda f: f.path)


def _source_files(
    repo: GitRepo,
    entries: Iterable[TreeEntry],
    limits: Limits,
    read: Callable[[Sequence[str]], Mapping[str, bytes]],
    spec_file: Callable[[str], bool],
) -> list[SourceFile]:
    """The spec files among tree entries, read (`read`: blob contents by id)."""
    files: list[SourceFile] = []
    wanted: list[tuple[str, str]] = []
    specs = [entry for entry in entries if spec_file(entry.path)]
    over = budget_error(len(specs), sum(e.size or 0 for e in specs), limits)
    if over is not None:
        return [SourceFile(BUDGET_FILE, None, over)]  # nothing read, nothing parsed
    for entry in specs:
        if entry.is_symlink:
            target = repo.read_blobs([entry.sha]).get(entry.sha, b"").decode("utf-8", "replace")
            files.append(SourceFile(entry.path, None, _symlink_error(entry.path, target)))
        elif entry.is_submodule:
            files.append(
                SourceFile(
                    entry.path,
                    None,
                    Finding(
                        entry.path,
                        None,
                        None,
                        "$",
                        "a submodule where a spec file belongs",
                        "layout",
                    ),
                )
            )
        elif entry.size is not None and entry.size > file_limits(entry.path, limits).max_bytes:
            files.append(
                SourceFile(
                    entry.path,
                    None,
                    _too_large(entry.path, entry.size, file_limits(entry.path, limits)),
                )
            )
        else:
            wanted.append((entry.path, entry.sha))
    blobs = read([sha for _, sha in wanted])
    files.extend(SourceFile(path, blobs[sha]) for path, sha in wanted)
    return files


def read_worktree(root: Path, limits: Limits = DEFAULT_LIMITS) -> list[SourceFile]:
    """The spec files of a directory on disk, for `validate` before a commit exists."""
    root = root.resolve()
    files: list[SourceFile] = []
    total_bytes = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS and not d.startswith("."))
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            rel = full.relative_to(root).as_posix()
            if not is_spec_file(rel):
                continue
            if full.is_symlink():
                files.append(
                    SourceFile(rel, None, _symlink_error(rel, os.readlink(full), root, full))
                )
                continue
            try:
                size = full.stat().st_size
                total_bytes += size
                if (over := budget_error(len(files) + 1, total_bytes, limits)) is not None:
                    return [SourceFile(BUDGET_FILE, None, over)]  # read no further
                if size > file_limits(rel, limits).max_bytes:
                    files.append(
                        SourceFile(rel, None, _too_large(rel, size, file_limits(rel, limits)))
                    )
                    continue
                if not full.is_file():
                    files.append(
                        SourceFile(
                            rel,
                            None,
                            Finding(rel, None, None, "$", "not a regular file", "layout"),
                        )
                    )
                    continue
                with full.open("rb") as fh:
                    files.append(SourceFile(rel, fh.read(limits.max_bytes + 1)))
            except OSError as e:
                files.append(
                    SourceFile(
                        rel,
                        None,
                        Finding(rel, None, None, "$", f"cannot read: {e.strerror}", "io"),
                    )
                )
    return files


def _symlink_error(
    path: str, target: str, root: Path | None = None, full: Path | None = None
) -> Finding:
    outside = False
    if root is not None and full is not None:
        # realpath, unlike Path.resolve, does not raise on a link loop.
        resolved = Path(os.path.realpath(full.parent / target))
        outside = not resolved.is_relative_to(root)
    else:
        normalised = os.path.normpath(os.path.join(os.path.dirname(path), target))
        outside = os.path.isabs(target) or normalised.startswith("..")
    where = "outside the repository" if outside else "inside the repository"
    return Finding(
        path,
        None,
        None,
        "$",
        f"is a symbolic link to {target!r} ({where}); gitsched does not follow links: commit the file itself",
        "symlink",
    )


def _too_large(path: str, size: int, limits: Limits) -> Finding:
    return Finding(
        path,
        None,
        None,
        "$",
        f"file is {size} bytes; "
        + ("a team's files" if path.startswith("teams/") else "spec files")
        + f" may be at most {limits.max_bytes} bytes",
        "too-large",
    )


K = TypeVar("K")
V = TypeVar("V")

# One file's documents that passed their schema, those that did not (their references
# are still checked), and every error of the file itself.
_Parsed = tuple[tuple[Document, ...], tuple[Document, ...], tuple[Finding, ...]]


def _parse_file(path: str, content: bytes, limits: Limits) -> _Parsed:
    docs, errors = schemas.parse_documents(content, path, limits)
    if not content.strip() or (not docs and not errors):
        # Read as "nothing here", an emptied file would silently withdraw what it defined.
        return (
            (),
            (),
            (
                Finding(
                    path,
                    None,
                    None,
                    "$",
                    "the file is empty (no YAML document, only whitespace or comments); to remove"
                    " what it defined (a job: to withdraw it), delete the file",
                    "empty",
                ),
            ),
        )
    all_errors = list(errors)
    valid: list[Document] = []
    invalid: list[Document] = []
    for doc in docs:
        doc_errors = schemas.validate_document(doc)
        all_errors.extend(doc_errors)
        (invalid if doc_errors else valid).append(doc)
    return tuple(valid), tuple(invalid), tuple(all_errors)


@dataclass(frozen=True, slots=True)
class _FileRead:
    """What one file gives a load: its documents that passed their schema and those that
    did not, its own errors, and for an OWNERS file the team and its owners."""

    valid: tuple[Document, ...] = ()
    invalid: tuple[Document, ...] = ()
    errors: tuple[Finding, ...] = ()
    owners: tuple[str, tuple[Owner, ...]] | None = None
    members: tuple[str, tuple[str, ...]] | None = None
    # The valid documents by the group build_desired puts them in, in their order.
    groups: tuple[tuple[str | None, tuple[Document, ...]], ...] = ()


def _group(kind: str | None) -> str | None:
    """The group build_desired takes a document of `kind` from: nodes and node pools
    together, and jobs and workspaces (a workspace is a one-replica job: one model, one
    placement path, docs/workspaces.md)."""
    return "Node" if kind == "NodePool" else "Job" if kind == "Workspace" else kind


def _groups(docs: Iterable[Document]) -> dict[str | None, list[Document]]:
    grouped: dict[str | None, list[Document]] = {}
    for doc in docs:  # (a document's kind is looked up in its data: once each)
        grouped.setdefault(_group(doc.kind), []).append(doc)
    return grouped


# A Kubernetes namespace name (RFC 1123 label): `serve` creates a team's pods in the
# namespace named after its folder, so a folder no namespace can be named after is an error.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAMESPACE_MAX_CHARS = 63


def team_name_problem(team: str) -> str | None:
    """Why `team` cannot name a Kubernetes namespace; None when it can."""
    if len(team) > NAMESPACE_MAX_CHARS:
        return f"is {len(team)} characters long; a namespace name has at most {NAMESPACE_MAX_CHARS}"
    if _NAMESPACE.fullmatch(team) is None:
        return (
            "is not a valid Kubernetes namespace name (RFC 1123 label): only lowercase letters "
            "a-z, digits and '-', starting and ending with a letter or digit"
        )
    return None


def _team_folder_error(path: str) -> Finding | None:
    parts = _parts(path)
    if len(parts) < 3 or parts[0] != "teams":
        return None
    problem = team_name_problem(parts[1])
    if problem is None:
        return None
    return Finding(
        path,
        None,
        None,
        "$",
        f"team folder {parts[1]!r} {problem}; serve creates the team's pods in the namespace "
        "named after it: rename the folder",
        "team-name",
    )


def _read(f: SourceFile, limits: Limits) -> _FileRead:
    if f.problem is not None:
        return _FileRead(errors=(f.problem,))
    if (bad_team := _team_folder_error(f.path)) is not None:
        return _FileRead(errors=(bad_team,))
    assert f.content is not None
    if is_owners_file(f.path):
        parts = PurePosixPath(f.path).parts
        team = parts[1] if len(parts) == 3 else PLATFORM
        listed, problems = parse_owners(f.content.decode("utf-8", "replace"))
        found = tuple(Finding(f.path, n, None, "$", m, "owners") for n, m in problems)
        return _FileRead(errors=found, owners=(team, listed))
    if is_members_file(f.path):
        listed_members, problems = parse_members(f.content.decode("utf-8", "replace"))
        found = tuple(Finding(f.path, n, None, "$", m, "members") for n, m in problems)
        return _FileRead(errors=found, members=(PurePosixPath(f.path).parts[1], listed_members))
    if policies.place_of(f.path).area == "elsewhere":
        return _FileRead(
            errors=(
                Finding(
                    f.path,
                    None,
                    None,
                    "$",
                    "YAML file outside the cluster repo layout (cluster.yaml, inventory/, "
                    "teams/<team>/queue.yaml, teams/<team>/jobs/, teams/<team>/workspaces/, "
                    "teams/<team>/services/, policies/): it would be ignored",
                    "layout",
                ),
            )
        )
    valid, invalid, errors = _parse_file(f.path, f.content, file_limits(f.path, limits))
    groups = tuple((group, tuple(docs)) for group, docs in _groups(valid).items())
    return _FileRead(valid, invalid, errors, groups=groups)


class _LastTwoLoads(Generic[K, V]):
    """Values by key, made when first asked for; a load keeps what it and the load
    before it used, and drops the rest."""

    def __init__(self) -> None:
        self._values: dict[K, V] = {}
        self._last: set[K] = set()

    def load(self, keys: Sequence[K], make: Callable[[list[K]], Mapping[K, V]]) -> list[V]:
        missing = list(dict.fromkeys(k for k in keys if k not in self._values))
        if missing:
            self._values.update(make(missing))
        used = set(keys)
        keep = used | self._last
        self._values = {k: v for k, v in self._values.items() if k in keep}
        self._last = used
        return [self._values[k] for k in keys]


@dataclass(frozen=True, slots=True)
class _Listing:
    """The spec files of the commit read last, by path, and their paths in order."""

    rev: str
    limits: Limits
    files: dict[str, SourceFile]
    paths: list[str]


class SpecCache:
    """What a long-running reader of one repository keeps from commit to commit.

    The spec files of the commit read last, so the next is read as a difference from it
    (`git diff-tree`: a commit of 50 files among 50,000 lists and reads those 50); what
    each file gave (documents that passed their schema, its own errors), so only changed
    files are parsed and validated; the cross-file rules' findings
    (policies.RepositoryCheck), so a commit of jobs re-checks its jobs; and the models
    built from unchanged documents (clusters, nodes, queues, jobs). A load gives the same
    result as one without the cache. Blob contents by git object id are kept for the last
    two loads, and which paths are spec files.
    """

    def __init__(self) -> None:
        self._blobs: _LastTwoLoads[str, bytes] = _LastTwoLoads()
        self._listing: _Listing | None = None
        # Each file's read, by path, while its SourceFile is the same object.
        self._reads: dict[str, tuple[SourceFile, _FileRead]] = {}
        self._reads_limits: Limits | None = None
        self.rules = policies.RepositoryCheck()
        # Each valid document's model, by the document object the file cache hands out
        # again while the file is unchanged (checked by identity: ids are reused), with
        # what else the model was made from (a job's queue and cluster: the cluster's
        # model is kept too, so the tuples compare by identity first, in C).
        self._models: dict[int, tuple[Document, tuple[object, ...], Any]] = {}
        # Each job document's key and model, by id, while the queues of the teams and
        # the cluster (the frame) are those of the last build.
        self._jobs: dict[int, tuple[Document, str, Job]] = {}
        self._jobs_frame: tuple[object, ...] | None = None
        self._spec_paths: dict[str, bool] = {}

    def model(self, doc: Document, context: tuple[object, ...], make: Callable[[], V]) -> V:
        """`make()`, the model of `doc` made with `context`; kept while both are unchanged."""
        found = self._models.get(id(doc))
        if found is not None and found[0] is doc and found[1] == context:
            value: V = found[2]
            return value
        value = make()
        self._models[id(doc)] = (doc, context, value)
        return value

    def kept_jobs(self, frame: tuple[object, ...]) -> dict[int, tuple[Document, str, Job]]:
        """The jobs the last build made, if it had the same frame; else none."""
        return self._jobs if frame == self._jobs_frame else {}

    def keep_jobs(
        self,
        others: Sequence[Document],
        frame: tuple[object, ...],
        jobs: dict[int, tuple[Document, str, Job]],
    ) -> None:
        """Keep this build's jobs; forget the models of documents (`others`: all but the
        jobs, the ones `model` is asked for) no longer in the repository."""
        self._jobs, self._jobs_frame = jobs, frame
        live = {id(d) for d in others}
        self._models = {k: v for k, v in self._models.items() if k in live}

    def is_spec_file(self, path: str) -> bool:
        found = self._spec_paths.get(path)
        if found is None:
            if len(self._spec_paths) > 4 * MAX_KEPT_PATHS:
                self._spec_paths.clear()
            found = self._spec_paths[path] = is_spec_file(path)
        return found

    def blobs(self, repo: GitRepo, shas: Sequence[str]) -> dict[str, bytes]:
        return dict(zip(shas, self._blobs.load(shas, repo.read_blobs), strict=True))

    def source_files(self, repo: GitRepo, rev: str, limits: Limits) -> list[SourceFile]:
        """`read_commit(repo, rev, limits)`: as a difference from the commit read last when
        both are named by commit id (a name may move) and few paths changed."""
        last = self._listing
        changed = None
        if last is not None and last.limits == limits and _COMMIT_ID.fullmatch(rev):
            try:
                changed = repo.changed_paths(last.rev, rev, MAX_CHANGED_PATHS)
            except GitError:  # the last commit is gone (history rewritten): list it all
                changed = None
        read = partial(self.blobs, repo)
        if last is None or changed is None:
            entries = repo.tree(rev)
            files = {
                f.path: f for f in _source_files(repo, entries, limits, read, self.is_spec_file)
            }
            paths = sorted(files)
        else:
            files, paths = dict(last.files), list(last.paths)
            for path in changed:
                if files.pop(path, None) is not None:
                    del paths[bisect.bisect_left(paths, path)]
            entries = repo.tree(rev, changed)
            for f in _source_files(repo, entries, limits, read, self.is_spec_file):
                if files.get(f.path) is None:
                    bisect.insort(paths, f.path)
                files[f.path] = f
        if _COMMIT_ID.fullmatch(rev) and BUDGET_FILE not in files:
            self._listing = _Listing(rev, limits, files, paths)
        return [files[p] for p in paths]

    def reads(self, files: Sequence[SourceFile], limits: Limits) -> list[_FileRead]:
        """What each file gives, read again only where the file differs from the one at its
        path last time (the same object, while the listing is a difference from the last)."""
        if limits != self._reads_limits:
            self._reads, self._reads_limits = {}, limits
        kept = self._reads
        now: dict[str, tuple[SourceFile, _FileRead]] = {}
        out: list[_FileRead] = []
        for f in files:
            found = kept.get(f.path)
            if found is not None and (found[0] is f or found[0] == f):
                read = found[1]
            else:
                read = _read(f, limits)
            now[f.path] = (f, read)
            out.append(read)
        self._reads = now
        return out


def parse_files(
    files: Sequence[SourceFile], limits: Limits = DEFAULT_LIMITS, cache: SpecCache | None = None
) -> LoadedSpecs:
    errors: list[Finding] = []
    valid: list[Document] = []
    invalid: list[Document] = []
    owners: dict[str, tuple[Owner, ...]] = {}
    members: dict[str, tuple[str, ...]] = {}
    by_group: dict[str | None, list[Document]] = {}
    if (over := _over_budget(files, limits)) is not None:
        return LoadedSpecs(None, (over,))
    reads = cache.reads(files, limits) if cache is not None else [_read(f, limits) for f in files]
    for read in reads:
        valid.extend(read.valid)
        invalid.extend(read.invalid)
        errors.extend(read.errors)
        for group, docs in read.groups:
            by_group.setdefault(group, []).extend(docs)
        if read.owners is not None:
            owners[read.owners[0]] = read.owners[1]
        if read.members is not None:
            members[read.members[0]] = read.members[1]
    merged = policies.merge_policies(by_group.get("Policy", []))
    # Cross-file rules run on every valid document even when others failed, and the
    # references of those that failed their schema are checked too: one run, every error.
    check = cache.rules.check if cache is not None else policies.check_repository
    errors.extend(check(valid, merged, unchecked=invalid, broken_files={e.file for e in errors}))
    if not errors:
        try:
            desired = build_desired(valid, merged, owners, cache, by_group=by_group)
        except _ModelError as e:
            errors.append(e.error)
        else:
            errors.extend(_spread_errors(by_group.get("InferenceService", []), desired))
        if not errors:
            kept = {team: listed for team, listed in sorted(members.items()) if listed}
            desired = dataclasses.replace(desired, members=kept)
            return LoadedSpecs(desired, (), tuple(valid), owners, members)
    return LoadedSpecs(None, tuple(sorted(errors, key=_error_order)), tuple(valid), owners, members)


def _spread_errors(services: Sequence[Document], desired: DesiredState) -> list[Finding]:
    """Each service's spread against the static inventory's domains (none: the live
    inventory decides, and a replica that does not fit waits with its reason)."""
    if not services or not desired.nodes:
        return []
    domains: dict[str, int] = {}
    for level in ("node", *desired.cluster.topology_levels):
        domains[level] = len({n.domain(level) for n in desired.nodes.values()})
    found: list[Finding] = []
    for doc in services:
        found.extend(policies.spread_findings(doc, domains))
    return found


def _error_order(e: Finding) -> tuple[str, int, int, str]:
    return (e.file, e.line or 0, e.column or 0, e.message)


class _ModelError(Exception):
    def __init__(self, error: Finding) -> None:
        super().__init__(error.message)
        self.error = error


# -- documents -> domain model ------------------------------------------------------------


def build_desired(
    docs: Sequence[Document],
    merged_policy: Mapping[str, Any],
    owners: Mapping[str, tuple[Owner, ...]] | None = None,
    cache: SpecCache | None = None,
    *,
    by_group: Mapping[str | None, Sequence[Document]] | None = None,
) -> DesiredState:
    """The desired state `docs` declare; `by_group`, when given, is `docs` by `_group`
    of their kind, in their order."""
    by_kind = _groups(docs) if by_group is None else by_group

    def model(doc: Document, context: tuple[object, ...], make: Callable[[], V]) -> V:
        return make() if cache is None else cache.model(doc, context, make)

    cluster_doc = by_kind["Cluster"][0]
    cluster = model(
        cluster_doc,
        (),
        partial(_cluster, cluster_doc.data["spec"], cluster_doc.name or "cluster"),
    )
    nodes: dict[str, Node] = {}
    for doc in by_kind.get("Node", []):  # and NodePool, in the documents' order
        built = model(doc, (), partial(_nodes_of, doc))
        for node in built:
            if node.name in nodes:
                raise _ModelError(
                    doc.error(
                        ("metadata", "name"),
                        f"node {node.name} is declared twice",
                        "duplicate-name",
                    )
                )
            nodes[node.name] = node
    queues: dict[str, Queue] = {}
    team_queue: dict[str, str] = {}
    for doc in by_kind.get("Queue", []):
        team = policies.place_of(doc.file).team or ""
        queue = model(doc, (team,), partial(_queue, doc.name or team, doc.data["spec"], team))
        queues[queue.name] = queue
        team_queue[team] = queue.name
    jobs: dict[str, Job] = {}
    # A job's model depends on its document, its team's queue (its default time limit) and
    # the cluster.
    limits = tuple((name, q.time_limits) for name, q in sorted(queues.items()))
    frame = (tuple(team_queue.items()), cluster, limits)
    kept = cache.kept_jobs(frame) if cache is not None else {}
    made: dict[int, tuple[Document, str, Job]] = {}
    for doc in by_kind.get("Job", []):
        found = kept.get(id(doc))
        if found is not None and found[0] is doc:
            made[id(doc)] = found
            jobs[found[1]] = found[2]
            continue
        team = policies.place_of(doc.file).team or ""
        spec = doc.data["spec"]
        queue_name = spec.get("queue") or team_queue.get(team, team)
        job = _job(
            doc.name or "", spec, queue_name, cluster, doc.file, queues.get(queue_name), doc.kind
        )
        made[id(doc)] = (doc, job.key, job)
        jobs[job.key] = job
    services: dict[str, InferenceService] = {}
    for doc in by_kind.get("InferenceService", []):
        team = policies.place_of(doc.file).team or ""
        spec = doc.data["spec"]
        queue_name = spec.get("queue") or team_queue.get(team, team)
        service = _service(doc.name or "", team, spec, queue_name, cluster, doc.file)
        services[service.key] = service
    if cache is not None:
        cache.keep_jobs(
            [d for group, ds in by_kind.items() if group != "Job" for d in ds], frame, made
        )
    return DesiredState(
        cluster=cluster,
        policy=policy_of(merged_policy),
        nodes=nodes,
        queues=queues,
        jobs=jobs,
        owners={team: listed for team, listed in sorted((owners or {}).items()) if listed},
        services=services,
    )


def _nodes_of(doc: Document) -> list[Node]:
    """The nodes a Node or NodePool document declares."""
    labels = doc.data["metadata"].get("labels", {})
    if doc.kind == "Node":
        return [_node(doc.name or "", doc.data["spec"], labels)]
    return _node_pool(doc.data["spec"], labels)


def _cluster(spec: Mapping[str, Any], name: str) -> ClusterSpec:
    return ClusterSpec(
        name=name,
        topology_levels=tuple(spec.get("topologyLevels", ())),
        gpu_flavors=tuple(
            GpuFlavor(f["name"], f.get("model", f["name"]), int(f.get("memoryGiB", 0)))
            for f in spec.get("gpuFlavors", ())
        ),
        priority_classes=tuple(
            PriorityClass(
                p["name"], int(p["value"]), (p.get("preemption") or {}).get("minRuntimeMinutes")
            )
            for p in spec.get("priorityClasses", ())
        ),
        default_priority_class=spec.get("defaultPriorityClass", ""),
    )


def _node(
    name: str,
    spec: Mapping[str, Any],
    labels: Mapping[str, str],
    topology: Mapping[str, str] | None = None,
) -> Node:
    return Node(
        name=name,
        flavor=spec.get("flavor"),
        gpus=int(spec.get("gpus", 0)),
        cpu_milli=milli_from_cores(spec.get("cpu", 0)),
        memory_mib=mib_from_gib(spec.get("memoryGiB", 0)),
        topology=dict(topology if topology is not None else spec.get("topology", {})),
        region=spec.get("region"),
        isolation=Isolation(spec.get("isolation", "shared")),
        state=NodeState(spec.get("state", "Ready")),
        labels=dict(labels),
    )


def _node_pool(spec: Mapping[str, Any], labels: Mapping[str, str]) -> list[Node]:
    count = int(spec["count"])
    width = max(2, len(str(count)))
    prefix = spec["namePrefix"]
    template = spec["template"]
    nodes = []
    for i in range(1, count + 1):
        topology = dict(spec.get("topology", {}))
        for domain in spec.get("domains", ()):
            group = (i - 1) // int(domain["nodesPerDomain"]) + 1
            topology[domain["level"]] = f"{domain['namePrefix']}{group}"
        nodes.append(_node(f"{prefix}{i:0{width}d}", template, labels, topology))
    return nodes


def _queue(name: str, spec: Mapping[str, Any], team: str) -> Queue:
    def limit(q: Mapping[str, Any], key: str) -> int | None:
        return milli_from_gpus(q[key]) if q.get(key) is not None else None

    return Queue(
        name=name,
        team=spec.get("team", team),
        cohort=spec.get("cohort"),
        weight=float(spec.get("weight", 1)),
        max_priority_class=spec.get("maxPriorityClass"),
        reclaim_within_cohort=(
            PreemptionScope(spec["preemption"]["reclaimWithinCohort"])
            if "reclaimWithinCohort" in spec.get("preemption", {})
            else None
        ),
        quotas=tuple(
            FlavorQuota(
                flavor=q["flavor"],
                nominal=milli_from_gpus(q["nominal"]),
                borrowing_limit=limit(q, "borrowingLimit"),
                lending_limit=limit(q, "lendingLimit"),
            )
            for q in spec.get("quotas", ())
        ),
        retry=retry_of(spec.get("retry")),
        min_runtime_minutes=(spec.get("preemption") or {}).get("minRuntimeMinutes"),
        queueing_strategy=QueueingStrategy(spec.get("queueingStrategy", "BestEffortFIFO")),
        time_limits=QueueTimeLimits(
            default_minutes=spec.get("timeLimits", {}).get("defaultMinutes"),
            max_minutes=spec.get("timeLimits", {}).get("maxMinutes"),
        ),
    )


def retry_of(spec: Mapping[str, Any] | None) -> RetryPolicy | None:
    """spec.retry of a Job, Queue or Policy; None when it is not there."""
    if spec is None:
        return None
    base = RetryPolicy()
    return RetryPolicy(
        max_retries=int(spec.get("maxRetries", base.max_retries)),
        backoff_seconds=int(spec.get("backoffSeconds", base.backoff_seconds)),
        max_backoff_seconds=int(spec.get("maxBackoffSeconds", base.max_backoff_seconds)),
    )


def _job(
    name: str,
    spec: Mapping[str, Any],
    queue: str,
    cluster: ClusterSpec,
    file: str,
    queue_model: Queue | None = None,
    kind: str | None = "Job",
) -> Job:
    resources = spec.get("resources", {})
    idle = spec.get("idle") or {}
    resume = spec.get("resume")
    topology = spec.get("topology")
    priority_class = spec.get("priorityClass") or cluster.default_priority_class
    return Job(
        name=name,
        queue=queue,
        replicas=int(spec.get("replicas", 1)),
        min_replicas=spec.get("minReplicas"),
        resources=Resources(
            gpu_milli=milli_from_gpus(resources.get("gpu", 0)),
            cpu_milli=milli_from_cores(resources.get("cpu", 0)),
            memory_mib=mib_from_gib(resources.get("memoryGiB", 0)),
        ),
        gpu_flavors=tuple(spec.get("gpuFlavors", ())),
        topology=TopologyRequirement(
            topology.get("level"),
            TopologyMode(topology.get("mode", "required")),
            topology.get("sliceSize"),
            topology.get("sliceLevel"),
        )
        if topology
        else None,
        priority_class=priority_class,
        priority=cluster.priority_value(priority_class) if priority_class else 0,
        preemptible=bool(spec.get("preemptible", True)),
        checkpoint_interval_minutes=spec.get("checkpointIntervalMinutes"),
        isolation=Isolation(spec.get("isolation", "shared")),
        residency=tuple(spec.get("residency", ())),
        file=file,
        template=spec.get("template"),
        retry=retry_of(spec.get("retry")),
        time_limit_minutes=_time_limit(spec, queue_model),
        kind=kind or "Job",
        suspend=bool(spec.get("suspend", False)),
        idle_suspend_after_minutes=idle.get("suspendAfterMinutes"),
        resume="" if resume is None else str(resume),
    )


def _service(
    name: str,
    team: str,
    spec: Mapping[str, Any],
    queue: str,
    cluster: ClusterSpec,
    file: str,
) -> InferenceService:
    resources = spec.get("resources", {})
    priority_class = spec.get("priorityClass") or cluster.default_priority_class
    update = spec.get("rollingUpdate", {})
    base = RollingUpdate()
    return InferenceService(
        name=name,
        team=team,
        queue=queue,
        min_replicas=int(spec["replicas"]["min"]),
        max_replicas=int(spec["replicas"]["max"]),
        resources=Resources(
            gpu_milli=milli_from_gpus(resources.get("gpu", 0)),
            cpu_milli=milli_from_cores(resources.get("cpu", 0)),
            memory_mib=mib_from_gib(resources.get("memoryGiB", 0)),
        ),
        priority_class=priority_class,
        priority=cluster.priority_value(priority_class) if priority_class else 0,
        gpu_flavors=tuple(spec.get("gpuFlavors", ())),
        residency=tuple(spec.get("residency", ())),
        checkpoint_interval_minutes=spec.get("checkpointIntervalMinutes"),
        spread=tuple(Spread(s["topology"], int(s["maxPerDomain"])) for s in spec.get("spread", ())),
        rolling_update=RollingUpdate(
            max_surge=update.get("maxSurge", base.max_surge),
            max_unavailable=update.get("maxUnavailable", base.max_unavailable),
        ),
        suspend=bool(spec.get("suspend", False)),
        template=spec.get("template"),
        autoscaling=spec.get("autoscaling"),
        file=file,
    )


def _time_limit(spec: Mapping[str, Any], queue: Queue | None) -> int | None:
    """The job's own limit, else its queue's default (docs/time.md)."""
    own = spec.get("timeLimitMinutes")
    if own is not None:
        return int(own)
    return queue.time_limits.default_minutes if queue is not None else None


def policy_of(spec: Mapping[str, Any]) -> Policy:
    """The engine's Policy from a merged Policy spec (policies.merge_policies)."""
    solver = spec.get("solver", {})
    objective = spec.get("objective", {})
    preemption = spec.get("preemption", {})
    approval = spec.get("approval", {})
    base = Policy()
    return Policy(
        solver=solver.get("name", base.solver),
        time_limit_s=float(solver.get("timeLimitSeconds", base.time_limit_s)),
        gap_tolerance=float(solver.get("gapTolerance", base.gap_tolerance)),
        node_limit=int(solver.get("nodeLimit", base.node_limit)),
        levels=str(solver.get("levels", base.levels)),
        priority_weight=float(objective.get("priorityWeight", base.priority_weight)),
        move_cost=float(objective.get("moveCost", base.move_cost)),
        preemption_cost=float(objective.get("preemptionCost", base.preemption_cost)),
        fragmentation_weight=float(objective.get("fragmentationWeight", base.fragmentation_weight)),
        compactness_weight=float(objective.get("compactnessWeight", base.compactness_weight)),
        fairness_weight=float(objective.get("fairnessWeight", base.fairness_weight)),
        preemption_enabled=bool(preemption.get("enabled", base.preemption_enabled)),
        max_moves_per_solve=(
            int(preemption["maxMovesPerSolve"])
            if preemption.get("maxMovesPerSolve") is not None
            else base.max_moves_per_solve
        ),
        preempt_within_queue=PreemptionScope(
            preemption.get("withinQueue", base.preempt_within_queue)
        ),
        reclaim_within_cohort=PreemptionScope(
            preemption.get("reclaimWithinCohort", base.reclaim_within_cohort)
        ),
        require_owner_approval=bool(
            approval.get("requireOwnerApproval", base.require_owner_approval)
        ),
        require_signed_approval=bool(
            approval.get("requireSignedApproval", base.require_signed_approval)
        ),
        require_member_for_jobs=bool(
            approval.get("requireMemberForJobs", base.require_member_for_jobs)
        ),
        team_namespaces=(
            tuple(sorted(set(approval["teamNamespaces"])))
            if approval.get("teamNamespaces") is not None
            else base.team_namespaces
        ),
        usage_half_life_hours=float(
            spec.get("fairness", {}).get("usageHalfLifeHours", base.usage_half_life_hours)
        ),
        idle=_idle_policy(spec.get("idle", {}), base.idle),
        retry=retry_of(spec.get("retry")),
        requeue_timestamp=RequeueTimestamp(
            spec.get("retry", {}).get("requeueTimestamp", base.requeue_timestamp)
        ),
        backfill=BackfillPolicy(
            reservations=int(
                spec.get("backfill", {}).get("reservations", base.backfill.reservations)
            ),
            yield_to_reclaim=bool(
                spec.get("backfill", {}).get("yieldToReclaim", base.backfill.yield_to_reclaim)
            ),
        ),
        pod_security=pod_security_policy(spec),
    )


def _idle_policy(idle: Mapping[str, Any], base: IdlePolicy) -> IdlePolicy:
    return IdlePolicy(
        enabled=bool(idle.get("enabled", base.enabled)),
        threshold_percent=float(idle.get("thresholdPercent", base.threshold_percent)),
        window_minutes=float(idle.get("windowMinutes", base.window_minutes)),
        grace_minutes=float(idle.get("graceMinutes", base.grace_minutes)),
        exempt_priority_classes=tuple(
            sorted(idle.get("exemptPriorityClasses", base.exempt_priority_classes))
        ),
        exempt_queues=tuple(sorted(idle.get("exemptQueues", base.exempt_queues))),
        action=IdleAction(idle.get("action", base.action)),
    )


def load_commit(
    repo: GitRepo, rev: str, limits: Limits = DEFAULT_LIMITS, cache: SpecCache | None = None
) -> LoadedSpecs:
    if (problem := repo.unreadable.get(rev)) is not None:
        # Rejected by its sha like any bad commit, and the commits after it go on.
        finding = Finding("(commit)", None, None, "$", f"gitsched cannot read commit {rev[:12]}: "
                          f"{problem}", "unreadable-commit")  # fmt: skip
        return LoadedSpecs(None, (finding,))
    return parse_files(read_commit(repo, rev, limits, cache), limits, cache)


def load_worktree(root: Path, limits: Limits = DEFAULT_LIMITS) -> LoadedSpecs:
    return parse_files(read_worktree(root, limits), limits)


__all__ = [
    "LoadedSpecs",
    "SourceFile",
    "SpecCache",
    "build_desired",
    "job_key",
    "load_commit",
    "load_worktree",
    "parse_files",
    "read_commit",
    "read_worktree",
]
