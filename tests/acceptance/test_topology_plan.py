"""`gitsched plan` says where a gang with a preferred level goes when no domain of that
level can hold it: the climb to a wider domain, or the spread, is in the admitted line."""

from __future__ import annotations

import pytest

from tests.support.cluster_repo import ClusterRepo, H, gitsched, queue_yaml
from tests.support.plan import PR, effects, open_pr, plan_json, reconcile

TREE_CLUSTER = (
    H
    + """kind: Cluster
metadata:
  name: tree
spec:
  topologyLevels: [block, spine, datacenter]
  gpuFlavors:
    - {name: h100-80g, model: H100, memoryGiB: 80}
  priorityClasses:
    - {name: normal, value: 500}
  defaultPriorityClass: normal
"""
)
# Three spines of two blocks of two nodes; s0 and s2 keep one block each, s1 three nodes.
DRAINED = {"n000", "n001", "n101", "n200", "n201"}


def node_yaml(s: int, b: int, i: int) -> str:
    name = f"n{s}{b}{i}"
    state = "Drained" if name in DRAINED else "Ready"
    return (
        H
        + f"""kind: Node
metadata:
  name: {name}
spec:
  flavor: h100-80g
  gpus: 8
  cpu: 192
  memoryGiB: 2048
  state: {state}
  topology: {{block: b{s}{b}, spine: s{s}, datacenter: dc}}
"""
    )


def gang_yaml(mode: str, level: str) -> str:
    return (
        H
        + f"""kind: Job
metadata:
  name: gang
spec:
  replicas: 3
  resources: {{gpu: 8, cpu: 8, memoryGiB: 64}}
  topology: {{level: {level}, mode: {mode}}}
"""
    )


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_plan_says_a_preferred_gang_climbed_to_one_spine(repo: ClusterRepo, solver: str) -> None:
    files = {
        "cluster.yaml": TREE_CLUSTER,
        "teams/ml/queue.yaml": queue_yaml(nominal=96),
        "policies/default.yaml": H
        + f"kind: Policy\nmetadata:\n  name: default\nspec:\n  solver: {{name: {solver}}}\n",
    }
    for s in range(3):
        for b in range(2):
            for i in range(2):
                files[f"inventory/n{s}{b}{i}.yaml"] = node_yaml(s, b, i)
    repo.write_all(files)
    repo.commit("Bootstrap: a three-level tree with five nodes drained")
    reconcile(repo)
    open_pr(repo, {"teams/ml/jobs/gang.yaml": gang_yaml("preferred", "block")}, "ml: a 3x8 gang")

    note = "preferred block: no block could hold it; placed within one spine"
    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert f"why: admitted; {note}" in text
    if solver == "greedy":  # highspy 1.16 prints its banner on stdout: JSON for greedy only
        (admitted,) = effects(plan_json(repo), "admitted")
        assert admitted["job"] == "ml/gang" and admitted["reason"] == f"admitted; {note}"
