"""The fact timeline: when each event's fact happened, beside when it was appended."""

from __future__ import annotations

from typing import Any

from gitsched.eventlog.timeline import Timeline, stated_time

SHA = "a" * 40
LATER_SHA = "b" * 40
APPENDED = "2025-11-19T12:00:00.000000Z"


def commit(sha: str, committed_at: str) -> dict[str, Any]:
    return {"commit": {"sha": sha, "committed_at": committed_at}}


def test_stated_times_are_the_commit_date_and_the_decision_time_in_utc() -> None:
    assert stated_time("CommitApplied", commit(SHA, "2025-11-17T02:00:00+02:00")) == (
        "2025-11-17T00:00:00.000000Z"
    )
    assert stated_time("CommitRejected", commit(SHA, "2025-11-17T00:00:00Z")) == (
        "2025-11-17T00:00:00.000000Z"
    )
    assert stated_time("PlacementDecided", {"at": "2025-11-17T00:00:00.000000Z"}) == (
        "2025-11-17T00:00:00.000000Z"
    )
    assert stated_time("PlacementDecided", {"at": ""}) == ""
    assert stated_time("JobSubmitted", {"job": {}}) == ""


def test_a_commits_changes_wait_for_its_date_and_its_solve_takes_it_too() -> None:
    timeline: Timeline[str] = Timeline()
    author = "Ana <ana@ml.example>"
    assert timeline.add("queue", "QueueConfigured", {}, APPENDED, SHA, author) == []
    assert timeline.add("job", "JobSubmitted", {}, APPENDED, SHA, author) == []
    assert timeline.held == ["queue", "job"]
    merged = "2025-11-17T00:00:00.000000Z"
    released = timeline.add(
        "commit", "CommitApplied", commit(SHA, "2025-11-16T19:00:00-05:00"), APPENDED, SHA, author
    )
    assert released == [("queue", merged), ("job", merged), ("commit", merged)]
    assert timeline.add("pending", "JobPending", {}, APPENDED, SHA, "solver") == [
        ("pending", merged)
    ]
    assert timeline.add("placed", "PlacementDecided", {"at": merged}, APPENDED, SHA, "solver") == [
        ("placed", merged)
    ]


def test_an_append_that_states_no_time_takes_its_append_time() -> None:
    timeline: Timeline[str] = Timeline()
    # A node agent's report: not a commit's change, nothing to wait for.
    assert timeline.add("finished", "JobFinished", {}, APPENDED, "k8s/pod-1", "kubernetes") == [
        ("finished", APPENDED)
    ]


def test_fact_times_never_go_back() -> None:
    timeline: Timeline[str] = Timeline()
    first = timeline.add(
        "c1", "CommitApplied", commit(SHA, "2025-11-17T10:00:00Z"), APPENDED, SHA, "a"
    )
    # Committed earlier (a skewed clock), logged later: it takes the time before it.
    second = timeline.add(
        "c2", "CommitApplied", commit(LATER_SHA, "2025-11-17T09:00:00Z"), APPENDED, LATER_SHA, "a"
    )
    assert first == [("c1", "2025-11-17T10:00:00.000000Z")]
    assert second == [("c2", "2025-11-17T10:00:00.000000Z")]


def test_held_changes_of_an_append_that_never_states_a_time_take_the_append_time() -> None:
    timeline: Timeline[str] = Timeline()
    assert timeline.add("queue", "QueueConfigured", {}, APPENDED, SHA, "a") == []
    later = "2025-11-19T13:00:00.000000Z"
    assert timeline.add("finished", "JobFinished", {}, later, "k8s", "kubernetes") == [
        ("queue", APPENDED),
        ("finished", later),
    ]


def test_a_timeline_resumes_from_its_saved_parts() -> None:
    timeline: Timeline[str] = Timeline()
    timeline.add("queue", "QueueConfigured", {}, APPENDED, SHA, "a")
    resumed: Timeline[str] = Timeline(timeline.time, list(timeline.unit), list(timeline.held))
    merged = "2025-11-17T00:00:00.000000Z"
    assert resumed.add("commit", "CommitApplied", commit(SHA, merged), APPENDED, SHA, "a") == [
        ("queue", merged),
        ("commit", merged),
    ]
