"""InferenceService from the command line, on a real git repo: `validate` names every bad
field, `plan` says which training jobs raising a service's minimum would preempt and
predicts exactly what `reconcile` appends, `state` lists the service with its replica
counts, and `audit history --service` tells them over time."""

from __future__ import annotations

import pytest

from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.plan import plan_change
from tests.support.cluster_repo import ANA, POLICY_YAML, ClusterRepo, H, git, gitsched, job_yaml
from tests.support.plan import PR, open_pr, payload, predicted, reconcile

SERVICE = "teams/ml/services/chat.yaml"


def service_yaml(low: int, high: int = 4, spread: str = "node") -> str:
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: chat
spec:
  replicas: {{min: {low}, max: {high}}}
  resources: {{gpu: 8, cpu: 8, memoryGiB: 64}}
  gpuFlavors: [h100-80g]
  priorityClass: high
  spread: [{{topology: {spread}, maxPerDomain: 1}}]
"""
    )


def training(repo: ClusterRepo) -> None:
    for name in ("a", "b", "c"):
        repo.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, gpu=8, priority="low"))


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_raising_min_says_which_training_jobs_it_preempts_and_plan_is_reconcile(
    bootstrapped: ClusterRepo, solver: str
) -> None:
    repo = bootstrapped
    repo.write("policies/default.yaml", POLICY_YAML.replace("name: greedy", f"name: {solver}"))
    training(repo)
    repo.write(SERVICE, service_yaml(1))
    repo.commit("ml: three training jobs and a chat service", author=ANA)
    reconcile(repo)
    state = gitsched("state", "--format", "json", cwd=repo.path, expect=0).json()
    (chat,) = state["services"]
    assert chat == {
        "service": "ml/chat",
        "queue": "ml",
        "min": 1,
        "max": 4,
        "desired": 1,
        "current": 1,
        "running": 0,
        "pending": 0,
        "revision": chat["revision"],
        "suspended": False,
        "replicas": [
            {"job": "ml/chat.0", "nodes": chat["replicas"][0]["nodes"], "state": "placed"}
        ],
    }

    open_pr(repo, {SERVICE: service_yaml(3)}, "ml: chat serves from 3 replicas", author=ANA)
    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout  # 1: changes
    assert "service ml/chat changed (replicas 3..4 (was 1..4)" in text, text
    assert "1 -> 3 replicas; would preempt ml/" in text, text
    with SQLiteEventLog(repo.log_path) as log:
        plan = plan_change(GitRepo(repo.path), log, "main", PR)
        stopped = sorted(e.job for e in plan.effects if e.action.value == "preempted")
        assert len(stopped) == 2 and all(j in ("ml/a", "ml/b", "ml/c") for j in stopped)
        assert f"would preempt {', '.join(stopped)}" in text
        seq = log.last_seq()
    git(repo.path, "merge", "-q", "--ff-only", PR)
    reconcile(repo)
    with SQLiteEventLog(repo.log_path) as log:
        appended = [
            (s.id, s.type, s.actor, s.cause, payload(s.type, s.data)) for s in log.read(seq)
        ]
    assert predicted(plan.groups) == appended
    after = gitsched("state", "--format", "json", cwd=repo.path, expect=0).json()
    (chat,) = after["services"]
    assert (chat["min"], chat["desired"], chat["current"]) == (3, 3, 3)
    nodes = [n for r in chat["replicas"] for n in r["nodes"]]
    assert len(set(nodes)) == 3  # spread: one per node

    history = gitsched(
        "audit", "history", "--service", "ml/chat", "--format", "json", cwd=repo.path, expect=0
    ).json()
    steps = [
        (h["desired"], h["replicas"]) for h in history if h["event"] == "ServiceReplicasChanged"
    ]
    assert steps == [(1, 1), (3, 3)]
    assert [h["event"] for h in history][:2] == ["ServiceSubmitted", "ServiceReplicasChanged"]
    # the replicas' placements and the preemptions they made pass every audit control
    gitsched("audit", "compliance", cwd=repo.path, expect=0)


def test_validate_names_file_line_and_field_of_a_bad_service(bootstrapped: ClusterRepo) -> None:
    repo = bootstrapped
    repo.write(
        SERVICE,
        service_yaml(5, 3).replace("priorityClass: high", "priorityClass: high\n  colour: blue"),
    )
    run = gitsched("validate", repo.path, "--format", "json", expect=1)
    found = {(e["file"], e["path"]) for e in run.json()["errors"]}
    assert (SERVICE, "$.spec.colour") in found
    repo.write(SERVICE, service_yaml(5, 3))
    run = gitsched("validate", repo.path, "--format", "json", expect=1)
    (error,) = run.json()["errors"]
    assert (error["file"], error["line"], error["path"]) == (SERVICE, 6, "$.spec.replicas.min")
