"""`plan` = `reconcile` with a job in its retry backoff: a real git repo and SQLite log,
the cluster's failure appended as `serve` appends it (with its requeue), then commits
planned and reconciled: the job is left out while its backoff runs and placed after,
and `plan` predicts exactly the events `reconcile` appends, greedy and HiGHS alike."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gitsched.engine import events as ev
from gitsched.engine.retries import with_requeues
from gitsched.eventlog.codec import encode
from gitsched.eventlog.replay import replay
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from tests.support.cluster_repo import (
    CLUSTER_YAML,
    EPOCH,
    POLICY_YAML,
    POOL_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    queue_yaml,
)
from tests.support.plan import payload, predicted


class Clock:
    """The log's append clock, set by the test: when serve or the reconciler wrote."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)


def utc(seconds_after_epoch: int) -> str:
    moment = datetime.fromtimestamp(EPOCH + seconds_after_epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_plan_predicts_reconcile_while_a_job_waits_out_its_backoff(
    tmp_path: Path, solver: str
) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    retry = "  retry: {maxRetries: 2, backoffSeconds: 7200, maxBackoffSeconds: 7200}\n"
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": POLICY_YAML.replace("name: greedy", f"name: {solver}"),
            "teams/ml/queue.yaml": queue_yaml(),
            "teams/ml/jobs/train.yaml": job_yaml("train") + retry,
        }
    )
    repo.commit("Bootstrap")  # at EPOCH
    clock = Clock(EPOCH)
    with SQLiteEventLog(repo.log_path, clock=clock) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        reconciler.run_once()
        tip = replay(event_log)
        assert "ml/train" in tip.state.placements
        # The cluster: train's pod failed 10 minutes in. serve appends that and its requeue.
        failure = ev.JobFailed("ml/train", "Error: exit 3", 3, 0, utc(600))
        told = with_requeues(tip.state, [failure])
        assert [type(e) for e in told] == [ev.JobFailed, ev.JobRequeued]
        requeued = told[1]
        assert isinstance(requeued, ev.JobRequeued) and requeued.ready_at == utc(600 + 7200)
        clock.at = EPOCH + 620  # serve saw the failure 20 s after it
        event_log.append(
            [
                encode(
                    e, id=f"kubernetes/{tip.last_seq}/{i}", actor="kubernetes", cause="kubernetes"
                )
                for i, e in enumerate(told)
            ],
            expected_last_seq=tip.last_seq,
        )
        # ... and places again at once, decided at the time it appended them.
        reconciler.solve_now(f"kubernetes/{tip.last_seq}")
        assert "ml/train" not in replay(event_log).state.placements
        placed_in: list[set[str]] = []
        for name in ("a", "b", "c"):  # commits at EPOCH + 1 h, + 2 h, + 3 h
            repo.write(f"teams/ml/jobs/{name}.yaml", job_yaml(name, gpu=1))
            sha = repo.commit(f"ml: job {name}")
            clock.at = EPOCH + 3600 * (repo.commits - 1)  # reconciled as it is merged
            plan = plan_change(GitRepo(repo.path), event_log, None, sha)
            seq = event_log.last_seq()
            reconciler.run_once()
            appended = [
                (s.id, s.type, s.actor, s.cause, payload(s.type, s.data))
                for s in event_log.read(seq)
            ]
            assert predicted(plan.groups) == appended, name
            placed_in.append(
                {s.data["job"] for s in event_log.read(seq) if s.type == "PlacementDecided"}
            )
        # At 1 h and 2 h train still waits (ready at 2 h 10 min); at 3 h it runs again.
        assert "ml/train" not in placed_in[0] | placed_in[1]
        assert {"ml/a", "ml/b"} <= placed_in[0] | placed_in[1]
        assert "ml/train" in placed_in[2]
        state = replay(event_log).state
        assert state.retries["ml/train"].attempt == 1
    # `audit history --job` lists both attempts with their start, end and reason.
    rows = gitsched(
        "audit", "history", "--job", "ml/train", "--repo", repo.path, "--format", "json"
    ).json()
    assert [(r["attempt"], r["state"]) for r in rows] == [(1, "FAILED"), (2, "RUNNING")]
    # (The audit timeline dates a cluster event when serve appended it: 20 s after.)
    assert rows[0]["end"] == utc(620) and "Error: exit 3" in rows[0]["end_reason"]
    assert rows[1]["queued"] == utc(600 + 7200) and rows[1]["start"] == utc(3 * 3600)
