"""RepositoryCheck, the cross-file rules kept from commit to commit, finds what a full
check_repository finds, in the same order, after any sequence of edits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.findings import Finding
from gitsched.policies import RepositoryCheck, check_repository, merge_policies
from gitsched.schemas import Document, parse_documents, validate_document

CLUSTER = """\
apiVersion: gitsched.io/v1
kind: Cluster
metadata: {{name: demo}}
spec:
  topologyLevels: [nvlink, rack]
  gpuFlavors: [{{name: h100}}, {{name: a100}}{extra_flavor}]
  priorityClasses: [{{name: low, value: 100}}, {{name: normal, value: 500}}, {{name: high, value: 900}}]
  defaultPriorityClass: {default}
"""

QUEUE = """\
apiVersion: gitsched.io/v1
kind: Queue
metadata: {{name: {name}}}
spec:
  maxPriorityClass: {ceiling}
  quotas: [{{flavor: h100, nominal: 16}}]
"""

NODE = """\
apiVersion: gitsched.io/v1
kind: Node
metadata: {name: n1}
spec: {flavor: h100, gpus: 8, cpu: 64, memoryGiB: 512, topology: {rack: r1}}
"""

POLICY = """\
apiVersion: gitsched.io/v1
kind: Policy
metadata: {{name: limits}}
spec:
  admission: {{maxGpusPerJob: {max_gpus}}}
"""

JOB = """\
apiVersion: gitsched.io/v1
kind: Job
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  resources: {{gpu: 8}}
{extra}"""

TEAMS = ("vision", "nlp", "ghost")  # ghost has no queue.yaml

job_files = st.builds(
    lambda team, stem, name, home, replicas, extras: (
        f"teams/{team}/jobs/{stem}.yaml" if home else f"inventory/{stem}-{team}.yaml",
        JOB.format(name=name, replicas=replicas, extra="".join(extras)),
    ),
    st.sampled_from((*TEAMS, "vision")),
    st.sampled_from(("a", "b", "c")),  # file names apart from job names: duplicates
    st.sampled_from(("train", "eval", "tune", "serve")),
    st.sampled_from((True, True, True, False)),  # at home, or misplaced
    st.sampled_from(("1", "2", "4", "1", "2", "4", "1", "0", "x")),  # 0, x break the schema
    st.lists(
        st.sampled_from(
            (
                "  queue: vision\n",
                "  queue: nlp\n",
                "  queue: nowhere\n",
                "  priorityClass: high\n",
                "  priorityClass: low\n",
                "  priorityClass: urgent\n",
                "  gpuFlavors: [a100]\n",
                "  gpuFlavors: [b200]\n",
                "  topology: {level: rack}\n",
                "  topology: {level: zone}\n",
                "  minReplicas: 3\n",
            )
        ),
        max_size=3,
        unique=True,
    ),
)

frame_edits = st.one_of(
    st.tuples(
        st.just("cluster.yaml"),
        st.builds(
            lambda extra, default: CLUSTER.format(extra_flavor=extra, default=default),
            st.sampled_from(("", ", {name: b200}")),
            st.sampled_from(("low", "normal", "missing")),
        ),
    ),
    st.tuples(
        st.sampled_from(("teams/vision/queue.yaml", "teams/nlp/queue.yaml")),
        st.builds(
            lambda name, ceiling: QUEUE.format(name=name, ceiling=ceiling),
            st.sampled_from(("vision", "nlp", "shared")),
            st.sampled_from(("normal", "high", "top")),
        ),
    ),
    st.tuples(
        st.just("policies/limits.yaml"),
        st.sampled_from(("8", "16", "null")).map(lambda m: POLICY.format(max_gpus=m)),
    ),
    st.tuples(st.just("teams/nlp/queue.yaml"), st.just("kind: [")),  # a broken file
    st.tuples(  # a team's first queue
        st.just("teams/ghost/queue.yaml"), st.just(QUEUE.format(name="ghost", ceiling="low"))
    ),
)
frame_files = st.sampled_from(
    ("cluster.yaml", "teams/nlp/queue.yaml", "teams/ghost/queue.yaml", "policies/limits.yaml")
)

job_edit = st.one_of(
    job_files.map(lambda f: ("write", *f)), job_files.map(lambda f: ("delete", f[0], ""))
)
frame_edit = st.one_of(
    frame_edits.map(lambda f: ("write", *f)),
    frame_files.map(lambda path: ("delete", path, "")),
)
# Most commits change jobs only (what the kept check is for); some change the frame too.
commits = st.one_of(
    st.lists(job_edit, min_size=1, max_size=4),
    st.lists(job_edit, min_size=1, max_size=4),
    st.lists(st.one_of(job_edit, frame_edit), min_size=1, max_size=4),
)


def base_files() -> dict[str, str]:
    return {
        "cluster.yaml": CLUSTER.format(extra_flavor="", default="normal"),
        "inventory/nodes.yaml": NODE,
        "teams/vision/queue.yaml": QUEUE.format(name="vision", ceiling="normal"),
        "teams/nlp/queue.yaml": QUEUE.format(name="nlp", ceiling="high"),
        "teams/vision/jobs/train.yaml": JOB.format(name="train", replicas=2, extra=""),
    }


class Parsed:
    """Each file's documents, parsed again only when its text changed (as SpecCache does:
    an unchanged file hands out the same Document objects)."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[str, tuple[Document, ...], tuple[Document, ...], bool]] = {}

    def load(self, files: dict[str, str]) -> tuple[list[Document], list[Document], set[str]]:
        valid: list[Document] = []
        invalid: list[Document] = []
        broken: set[str] = set()
        for path in sorted(files):
            text = files[path]
            kept = self._files.get(path)
            if kept is None or kept[0] != text:
                docs, errors = parse_documents(text.encode(), path)
                good = tuple(d for d in docs if not validate_document(d))
                bad = tuple(d for d in docs if validate_document(d))
                kept = self._files[path] = (text, good, bad, bool(errors or bad))
            valid.extend(kept[1])
            invalid.extend(kept[2])
            if kept[3]:
                broken.add(path)
        return valid, invalid, broken


def full(valid: list[Document], invalid: list[Document], broken: set[str]) -> tuple[Finding, ...]:
    return check_repository(valid, merge_policies(valid), unchecked=invalid, broken_files=broken)


@settings(max_examples=200, deadline=None)
@given(st.lists(commits, min_size=1, max_size=10))
def test_kept_check_equals_the_full_check_after_every_commit(
    history: list[list[tuple[str, str, str]]],
) -> None:
    files = base_files()
    parsed = Parsed()
    kept = RepositoryCheck()
    valid, invalid, broken = parsed.load(files)
    assert kept.check(valid, merge_policies(valid), unchecked=invalid, broken_files=broken) == (
        full(valid, invalid, broken)
    )
    for commit in history:
        for action, path, text in commit:
            if action == "write":
                files[path] = text
            else:
                files.pop(path, None)
        valid, invalid, broken = parsed.load(files)
        found = kept.check(valid, merge_policies(valid), unchecked=invalid, broken_files=broken)
        assert found == full(valid, invalid, broken)


def test_a_commit_of_jobs_is_checked_in_its_own_size() -> None:
    """Only the new job is checked again: the kept findings of the others are reused,
    so a finding that full checks would repeat is the same object."""
    files = base_files()
    files["teams/vision/jobs/big.yaml"] = JOB.format(
        name="big", replicas=2, extra="  priorityClass: high\n"
    )
    parsed = Parsed()
    kept = RepositoryCheck()
    valid, invalid, broken = parsed.load(files)
    first = kept.check(valid, merge_policies(valid), unchecked=invalid, broken_files=broken)
    assert [f.message for f in first] == [
        "job 'big' asks for priority class 'high' (900) but queue 'vision' allows at most"
        " 'normal' (500) (maxPriorityClass at teams/vision/queue.yaml:5)"
    ]
    files["teams/vision/jobs/train2.yaml"] = JOB.format(name="train", replicas=1, extra="")
    valid, invalid, broken = parsed.load(files)
    second = kept.check(valid, merge_policies(valid), unchecked=invalid, broken_files=broken)
    assert second == full(valid, invalid, broken)
    assert second[0] is first[0]  # kept, not made again
    assert [f.file for f in second[1:]] == [
        "teams/vision/jobs/train.yaml",
        "teams/vision/jobs/train2.yaml",
    ]


def test_a_name_taken_three_times_then_freed_one_commit_at_a_time() -> None:
    files = base_files()
    parsed = Parsed()
    kept = RepositoryCheck()
    steps: list[tuple[str, str | None]] = [
        ("teams/vision/jobs/c.yaml", JOB.format(name="dup", replicas=1, extra="")),
        ("teams/vision/jobs/b.yaml", JOB.format(name="dup", replicas=1, extra="")),
        ("teams/vision/jobs/a.yaml", JOB.format(name="dup", replicas=1, extra="")),
        ("teams/vision/jobs/b.yaml", None),
        ("teams/vision/jobs/a.yaml", None),
        ("teams/vision/jobs/c.yaml", None),
        ("teams/vision/jobs/a.yaml", JOB.format(name="dup", replicas=1, extra="")),
    ]
    seen = []
    for path, text in steps:
        if text is None:
            del files[path]
        else:
            files[path] = text
        valid, invalid, broken = parsed.load(files)
        found = kept.check(valid, merge_policies(valid), unchecked=invalid, broken_files=broken)
        assert found == full(valid, invalid, broken)
        seen.append(len(found))
    assert seen == [0, 2, 3, 2, 0, 0, 0]
