"""Rules that need more than one document: layout, names, references and admission.

A commit is judged as a whole, so every broken rule in every file is reported at the
line of the field that breaks it, and a pull request shows all of them at once.
"""

from __future__ import annotations

import bisect
import difflib
import functools
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from gitsched.engine.model import PodSecurityPolicy, Resources
from gitsched.engine.units import mib_from_gib, milli_from_cores, milli_from_gpus
from gitsched.findings import Finding
from gitsched.policies.pod_security import (
    DEFAULT_SERVICE_ACCOUNT,
    pod_security_policy,
    template_problems,
)
from gitsched.schemas import Document, JsonPath

CLUSTER_FILE = "cluster.yaml"
_YAML_SUFFIXES = (".yaml", ".yml")
_HOMES = {
    "Cluster": "cluster.yaml",
    "Node": "inventory/<name>.yaml",
    "NodePool": "inventory/<name>.yaml",
    "Queue": "teams/<team>/queue.yaml",
    "Job": "teams/<team>/jobs/<name>.yaml",
    "Workspace": "teams/<team>/workspaces/<name>.yaml",
    "Policy": "policies/<name>.yaml",
    "InferenceService": "teams/<team>/services/<name>.yaml",
}
_AREA_OF_KIND = {
    "Cluster": "cluster",
    "Node": "inventory",
    "NodePool": "inventory",
    "Queue": "queue",
    "Job": "jobs",
    "Workspace": "workspaces",
    "Policy": "policies",
    "InferenceService": "services",
}
_IMPLICIT_LEVEL = "node"
# The kinds placed as jobs (a Workspace is a one-replica job, docs/workspaces.md): each is
# checked by the job rules, and a job's name is unique in its queue across both.
WORK_KINDS = frozenset(("Job", "Workspace"))


@dataclass(frozen=True, slots=True)
class Place:
    """Where a file sits in the cluster repo: its area and, under teams/, its team."""

    area: str  # cluster | inventory | queue | jobs | workspaces | services | policies | elsewhere
    team: str | None = None


@functools.lru_cache(maxsize=1 << 16)
def place_of(file: str) -> Place:
    """(Cached: every commit asks again for each of thousands of files.)"""
    parts = PurePosixPath(file).parts
    if not file.endswith(_YAML_SUFFIXES):
        return Place("elsewhere")
    if len(parts) == 1 and parts[0] in ("cluster.yaml", "cluster.yml"):
        return Place("cluster")
    if len(parts) == 2 and parts[0] in ("inventory", "policies"):
        return Place(parts[0])
    if len(parts) == 3 and parts[0] == "teams" and parts[2] in ("queue.yaml", "queue.yml"):
        return Place("queue", parts[1])
    if len(parts) == 4 and parts[0] == "teams" and parts[2] in ("jobs", "workspaces", "services"):
        return Place(parts[2], parts[1])
    return Place("elsewhere")


@dataclass(frozen=True, slots=True)
class _Cluster:
    """What other documents may refer to, as the Cluster document defines it."""

    doc: Document
    flavors: tuple[str, ...]
    classes: Mapping[str, int]
    levels: tuple[str, ...]
    default_class: str | None


def check_repository(
    docs: Sequence[Document],
    policy: Mapping[str, Any],
    *,
    unchecked: Sequence[Document] = (),
    broken_files: Collection[str] = (),
) -> tuple[Finding, ...]:
    """Every cross-document problem of one commit's valid documents, sorted by file and line.

    `unchecked` are documents that parsed but broke their schema: their references
    (flavors, priority classes, levels, queues) are checked too, so one run reports
    every error, as check-jsonschema does. `broken_files` had errors of their own: a
    job whose queue lives in one is not also told that its queue is missing.
    """
    ordered = sorted(docs, key=_doc_order)
    frame, errors = _frame(
        [d for d in ordered if d.kind not in WORK_KINDS], policy, unchecked, broken_files
    )
    jobs_by_queue: dict[str, list[Document]] = defaultdict(list)
    for doc in ordered:
        if doc.kind in WORK_KINDS:
            queue, found = _job_findings(doc, frame)
            if queue is not None:
                jobs_by_queue[queue].append(doc)
            errors.extend(found)
    for queue_name, jobs in jobs_by_queue.items():
        errors.extend(_duplicate_jobs(jobs, queue_name))
    errors.extend(_unchecked_findings(unchecked, frame))
    return _in_order(errors)


class RepositoryCheck:
    """`check_repository` kept from commit to commit, for a reader of one repository.

    Each job's findings depend on the job's own document and on the frame the other
    documents make (the cluster, the queues, the admission limits, the files with
    errors of their own), and a job's name must be unique in its queue. So while the
    frame's documents are the same objects as last time (the reconciler's SpecCache hands out
    the same Document while its file is unchanged), a commit that adds or removes jobs
    is checked in the size of the commit: its jobs' findings, and the names of the
    queues they join or leave; every other job's findings are the ones kept. Anything
    else (a frame document changed, other policy limits, another set of broken files)
    is checked in full. Either way the findings are those of `check_repository`.
    """

    def __init__(self) -> None:
        # Every document of the last check by id: held, so no other object takes an id.
        self._docs: dict[int, Document] = {}
        self._frame_key: tuple[object, ...] | None = None
        self._frame: _Frame | None = None
        self._frame_errors: list[Finding] = []
        self._unchecked: tuple[Document, ...] = ()
        # Each job's queue and findings, by id(doc); the jobs that have findings.
        self._jobs: dict[int, tuple[str | None, tuple[Finding, ...]]] = {}
        self._failing: dict[int, Document] = {}
        # Jobs by queue and name, each list in document order; the names taken twice.
        self._names: dict[tuple[str, str], list[Document]] = {}
        self._twice: set[tuple[str, str]] = set()

    def check(
        self,
        docs: Sequence[Document],
        policy: Mapping[str, Any],
        *,
        unchecked: Sequence[Document] = (),
        broken_files: Collection[str] = (),
    ) -> tuple[Finding, ...]:
        """`check_repository(docs, policy, unchecked=..., broken_files=...)`."""
        current = {id(d): d for d in docs}
        if len(current) != len(docs):  # one document twice: no case to keep
            self._docs, self._frame = {}, None
            return check_repository(docs, policy, unchecked=unchecked, broken_files=broken_files)
        admission = policy.get("admission")
        frame_key = (
            dict(admission) if isinstance(admission, Mapping) else None,
            pod_security_policy(policy),
            tuple(id(d) for d in unchecked),
            frozenset(broken_files),
        )
        added = [current[i] for i in current.keys() - self._docs.keys()]
        removed = [self._docs[i] for i in self._docs.keys() - current.keys()]
        if (
            self._frame is None
            or frame_key != self._frame_key
            or any(i not in self._jobs for i in map(id, removed))
            or any(d.kind not in WORK_KINDS for d in added)
        ):
            self._rebuild(current, policy, unchecked, broken_files)
            # The key names the unchecked documents by id: held, so the ids stay theirs.
            self._frame_key, self._unchecked = frame_key, tuple(unchecked)
        else:
            for doc in removed:
                self._forget_job(doc)
            for doc in sorted(added, key=_doc_order):
                self._add_job(doc, self._frame)
            self._docs = current
        assert self._frame is not None
        errors = list(self._frame_errors)
        for doc in sorted(self._failing.values(), key=_doc_order):
            errors.extend(self._jobs[id(doc)][1])
        for queue, name in sorted(self._twice):
            errors.extend(_duplicate_jobs(self._names[queue, name], queue))
        errors.extend(_unchecked_findings(unchecked, self._frame))
        return _in_order(errors)

    def _rebuild(
        self,
        current: dict[int, Document],
        policy: Mapping[str, Any],
        unchecked: Sequence[Document],
        broken_files: Collection[str],
    ) -> None:
        ordered = sorted(current.values(), key=_doc_order)
        self._frame, self._frame_errors = _frame(
            [d for d in ordered if d.kind not in WORK_KINDS], policy, unchecked, broken_files
        )
        self._docs = current
        self._jobs, self._failing, self._names, self._twice = {}, {}, {}, set()
        for doc in ordered:
            if doc.kind in WORK_KINDS:
                self._add_job(doc, self._frame)

    def _add_job(self, doc: Document, frame: _Frame) -> None:
        queue, found = _job_findings(doc, frame)
        self._jobs[id(doc)] = (queue, found)
        if found:
            self._failing[id(doc)] = doc
        if queue is None:
            return
        key = (queue, _name(doc))
        group = self._names.setdefault(key, [])
        bisect.insort(group, doc, key=_doc_order)
        if len(group) > 1:
            self._twice.add(key)

    def _forget_job(self, doc: Document) -> None:
        queue, _ = self._jobs.pop(id(doc))
        self._failing.pop(id(doc), None)
        if queue is None:
            return
        key = (queue, _name(doc))
        group = self._names[key]
        group.remove(doc)
        if len(group) < 2:
            self._twice.discard(key)
        if not group:
            del self._names[key]


@dataclass(frozen=True, slots=True)
class _Frame:
    """What a job's findings depend on besides its own document."""

    cluster: _Cluster | None
    queues: Mapping[str, Document]
    team_queues: Mapping[str, Document]
    broken_queues: QueuesInBrokenFiles
    limits: Mapping[str, Any]
    pod_security: PodSecurityPolicy


def _doc_order(doc: Document) -> tuple[str, int]:
    return (doc.file, doc.index)


def _in_order(errors: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(errors, key=lambda e: (e.file, e.line or 0, e.column or 0, e.message)))


def _frame(
    ordered: Sequence[Document],
    policy: Mapping[str, Any],
    unchecked: Sequence[Document],
    broken_files: Collection[str],
) -> tuple[_Frame, list[Finding]]:
    """The frame the documents other than jobs make (in file order), and their findings."""
    errors: list[Finding] = list(_layout(ordered))
    by_kind: dict[str, list[Document]] = defaultdict(list)
    for doc in ordered:
        by_kind[doc.kind or ""].append(doc)

    cluster = _the_cluster(by_kind["Cluster"], errors)
    if cluster is not None:
        errors.extend(_check_cluster(cluster))
    for kind in ("Queue", "Policy", "NodePool"):
        errors.extend(_duplicate_names(by_kind[kind], kind))
    errors.extend(_node_names(by_kind["Node"], by_kind["NodePool"]))

    queues: dict[str, Document] = {}
    team_queues: dict[str, Document] = {}
    for doc in by_kind["Queue"]:
        queues.setdefault(_name(doc), doc)
        team = place_of(doc.file).team
        if team is not None and place_of(doc.file).area == "queue":
            team_queues.setdefault(team, doc)
    # Queues whose own file is broken: whoever names them hears about that file only.
    broken_queues = QueuesInBrokenFiles(
        names=frozenset(d.name for d in unchecked if d.kind == "Queue" and d.name),
        teams=frozenset(
            place.team
            for place in map(place_of, broken_files)
            if place.area == "queue" and place.team is not None
        ),
    )

    for doc in by_kind["Node"]:
        errors.extend(_check_node_spec(doc, _spec(doc), ("spec",), cluster))
        errors.extend(_check_labels(doc, ("spec", "topology"), cluster))
    for doc in by_kind["NodePool"]:
        errors.extend(_check_pool(doc, cluster))
    for doc in by_kind["Queue"]:
        errors.extend(_check_queue(doc, cluster))
    for doc in by_kind["Policy"]:
        errors.extend(check_retry(doc))
    admission = policy.get("admission")
    limits: Mapping[str, Any] = admission if isinstance(admission, Mapping) else {}
    frame = _Frame(cluster, queues, team_queues, broken_queues, limits, pod_security_policy(policy))
    services_by_team: dict[str, list[Document]] = defaultdict(list)
    for doc in by_kind["InferenceService"]:
        errors.extend(_check_service(doc, frame))
        services_by_team[place_of(doc.file).team or ""].append(doc)
    for team, services in sorted(services_by_team.items()):
        errors.extend(_duplicate_names(services, "InferenceService", f" in team '{team}'"))
    return frame, errors


# --- inference services (docs/services.md) ---


def _check_service(doc: Document, frame: _Frame) -> Iterator[Finding]:
    """An InferenceService's references and ranges: its queue like a job's, flavors and
    priority class the cluster defines, min <= max, spread levels the cluster has, a
    rolling update that can move, and its pod template judged as a job's is."""
    spec = _spec(doc)
    errors: list[Finding] = []
    queue = _job_queue(doc, frame.queues, frame.team_queues, frame.broken_queues, errors)
    yield from errors
    cluster = frame.cluster
    if cluster is not None:
        yield from _check_job_references(doc, spec, cluster)
        if queue is not None:
            yield from _check_job_priority(doc, spec, queue, cluster)
    replicas: Mapping[str, Any] = spec["replicas"]
    low, high = replicas["min"], replicas["max"]
    if low > high:
        yield doc.error(
            ("spec", "replicas", "min"),
            f"service '{_name(doc)}': min ({low}) is more than max ({high})",
            "policy",
        )
    levels = (_IMPLICIT_LEVEL, *cluster.levels) if cluster is not None else None
    for index, rule in enumerate(spec.get("spread", [])):
        level = rule["topology"]
        if levels is not None and level not in levels:
            yield _unknown(
                doc, ("spec", "spread", index, "topology"), "topology level", level, levels
            )
    update = spec.get("rollingUpdate", {})
    if update.get("maxSurge") in (0, "0%") and update.get("maxUnavailable") in (0, "0%"):
        yield doc.error(
            ("spec", "rollingUpdate", "maxSurge"),
            "maxSurge and maxUnavailable are both 0: a rolling update could never replace a"
            " replica (as a Deployment, one of them must be above 0)",
            "policy",
        )
    yield from _check_job_template(doc, frame.pod_security)


def spread_findings(doc: Document, domains: Mapping[str, int]) -> Iterator[Finding]:
    """A spread larger than the topology allows: the service's minimum cannot be placed
    with at most maxPerDomain replicas in each of the `domains` (level -> how many the
    static inventory has) of a level."""
    spec = _spec(doc)
    low = spec["replicas"]["min"]
    for index, rule in enumerate(spec.get("spread", [])):
        count = domains.get(rule["topology"])
        if count is None:
            continue
        most = count * rule["maxPerDomain"]
        if low > most:
            yield doc.error(
                ("spec", "spread", index, "maxPerDomain"),
                f"service '{_name(doc)}' needs at least {low} replicas but its spread allows"
                f" at most {most}: {rule['maxPerDomain']} in each of the {count}"
                f" {rule['topology']} domain(s) of the inventory",
                "policy",
            )


def _job_findings(doc: Document, frame: _Frame) -> tuple[str | None, tuple[Finding, ...]]:
    """A job's queue (None when it names none that exists) and its own findings: where
    it sits, which queue it goes to, what it asks for."""
    errors: list[Finding] = list(_layout((doc,)))
    queue = _job_queue(doc, frame.queues, frame.team_queues, frame.broken_queues, errors)
    errors.extend(_check_job(doc, queue, frame.cluster, frame.limits))
    errors.extend(_check_job_template(doc, frame.pod_security))
    return (None if queue is None else _name(queue)), tuple(errors)


def _duplicate_jobs(jobs: Sequence[Document], queue: str) -> Iterator[Finding]:
    return _duplicate_names(jobs, "Job", f" in queue '{queue}'")


def _unchecked_findings(unchecked: Sequence[Document], frame: _Frame) -> Iterator[Finding]:
    for doc in sorted(unchecked, key=_doc_order):
        yield from _unchecked_references(
            doc, frame.cluster, frame.queues, frame.team_queues, frame.broken_queues
        )


# --- layout and names ---


def _layout(docs: Iterable[Document]) -> Iterator[Finding]:
    queue_files: set[str] = set()
    for doc in docs:
        kind = doc.kind or ""
        place = place_of(doc.file)
        home = _HOMES.get(kind)
        if home is None:
            continue
        if place.area != _AREA_OF_KIND[kind]:
            yield doc.error(
                ("kind",),
                f"a {kind} belongs in {home}, not in {doc.file}; files elsewhere would be"
                " silently ignored",
                "layout",
            )
        elif kind == "Queue":
            if doc.file in queue_files:
                yield doc.error(
                    ("kind",),
                    f"{doc.file} holds more than one Queue; a team folder defines one queue",
                    "layout",
                )
            queue_files.add(doc.file)


def _the_cluster(clusters: list[Document], errors: list[Finding]) -> _Cluster | None:
    if not clusters:
        errors.append(
            Finding(
                CLUSTER_FILE,
                None,
                None,
                "$",
                "no Cluster document: add cluster.yaml with kind: Cluster (topology levels,"
                " GPU flavors, priority classes)",
                "layout",
            )
        )
        return None
    # Prefer the one in its proper home, so the error lands on the stray copies.
    first, *extra = sorted(clusters, key=lambda d: (place_of(d.file).area != "cluster", d.file))
    for doc in extra:
        errors.append(
            doc.error(
                ("kind",),
                f"a second Cluster document; a cluster repo has exactly one"
                f" (the first is at {_at(first, ('kind',))})",
                "layout",
            )
        )
    spec = _spec(first)
    classes: dict[str, int] = {}
    for entry in spec.get("priorityClasses", []):
        classes.setdefault(entry["name"], entry["value"])
    return _Cluster(
        doc=first,
        flavors=tuple(dict.fromkeys(f["name"] for f in spec.get("gpuFlavors", []))),
        classes=classes,
        levels=tuple(spec.get("topologyLevels", [])),
        default_class=spec.get("defaultPriorityClass"),
    )


def _check_cluster(cluster: _Cluster) -> Iterator[Finding]:
    doc, spec = cluster.doc, _spec(cluster.doc)
    for field, what in (("gpuFlavors", "GPU flavor"), ("priorityClasses", "priority class")):
        seen: dict[str, int] = {}
        for index, entry in enumerate(spec.get(field, [])):
            name = entry["name"]
            path: JsonPath = ("spec", field, index, "name")
            if name in seen:
                first = _at(doc, ("spec", field, seen[name], "name"))
                yield doc.error(
                    path, f"{what} '{name}' is defined twice (first at {first})", "duplicate-name"
                )
            else:
                seen[name] = index
    default = cluster.default_class
    if default is not None and default not in cluster.classes:
        yield doc.error(
            ("spec", "defaultPriorityClass"),
            f"default priority class '{default}' is not one of the priorityClasses"
            f"{_choices(default, cluster.classes)}",
            "reference",
        )


def _duplicate_names(docs: Sequence[Document], kind: str, scope: str = "") -> Iterator[Finding]:
    groups: dict[str, list[Document]] = defaultdict(list)
    for doc in docs:
        groups[_name(doc)].append(doc)
    for name, group in groups.items():
        if len(group) < 2:
            continue
        for doc in group:
            others = ", ".join(_at(o, ("metadata", "name")) for o in group if o is not doc)
            yield doc.error(
                ("metadata", "name"),
                f"{_noun(kind)} '{name}' is defined more than once{scope}: also at {others}",
                "duplicate-name",
            )


def _pool_node_names(doc: Document) -> list[str]:
    spec = _spec(doc)
    count: int = spec["count"]
    width = max(2, len(str(count)))
    prefix: str = spec["namePrefix"]
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def _node_names(nodes: Sequence[Document], pools: Sequence[Document]) -> Iterator[Finding]:
    yield from _duplicate_names(nodes, "Node")
    owner: dict[str, Document] = {}
    for doc in nodes:
        owner.setdefault(_name(doc), doc)
    for pool in pools:
        clashes: dict[int, tuple[str, Document]] = {}
        for node_name in _pool_node_names(pool):
            other = owner.get(node_name)
            if other is None:
                owner[node_name] = pool
            elif other is not pool and id(other) not in clashes:
                clashes[id(other)] = (node_name, other)
        for node_name, other in clashes.values():
            other_path: JsonPath = (
                ("metadata", "name") if other.kind == "Node" else ("spec", "namePrefix")
            )
            yield pool.error(
                ("spec", "namePrefix"),
                f"node pool '{_name(pool)}' makes node '{node_name}', which"
                f" {_noun(other.kind or '')} '{_name(other)}' at {_at(other, other_path)} also"
                " makes; node names must be unique",
                "duplicate-name",
            )
            yield other.error(
                other_path,
                f"node '{node_name}' is also made by node pool '{_name(pool)}' at"
                f" {_at(pool, ('spec', 'namePrefix'))}; node names must be unique",
                "duplicate-name",
            )


# --- inventory ---


def _check_node_spec(
    doc: Document, spec: Mapping[str, Any], at: JsonPath, cluster: _Cluster | None
) -> Iterator[Finding]:
    flavor = spec.get("flavor")
    gpus = spec.get("gpus", 0)
    what = "node" if doc.kind == "Node" else "node pool"
    if flavor is not None:
        if cluster is not None:
            yield from _flavor_reference(doc, spec, at, cluster)
        if gpus < 1:
            yield doc.error(
                (*at, "gpus"),
                f"{what} '{_name(doc)}' has GPU flavor '{flavor}' but {gpus} GPUs; a node"
                " with a flavor has at least 1 GPU",
                "policy",
            )
    elif gpus != 0:
        yield doc.error(
            (*at, "gpus"),
            f"{what} '{_name(doc)}' has {gpus} GPUs but no flavor; name its GPU flavor, or"
            " set gpus: 0 for a CPU-only node",
            "policy",
        )


def _check_labels(doc: Document, at: JsonPath, cluster: _Cluster | None) -> Iterator[Finding]:
    labels = _get(doc.data, at)
    if cluster is None or not isinstance(labels, Mapping):
        return
    for level in labels:
        if level not in cluster.levels:
            yield _unknown(doc, (*at, level), "topology level", level, cluster.levels)


def _check_pool(doc: Document, cluster: _Cluster | None) -> Iterator[Finding]:
    spec = _spec(doc)
    yield from _check_node_spec(doc, spec["template"], ("spec", "template"), cluster)
    yield from _check_labels(doc, ("spec", "topology"), cluster)
    fixed = set(spec.get("topology", {}))
    seen: set[str] = set()
    for index, domain in enumerate(spec.get("domains", [])):
        level = domain["level"]
        path: JsonPath = ("spec", "domains", index, "level")
        if cluster is not None and level not in cluster.levels:
            yield _unknown(doc, path, "topology level", level, cluster.levels)
        if level in fixed:
            yield doc.error(
                path,
                f"level '{level}' is both in topology (one domain for the whole pool) and"
                " in domains (split into groups); keep one",
                "policy",
            )
        elif level in seen:
            yield doc.error(path, f"level '{level}' is split twice in domains", "policy")
        seen.add(level)


# --- queues and jobs ---


def _queue_references(
    doc: Document, spec: Mapping[str, Any], cluster: _Cluster
) -> Iterator[Finding]:
    top = spec.get("maxPriorityClass")
    if isinstance(top, str) and top not in cluster.classes:
        yield _unknown(doc, ("spec", "maxPriorityClass"), "priority class", top, cluster.classes)
    quotas = spec.get("quotas", [])
    for index, quota in enumerate(quotas if isinstance(quotas, list) else []):
        flavor = quota.get("flavor") if isinstance(quota, Mapping) else None
        if isinstance(flavor, str) and flavor not in cluster.flavors:
            path: JsonPath = ("spec", "quotas", index, "flavor")
            yield _unknown(doc, path, "GPU flavor", flavor, cluster.flavors)


def _check_queue(doc: Document, cluster: _Cluster | None) -> Iterator[Finding]:
    yield from check_queue_time_limits(doc)
    spec = _spec(doc)
    name = _name(doc)
    place = place_of(doc.file)
    team = spec.get("team")
    if team is not None and place.area == "queue" and team != place.team:
        yield doc.error(
            ("spec", "team"),
            f"queue '{name}' says team '{team}' but lives in teams/{place.team}/;"
            f" set team: {place.team} or leave it out",
            "reference",
        )
    if cluster is not None:
        yield from _queue_references(doc, spec, cluster)
    yield from check_retry(doc)
    seen: dict[str, int] = {}
    for index, quota in enumerate(spec.get("quotas", [])):
        flavor = quota["flavor"]
        path: JsonPath = ("spec", "quotas", index, "flavor")
        if flavor in seen:
            first = _at(doc, ("spec", "quotas", seen[flavor], "flavor"))
            yield doc.error(
                path,
                f"queue '{name}' lists flavor '{flavor}' twice (first at {first});"
                " give each flavor one quota",
                "policy",
            )
        else:
            seen[flavor] = index
        lending = quota.get("lendingLimit")
        if lending is not None and lending > quota["nominal"]:
            yield doc.error(
                ("spec", "quotas", index, "lendingLimit"),
                f"lendingLimit ({_num(lending)}) is more than nominal ({_num(quota['nominal'])});"
                " a queue can lend only its own quota",
                "policy",
            )


def queue_owner(queue: Document) -> str | None:
    """The team that owns a queue: the folder its file sits in (teams/<team>/queue.yaml).

    Only that team's jobs (teams/<team>/jobs/) may submit to it, and only its OWNERS
    approve changes to it; other teams reach its unused quota by borrowing in a cohort.
    """
    return place_of(queue.file).team


@dataclass(frozen=True, slots=True)
class QueuesInBrokenFiles:
    """Queues a commit may define in files that have errors of their own."""

    names: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()

    def may_define(self, queue: str) -> bool:
        return queue in self.names or queue in self.teams


def _job_queue(
    doc: Document,
    queues: Mapping[str, Document],
    team_queues: Mapping[str, Document],
    broken: QueuesInBrokenFiles,
    errors: list[Finding],
) -> Document | None:
    """The Queue document a job goes to, reporting a missing one."""
    spec = _spec(doc)
    named = spec.get("queue")
    team = place_of(doc.file).team
    if named is not None and not isinstance(named, str):
        return None  # not a name: its schema error says so
    if named is not None:
        found = queues.get(named)
        if found is None:
            if not broken.may_define(named):
                errors.append(_unknown_queue(doc, named, queues))
        elif team is not None and queue_owner(found) != team:
            errors.append(
                doc.error(
                    ("spec", "queue"),
                    f"job '{_name(doc)}' of team '{team}' names queue '{named}', which team"
                    f" '{queue_owner(found)}' owns ({found.file}); a team's jobs run on its own"
                    f" queue (teams/{team}/queue.yaml) and borrow through its cohort",
                    "ownership",
                )
            )
        return found
    if team is None:
        return None  # a misplaced job: the layout error already says where it belongs
    found = team_queues.get(team)
    if found is None and team not in broken.teams:
        errors.append(
            doc.error(
                ("spec",),
                f"job '{_name(doc)}' names no queue and teams/{team}/ has no queue.yaml;"
                f" add teams/{team}/queue.yaml or set spec.queue",
                "reference",
            )
        )
    return found


def _unknown_queue(doc: Document, named: str, queues: Mapping[str, Document]) -> Finding:
    return doc.error(
        ("spec", "queue"),
        f"job '{_name(doc)}' names queue '{named}', which no"
        f" teams/<team>/queue.yaml defines{_choices(named, queues)}",
        "reference",
    )


def _unchecked_references(
    doc: Document,
    cluster: _Cluster | None,
    queues: Mapping[str, Document],
    team_queues: Mapping[str, Document],
    broken: QueuesInBrokenFiles,
) -> Iterator[Finding]:
    """The reference errors of a document that broke its schema: only the fields that
    still have the shape the schema asks for are looked at."""
    spec = _spec(doc)
    if doc.kind in WORK_KINDS:
        if cluster is not None:
            yield from _check_job_references(doc, spec, cluster)
        errors: list[Finding] = []
        _job_queue(doc, queues, team_queues, broken, errors)
        yield from errors
    elif doc.kind == "Queue" and cluster is not None:
        yield from _queue_references(doc, spec, cluster)
    elif doc.kind == "Node" and cluster is not None:
        yield from _flavor_reference(doc, spec, ("spec",), cluster)
    elif doc.kind == "NodePool" and cluster is not None:
        template = spec.get("template")
        if isinstance(template, Mapping):
            yield from _flavor_reference(doc, template, ("spec", "template"), cluster)


def _flavor_reference(
    doc: Document, spec: Mapping[str, Any], at: JsonPath, cluster: _Cluster
) -> Iterator[Finding]:
    flavor = spec.get("flavor")
    if isinstance(flavor, str) and flavor not in cluster.flavors:
        yield _unknown(doc, (*at, "flavor"), "GPU flavor", flavor, cluster.flavors)


def _check_job(
    doc: Document,
    queue: Document | None,
    cluster: _Cluster | None,
    limits: Mapping[str, Any],
) -> Iterator[Finding]:
    spec = _spec(doc)
    name = _name(doc)
    if cluster is not None:
        yield from _check_job_references(doc, spec, cluster)

    replicas: int = spec.get("replicas", 1)  # a Workspace's is 1
    resources: Mapping[str, Any] = spec["resources"]
    gpu = resources.get("gpu", 0)
    total = replicas * gpu
    max_gpus = limits.get("maxGpusPerJob")
    if isinstance(max_gpus, int | float) and total > max_gpus:
        where: JsonPath = ("spec", "resources", "gpu")
        yield doc.error(
            where,
            f"job '{name}' asks for {_num(total)} GPUs ({replicas} replicas x {_num(gpu)}),"
            f" more than the {_num(max_gpus)} one job may have (policy admission.maxGpusPerJob)",
            "policy",
        )
    max_replicas = limits.get("maxReplicasPerJob")
    if isinstance(max_replicas, int) and replicas > max_replicas:
        yield doc.error(
            ("spec", "replicas"),
            f"job '{name}' asks for {replicas} replicas, more than the {max_replicas} one job"
            " may have (policy admission.maxReplicasPerJob)",
            "policy",
        )
    min_replicas = spec.get("minReplicas")
    if min_replicas is not None and min_replicas > replicas:
        yield doc.error(
            ("spec", "minReplicas"),
            f"minReplicas ({min_replicas}) is more than replicas ({replicas})",
            "policy",
        )
    if (
        spec.get("isolation") == "dedicated"
        and limits.get("requireResidencyForIsolated") is True
        and not spec.get("residency")
    ):
        yield doc.error(
            ("spec", "isolation"),
            f"job '{name}' is dedicated but names no residency; the policy requires isolated"
            " jobs to list their allowed regions (admission.requireResidencyForIsolated)",
            "policy",
        )
    yield from check_retry(doc)
    if cluster is not None and queue is not None:
        yield from _check_job_priority(doc, spec, queue, cluster)
    if queue is not None:
        yield from _check_job_time_limit(doc, spec, queue)


def check_retry(doc: Document) -> Iterator[Finding]:
    """spec.retry of a Job, Queue or Policy: the first backoff is at most the longest
    (each bound alone is the schema's)."""
    retry = _spec(doc).get("retry")
    if not isinstance(retry, Mapping):
        return
    first, longest = retry.get("backoffSeconds", 10), retry.get("maxBackoffSeconds", 3600)
    if isinstance(first, int) and isinstance(longest, int) and first > longest:
        yield doc.error(
            ("spec", "retry", "backoffSeconds"),
            f"backoffSeconds ({first}) is more than maxBackoffSeconds ({longest});"
            " the first wait cannot be longer than the longest",
            "policy",
        )


def _check_job_template(doc: Document, pod_security: PodSecurityPolicy) -> Iterator[Finding]:
    """The pod template asks for no more than the job spec grants (policies/pod_security.py),
    held to the Pod Security Standard level of the job's team."""
    spec = _spec(doc)
    template = spec.get("template")
    if template is None and DEFAULT_SERVICE_ACCOUNT in pod_security.service_accounts:
        return  # most jobs: nothing to judge (a commit may hold 50,000 of them)
    resources: Mapping[str, Any] = spec["resources"]
    granted = Resources(
        gpu_milli=milli_from_gpus(resources.get("gpu", 0)),
        cpu_milli=milli_from_cores(resources.get("cpu", 0)),
        memory_mib=mib_from_gib(resources.get("memoryGiB", 0)),
    )
    team = place_of(doc.file).team or str(spec.get("queue", ""))
    level = pod_security.level_of(team)
    for problem in template_problems(template, granted, level, pod_security.service_accounts):
        at: JsonPath = ("spec", "template", *problem.path) if template is not None else ("spec",)
        yield doc.error(at, f"job '{_name(doc)}': {problem.message}", problem.code)


def _check_job_references(
    doc: Document, spec: Mapping[str, Any], cluster: _Cluster
) -> Iterator[Finding]:
    # Shapes are checked as well as names: a document that broke its schema comes here too.
    flavors = spec.get("gpuFlavors", [])
    for index, flavor in enumerate(flavors if isinstance(flavors, list) else []):
        if isinstance(flavor, str) and flavor not in cluster.flavors:
            path: JsonPath = ("spec", "gpuFlavors", index)
            yield _unknown(doc, path, "GPU flavor", flavor, cluster.flavors)
    wanted = spec.get("priorityClass")
    if isinstance(wanted, str) and wanted not in cluster.classes:
        yield _unknown(doc, ("spec", "priorityClass"), "priority class", wanted, cluster.classes)
    topology = spec.get("topology")
    if isinstance(topology, Mapping):
        yield from _check_job_topology(doc, spec, topology, (_IMPLICIT_LEVEL, *cluster.levels))


def _check_job_topology(
    doc: Document, spec: Mapping[str, Any], topology: Mapping[str, Any], levels: tuple[str, ...]
) -> Iterator[Finding]:
    """Levels the cluster has; slices below the level, and a whole number of them."""
    at: JsonPath = ("spec", "topology")
    level = topology.get("level")
    if topology.get("mode") == "unconstrained":
        for key in ("level", "sliceSize", "sliceLevel"):
            if key in topology:
                yield doc.error(
                    (*at, key),
                    f"mode unconstrained places the replicas anywhere; drop {key}"
                    " (or use mode preferred)",
                    "policy",
                )
        return
    if isinstance(level, str) and level not in levels:
        yield _unknown(doc, (*at, "level"), "topology level", level, levels)
    slice_level = topology.get("sliceLevel")
    slice_size = topology.get("sliceSize")
    if isinstance(slice_level, str) and slice_level not in levels:
        yield _unknown(doc, (*at, "sliceLevel"), "topology level", slice_level, levels)
    elif (
        isinstance(slice_level, str)
        and isinstance(level, str)
        and level in levels
        and levels.index(slice_level) >= levels.index(level)
    ):
        yield doc.error(
            (*at, "sliceLevel"),
            f"sliceLevel '{slice_level}' must be below level '{level}'"
            f" (levels narrowest first: {', '.join(levels)})",
            "policy",
        )
    if isinstance(slice_size, int) and slice_size > 0:
        for key in ("replicas", "minReplicas"):
            count = spec.get(key, 1 if key == "replicas" else None)
            if isinstance(count, int) and count % slice_size:
                yield doc.error(
                    (*at, "sliceSize"),
                    f"{key} ({count}) is not a multiple of sliceSize ({slice_size}):"
                    " every slice needs all its replicas",
                    "policy",
                )


def _check_job_priority(
    doc: Document, spec: Mapping[str, Any], queue: Document, cluster: _Cluster
) -> Iterator[Finding]:
    ceiling = _spec(queue).get("maxPriorityClass")
    explicit = spec.get("priorityClass")
    wanted = explicit if explicit is not None else cluster.default_class
    if ceiling not in cluster.classes or wanted not in cluster.classes:
        return  # an unknown class is reported as a reference error
    assert isinstance(ceiling, str) and isinstance(wanted, str)
    value, limit = cluster.classes[wanted], cluster.classes[ceiling]
    if value <= limit:
        return
    asks = "asks for" if explicit is not None else "gets the cluster's default"
    yield doc.error(
        ("spec", "priorityClass") if explicit is not None else ("spec",),
        f"job '{_name(doc)}' {asks} priority class '{wanted}' ({value}) but queue"
        f" '{_name(queue)}' allows at most '{ceiling}' ({limit})"
        f" (maxPriorityClass at {_at(queue, ('spec', 'maxPriorityClass'))})",
        "policy",
    )


def _check_job_time_limit(
    doc: Document, spec: Mapping[str, Any], queue: Document
) -> Iterator[Finding]:
    """A job may not ask for more time than its queue's maximum (docs/time.md)."""
    limits = _spec(queue).get("timeLimits")
    if not isinstance(limits, Mapping):
        return
    most = limits.get("maxMinutes")
    asked = spec.get("timeLimitMinutes")
    if not isinstance(most, int) or not isinstance(asked, int) or asked <= most:
        return
    yield doc.error(
        ("spec", "timeLimitMinutes"),
        f"job '{_name(doc)}' asks for a time limit of {asked} min but queue"
        f" '{_name(queue)}' allows at most {most} min"
        f" (timeLimits.maxMinutes at {_at(queue, ('spec', 'timeLimits', 'maxMinutes'))})",
        "policy",
    )


def check_queue_time_limits(doc: Document) -> Iterator[Finding]:
    """A queue's default limit may not be above its own maximum."""
    limits = _spec(doc).get("timeLimits")
    if not isinstance(limits, Mapping):
        return
    default, most = limits.get("defaultMinutes"), limits.get("maxMinutes")
    if isinstance(default, int) and isinstance(most, int) and default > most:
        yield doc.error(
            ("spec", "timeLimits", "defaultMinutes"),
            f"queue '{_name(doc)}' gives its jobs a default time limit of {default} min,"
            f" above its maximum of {most} min",
            "policy",
        )


# --- small shared pieces ---


def _spec(doc: Document) -> Mapping[str, Any]:
    spec = doc.data.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(doc: Document) -> str:
    return doc.name or "?"


def _get(data: Any, path: JsonPath) -> Any:
    for step in path:
        if isinstance(data, Mapping) and isinstance(step, str):
            data = data.get(step)
        else:
            return None
    return data


def _at(doc: Document, path: JsonPath) -> str:
    return f"{doc.file}:{doc.position(path)[0]}"


def _noun(kind: str) -> str:
    return {"NodePool": "node pool", "InferenceService": "service"}.get(kind, kind.lower())


def _num(value: float) -> str:
    return f"{value:g}"


def _choices(word: str, known: Iterable[str]) -> str:
    names = list(known)
    if not names:
        return " (none are defined)"
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{hint} (known: {', '.join(names)})"


def _unknown(doc: Document, path: JsonPath, what: str, name: str, known: Iterable[str]) -> Finding:
    return doc.error(
        path, f"{what} '{name}' is not defined in the cluster{_choices(name, known)}", "reference"
    )
