"""Hostile and broken files, each committed to a real repo on top of an applied history.

Every one must be rejected with a message naming the file, and none may crash
gitsched, hang it, or change a single event already in the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.cluster_repo import (
    ClusterRepo,
    assert_chain_intact,
    gitsched,
    job_yaml,
    log_state,
    read_events,
)

BILLION_LAUGHS = "".join(
    [
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


@dataclass(frozen=True)
class Hostile:
    file: str
    make: Callable[[ClusterRepo, str], object]
    codes: frozenset[str]
    # (line, JSON path) of each expected error; None where the error has no line.
    where: tuple[tuple[int | None, str], ...]
    says: str = ""


def writes(content: str | bytes) -> Callable[[ClusterRepo, str], object]:
    return lambda repo, rel: repo.write(rel, content)


CASES = {
    "billion-laughs": Hostile(
        "teams/ml/jobs/lol.yaml",
        writes(BILLION_LAUGHS),
        frozenset({"too-many-nodes", "too-many-aliases"}),
        (),
        "expands to more than",
    ),
    "two-megabytes": Hostile(
        "teams/ml/jobs/huge.yaml",
        writes(job_yaml("huge") + "# " + "x" * (2 * 1024 * 1024) + "\n"),
        frozenset({"too-large"}),
        ((None, "$"),),
        "bytes",
    ),
    "binary-junk": Hostile(
        "teams/ml/jobs/junk.yaml",
        writes(random.Random(20251116).randbytes(4096)),
        frozenset({"binary", "encoding"}),
        (),
    ),
    "latin-1": Hostile(
        "teams/ml/jobs/cafe.yaml",
        writes(job_yaml("cafe").replace("metadata:", "# café\nmetadata:").encode("latin-1")),
        frozenset({"encoding"}),
        ((3, "$"),),
        "not valid UTF-8",
    ),
    "duplicate-keys": Hostile(
        "teams/ml/jobs/dup.yaml",
        writes(job_yaml("dup") + "  replicas: 2\n"),
        frozenset({"duplicate-key"}),
        ((9, "$.spec.replicas"),),
        "duplicate key 'replicas' (first at line 6, again at line 9)",
    ),
    "symlink-outside": Hostile(
        "teams/ml/jobs/passwd.yaml",
        lambda repo, rel: repo.symlink(rel, "/etc/passwd"),
        frozenset({"symlink"}),
        ((None, "$"),),
        "symbolic link to '/etc/passwd' (outside the repository)",
    ),
    "a-list-not-a-mapping": Hostile(
        "teams/ml/jobs/list.yaml",
        writes("- apiVersion: gitsched.io/v1\n- kind: Job\n"),
        frozenset({"not-a-mapping"}),
        ((1, "$"),),
        "must be a mapping",
    ),
    "unknown-fields": Hostile(
        "teams/ml/jobs/unknown.yaml",
        writes(job_yaml("unknown") + "  colour: red\n"),
        frozenset({"schema"}),
        ((9, "$.spec.colour"),),
        "unknown field 'colour'",
    ),
    "wrong-types": Hostile(
        "teams/ml/jobs/types.yaml",
        writes(
            job_yaml("types").replace("replicas: 1", "replicas: many").replace("gpu: 8", "gpu: [8]")
        ),
        frozenset({"schema"}),
        ((6, "$.spec.replicas"), (7, "$.spec.resources.gpu")),
    ),
    "yaml-outside-the-layout": Hostile(
        "jobs/stray.yaml",
        writes(job_yaml("stray")),
        frozenset({"layout"}),
        ((None, "$"),),
        "outside the cluster repo layout",
    ),
    "missing-queue-and-flavor": Hostile(
        "teams/ml/jobs/refs.yaml",
        writes(job_yaml("refs", queue="nope", flavors=["b200"])),
        frozenset({"reference"}),
        ((8, "$.spec.queue"), (9, "$.spec.gpuFlavors[0]")),
        "queue 'nope'",
    ),
    "too-deep": Hostile(
        "teams/ml/jobs/deep.yaml",
        writes("a: " + "[" * 200 + "]" * 200 + "\n"),
        frozenset({"too-deep"}),
        (),
        "nesting deeper than",
    ),
    "tab-indented": Hostile(
        "teams/ml/jobs/tabs.yaml",
        writes(job_yaml("tabs").replace("  replicas", "\treplicas")),
        frozenset({"yaml"}),
        (),
        "tab",
    ),
}


@pytest.fixture(scope="module")
def good_state(reconciled_template: ClusterRepo) -> dict[str, Any]:
    return log_state(reconciled_template.log_path)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_hostile_commit_is_rejected_and_the_log_is_untouched(
    reconciled: ClusterRepo, good_state: dict[str, Any], case: Hostile
) -> None:
    before = read_events(reconciled.log_path)
    case.make(reconciled, case.file)
    sha = reconciled.commit(f"add {case.file}")

    report = gitsched(
        "validate", reconciled.path, "--rev", "HEAD", "--format", "json", expect=1
    ).json()
    assert {e["file"] for e in report["errors"]} == {case.file}
    assert {e["code"] for e in report["errors"]} <= case.codes, report
    if case.where:
        assert [(e["line"], e["path"]) for e in report["errors"]] == list(case.where)
    else:
        assert all(e["line"] is not None for e in report["errors"]), report

    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert f"REJECTED {sha[:12]}" in run.stdout
    assert f"\n    {case.file}" in run.stdout
    assert case.says in run.stdout

    after = read_events(reconciled.log_path)
    assert after[: len(before)] == before, "events already in the log were changed"
    assert_chain_intact(after)
    new = after[len(before) :]
    assert [e.type for e in new] == ["CommitRejected"]
    assert new[0].cause == sha
    assert new[0].id.startswith(sha)
    stored_errors = new[0].data["errors"]
    assert [(e["file"], e["line"], e["path"]) for e in stored_errors] == [
        (e["file"], e["line"], e["path"]) for e in report["errors"]
    ]

    state = log_state(reconciled.log_path)
    assert state["last_commit"] == sha
    assert state["last_good_commit"] == good_state["last_good_commit"]
    assert state["placements"] == good_state["placements"]
    assert state["last_rejection"] == [
        line.strip() for line in run.stdout.splitlines() if line.startswith("    ")
    ]


def test_a_symlink_in_the_work_tree_is_reported_not_followed(reconciled: ClusterRepo) -> None:
    reconciled.symlink("teams/ml/jobs/passwd.yaml", "/etc/passwd")
    reconciled.symlink("inventory/loop.yaml", "loop.yaml")
    run = gitsched("validate", reconciled.path, expect=1)
    assert run.stdout.endswith("2 error(s) in 2 file(s)\n")
    assert "teams/ml/jobs/passwd.yaml: $: is a symbolic link to '/etc/passwd'" in run.stdout
    assert "inventory/loop.yaml: $: is a symbolic link to 'loop.yaml'" in run.stdout
    assert "root:" not in run.stdout
