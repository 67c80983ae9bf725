"""The audit views folded from hand-written logs: intervals, usage, compliance, changes.

Each log is made of real domain events, encoded and sealed as the reconciler's
are, with times chosen so every expected number can be worked out by hand.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gitsched.audit import changes as changes_query
from gitsched.audit import compliance as compliance_query
from gitsched.audit import history, usage
from gitsched.audit.catchup import catch_up
from gitsched.audit.pointintime import cluster_at, seq_at_time
from gitsched.audit.projection.state import ProjectionState
from gitsched.audit.store import AuditError, AuditStore, EventList
from gitsched.engine import events as ev
from gitsched.engine.model import (
    CommitInfo,
    Isolation,
    NodeState,
    Owner,
    Policy,
    PreemptionScope,
)
from gitsched.eventlog.codec import decode_all, encode
from gitsched.eventlog.envelope import StoredEvent, format_time, seal_batch
from tests.support.audit_log import (
    ANA,
    LI,
    T0,
    LogBuilder,
    bootstrap,
    hours,
    placed,
    submit,
    ts,
)
from tests.support.factories import job, node, queue

# -- placement history -----------------------------------------------------------------------


def test_intervals_say_why_they_started_and_ended() -> None:
    log = LogBuilder()
    bootstrap(log)
    sha = submit(log, 1, job("x", queue="a", gpu=8), job("w", queue="a", gpu=8))
    log.solve(1, sha, [placed("a/x", ("n1", 8)), placed("a/w", ("n2", 8))])
    sha = log.commit(2, [ev.JobChanged(job("x", queue="a", gpu=8, replicas=1), ("resources",))])
    log.solve(
        2, sha, [placed("a/x", ("n2", 8), action="moved", reason="the job's resources changed")]
    )
    log.batch(
        3,
        [ev.NodeStateChanged("n2", NodeState.FAILED, "failed")],
        actor="inventory:static",
        cause="inv",
    )
    log.solve(
        3,
        "inv",
        [
            ev.JobPreempted("a/x", "node n2 is Failed; no other place", None, 0.0, "s"),
            placed("a/w", ("n1", 8), action="moved", reason="node n2 is Failed"),
        ],
    )
    log.batch(4, [ev.JobFinished("a/w")], actor="kubernetes", cause="k8s")
    sha = log.commit(5, [ev.JobWithdrawn("a/x")])

    with log.view() as store:
        got = [(i.job, i.nodes, i.start_kind, i.end_kind, i.state) for i in history.query(store)]
        assert got == [
            ("a/x", ("n1",), "admitted", "moved", "MOVED"),
            ("a/w", ("n2",), "admitted", "node_failed", "NODE_FAIL"),
            ("a/x", ("n2",), "moved", "node_failed", "NODE_FAIL"),
            ("a/w", ("n1",), "moved", "finished", "COMPLETED"),
        ]
        by_node = history.query(store, node="n2")
        assert [i.job for i in by_node] == ["a/w", "a/x"]
        assert history.query(store, job="x")[0].end_reason == "the job's resources changed"
        assert [i.gpu_hours for i in history.query(store, job="a/x")] == [8.0, 8.0]
        assert history.query(store, team="b") == []
        # Intervals overlapping [2.5h, 3.5h]: both ended at 3h by the failure, and a/w's second.
        window = history.query(store, since=ts(2.5), until=ts(3.5))
        assert [(i.job, i.start) for i in window] == [
            ("a/w", format_time(hours(1))),
            ("a/x", format_time(hours(2))),
            ("a/w", format_time(hours(3))),
        ]


def test_build_history_and_select_keep_their_signatures() -> None:
    log = LogBuilder()
    bootstrap(log)
    sha = submit(log, 1, job("x", queue="a", gpu=8))
    log.solve(1, sha, [placed("a/x", ("n1", 8))])
    events = list(decode_all(log.events))
    intervals = history.build_history(events)
    assert [(i.queue, i.end) for i in intervals] == [("a", None)]
    assert history.select(intervals, node="n1") == intervals
    assert history.select(intervals, team="b") == []


# -- usage ----------------------------------------------------------------------------------


def borrowing_log() -> LogBuilder:
    """a runs 16 GPUs (8 over its nominal, borrowed from b) from 1h to 3h; b runs nothing."""
    log = LogBuilder()
    bootstrap(log)
    sha = submit(log, 1, job("big", queue="a", gpu=8, replicas=2))
    log.solve(1, sha, [placed("a/big", ("n1", 8), ("n2", 8))])
    log.batch(3, [ev.JobFinished("a/big")], actor="kubernetes", cause="k8s")
    return log


def rows_by(rows: list[dict[str, object]], key: str) -> dict[object, dict[str, object]]:
    return {r[key]: r for r in rows}


def test_usage_by_team_counts_used_quota_borrowed_lent_and_idle_quota() -> None:
    with borrowing_log().view() as store:
        teams = rows_by(usage.by_team(store, ts(0), ts(4)), "team")
        assert teams["a"] == {
            "team": "a",
            "flavor": "h100",
            "used_gpu_h": 32.0,
            "quota_gpu_h": 32.0,
            "used_pct": 100.0,
            "borrowed_gpu_h": 16.0,
            "lent_gpu_h": 0.0,
            "idle_quota_gpu_h": 16.0,
        }
        assert teams["b"]["lent_gpu_h"] == 16.0
        assert teams["b"]["used_gpu_h"] == 0.0
        assert teams["b"]["idle_quota_gpu_h"] == 32.0
        # A window inside the run is clipped to it.
        part = rows_by(usage.by_team(store, ts(2), ts(2.5)), "team")
        assert part["a"]["used_gpu_h"] == 8.0
        assert part["a"]["borrowed_gpu_h"] == 4.0
        assert part["b"]["lent_gpu_h"] == 4.0


def test_usage_by_user_and_flavor() -> None:
    with borrowing_log().view() as store:
        users = usage.by_user(store, ts(0), ts(4))
        assert users == [
            {
                "user": "Ana Souza <ana@ml.example>",
                "team": "a",
                "flavor": "h100",
                "placements": 1,
                "used_gpu_h": 32.0,
                "team_pct": 100.0,
            }
        ]
        flavors = rows_by(usage.by_flavor(store, ts(0), ts(4)), "flavor")
        h100 = flavors["h100"]
        # Three 8-GPU nodes for 4 hours; a used 32 GPU-hours of them.
        assert h100["capacity_gpu_h"] == 96.0
        assert h100["used_gpu_h"] == 32.0
        assert h100["idle_gpu_h"] == 64.0
        assert h100["down_gpu_h"] == 0.0
        assert h100["quota_gpu_h"] == 96.0
        assert h100["borrowed_gpu_h"] == 16.0


def test_open_intervals_run_to_the_end_of_the_period() -> None:
    log = LogBuilder()
    bootstrap(log)
    sha = submit(log, 1, job("x", queue="r", gpu=4))
    log.solve(1, sha, [placed("r/x", ("n1", 4))])
    with log.view() as store:
        assert rows_by(usage.by_team(store, ts(0), ts(11)), "team")["r"]["used_gpu_h"] == 40.0
        starts, series = usage.over_time(store, ts(1), ts(3), buckets=2)
        assert starts == [ts(1), ts(2)]
        assert series == {"r": [4.0, 4.0]}


def test_a_segment_ending_exactly_at_midnight_is_split_over_every_day_it_covers() -> None:
    # Regression: a segment over several days that ended at 00:00:00 UTC was booked whole to
    # its first day. r runs 8 GPUs from 14:00 on day 0 until 00:00 on day 3.
    day0 = datetime(2025, 11, 16, tzinfo=UTC)
    start = (day0 + timedelta(hours=14) - T0) / timedelta(hours=1)
    end = (day0 + timedelta(days=3) - T0) / timedelta(hours=1)
    log = LogBuilder()
    bootstrap(log)
    sha = submit(log, start, job("x", queue="r", gpu=8))
    log.solve(start, sha, [placed("r/x", ("n1", 8))])
    log.batch(end, [ev.JobFinished("r/x")], actor="kubernetes", cause="k8s")
    log.batch(end + 30, [ev.JobFinished("r/none")], actor="kubernetes", cause="k8s")
    with log.view() as store:
        per_day = []
        for d in range(4):
            since = (day0 + timedelta(days=d)).timestamp()
            per_day.append(rows_by(usage.by_team(store, since, since + 86_400.0), "team"))
        assert [p["r"]["used_gpu_h"] for p in per_day] == [80.0, 192.0, 192.0, 0.0]
        total = rows_by(usage.by_team(store, day0.timestamp(), ts(end + 30)), "team")
        assert total["r"]["used_gpu_h"] == 464.0
        # A window from between two events to between two others, its edges off the hour.
        window = rows_by(usage.by_team(store, ts(start + 0.5), ts(end - 0.25)), "team")
        assert window["r"]["used_gpu_h"] == 8 * (end - start - 0.75)


# -- compliance -----------------------------------------------------------------------------


def violations(store: AuditStore) -> list[tuple[str, str, list[int]]]:
    return [
        (v["check"], v["subject"], v["evidence"])
        for v in compliance_query.compliance(store)["violations"]
    ]


def test_a_non_preemptible_job_preempted_is_a_violation_a_node_failure_is_not() -> None:
    log = LogBuilder()
    bootstrap(log, approvers=(LI,))
    sha = submit(
        log,
        1,
        job("keep", queue="b", gpu=8, preemptible=False),
        job("also", queue="b", gpu=8, preemptible=False),
    )
    log.solve(1, sha, [placed("b/keep", ("n1", 8)), placed("b/also", ("n2", 8))])
    log.batch(2, [ev.NodeStateChanged("n1", NodeState.FAILED, "x")], actor="inventory", cause="inv")
    log.solve(2, "inv", [ev.JobPreempted("b/keep", "node n1 is Failed", None, 0.0, "s")])
    sha = submit(log, 3, job("urgent", queue="a", gpu=8, priority=900))
    seqs = log.solve(
        3,
        sha,
        [
            ev.JobPreempted("b/also", "preempted by a/urgent", "a/urgent", 60.0, "s"),
            placed("a/urgent", ("n2", 8)),
        ],
    )
    with log.view() as store:
        found = violations(store)
        # Queues a and b share no cohort: no rule lets a/urgent preempt b/also either.
        assert [(c, s) for c, s, _ in found] == [
            ("preemption-rules", "b/also"),
            ("non-preemptible", "b/also"),
        ]
        assert seqs[0] in found[0][2]
        result = compliance_query.compliance(store)
        assert not result["ok"]
        checks = {c["check"]: c for c in result["checks"]}
        assert checks["non-preemptible"]["checked"] == 2
        assert checks["non-preemptible"]["status"] == "FAIL"
        assert checks["isolation"]["status"] == "PASS"
        ended = history.query(store, job="b/keep")[0]
        assert ended.end_kind == "node_failed"


def test_regulated_jobs_only_on_dedicated_nodes_and_in_their_regions() -> None:
    log = LogBuilder()
    bootstrap(log, approvers=(LI,))
    secret = job(
        "secret", queue="r", gpu=8, isolation=Isolation.DEDICATED, residency=("eu-central",)
    )
    sha = submit(log, 1, secret, job("plain", queue="a", gpu=1))
    good = log.solve(1, sha, [placed("r/secret", ("s1", 8))])
    sha = log.commit(2, [ev.JobChanged(secret, ("priority",))])
    bad = log.solve(
        2,
        sha,
        [placed("r/secret", ("n1", 8), action="moved", reason="x"), placed("a/plain", ("s1", 1))],
    )
    with log.view() as store:
        found = violations(store)
        assert good[0] not in {s for _, _, e in found for s in e}
        assert [(c, s) for c, s, _ in found] == [
            ("isolation", "r/secret"),
            ("residency", "r/secret"),
        ]
        assert bad[0] in found[0][2]
        # a/plain on the dedicated node after r/secret left it: no one is beside a regulated job.
        assert compliance_query.compliance(store)["checks"][0]["checked"] == 3


def test_a_queue_over_its_limits_is_one_episode_with_its_evidence() -> None:
    log = LogBuilder()
    bootstrap(log, approvers=(LI,))
    sha = submit(log, 1, job("one", queue="a", gpu=8, replicas=2), job("two", queue="a", gpu=8))
    over = log.solve(1, sha, [placed("a/one", ("n1", 8), ("n2", 8)), placed("a/two", ("s1", 8))])
    sha = submit(log, 2, job("three", queue="a", gpu=1))
    log.solve(2, sha, [ev.JobPending("a/three", "quota", "quota__a__h100", "s")])
    log.batch(3, [ev.JobFinished("a/two")], actor="kubernetes", cause="k8s")
    back = log.solve(3, "k8s", [])
    with log.view() as store:
        limits = [
            v
            for v in compliance_query.compliance(store)["violations"]
            if v["check"] == "queue-limits"
        ]
        # a uses 24 > 8 + 8; the cohort borrows 16 but b can lend only 8.
        assert [v["subject"] for v in limits] == ["a", "c"]
        assert all(v["until_seq"] == back[-1] for v in limits)
        assert over[0] in limits[0]["evidence"] and over[-1] in limits[0]["evidence"]
        assert "uses 24 h100 GPUs; its limit is 16" in limits[0]["message"]


OWNER_OF_A = "li@cv.example"


@pytest.mark.parametrize(
    ("approvers", "violation"),
    [
        ((), "has no approval from an owner at the base (li@cv.example)"),
        (("Priya Raman <priya@platform.example>",), "is not in teams/a/OWNERS"),
        (("priya raman <PRIYA@platform.example>",), "is not in teams/a/OWNERS"),
        # a made-up outsider is not an owner: their trailer counts for nothing
        (("Mallory <mallory@elsewhere.example>",), "is not in teams/a/OWNERS"),
        ((LI,), None),
        (("Priya Raman <priya@platform.example>", LI), None),
    ],
)
def test_every_quota_change_is_approved_by_an_owner_at_the_base(
    approvers: tuple[str, ...], violation: str | None
) -> None:
    log = LogBuilder()
    bootstrap(log)
    # the commit that gives team a its OWNERS: nobody owned it at its base (bootstrap)
    log.commit(0.5, [ev.OwnersChanged("a", (Owner(OWNER_OF_A),))])
    log.commit(
        1,
        [ev.QueueConfigured(queue("a", cohort="c", quotas={"h100": (16, 8, None)}))],
        approvers=approvers,
    )
    log.commit(2, [ev.PolicyChanged(Policy(move_cost=2.0))])  # a policy is not a quota
    with log.view() as store:
        found = compliance_query.compliance(store)["violations"]
        if violation is None:
            assert found == []
        else:
            assert len(found) == 1 and violation in found[0]["message"], found
            assert found[0]["evidence"] == [log.events[-3].seq - 1, log.events[-3].seq]
        rows = changes_query.changes(store, team="a")
        assert rows[0]["approval"]["status"] == "bootstrap"
        assert rows[-1]["approval"]["status"] == ("missing" if violation else "approved")


def test_the_owners_of_a_change_are_those_at_its_base_not_those_it_adds() -> None:
    log = LogBuilder()
    bootstrap(log)
    log.commit(0.5, [ev.OwnersChanged("a", (Owner(OWNER_OF_A),))])
    # priya adds herself to OWNERS and raises the quota in the same commit, approving it
    log.commit(
        1,
        [
            ev.QueueConfigured(queue("a", cohort="c", quotas={"h100": (16, 8, None)})),
            ev.OwnersChanged("a", (Owner(OWNER_OF_A), Owner("mallory@elsewhere.example"))),
        ],
        approvers=("Mallory <mallory@elsewhere.example>",),
        author=("Ana Souza", "ana@ml.example"),
    )
    with log.view() as store:
        (found,) = compliance_query.compliance(store)["violations"]
        assert "team a" in found["message"] and "not in teams/a/OWNERS" in found["message"]
        rows = changes_query.changes(store, team="a")
        owners_row = [r for r in rows if r["kind"] == "owners"][-1]
        assert owners_row["change"] == "owner mallory@elsewhere.example added"
        assert owners_row["approval"]["approvals"] == [
            {
                "approver": "mallory@elsewhere.example",
                "owner_at_base": False,
                "counted": False,
                "via": "trailer",
                "commit": owners_row["commit"],
                "fingerprint": "",
            }
        ]


# -- changes --------------------------------------------------------------------------------


def test_changes_name_commit_author_approvers_and_what_they_caused() -> None:
    log = borrowing_log()
    sha = log.commit(
        4,
        [ev.QueueConfigured(queue("b", cohort="c", quotas={"h100": (4, None, None)}))],
        approvers=(LI,),
    )
    caused = log.solve(4, sha, [ev.JobPending("a/late", "cohort full", "cohort__c__h100", "s")])
    submit(log, 4.5, job("late", queue="a"))
    log.commit(5, [ev.JobChanged(job("late", queue="a", priority=900), ("priority",))])
    with log.view() as store:
        everything = changes_query.changes(store)
        assert [c["kind"] for c in everything] == [
            "priorities",
            "policy",
            "queue",
            "queue",
            "queue",
            "queue",
            "priority",
        ]
        cut = changes_query.changes(store, team="b")
        assert [c["change"] for c in cut] == [
            "queue created in cohort c: h100 nominal 8",
            "h100 nominal 8 -> 4",
        ]
        assert cut[1]["approvers"] == [LI]
        assert cut[1]["author"] == "Priya Raman <priya@platform.example>"
        assert cut[1]["merged"] == format_time(hours(4))
        assert cut[1]["effects"] == [
            {
                "seq": caused[0],
                "type": "JobPending",
                "job": "a/late",
                "detail": "pending: cohort full",
            }
        ]
        assert changes_query.changes(store, team="a")[-1]["change"].startswith(
            "job priority x (500) -> x (900)"
        )


# -- point in time, rebuild, integrity -------------------------------------------------------


def test_at_a_seq_and_at_a_time() -> None:
    log = borrowing_log()
    with log.view() as store:
        running = cluster_at(store, seq_at_time(store, format_time(hours(2))))
        assert [p["job"] for p in running["placements"]] == ["a/big"]
        assert running["gpus_used"] == 16.0 and running["gpus_total"] == 24
        assert [q["name"] for q in running["queues"]] == ["a", "b", "r"]
        before = cluster_at(store, seq_at_time(store, format_time(hours(0.5))))
        assert before["placements"] == [] and before["commit"]["subject"] == "commit 1"
        assert cluster_at(store, 0)["nodes"] == []
        assert seq_at_time(store, format_time(hours(-1))) == 0
        assert seq_at_time(store, format_time(hours(99))) == len(log.events)


def test_the_fold_state_survives_a_round_trip_through_json() -> None:
    log = borrowing_log()
    with log.view() as store:
        state = store.load_state()
        assert ProjectionState.from_json(state.to_json()).to_json() == state.to_json()
        assert state.seq == len(log.events)


def test_a_log_with_a_broken_link_or_gap_is_refused() -> None:
    log = borrowing_log()
    events = list(log.events)
    broken = events[:5] + events[6:]
    with AuditStore(":memory:") as store, pytest.raises(AuditError, match="gap"):
        catch_up(EventList(broken), store)
    relinked = [*events[:5], StoredEvent(**{**events[5].to_record(), "prev_hash": "0" * 64})]
    with AuditStore(":memory:") as store, pytest.raises(AuditError, match="does not link"):
        catch_up(EventList(relinked), store)


def test_a_view_refuses_a_log_rewritten_under_it(tmp_path: Path) -> None:
    log = borrowing_log()
    with log.view(tmp_path / "audit.db"):
        pass
    other = LogBuilder()
    bootstrap(other, approvers=(LI,))
    submit(other, 1, job("x", queue="a"))
    submit(other, 2, job("y", queue="a"))
    with AuditStore(tmp_path / "audit.db") as store, pytest.raises(AuditError, match="rebuild"):
        catch_up(EventList(other.events), store)
    with AuditStore(tmp_path / "audit.db") as store, pytest.raises(AuditError, match="another log"):
        catch_up(EventList(other.events[:3]), store)


def test_a_preemption_the_rules_do_not_allow_fails_compliance() -> None:
    """A hand-made log: a/high preempts a/low of its own queue (allowed), then a/urgent
    "reclaims" b/keep although queue b borrows nothing and queue a is at its nominal
    quota: a preemption to borrow, which the preemption-rules check fails."""
    log = LogBuilder()
    bootstrap(log, approvers=(LI,))
    sha = submit(
        log,
        1,
        job("low", queue="a", gpu=8, priority=100),
        job("keep", queue="b", gpu=8, priority=100),
    )
    log.solve(1, sha, [placed("a/low", ("n1", 8)), placed("b/keep", ("n2", 8))])
    sha = submit(log, 2, job("high", queue="a", gpu=8, priority=900))
    log.solve(
        2,
        sha,
        [
            placed("a/high", ("n1", 8)),
            ev.JobPreempted("a/low", "preempted by a/high", "a/high", 0.0, "s", "within-queue"),
        ],
    )
    sha = submit(log, 3, job("urgent", queue="a", gpu=8, priority=900))
    seqs = log.solve(
        3,
        sha,
        [
            ev.JobPreempted("b/keep", "queue a reclaims", "a/urgent", 0.0, "s", "reclaim"),
            placed("a/urgent", ("n2", 8)),
        ],
    )
    with log.view() as store:
        found = violations(store)
        assert [(c, s) for c, s, _ in found] == [("preemption-rules", "b/keep")]
        assert seqs[0] in found[0][2]
        result = compliance_query.compliance(store)
        (v,) = result["violations"]
        assert "queue b does not borrow" in v["message"]
        checks = {c["check"]: c for c in result["checks"]}
        assert checks["preemption-rules"]["checked"] == 2
        assert checks["preemption-rules"]["status"] == "FAIL"
        assert not result["ok"]


def test_a_commit_reconciled_late_counts_from_its_date_even_read_in_two_parts(
    tmp_path: Path,
) -> None:
    # Merged at 1h, reconciled (appended) at 30h: its quota, its job and the job's placement
    # take effect at 1h. The view is read once up to the middle of that append (its changes
    # held in the saved fold state), then on: it answers as one read from the start.
    log = LogBuilder()
    bootstrap(log)
    sha = f"{99:040x}"
    info = CommitInfo(sha, *ANA, format_time(hours(1)), "late", ())
    items: list[ev.Event] = [
        ev.QueueConfigured(queue("a", cohort="c", quotas={"h100": (16, 8, None)})),
        ev.JobSubmitted(job("x", queue="a", gpu=8)),
        ev.CommitApplied(info, 2),
    ]
    late = placed("a/x", ("n1", 8))
    late = ev.PlacementDecided(
        late.job, late.flavor, late.replicas, late.action, late.reason, "s", format_time(hours(1))
    )
    done = ev.SolveCompleted("s", "greedy", "heuristic", 0.0, None, None, 0.0, 0, 0, 1, 0, 0, 0, 0)
    first = len(log.events) + 1
    log.events.extend(
        seal_batch(
            [encode(e, id=f"{sha}/{i}", actor=info.actor, cause=sha) for i, e in enumerate(items)]
            + [
                encode(e, id=f"{sha}/solve/{i}", actor="solver", cause=sha)
                for i, e in enumerate([late, done])
            ],
            first_seq=first,
            time=format_time(hours(30)),
            prev_hash=log.events[-1].hash,
        )
    )
    whole = log.view()
    split_path = tmp_path / "split.db"
    with AuditStore(split_path) as store:
        catch_up(EventList(log.events[:first]), store)  # up to the queue change: held
        assert store.load_state().held
    with AuditStore(split_path) as store:
        catch_up(EventList(log.events), store)
        for view in (whole, store):
            (interval,) = history.query(view, job="a/x")
            assert interval.start == format_time(hours(1))
            used = rows_by(usage.by_team(view, ts(0), ts(2)), "team")["a"]
            assert used["used_gpu_h"] == 8.0 and used["quota_gpu_h"] == 24.0
            at = cluster_at(view, seq_at_time(view, format_time(hours(1.5))))
            assert [p["job"] for p in at["placements"]] == ["a/x"]
            change = changes_query.changes(view, team="a")[-1]
            assert change["merged"] == format_time(hours(1))
            assert change["applied"] == format_time(hours(30))
    whole.close()


def reclaim_log(b_reclaim: PreemptionScope | None, victim: str) -> LogBuilder:
    """Queue a (nominal 8) runs two 8-GPU jobs, so it borrows 8; queue b (nominal 8) runs
    nothing and reclaims `victim` for its low-priority job. a/np1 and a/np2 are
    non-preemptible (np1, first by name, is the one within nominal), a/hi is not."""
    log = LogBuilder()
    bootstrap(log, approvers=(LI,))
    if b_reclaim is not None:
        own = replace(
            queue("b", cohort="c", quotas={"h100": (8, None, None)}),
            reclaim_within_cohort=b_reclaim,
        )
        log.commit(0.5, [ev.QueueConfigured(own)], approvers=(LI,))
    first, second = ("np1", "np2") if victim.startswith("a/np") else ("np1", "hi")
    sha = submit(
        log,
        1,
        job(first, queue="a", gpu=8, priority=900, preemptible=False),
        job(second, queue="a", gpu=8, priority=900, preemptible=second == "hi"),
    )
    log.solve(1, sha, [placed(f"a/{first}", ("n1", 8)), placed(f"a/{second}", ("n2", 8))])
    sha = submit(log, 2, job("low", queue="b", gpu=8, priority=100))
    log.solve(
        2,
        sha,
        [
            ev.JobPreempted(victim, "queue b reclaims", "b/low", 0.0, "s", "reclaim"),
            placed("b/low", ("n1" if victim == "a/np1" else "n2", 8)),
        ],
    )
    return log


def test_audit_judges_reclaim_by_the_reclaiming_queues_own_setting() -> None:
    """reclaimWithinCohort per queue (Kueue's ClusterQueue): b's own LowerPriority forbids
    reclaiming a higher-priority borrower; the Policy's Any (no setting) allows it."""
    with reclaim_log(None, "a/hi").view() as store:
        assert violations(store) == []
    with reclaim_log(PreemptionScope.LOWER_PRIORITY, "a/hi").view() as store:
        found = violations(store)
        assert [(c, s) for c, s, _ in found] == [("preemption-rules", "a/hi")]
        (v,) = compliance_query.compliance(store)["violations"]
        assert "reclaimWithinCohort is LowerPriority" in v["message"]


def test_a_non_preemptible_job_on_borrowed_capacity_may_be_reclaimed() -> None:
    """A non-preemptible job does not borrow: of a/np1 and a/np2 (16 GPUs on a nominal 8),
    np2 holds borrowed capacity and may be reclaimed; np1, within nominal, may not."""
    with reclaim_log(None, "a/np2").view() as store:
        assert violations(store) == []
    with reclaim_log(None, "a/np1").view() as store:
        found = violations(store)
        assert sorted(c for c, _, _ in found) == ["non-preemptible", "preemption-rules"]


# -- the trust boundary: platform owners, namespaces, members (issue 32) --------------------


def test_a_team_in_a_kubernetes_namespace_and_an_unapproved_platform_change_fail() -> None:
    """A log an older gitsched wrote: audit judges it by today's rules."""
    log = LogBuilder()
    bootstrap(log)
    log.commit(0.5, [ev.OwnersChanged("/", (Owner("olga@platform.example"),))])
    log.commit(1, [ev.QueueConfigured(queue("kube-system", quotas={"h100": (8, None, None)}))])
    log.commit(
        2, [ev.NodeRegistered(node("n3", region="eu"))], approvers=("olga@platform.example",)
    )
    log.commit(3, [ev.NodeRegistered(node("n4", region="eu"))])
    with log.view() as store:
        found = [
            (v["subject"], v["message"]) for v in compliance_query.compliance(store)["violations"]
        ]
    assert any(
        subject == "kube-system" and "would run its pods in namespace kube-system" in message
        for subject, message in found
    ), found
    # the unowned team's creation needed the platform, as did the last node; n3 was approved
    platform = [m for s, m in found if s == "/"]
    assert len(platform) == 1 and "change of the platform" in platform[0]
    assert "olga@platform.example" in platform[0]


def test_jobs_from_outside_the_team_fail_job_membership() -> None:
    log = LogBuilder()
    bootstrap(log)
    log.commit(
        0.5,
        [
            ev.PolicyChanged(Policy(require_member_for_jobs=True)),
            ev.OwnersChanged("a", (Owner("ana@ml.example"),)),
            ev.MembersChanged("a", ("lin@a.example",)),
        ],
    )
    submit(log, 1, job("mine", queue="a"), author=("Lin", "lin@a.example"))
    submit(log, 2, job("sneaky", queue="a"), author=("Bob", "bob@b.example"))
    with log.view() as store:
        result = compliance_query.compliance(store)
    (check,) = [c for c in result["checks"] if c["check"] == "job-membership"]
    assert check["checked"] == 2 and check["violations"] == 1
    (violation,) = [v for v in result["violations"] if v["check"] == "job-membership"]
    assert violation["subject"] == "a"
    assert "bob@b.example is not a member or owner of team a" in violation["message"]
