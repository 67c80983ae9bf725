"""serve's hook for retries (cluster.controller): a Failed pod becomes JobFailed and its
JobRequeued in one append, and once the daemon's clock has passed the backoff's end it
records JobBackoffEnded, dated at that end, once. The pods come from a stand-in for our
own informer; the log is a real SQLite log."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gitsched.cluster import controller as controller_module
from gitsched.cluster.controller import Controller
from gitsched.cluster.pods import desired_pods
from gitsched.engine.core import ApplyCommit, ApplyPlan, decide, placement_instance
from gitsched.engine.model import RetryPolicy
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.state import ClusterState, fold
from gitsched.eventlog.codec import encode
from gitsched.eventlog.replay import replay
from gitsched.eventlog.sqlite import SQLiteEventLog
from tests.support.factories import commit, desired, job, node

NOW = "2026-11-20T10:00:00.000000Z"


def failed_pods(state: ClusterState, finished_at: str) -> dict[tuple[str, str], Any]:
    pods = {}
    for key, want in desired_pods(state).items():
        body = want.body
        pods[key] = {
            "metadata": {**body["metadata"], "uid": "u"},
            "spec": {**body["spec"], "nodeName": want.node, "schedulingGates": None},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "state": {
                            "terminated": {
                                "exitCode": 3,
                                "reason": "Error",
                                "finishedAt": finished_at,
                            }
                        }
                    }
                ],
            },
        }
    return pods


def test_the_daemon_records_the_requeue_and_the_end_of_the_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retry = RetryPolicy(max_retries=2, backoff_seconds=90, max_backoff_seconds=600)
    d = desired([dataclasses.replace(job("train", gpu=8), retry=retry)], nodes=[node("n1")])
    events = list(decide(ClusterState(), ApplyCommit(commit(1), d)))
    state = fold(events)
    plan = GreedyPlacer().solve(placement_instance(state, NOW))
    placed = decide(state, ApplyPlan(plan, "s1", NOW))
    state = fold(placed, state)
    with SQLiteEventLog(tmp_path / "log.db") as event_log:
        event_log.append(
            [
                encode(e, id=f"c/{i}", actor="t", cause="c")
                for i, e in enumerate([*events, *placed])
            ],
            expected_last_seq=0,
        )
        controller = Controller(None, event_log, None)  # type: ignore[arg-type]
        pods = failed_pods(state, "2026-11-20T10:05:00Z")
        monkeypatch.setattr(controller.pods, "snapshot", lambda: pods)
        clock = {"now": "2026-11-20T10:05:10.000000Z"}
        monkeypatch.setattr(controller_module, "_clock_now", lambda: clock["now"])

        told = controller.observe_only()
        assert [e.type for e in told] == ["JobFailed", "JobRequeued"]
        assert told[1].ready_at == "2026-11-20T10:06:30.000000Z"  # type: ignore[attr-defined]
        # Before the end of the backoff: nothing to record.
        clock["now"] = "2026-11-20T10:06:29.000000Z"
        assert controller.observe_only() == []
        # After it (the daemon looked late): recorded at the backoff's end, not at the look.
        clock["now"] = "2026-11-20T10:09:00.000000Z"
        (ended,) = controller.observe_only()
        assert (ended.type, ended.at, ended.attempt) == (  # type: ignore[attr-defined]
            "JobBackoffEnded",
            "2026-11-20T10:06:30.000000Z",
            1,
        )
        assert controller.observe_only() == []  # once
        final = replay(event_log).state
        assert final.retries["q/train"].due and final.needs_placement
