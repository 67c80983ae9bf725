"""Events are forever: an old payload stored in the log is upcast on read."""

from __future__ import annotations

from typing import Any

import pytest

from gitsched.engine import events as ev
from gitsched.eventlog import codec
from gitsched.eventlog.base import LogCorrupted
from gitsched.eventlog.envelope import GENESIS_HASH, NewEvent, seal


def stored(type_name: str, version: int, data: dict[str, Any]):  # type: ignore[no-untyped-def]
    return seal(
        NewEvent("x/0", type_name, version, data, "a", "c"),
        seq=1,
        time="2026-01-01T00:00:00.000000Z",
        prev_hash=GENESIS_HASH,
    )


def test_an_old_version_is_upcast_one_step_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend JobWithdrawn is at v3 now: v1 called the field "name", v2 added "reason" which v3 dropped.
    monkeypatch.setattr(ev.JobWithdrawn, "schema_version", 3)

    def v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
        return {"job": d["name"], "reason": ""}

    def v2_to_v3(d: dict[str, Any]) -> dict[str, Any]:
        return {"job": d["job"]}

    monkeypatch.setitem(codec.UPCASTERS, ("JobWithdrawn", 1), v1_to_v2)
    monkeypatch.setitem(codec.UPCASTERS, ("JobWithdrawn", 2), v2_to_v3)
    event = codec.decode(stored("JobWithdrawn", 1, {"name": "q/a"}))
    assert event == ev.JobWithdrawn(job="q/a")


def test_a_missing_upcaster_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev.JobWithdrawn, "schema_version", 2)
    with pytest.raises(LogCorrupted, match="no upcaster for JobWithdrawn v1"):
        codec.decode(stored("JobWithdrawn", 1, {"job": "q/a"}))


def test_a_newer_version_than_we_know_asks_for_an_upgrade() -> None:
    with pytest.raises(LogCorrupted, match="upgrade gitsched"):
        codec.decode(stored("JobWithdrawn", 9, {"job": "q/a"}))


def test_every_event_class_declares_type_and_version() -> None:
    for name, cls in ev.EVENT_TYPES.items():
        assert cls.type == name
        assert isinstance(cls.schema_version, int) and cls.schema_version >= 1


def test_a_payload_of_the_wrong_shape_is_refused_with_the_path_to_the_bad_value() -> None:
    good = stored(
        "JobPreempted",
        1,
        {
            "job": "q/a",
            "reason": "r",
            "preempted_by": "q/b",
            "lost_gpu_seconds": 2,
            "solve_id": "s",
        },
    )
    assert codec.decode(good) == ev.JobPreempted("q/a", "r", "q/b", 2.0, "s", "unrecorded")
    wrong = stored(
        "JobPreempted",
        1,
        {
            "job": "q/a",
            "reason": "r",
            "preempted_by": "q/b",
            "lost_gpu_seconds": "2",
            "solve_id": "s",
        },
    )
    with pytest.raises(LogCorrupted, match=r"event 1 \(JobPreempted\).*lost_gpu_seconds"):
        codec.decode(wrong)
    missing = stored("JobPreempted", 1, {"job": "q/a"})
    with pytest.raises(LogCorrupted, match="missing required field"):
        codec.decode(missing)


def test_a_job_stored_before_slices_reads_with_no_slices() -> None:
    """JobSubmitted v1 written before topology had sliceSize/sliceLevel (and mode unconstrained)."""
    from gitsched.engine.model import Resources, TopologyMode, TopologyRequirement

    old = stored(
        "JobSubmitted",
        1,
        {
            "job": {
                "name": "train",
                "queue": "q",
                "replicas": 2,
                "resources": {"gpu_milli": 8000, "cpu_milli": 0, "memory_mib": 0},
                "priority_class": "normal",
                "priority": 500,
                "topology": {"level": "rack", "mode": "preferred"},
            }
        },
    )
    event = codec.decode(old)
    assert isinstance(event, ev.JobSubmitted)
    assert event.job.topology == TopologyRequirement("rack", TopologyMode.PREFERRED, None, None)
    assert event.job.resources == Resources(8000)


def test_a_stored_v1_job_preempted_reads_as_v2_with_its_rule_unrecorded() -> None:
    """v2 records the rule that allowed a preemption; a v1 event never knew it."""
    old = stored(
        "JobPreempted",
        1,
        {
            "job": "q/low",
            "reason": "preempted by q/high (priority 900 > 100)",
            "preempted_by": "q/high",
            "lost_gpu_seconds": 0.0,
            "solve_id": "s1",
        },
    )
    event = codec.decode(old)
    assert isinstance(event, ev.JobPreempted)
    assert event.rule == "unrecorded" and event.preempted_by == "q/high"
    assert ev.JobPreempted.schema_version == 3
    new = codec.encode(event, id="x/1", actor="solver", cause="c")
    assert new.schema_version == 3 and new.data["rule"] == "unrecorded"
    assert new.data["at"] == ""


def test_a_stored_v2_job_preempted_reads_as_v3_with_its_decision_time_unknown() -> None:
    """v3 records when the decision that stopped the job was made (minimum run time is
    re-judged on it); a v2 event never knew it."""
    old = stored(
        "JobPreempted",
        2,
        {
            "job": "q/low",
            "reason": "preempted by q/high (priority 900 > 100)",
            "preempted_by": "q/high",
            "lost_gpu_seconds": 0.0,
            "solve_id": "s1",
            "rule": "within-queue",
        },
    )
    event = codec.decode(old)
    assert event == ev.JobPreempted(
        "q/low", "preempted by q/high (priority 900 > 100)", "q/high", 0.0, "s1", "within-queue", ""
    )


def test_a_v1_commit_applied_reads_with_its_author_date_and_committer_unknown() -> None:
    # As the log stored it before v2: the commit without author date or committer.
    commit = {
        "sha": "a" * 40,
        "author": "Ana Souza",
        "author_email": "ana@ml.example",
        "committed_at": "2025-11-16T10:00:00+01:00",
        "subject": "add job",
        "approvers": ["Priya Raman <priya@platform.example>"],
    }
    event = codec.decode(stored("CommitApplied", 1, {"commit": commit, "changes": 3}))
    assert isinstance(event, ev.CommitApplied)
    assert event.changes == 3
    assert event.commit.committed_at == "2025-11-16T10:00:00+01:00"
    assert (event.commit.authored_at, event.commit.committer, event.commit.committer_email) == (
        "",
        "",
        "",
    )
    rejected = codec.decode(stored("CommitRejected", 1, {"commit": commit, "errors": []}))
    assert isinstance(rejected, ev.CommitRejected)
    assert rejected.commit.approvers == ("Priya Raman <priya@platform.example>",)
    assert rejected.commit.committer == ""


def test_a_v1_solve_completed_reads_as_of_an_unrecorded_plan_source() -> None:
    v1 = {
        "solve_id": "abc/solve",
        "solver": "greedy",
        "status": "heuristic",
        "objective": 12.5,
        "bound": None,
        "gap": None,
        "seconds": 0.01,
        "variables": 0,
        "constraints": 0,
        "placed": 1,
        "kept": 0,
        "moved": 0,
        "preempted": 0,
        "pending": 0,
        "broken_soft": [],
    }
    event = codec.decode(stored("SolveCompleted", 1, v1))
    assert isinstance(event, ev.SolveCompleted)
    assert (event.plan_source, event.fallback, event.objective) == ("unrecorded", "", 12.5)


@pytest.mark.parametrize(
    ("solver", "levels"),
    [("highs", "weighted"), ("cbc", "weighted"), ("highs/decomposed", "weighted"), ("greedy", "")],
)
def test_a_v2_solve_completed_reads_as_of_one_weighted_objective(solver: str, levels: str) -> None:
    """v2 had no `solver.levels`: every MILP solve took the levels as one weighted sum."""
    v2 = {
        "solve_id": "abc/solve",
        "solver": solver,
        "status": "optimal",
        "objective": 12.5,
        "bound": 12.5,
        "gap": 0.0,
        "seconds": 0.01,
        "variables": 3,
        "constraints": 2,
        "placed": 1,
        "kept": 0,
        "moved": 0,
        "preempted": 0,
        "pending": 0,
        "broken_soft": [],
        "plan_source": "milp",
        "fallback": "",
    }
    event = codec.decode(stored("SolveCompleted", 2, v2))
    assert isinstance(event, ev.SolveCompleted)
    assert (event.levels, event.solver, event.plan_source) == (levels, solver, "milp")


@pytest.mark.parametrize(
    ("type_name", "data"),
    [
        ("JobFinished", {"job": "q/a"}),
        ("JobFailed", {"job": "q/a", "reason": "OOMKilled", "exit_code": 137, "replica": 0}),
        ("JobInterrupted", {"job": "q/a", "reason": "pod deleted outside gitsched"}),
    ],
)
def test_a_v1_job_end_reads_as_ending_at_an_unknown_time(
    type_name: str, data: dict[str, Any]
) -> None:
    event = codec.decode(stored(type_name, 1, data))
    assert type(event).__name__ == type_name and event.job == "q/a"  # type: ignore[attr-defined]
    assert event.at == ""  # type: ignore[attr-defined]


def test_a_stored_v1_placement_decided_reads_as_v2_with_its_move_reason_unrecorded() -> None:
    """v2 records why a running job moved and the work the move lost; a v1 move never knew
    it (an admission has no move reason either way)."""
    replica = {"node": "n1", "gpus": [0], "gpu_milli": 1000}
    base = {
        "job": "q/a",
        "flavor": "h100",
        "replicas": [replica],
        "reason": "moved to make room for q/b",
        "solve_id": "s1",
        "at": "2026-01-01T00:00:00+00:00",
    }
    moved = codec.decode(stored("PlacementDecided", 1, {**base, "action": "moved"}))
    assert isinstance(moved, ev.PlacementDecided)
    assert moved.rule == "unrecorded" and moved.lost_gpu_seconds == 0.0
    admitted = codec.decode(stored("PlacementDecided", 1, {**base, "action": "admitted"}))
    assert isinstance(admitted, ev.PlacementDecided) and admitted.rule == ""
    assert ev.PlacementDecided.schema_version == 2
    new = codec.encode(moved, id="x/1", actor="solver", cause="c")
    assert new.schema_version == 2 and new.data["rule"] == "unrecorded"


def test_a_v1_reservations_decided_reads_as_borrowing_nothing() -> None:
    """v2 records the part of each reservation beyond its queue's nominal quota; a v1
    reservation borrowed nothing: it is held against every later job, as it was then."""
    reservation = {
        "job": "q/big",
        "start": "2026-01-01T01:00:00.000000Z",
        "nodes": ["n1"],
        "flavor": "h100",
        "gpu_milli": 8000,
        "waits_for": ["q/a"],
    }
    v1 = {"solve_id": "s1", "at": "2026-01-01T00:00:00.000000Z", "reservations": [reservation]}
    event = codec.decode(stored("ReservationsDecided", 1, v1))
    assert isinstance(event, ev.ReservationsDecided)
    (r,) = event.reservations
    assert (r.job, r.gpu_milli, r.borrowed_milli) == ("q/big", 8000, 0)
    assert ev.ReservationsDecided.schema_version == 2
    new = codec.encode(event, id="x/1", actor="solver", cause="c")
    assert new.schema_version == 2 and new.data["reservations"][0]["borrowed_milli"] == 0
