"""`gitsched audit ...` against logs built from real git repos.

Golden tests: the log of `audit_fixtures.HISTORY` is reconciled with a fixed
clock, so every answer is the same on every run and is compared with the files
in audit_golden/ (GITSCHED_UPDATE_GOLDEN=1 rewrites them after a deliberate
change). Also: a view rebuilt from 0 equals one built incrementally, the same
log always gives the same report, and a tampered log fails `log verify`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.audit_fixtures import (
    ANA,
    EPOCH,
    HISTORY,
    STEP,
    build_audit_log,
    commit_step,
    gitsched_cli,
    init_repo,
)

GOLDEN = Path(__file__).with_name("audit_golden")
UPDATE = os.environ.get("GITSCHED_UPDATE_GOLDEN") == "1"
PERIOD = ("--since", "2025-11-16T09:00:00Z", "--until", "2025-11-16T20:00:00Z")


@pytest.fixture(scope="module")
def audited_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The reconciled HISTORY repo: copy it, never change it."""
    yield build_audit_log(tmp_path_factory.mktemp("audit") / "cluster")


@pytest.fixture
def audited(audited_template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cluster"
    shutil.copytree(audited_template, copy, symlinks=True)
    for stale in (copy / ".gitsched").glob("audit.db*"):
        stale.unlink()
    return copy


def golden(name: str, value: Any) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if UPDATE or not path.exists():
        if not UPDATE and os.environ.get("CI"):
            pytest.fail(f"golden file {path} is missing: run with GITSCHED_UPDATE_GOLDEN=1")
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert json.loads(path.read_text()) == json.loads(text), (
        f"`{name}` differs from {path}; if the change is intended, rerun with "
        "GITSCHED_UPDATE_GOLDEN=1 and review the diff"
    )


QUERIES: dict[str, tuple[str, ...]] = {
    "history-team-ml": ("history", "--team", "ml"),
    "history-node-gpu-3": ("history", "--node", "gpu-3"),
    "history-job-serve": ("history", "--job", "serve"),
    "history-flavor-window": (
        "history",
        "--gpu-flavor",
        "h100-80g",
        "--since",
        "2025-11-16T14:30Z",
        "--until",
        "2025-11-16T15:30Z",
    ),
    "at-seq-30": ("at", "--seq", "30"),
    "at-time": ("at", "--at", "2025-11-16T14:30:00Z"),
    "usage-team": ("usage", "--by", "team", *PERIOD),
    "usage-user": ("usage", "--by", "user", *PERIOD),
    "usage-flavor": ("usage", "--by", "flavor", *PERIOD),
    "changes": ("changes",),
    "changes-team-cv": ("changes", "--team", "cv"),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_queries_match_their_golden_answers(audited: Path, name: str) -> None:
    run = gitsched_cli("audit", *QUERIES[name], "--repo", audited, "--format", "json")
    golden(name, run.json())


def test_compliance_names_the_violations_and_their_events(audited: Path) -> None:
    run = gitsched_cli("audit", "compliance", "--repo", audited, "--format", "json", expect=1)
    result = run.json()
    golden("compliance", result)
    failed = {c["check"] for c in result["checks"] if c["status"] == "FAIL"}
    assert failed == {"quota-approval"}
    # the bootstrap commit creates the queues and OWNERS: nobody owned them at its base;
    # priya's raise of ml's limit, approved by herself, is not approved by ml's owner
    (violation,) = result["violations"]
    assert violation["subject"] == "ml"
    assert "has no approval from an owner at the base (ana@ml.example)" in violation["message"]
    assert "priya@platform.example (trailer on" in violation["message"]
    assert "is not in teams/ml/OWNERS" in violation["message"]
    for v in result["violations"]:
        assert all(e["type"] and e["id"] for e in v["evidence"]), v
    table = gitsched_cli("audit", "compliance", "--repo", audited, expect=1).stdout
    assert re.search(r"^quota-approval +FAIL", table, re.MULTILINE)


def test_history_tells_why_each_interval_ended(audited: Path) -> None:
    rows = gitsched_cli(
        "audit", "history", "--team", "cv", "--repo", audited, "--format", "json"
    ).json()
    states = {(r["job"], r["state"]) for r in rows}
    assert ("cv/eval", "NODE_FAIL") in states
    rows = gitsched_cli(
        "audit", "history", "--team", "ml", "--repo", audited, "--format", "json"
    ).json()
    preempted = [r for r in rows if r["state"] == "PREEMPTED"]
    assert preempted and "reclaims" in preempted[0]["end_reason"]
    csv = gitsched_cli(
        "audit", "history", "--node", "gpu-3", "--repo", audited, "--format", "csv"
    ).stdout
    assert (
        csv.splitlines()[0]
        == "job,attempt,user,nodes,replicas,gpus,flavor,queued,start,wait_s,end,state,start_reason,end_reason"
    )


def test_waits_give_the_figures_of_the_admissions_history_lists(audited: Path) -> None:
    """`audit waits` over a period: per queue, the count and the largest wait of the
    intervals `audit history` shows admitted in it, and one JSON document."""
    result = gitsched_cli("audit", "waits", *PERIOD, "--repo", audited, "--format", "json").json()
    assert (result["by"], result["since"]) == ("queue", "2025-11-16T09:00:00.000000Z")
    expected: dict[str, list[float]] = {}
    for team in ("ml", "cv", "risk"):
        rows = gitsched_cli(
            "audit", "history", "--team", team, *PERIOD, "--repo", audited, "--format", "json"
        ).json()
        for r in rows:
            start = r["start"].replace(".000000", "")
            if (
                r["start_kind"] == "admitted"
                and r["wait_s"] is not None
                and PERIOD[1] <= start < PERIOD[3]
            ):
                expected.setdefault(r["queue"], []).append(r["wait_s"])
    got = {r["group"]: (r["count"], r["max_wait_s"]) for r in result["rows"]}
    assert got == {q: (len(w), max(w)) for q, w in expected.items()}
    assert result["all"]["count"] == sum(len(w) for w in expected.values()) > 0
    csv = gitsched_cli("audit", "waits", "--by", "size", "--repo", audited, "--format", "csv")
    lines = csv.stdout.splitlines()
    assert lines[0] == "group,count,mean_wait_s,p50_wait_s,p95_wait_s,p99_wait_s,max_wait_s"
    assert lines[-1].startswith("all,")


def test_usage_balances_borrowed_against_lent(audited: Path) -> None:
    rows = gitsched_cli("audit", "usage", *PERIOD, "--repo", audited, "--format", "json").json()[
        "rows"
    ]
    borrowed = sum(r["borrowed_gpu_h"] for r in rows if r["team"] in ("ml", "cv"))
    lent = sum(r["lent_gpu_h"] for r in rows if r["team"] in ("ml", "cv"))
    assert borrowed > 0 and abs(borrowed - lent) < 0.01


def test_a_view_built_incrementally_equals_one_rebuilt_from_zero(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "cluster")
    incremental = tmp_path / "incremental.db"
    for i, step in enumerate(HISTORY):
        commit_step(repo, step, EPOCH + i * STEP)
        gitsched_cli("reconcile", "--once", repo)
        gitsched_cli("audit", "history", "--team", "ml", "--repo", repo, "--db", incremental)
    # Lookups fold without verifying; evidence verifies what they folded since (a rebuild
    # verifies as it goes), so both views end verified to the head.
    gitsched_cli("audit", "compliance", "--repo", repo, "--db", incremental, expect=1)
    rebuilt = tmp_path / "rebuilt.db"
    out = gitsched_cli("audit", "rebuild", "--repo", repo, "--db", rebuilt).stdout
    assert "rebuilt" in out and "events/s" in out
    assert dump(incremental) == dump(rebuilt)
    # A rerun on a view that has seen everything reads nothing new and answers the same.
    again = gitsched_cli("audit", "changes", "--repo", repo, "--db", rebuilt, "--format", "json")
    assert (
        again.json()
        == gitsched_cli(
            "audit", "changes", "--repo", repo, "--db", incremental, "--format", "json"
        ).json()
    )


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(db.execute(f"SELECT * FROM {t}"), key=repr) for t in tables}
    finally:
        db.close()


def test_the_view_lives_beside_the_log_unless_told_otherwise(audited: Path, tmp_path: Path) -> None:
    gitsched_cli("audit", "changes", "--repo", audited)
    assert (audited / ".gitsched" / "audit.db").exists()
    elsewhere = tmp_path / "views" / "mine.db"
    gitsched_cli("audit", "changes", "--repo", audited, env={"GITSCHED_AUDIT_DB": str(elsewhere)})
    assert elsewhere.exists()


def test_the_same_log_always_gives_the_same_report(audited: Path, tmp_path: Path) -> None:
    first, second, third = tmp_path / "1.html", tmp_path / "2.html", tmp_path / "3.html"
    gitsched_cli("audit", "report", "--repo", audited, "--output", first)
    gitsched_cli("audit", "report", "--repo", audited, "--output", second)
    gitsched_cli("audit", "rebuild", "--repo", audited)
    gitsched_cli("audit", "report", "--repo", audited, "--output", third)
    assert first.read_bytes() == second.read_bytes() == third.read_bytes()
    page = first.read_text()
    assert "<script" in page and "cdn" not in page.lower().split("<body>")[1][:2000]
    for text in ("Audit report: cluster audit-test", "quota-approval", "Li Wei"):
        assert text in page
    assert "cv\\u002fserve" in page  # in the Gantt chart's data, where plotly escapes "/"


def tamper(log: Path, sql: str) -> None:
    db = sqlite3.connect(log)
    try:
        db.execute(sql)
        db.commit()
    finally:
        db.close()


def test_a_tampered_log_fails_verify_and_names_the_first_broken_event(audited: Path) -> None:
    log = audited / ".gitsched" / "log.db"
    ok = gitsched_cli("log", "verify", "--repo", audited, "--format", "json").json()
    assert ok["ok"] and ok["broken"] is None
    gitsched_cli("audit", "history", "--team", "ml", "--repo", audited)  # the view reads it all
    tamper(
        log,
        "UPDATE events SET data = replace(data, '\"gpu_milli\":1000', '\"gpu_milli\":100') WHERE seq = 24",
    )
    broken = gitsched_cli("log", "verify", "--repo", audited, expect=1)
    assert broken.stdout.startswith("BROKEN at seq 24 (PlacementDecided ")
    assert "content does not match its hash" in broken.stdout
    data = gitsched_cli("log", "verify", "--repo", audited, "--format", "json", expect=1).json()
    assert data["broken"]["seq"] == 24 and data["broken"]["type"] and data["broken"]["id"]


def test_evidence_verifies_only_the_tail_and_log_verify_the_whole_chain(audited: Path) -> None:
    log = audited / ".gitsched" / "log.db"
    gitsched_cli("audit", "changes", "--repo", audited)  # builds the view, verified to the head
    with sqlite3.connect(audited / ".gitsched" / "audit.db") as view:
        checked = dict(view.execute("SELECT key, value FROM meta WHERE key LIKE 'chain_checked%'"))
        offset = dict(view.execute("SELECT key, value FROM meta WHERE key LIKE 'offset%'"))
    assert checked == {
        "chain_checked": offset["offset"],
        "chain_checked_hash": offset["offset_hash"],
    }
    # A change before the verified offset: the tail verification does not re-read it...
    tamper(log, "UPDATE events SET actor = actor || ' (edited)' WHERE seq = 5")
    gitsched_cli("audit", "changes", "--repo", audited, expect=0)
    # ...`log verify` reads it all, and finds it; its old name still works, and says so.
    assert gitsched_cli("log", "verify", "--repo", audited, expect=1).stdout.startswith(
        "BROKEN at seq 5"
    )
    moved = gitsched_cli("audit", "verify", "--repo", audited, expect=1)
    assert moved.stdout.startswith("BROKEN at seq 5") and "log verify" in moved.stderr


def test_a_deleted_event_is_a_gap_and_the_view_refuses_a_rewritten_log(audited: Path) -> None:
    log = audited / ".gitsched" / "log.db"
    tamper(log, "DELETE FROM events WHERE seq = 12")
    broken = gitsched_cli("log", "verify", "--repo", audited, expect=1)
    assert "BROKEN at seq 12" in broken.stdout and "missing" in broken.stdout
    refused = gitsched_cli("audit", "history", "--team", "ml", "--repo", audited, expect=2)
    assert "log verify" in refused.stderr


def test_the_view_refuses_a_log_rewritten_after_it_was_read(audited: Path) -> None:
    gitsched_cli("audit", "changes", "--repo", audited)
    last = gitsched_cli("log", "verify", "--repo", audited, "--format", "json").json()["events"]
    tamper(audited / ".gitsched" / "log.db", f"UPDATE events SET hash = 'x' WHERE seq = {last}")
    refused = gitsched_cli("audit", "history", "--team", "ml", "--repo", audited, expect=2)
    assert "rewritten" in refused.stderr and "rebuild" in refused.stderr
    # Evidence (changes, compliance) checks the whole chain first, and calls it broken.
    broken = gitsched_cli("audit", "changes", "--repo", audited, expect=1)
    assert f"the log's hash chain is broken at seq {last}" in broken.stderr


def test_mistakes_get_one_line_and_exit_2(audited: Path) -> None:
    for args, says in (
        (("history",), "give one of --job"),
        (("history", "--job", "x", "--since", "yesterday"), "not an ISO-8601 time"),
        (("at",), "give --at TIME or --seq N"),
        (("at", "--at", "2025-11-16", "--seq", "3"), "give --at TIME or --seq N"),
        (("usage", "--since", "2025-11-17", "--until", "2025-11-16"), "--since is after --until"),
    ):
        run = gitsched_cli("audit", *args, "--repo", audited, expect=2)
        assert says in run.stderr, run


def test_a_repo_that_keeps_changing_is_caught_up_on_every_query(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "cluster")
    for i, step in enumerate(HISTORY[:3]):
        commit_step(repo, step, EPOCH + i * STEP)
    gitsched_cli("reconcile", "--once", repo)
    before = gitsched_cli(
        "audit", "history", "--team", "ml", "--repo", repo, "--format", "json"
    ).json()
    commit_step(repo, HISTORY[3], EPOCH + 3 * STEP)
    gitsched_cli("reconcile", "--once", repo)
    after = gitsched_cli(
        "audit", "history", "--team", "ml", "--repo", repo, "--format", "json"
    ).json()
    assert len(after) == len(before) + 1 and after[-1]["job"] == "ml/sweep"
    assert after[-1]["user"] == f"{ANA[0]} <{ANA[1]}>"


def test_a_row_that_is_not_json_stops_the_view_with_one_line(audited: Path) -> None:
    tamper(audited / ".gitsched" / "log.db", "UPDATE events SET data = 'not json' WHERE seq = 14")
    refused = gitsched_cli("audit", "history", "--team", "ml", "--repo", audited, expect=2)
    assert "seq 14: the stored data is not JSON" in refused.stderr
    assert not list((audited / ".gitsched").glob("audit.db*"))  # no half-built view left
    broken = gitsched_cli("log", "verify", "--repo", audited, expect=1)
    assert broken.stdout.startswith("BROKEN at seq 14")


def test_usage_and_the_report_cover_the_same_default_period(audited: Path) -> None:
    from datetime import datetime

    from gitsched.eventlog.timeline import Timeline
    from tests.support.cluster_repo import read_events

    # The log's first and last facts, dated as every audit answer dates them.
    timeline: Timeline[object] = Timeline()
    facts = [
        fact_time
        for e in read_events(audited / ".gitsched" / "log.db")
        for _, fact_time in timeline.add(e, e.type, e.data, e.time, e.cause, e.actor)
    ]
    usage = gitsched_cli("audit", "usage", "--repo", audited, "--format", "json").json()
    first, last = (datetime.fromisoformat(t) for t in (facts[0], facts[-1]))
    assert datetime.fromisoformat(usage["since"]) == first
    assert datetime.fromisoformat(usage["until"]) == last  # the log's, not the clock's
    page = audited.parent / "report.html"
    gitsched_cli("audit", "report", "--repo", audited, "--output", page)
    shown = f"Period {first:%Y-%m-%d %H:%M:%S} UTC to {last:%Y-%m-%d %H:%M:%S} UTC"
    assert shown in page.read_text()
