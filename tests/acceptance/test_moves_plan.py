"""`gitsched plan` and `reconcile` say why a running job moves (issue 29): a drained node
moves its job, with the reason code and the work it loses, in the plan and in the log."""

from __future__ import annotations

from tests.support.cluster_repo import (
    CLUSTER_YAML,
    POLICY_YAML,
    ClusterRepo,
    H,
    git,
    gitsched,
    job_yaml,
    queue_yaml,
    read_events,
)
from tests.support.plan import PR, effects, open_pr, plan_json, reconcile


def node_yaml(name: str, nvlink: str, state: str = "Ready") -> str:
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
  topology: {{nvlink: {nvlink}, rack: rack-a}}
  region: eu-west
  state: {state}
"""
    )


def test_a_drained_node_moves_its_job_and_the_plan_and_log_say_why(repo: ClusterRepo) -> None:
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/a.yaml": node_yaml("node-a", "nvl-1"),
            "inventory/b.yaml": node_yaml("node-b", "nvl-2", state="Drained"),
            "policies/default.yaml": POLICY_YAML,
            "teams/ml/queue.yaml": queue_yaml(nominal=16),
            "teams/ml/jobs/train.yaml": job_yaml("train"),
        }
    )
    repo.commit("Bootstrap: train runs on node-a, node-b is drained")
    reconcile(repo)
    open_pr(
        repo,
        {
            "inventory/a.yaml": node_yaml("node-a", "nvl-1", state="Drained"),
            "inventory/b.yaml": node_yaml("node-b", "nvl-2"),
        },
        "infra: drain node-a, node-b is back",
    )

    plan = plan_json(repo)

    (move,) = effects(plan, "moved")
    assert (move["job"], move["from"], move["to"]) == ("ml/train", ["node-a"], ["node-b"])
    assert move["rule"] == "place-gone" and "Drained" in move["reason"]
    assert move["lost_gpu_hours"] >= 0
    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert "node-a -> node-b; place-gone, loses" in text

    # Merged, the reconciler appends the move with the same reason.
    git(repo.path, "merge", "-q", "--ff-only", PR)
    reconcile(repo)
    (decided,) = [
        e
        for e in read_events(repo.log_path)
        if e.type == "PlacementDecided" and e.data["action"] == "moved"
    ]
    assert decided.schema_version == 2
    assert decided.data["rule"] == "place-gone" and "Drained" in decided.data["reason"]
