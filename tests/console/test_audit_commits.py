"""gitsched.audit.commits, the lookups the console reads the audit view with, on the demo's log:
each answer checked against the log's own events."""

from __future__ import annotations

from pathlib import Path

from gitsched.audit import commits
from gitsched.audit.catchup import open_view
from gitsched.eventlog import open_log
from tests.support.console import log_url


def test_commit_lookups_and_what_each_moved(demo: Path) -> None:
    with open_log(log_url(demo), create=False) as event_log:
        events = list(event_log.read())
        store, _ = open_view(event_log, demo / ".gitsched" / "audit.db")
    try:
        recorded = [e for e in events if e.type in ("CommitApplied", "CommitRejected")]
        newest = commits.recent_commits(store, limit=3)
        assert [c["seq"] for c in newest] == [e.seq for e in recorded][::-1][:3]
        assert commits.commit_count(store) == len(recorded)
        older = commits.recent_commits(store, before_seq=newest[-1]["seq"], limit=100)
        assert len(newest) + len(older) == len(recorded)

        sha = recorded[-1].data["commit"]["sha"]
        assert commits.find_commit(store, sha[:7])["sha"] == sha  # type: ignore[index]
        assert commits.find_commit(store, sha[:6]) is None  # too short to name one
        assert commits.find_commit(store, "f" * 40) is None

        # the commit that made a job: the first applied commit at or after its event
        submitted = next(e for e in events if e.type == "JobSubmitted")
        made = commits.commit_that_made(store, submitted.seq)
        first_after = next(
            e for e in recorded if e.seq >= submitted.seq and e.type == "CommitApplied"
        )
        assert made is not None and made["seq"] == first_after.seq

        # what a commit moved: the placements whose cause is the commit, counted in full
        by_cause: dict[str, int] = {}
        for e in events:
            if e.type == "PlacementDecided":
                by_cause[e.cause] = by_cause.get(e.cause, 0) + 1
        shas = [e.data["commit"]["sha"] for e in recorded]
        moved = commits.moved_by(store, shas, shown=1)
        for s in shas:
            assert moved[s]["total"] >= by_cause.get(s, 0)
            assert sum(n for _, n in moved[s]["counts"]) == moved[s]["total"]
            assert len(moved[s]["shown"]) == min(1, moved[s]["total"])
        assert sum(m["total"] for m in moved.values()) > 0

        # nlp/moe-gang waited for its quota before the borrowing limit was raised
        stretches = commits.pending_stretches(store, "nlp/moe-gang")
        assert stretches and "borrowing limit 8" in stretches[0]["reason"]
        assert stretches[0]["to_seq"] is not None
        waits = commits.wait_seconds_by_queue(store)
        assert set(waits) <= {"fraud", "nlp", "speech", "vision"} and waits["nlp"] == sorted(
            waits["nlp"]
        )
    finally:
        store.close()
