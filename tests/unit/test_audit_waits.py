"""`audit waits` on a hand-written log whose every wait is known, and `audit history`'s
attempts of a job requeued after failures."""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.audit import history
from gitsched.audit import waits as waits_query
from gitsched.engine import events as ev
from gitsched.engine.model import RetryPolicy
from tests.support.audit_log import LogBuilder, bootstrap, hours, placed, submit, ts
from tests.support.factories import job


def known_log() -> LogBuilder:
    """Admissions: a/x at once, a/y after 1 h, b/w at once, b/z after 3 h; a/x then
    moves (no admission) and b/w is preempted and admitted again 30 min later."""
    log = LogBuilder()
    bootstrap(log)
    sha = submit(
        log,
        1,
        job("x", queue="a", gpu=8),
        job("y", queue="a", gpu=8),
        job("z", queue="b", gpu=4, priority=900),
    )
    log.solve(1, sha, [placed("a/x", ("n1", 8))])
    sha = submit(log, 2, job("w", queue="b", gpu=1, priority=100))
    log.solve(2, sha, [placed("a/y", ("n2", 8)), placed("b/w", ("s1", 1))])
    sha = submit(log, 3, job("v", queue="r", gpu=1))
    log.solve(
        3,
        sha,
        [
            placed("a/x", ("n1", 8), action="moved", reason="moved"),
            ev.JobPreempted("b/w", "preempted", None, 0.0, "s", "place-gone"),
        ],
    )
    sha = submit(log, 3.5, job("u", queue="r", gpu=1))
    log.solve(3.5, sha, [placed("b/w", ("s1", 1))])
    sha = submit(log, 4, job("t", queue="r", gpu=1))
    log.solve(4, sha, [placed("b/z", ("s1", 4))])
    return log


def test_waits_per_queue_priority_and_size_are_the_known_figures() -> None:
    with known_log().view() as store:
        result = waits_query.waits(store, by="queue", since=ts(0), until=ts(10))
        rows = {r["group"]: r for r in result["rows"]}
        assert set(rows) == {"a", "b"}
        assert rows["a"] == {
            "group": "a",
            "count": 2,
            "mean_wait_s": 1800.0,
            "p50_wait_s": 0.0,
            "p95_wait_s": 3600.0,
            "p99_wait_s": 3600.0,
            "max_wait_s": 3600.0,
        }
        # b: w at once, w again 30 min after its preemption, z after 3 h.
        assert rows["b"]["count"] == 3
        assert rows["b"]["mean_wait_s"] == pytest.approx((0 + 1800 + 10800) / 3, abs=1e-3)
        assert (rows["b"]["p50_wait_s"], rows["b"]["max_wait_s"]) == (1800.0, 10800.0)
        assert result["all"]["count"] == 5 and result["all"]["p99_wait_s"] == 10800.0

        by_priority = waits_query.waits(store, by="priority", since=ts(0), until=ts(10))
        assert [(r["group"], r["count"]) for r in by_priority["rows"]] == [("x", 5)]
        by_size = waits_query.waits(store, by="size", since=ts(0), until=ts(10))
        assert [(r["group"], r["count"]) for r in by_size["rows"]] == [
            ("1", 2),
            ("3-4", 1),
            ("5-8", 2),
        ]
        # The period counts the admissions that started in it: a/y, b/w at 2 h only.
        window = waits_query.waits(store, since=ts(1.5), until=ts(2.5))
        assert window["all"]["count"] == 2 and window["all"]["max_wait_s"] == 3600.0


def test_nearest_rank_percentiles_and_size_groups() -> None:
    values = [float(v) for v in range(1, 101)]
    assert waits_query.percentile(values, 50) == 50.0
    assert waits_query.percentile(values, 95) == 95.0
    assert waits_query.percentile(values, 99) == 99.0
    assert waits_query.percentile([7.0], 99) == 7.0
    assert [waits_query.size_group(m) for m in (0, 250, 1000, 2000, 3000, 8000, 9000, 64000)] == [
        "0",
        "1",
        "1",
        "2",
        "3-4",
        "5-8",
        "9-16",
        "33-64",
    ]
    assert waits_query.summary("none", [])["count"] == 0


def test_history_lists_every_attempt_with_its_start_end_and_reason() -> None:
    log = LogBuilder()
    bootstrap(log)
    retry = RetryPolicy(max_retries=2, backoff_seconds=600, max_backoff_seconds=600)
    train = dataclasses.replace(job("train", queue="a", gpu=8), retry=retry)
    sha = submit(log, 1, train)
    log.solve(1, sha, [placed("a/train", ("n1", 8))])
    failed_at = hours(2).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    ready_at = hours(2 + 1 / 6).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    log.batch(
        2,
        [
            ev.JobFailed("a/train", "OOMKilled", 137, 0, failed_at),
            ev.JobRequeued(train, 1, 2, "OOMKilled", "failed", failed_at, ready_at, 600.0),
        ],
        actor="kubernetes",
        cause="kubernetes/1",
    )
    log.batch(
        2 + 1 / 6,
        [ev.JobBackoffEnded("a/train", 1, ready_at)],
        actor="kubernetes",
        cause="kubernetes/2",
    )
    log.solve(2 + 1 / 6, "kubernetes/2", [placed("a/train", ("n2", 8))])
    with log.view() as store:
        intervals = history.query(store, job="a/train")
        assert [(i.attempt, i.state, i.nodes) for i in intervals] == [
            (1, "FAILED", ("n1",)),
            (2, "RUNNING", ("n2",)),
        ]
        first, second = intervals
        assert first.end_reason is not None and "OOMKilled" in first.end_reason
        assert first.end is not None and first.end.startswith(failed_at[:19])
        # The second attempt waited from the end of its backoff.
        assert second.queued.startswith(ready_at[:19]) and second.wait_s == pytest.approx(0, abs=1)
        assert second.to_dict()["attempt"] == 2
