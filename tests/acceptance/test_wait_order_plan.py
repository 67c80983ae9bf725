"""`plan` = `reconcile` on wait order (docs/time.md): when room frees for one of two
waiting jobs of one priority, the one submitted first starts, whether greedy or the MILP
decides, and `plan` predicts exactly what `reconcile` then does."""

from __future__ import annotations

import pytest

from gitsched.engine import events as ev
from gitsched.eventlog.codec import decode
from tests.support.cluster_repo import (
    ANA,
    CLUSTER_YAML,
    POLICY_YAML,
    POOL_YAML,
    ClusterRepo,
    git,
    job_yaml,
    queue_yaml,
    read_events,
)
from tests.support.plan import effects, open_pr, plan_json, reconcile


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_the_job_submitted_first_takes_the_room_that_frees(repo: ClusterRepo, solver: str) -> None:
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,  # 4 nodes of 8 GPUs
            "policies/default.yaml": POLICY_YAML.replace("name: greedy", f"name: {solver}"),
            "teams/ml/queue.yaml": queue_yaml(nominal=32),
            "teams/ml/jobs/big.yaml": job_yaml("big", replicas=3),
            "teams/ml/jobs/filler.yaml": job_yaml("filler"),
        }
    )
    repo.commit("Bootstrap: the cluster is full")
    # Submitted first, though its name sorts last: order is the commits', not the names'.
    repo.write("teams/ml/jobs/zz-old.yaml", job_yaml("zz-old"))
    repo.commit("ml: zz-old waits", author=ANA)
    repo.write("teams/ml/jobs/aa-young.yaml", job_yaml("aa-young"))
    repo.commit("ml: aa-young waits", author=ANA)
    reconcile(repo)
    open_pr(repo, {}, "ml: filler is done", remove=("teams/ml/jobs/filler.yaml",))

    plan = plan_json(repo)
    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/zz-old"]
    assert [e["job"] for e in effects(plan, "still pending")] == ["ml/aa-young"]

    git(repo.path, "merge", "-q", "--ff-only", "pr/change")
    seen = len(read_events(repo.log_path))
    reconcile(repo)
    placed = [
        e.job
        for e in (decode(s) for s in read_events(repo.log_path)[seen:])
        if isinstance(e, ev.PlacementDecided)
    ]
    assert placed == ["ml/zz-old"]
