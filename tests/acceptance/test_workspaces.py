"""Workspaces and suspend, through the CLI on a real git repo: a workspace suspended when
its GPUs stay idle (telemetry ingested as a DCGM scrape series) and resumed by a commit, a
job suspended and resumed with spec.suspend, `plan` predicting exactly what `reconcile`
appends (greedy and HiGHS), `state` and `audit history` saying who did what and when, and
bad input rejected with file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gitsched.eventlog.base import EventLog
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from tests.support.cluster_repo import (
    ANA,
    EPOCH,
    LI,
    POLICY_YAML,
    ClusterRepo,
    gitsched,
    job_yaml,
    read_events,
)
from tests.support.plan import payload, predicted
from tests.support.telemetry import dcgm_series

H = "apiVersion: gitsched.io/v1\n"


def workspace_yaml(name: str = "nb", *, extra: str = "", minutes: int = 30) -> str:
    return (
        H
        + f"""kind: Workspace
metadata:
  name: {name}
spec:
  resources: {{gpu: 1, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
  idle: {{suspendAfterMinutes: {minutes}}}
{extra}"""
    )


def suspended(job: str, text: str) -> str:
    return text + "  suspend: true\n" if "suspend:" not in text else text


def state_of(repo: ClusterRepo) -> dict[str, object]:
    run = gitsched("state", "--repo", repo.path, "--format", "json", expect=0)
    state: dict[str, object] = json.loads(run.stdout)
    return state


def test_a_workspace_is_suspended_when_idle_and_resumed_by_a_commit(repo: ClusterRepo) -> None:
    repo.bootstrap()
    repo.write("teams/ml/workspaces/nb.yaml", workspace_yaml())
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train", gpu=8))
    repo.commit("ml: a notebook and a training job", author=ANA)  # at EPOCH + 1 h
    gitsched("reconcile", "--once", repo.path, expect=0)
    state = state_of(repo)
    placements = state["placements"]
    assert isinstance(placements, dict) and "ml/nb" in placements
    (node,) = {r["node"] for r in placements["ml/nb"]["replicas"]}
    (gpu,) = placements["ml/nb"]["replicas"][0]["gpus"]

    # Its GPU at 1% for 25 minutes: not yet its 30.
    series = repo.path.parent / "dcgm.prom"
    series.write_text(dcgm_series(node, range(gpu, gpu + 1), EPOCH + 3600, 25, 1))
    run = gitsched("telemetry", "ingest", series, "--repo", repo.path, "--format", "json")
    assert json.loads(run.stdout)["suspended"] == []
    # ... then idle on to 35 minutes: suspended at the telemetry's time, not the clock's.
    series.write_text(dcgm_series(node, range(gpu, gpu + 1), EPOCH + 3600 + 25 * 60, 10, 1))
    run = gitsched("telemetry", "ingest", series, "--repo", repo.path, "--format", "json")
    (flag,) = json.loads(run.stdout)["suspended"]
    assert flag["job"] == "ml/nb" and flag["after_minutes"] == 30
    assert flag["since"] == "2025-11-16T10:00:00.000000Z"
    assert flag["until"] >= "2025-11-16T10:30:00.000000Z"

    state = state_of(repo)
    assert "ml/nb" not in state["placements"]  # type: ignore[operator]
    held = state["suspended"]["ml/nb"]  # type: ignore[index]
    assert held["kind"] == "Workspace" and held["cause"] == "idle"
    assert "idle" in held["reason"] and "spec.resume" in held["reason"]
    text = gitsched("state", "--repo", repo.path, expect=0).stdout
    assert "Suspended" in text and "1 suspended" in text
    types = [e.type for e in read_events(repo.log_path)]
    assert "WorkspaceSuspended" in types

    # A commit that leaves the file as it was does not resume it: it still says suspend: false.
    repo.write("teams/ml/jobs/other.yaml", job_yaml("other", gpu=1))
    repo.commit("ml: another job", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    assert "ml/nb" in state_of(repo)["suspended"]  # type: ignore[operator]

    # Li bumps spec.resume: resumed, queued, placed; the audit says who and when.
    repo.write("teams/ml/workspaces/nb.yaml", workspace_yaml(extra='  resume: "2025-11-16"\n'))
    resumed_at = repo.commit("ml: back to the notebook", author=LI)
    gitsched("reconcile", "--once", repo.path, expect=0)
    state = state_of(repo)
    assert "ml/nb" in state["placements"] and not state["suspended"]  # type: ignore[operator]
    events = read_events(repo.log_path)
    (resumed,) = [e for e in events if e.type == "JobResumed"]
    assert resumed.data["by"] == f"{LI[0]} <{LI[1]}>" and resumed.data["how"] == "resume"
    assert resumed.cause == resumed_at

    history = gitsched(
        "audit", "history", "--repo", repo.path, "--job", "ml/nb", "--format", "json", expect=0
    ).json()
    assert [i["state"] for i in history] == ["PREEMPTED", "RUNNING"]
    assert "suspended: idle" in history[0]["end_reason"]
    assert f"resumed (spec.resume changed) by {LI[0]} <{LI[1]}>" in history[1]["start_reason"]
    assert history[1]["cause"] == resumed_at
    assert gitsched("audit", "compliance", "--repo", repo.path).returncode == 0

    # GPU-hours by kind of work: the notebook's, and the batch job's, per team.
    period = ("--since", "2025-11-16T09:00:00Z", "--until", "2025-11-16T23:00:00Z")
    usage = gitsched(
        "audit", "usage", "--by", "kind", *period, "--repo", repo.path, "--format", "json"
    ).json()
    by_kind = {(r["team"], r["kind"]): r for r in usage["rows"]}
    assert set(by_kind) == {("ml", "Job"), ("ml", "Workspace")}
    assert (
        by_kind[("ml", "Workspace")]["used_gpu_h"] > 0 and by_kind[("ml", "Job")]["used_gpu_h"] > 0
    )
    team = gitsched(
        "audit", "usage", "--by", "team", *period, "--repo", repo.path, "--format", "json"
    ).json()
    total = sum(r["used_gpu_h"] for r in team["rows"] if r["team"] == "ml")
    assert abs(sum(r["used_gpu_h"] for r in usage["rows"]) - total) < 0.01


def plan_then_reconcile(repo: ClusterRepo, event_log: EventLog, rec: Reconciler) -> None:
    """`plan` of the newest commit, then `reconcile`: the same events, byte for byte."""
    plan = plan_change(GitRepo(repo.path), event_log, None, repo.head())
    seq = event_log.last_seq()
    report = rec.run_once()
    appended = [
        (s.id, s.type, s.actor, s.cause, payload(s.type, s.data)) for s in event_log.read(seq)
    ]
    assert predicted(plan.groups) == appended
    assert report.commits[-1].applied


@pytest.mark.parametrize("solver", ["greedy", "highs"])
def test_suspend_stops_a_running_job_and_resume_queues_it_in_its_old_place(
    repo: ClusterRepo, solver: str
) -> None:
    repo.bootstrap()
    repo.write("policies/default.yaml", POLICY_YAML.replace("name: greedy", f"name: {solver}"))
    big = job_yaml("big", replicas=4, gpu=8)  # the whole cluster
    repo.write("teams/ml/jobs/big.yaml", big)
    repo.commit("ml: big", author=ANA)
    with SQLiteEventLog(repo.log_path) as event_log:
        rec = Reconciler(GitRepo(repo.path), event_log)
        rec.run_once()
        repo.write("teams/ml/jobs/small.yaml", job_yaml("small", gpu=8))
        repo.commit("ml: small waits", author=ANA)
        plan_then_reconcile(repo, event_log, rec)
        repo.write("teams/ml/jobs/big.yaml", big + "  suspend: true\n")
        suspended_in = repo.commit("ml: pause big", author=LI)
        plan_then_reconcile(repo, event_log, rec)
        repo.write("teams/ml/jobs/late.yaml", job_yaml("late", replicas=4, gpu=8))
        repo.commit("ml: late", author=ANA)
        plan_then_reconcile(repo, event_log, rec)
        repo.write("teams/ml/jobs/big.yaml", big)
        resumed_in = repo.commit("ml: resume big", author=LI)
        plan_then_reconcile(repo, event_log, rec)
        repo.remove("teams/ml/jobs/small.yaml")
        repo.commit("ml: small is done", author=ANA)
        plan_then_reconcile(repo, event_log, rec)

    events = read_events(repo.log_path)
    (paused,) = [e for e in events if e.type == "JobSuspended"]
    assert paused.cause == suspended_in and paused.data["by"] == f"{LI[0]} <{LI[1]}>"
    (stop,) = [e for e in events if e.type == "JobPreempted" and e.data["job"] == "ml/big"]
    assert stop.data["rule"] == "suspend" and stop.data["lost_gpu_seconds"] == 32 * 7200
    (resumed,) = [e for e in events if e.type == "JobResumed"]
    assert resumed.cause == resumed_in and resumed.data["how"] == "suspend"
    state = state_of(repo)
    # big was submitted before late: resumed, it goes first when small's GPUs free up.
    assert sorted(state["placements"]) == ["ml/big"]  # type: ignore[call-overload]
    assert "ml/late" in state["pending"]  # type: ignore[operator]

    history = gitsched("audit", "history", "--repo", repo.path, "--job", "ml/big").stdout
    assert "suspended (spec.suspend: true) by Li Wei" in history
    assert "resumed (spec.suspend: false) by Li Wei" in history
    assert gitsched("audit", "compliance", "--repo", repo.path).returncode == 0


def test_plan_says_a_suspend_stops_the_job(repo: ClusterRepo) -> None:
    repo.bootstrap()
    repo.write("teams/ml/jobs/a.yaml", job_yaml("a", gpu=8))
    repo.commit("ml: a", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    repo.write("teams/ml/jobs/a.yaml", job_yaml("a", gpu=8) + "  suspend: true\n")
    repo.commit("ml: pause a", author=ANA)
    plan = gitsched("plan", repo.path, "..main", "--format", "json", expect=1).json()
    (stop,) = [e for e in plan["effects"] if e["job"] == "ml/a"]
    assert stop["action"] == "preempted" and "suspended (spec.suspend: true)" in stop["reason"]


BAD = {
    "teams/ml/workspaces/two.yaml": (
        workspace_yaml("two", extra="  replicas: 2\n"),
        "spec.replicas",
        "must be 1: a workspace is one interactive session",
    ),
    "teams/ml/workspaces/odd.yaml": (
        workspace_yaml("odd", extra="  gpuCount: 1\n"),
        "spec.gpuCount",
        "unknown field 'gpuCount'",
    ),
    "teams/ml/workspaces/late.yaml": (
        workspace_yaml("late", minutes=0),
        "spec.idle.suspendAfterMinutes",
        "must be at least 1",
    ),
    "teams/ml/workspaces/root.yaml": (
        workspace_yaml(
            "root",
            extra="  template:\n    spec:\n      containers:\n        - name: nb\n"
            "          image: jupyter\n          securityContext: {privileged: true}\n",
        ),
        "spec.template.spec.containers[0].securityContext.privileged",
        "privileged",
    ),
    "teams/ml/queue.yaml": (
        H
        + "kind: Queue\nmetadata:\n  name: ml\nspec:\n  suspend: true\n"
        + "  quotas:\n    - {flavor: h100-80g, nominal: 32}\n",
        "spec.suspend",
        "unknown field 'suspend'",
    ),
    "teams/ml/jobs/flag.yaml": (
        job_yaml("flag", gpu=1) + '  suspend: "yes"\n',
        "spec.suspend",
        "must be true or false",
    ),
}


def test_bad_workspaces_and_suspends_are_findings_and_change_nothing(
    repo: ClusterRepo, tmp_path: Path
) -> None:
    repo.bootstrap()
    repo.write("teams/ml/workspaces/nb.yaml", workspace_yaml())
    repo.commit("ml: a notebook", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    before = state_of(repo)
    count = len(read_events(repo.log_path))

    for path, (text, _, _) in BAD.items():
        repo.write(path, text)
    run = gitsched("validate", repo.path, "--format", "json", expect=1)
    found = run.json()
    errors = found["errors"] if isinstance(found, dict) else found
    for path, (_, field, words) in BAD.items():
        hits = [e for e in errors if e["file"] == path and words in e["message"]]
        assert hits, f"{path}: no finding with {words!r} in {errors}"
        assert (
            hits[0]["line"] and hits[0]["path"].endswith(field.split(".")[-1])
        ) or field == "spec"

    bad = repo.commit("ml: broken", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=1)
    events = read_events(repo.log_path)
    assert [e.type for e in events[count:]] == ["CommitRejected"]
    assert events[-1].cause == bad
    rejected = {f["file"] for f in events[-1].data["errors"]}
    assert set(BAD) <= rejected
    after = state_of(repo)
    assert after["placements"] == before["placements"]
    assert after["suspended"] == before["suspended"]


def test_a_workspace_and_a_job_may_not_share_a_name_in_a_queue(repo: ClusterRepo) -> None:
    repo.bootstrap()
    repo.write("teams/ml/workspaces/nb.yaml", workspace_yaml())
    repo.write("teams/ml/jobs/nb.yaml", job_yaml("nb", gpu=1))
    run = gitsched("validate", repo.path, expect=1)
    assert "defined more than once in queue 'ml'" in run.stdout
