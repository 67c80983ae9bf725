"""approval.requireMemberForJobs covers every kind of work a team owns, with real git.

A team's inference services (teams/<team>/services/) and workspaces
(teams/<team>/workspaces/) run on its quota like its jobs: an outsider who commits one
into another team's folder is refused with the file named, a member's is accepted, an
owner's approval lets the outsider's in, and `audit compliance` judges the log again
with the same rule (`gitsched.policies.approval.check_submitters`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gitsched.engine import events as ev
from gitsched.eventlog.envelope import NewEvent
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from tests.support.approvals import SigningRepo, applied_shas, reconcile
from tests.support.cluster_repo import (
    MINIMAL_CLUSTER,
    H,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
)
from tests.support.plan import payload, predicted
from tests.support.serving import append_as_serve

BOB = ("Bob Stone", "bob@beta.example")  # owner of beta, outsider to alpha
LIN = ("Lin Wu", "lin@alpha.example")  # member of alpha
PAT = ("Pat Kim", "pat@alpha.example")  # nobody in particular: carries an approval

SERVICE = "teams/alpha/services/chat.yaml"
WORKSPACE = "teams/alpha/workspaces/nb.yaml"


def member_policy() -> str:
    return (
        H
        + """kind: Policy
metadata:
  name: default
spec:
  solver: {name: greedy}
  approval: {requireMemberForJobs: true}
"""
    )


def service_yaml(low: int = 1, high: int = 2) -> str:
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: chat
spec:
  replicas: {{min: {low}, max: {high}}}
  resources: {{gpu: 1, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
"""
    )


def workspace_yaml(gpu: int = 1) -> str:
    return (
        H
        + f"""kind: Workspace
metadata:
  name: nb
spec:
  resources: {{gpu: {gpu}, cpu: 4, memoryGiB: 32}}
  gpuFlavors: [h100-80g]
  idle: {{suspendAfterMinutes: 30}}
"""
    )


WORK = {SERVICE: service_yaml(), WORKSPACE: workspace_yaml()}


def members_repo(tmp_path: Path) -> SigningRepo:
    """alpha: owner ana, member lin; beta: owner bob. Work only from its own team."""
    r = SigningRepo(tmp_path / "cluster")
    r.write_all(MINIMAL_CLUSTER)
    r.write_all(
        {
            "policies/default.yaml": member_policy(),
            "teams/alpha/queue.yaml": queue_yaml("alpha", 8),
            "teams/alpha/OWNERS": "ana@ml.example\n",
            "teams/alpha/MEMBERS": "Lin Wu <lin@alpha.example>\n",
            "teams/beta/queue.yaml": queue_yaml("beta", 8),
            "teams/beta/OWNERS": "bob@beta.example\n",
        }
    )
    r.commit("Bootstrap")
    assert reconcile(r, expect=0) == []
    return r


def compliance(repo: SigningRepo) -> dict[str, object]:
    result: dict[str, object] = gitsched(
        "audit", "compliance", "--repo", repo.path, "--format", "json"
    ).json()
    return result


def membership_check(result: dict[str, object]) -> dict[str, object]:
    checks = result["checks"]
    assert isinstance(checks, list)
    (check,) = [c for c in checks if c["check"] == "job-membership"]
    assert isinstance(check, dict)
    return check


@pytest.mark.parametrize("path", [SERVICE, WORKSPACE])
def test_an_outsiders_service_or_workspace_is_refused_until_an_owner_approves(
    tmp_path: Path, path: str
) -> None:
    repo = members_repo(tmp_path)
    repo.write(path, WORK[path])
    sneaky = repo.commit("alpha: work on alpha's quota", author=BOB)
    run = gitsched("plan", repo.path, "HEAD~1..HEAD", "--format", "json")
    assert "bob@beta.example is not a member or owner of team alpha" in run.stdout
    (message,) = reconcile(repo, expect=1)
    assert message.startswith("bob@beta.example is not a member or owner of team alpha")
    assert f"may not add, change or remove its work ({path})" in message
    assert "ana@ml.example" in message and "approval.requireMemberForJobs" in message
    assert sneaky not in applied_shas(repo)
    events = read_events(repo.log_path)
    assert not of_type(events, "ServiceSubmitted", "JobSubmitted")
    (rejected,) = of_type(events, "CommitRejected")
    (error,) = rejected.data["errors"]
    assert (error["file"], error["path"], error["code"]) == (path, "$", "membership")

    # an owner of alpha approves: the same change goes in, and the audit agrees
    repo.commit(
        "Approve", author=PAT, trailers=[("Approved-by", "Ana <ana@ml.example>")],
        allow_empty=True,
    )  # fmt: skip
    assert reconcile(repo, expect=0) == []
    events = read_events(repo.log_path)
    assert len(of_type(events, "ServiceSubmitted", "JobSubmitted")) == 1
    result = compliance(repo)
    assert result["ok"], result["violations"]
    check = membership_check(result)
    assert check["checked"] == 1 and check["status"] == "PASS"


@pytest.mark.parametrize("path", [SERVICE, WORKSPACE])
def test_a_members_service_or_workspace_is_accepted_and_its_changes_too(
    tmp_path: Path, path: str
) -> None:
    repo = members_repo(tmp_path)
    repo.write(path, WORK[path])
    repo.commit("alpha: lin's work", author=LIN)
    assert reconcile(repo, expect=0) == []
    # an outsider may not change it, nor remove it
    changed = service_yaml(1, 3) if path == SERVICE else workspace_yaml(2)
    repo.write(path, changed)
    repo.commit("alpha: more", author=BOB)
    (message,) = reconcile(repo, expect=1)
    assert "bob@beta.example is not a member or owner of team alpha" in message
    assert f"its work ({path})" in message
    repo.remove(path)
    repo.commit("alpha: gone", author=BOB)
    (message,) = reconcile(repo, expect=1)
    assert f"its work ({path})" in message
    result = compliance(repo)
    assert result["ok"], result["violations"]
    assert membership_check(result)["checked"] == 1


def test_an_outsider_may_still_change_their_own_team_beside_a_running_service(
    tmp_path: Path,
) -> None:
    """A service's replicas are jobs of the log, not files of the commit: a commit of
    another team's must not be judged as removing them."""
    repo = members_repo(tmp_path)
    repo.write(SERVICE, service_yaml(2, 2))
    repo.commit("alpha: a service", author=LIN)
    assert reconcile(repo, expect=0) == []
    state = gitsched("state", "--repo", repo.path, "--format", "json", expect=0).json()
    assert [s["current"] for s in state["services"]] == [2]
    repo.write("teams/beta/jobs/train.yaml", job_yaml("train", gpu=1))
    repo.commit("beta: a job", author=BOB)
    assert reconcile(repo, expect=0) == []
    result = compliance(repo)
    assert result["ok"], result["violations"]


def test_plan_predicts_what_reconcile_appends_for_a_refused_service(tmp_path: Path) -> None:
    repo = members_repo(tmp_path)
    repo.write(SERVICE, service_yaml())
    sha = repo.commit("alpha: a service", author=BOB)
    with SQLiteEventLog(repo.log_path) as event_log:
        plan = plan_change(GitRepo(repo.path), event_log, None, sha)
        seq = event_log.last_seq()
        report = Reconciler(GitRepo(repo.path), event_log).run_once()
        appended = [
            (s.id, s.type, s.actor, s.cause, payload(s.type, s.data)) for s in event_log.read(seq)
        ]
    assert predicted(plan.groups) == appended
    assert [t for _, t, *_ in appended] == ["CommitRejected"]
    assert not report.commits[-1].applied


@pytest.mark.parametrize("path", [SERVICE, WORKSPACE])
def test_audit_compliance_flags_an_outsiders_work_a_log_let_in(tmp_path: Path, path: str) -> None:
    """A log whose writer let an outsider's service or workspace in under the rule (as
    gitsched did for services before it judged them): the audit, judging the log again,
    names the team, the author and the event. The log is made of a real reconcile's events
    (the rule off, in a twin repo) appended to a log whose Policy has the rule on."""
    lax = SigningRepo(tmp_path / "lax")
    lax.write_all(MINIMAL_CLUSTER)
    lax.write_all(
        {
            "policies/default.yaml": member_policy().replace("true", "false"),
            "teams/alpha/queue.yaml": queue_yaml("alpha", 8),
            "teams/alpha/OWNERS": "ana@ml.example\n",
            "teams/alpha/MEMBERS": "Lin Wu <lin@alpha.example>\n",
            "teams/beta/queue.yaml": queue_yaml("beta", 8),
            "teams/beta/OWNERS": "bob@beta.example\n",
        }
    )
    lax.commit("Bootstrap")
    assert reconcile(lax, expect=0) == []
    start = len(read_events(lax.log_path))
    lax.write(path, WORK[path])
    lax.commit("alpha: work on alpha's quota", author=BOB)
    assert reconcile(lax, expect=0) == []
    let_in = read_events(lax.log_path)[start:]
    assert of_type(let_in, "ServiceSubmitted", "JobSubmitted")

    strict = members_repo(tmp_path)
    with SQLiteEventLog(strict.log_path) as event_log:
        event_log.append(
            [
                NewEvent(f"lax-{e.id}", e.type, e.schema_version, e.data, e.actor, e.cause)
                for e in let_in
            ],
            expected_last_seq=event_log.last_seq(),
        )
    result = compliance(strict)
    assert not result["ok"]
    check = membership_check(result)
    assert check["status"] == "FAIL" and check["checked"] == 1
    violations = result["violations"]
    assert isinstance(violations, list)
    (violation,) = [v for v in violations if v["check"] == "job-membership"]
    assert violation["subject"] == "alpha"
    assert "bob@beta.example is not a member or owner of team alpha" in violation["message"]
    assert path in violation["message"]


def test_removing_the_file_of_a_job_that_ended_needs_nobody_in_reconcile_and_audit(
    tmp_path: Path,
) -> None:
    """A finished job's file is a record, not work on the quota: the reconciler lets an
    outsider remove it, and the audit, judging the log again, agrees."""
    repo = members_repo(tmp_path)
    repo.write("teams/alpha/jobs/done.yaml", job_yaml("done", gpu=1))
    repo.commit("alpha: a job", author=LIN)
    assert reconcile(repo, expect=0) == []
    finished = ev.JobFinished(job="alpha/done", at="2025-11-16T12:00:00.000000Z")
    append_as_serve(repo, [finished], "cluster/finished")
    repo.remove("teams/alpha/jobs/done.yaml")
    repo.commit("tidy up", author=BOB)
    assert reconcile(repo, expect=0) == []
    assert of_type(read_events(repo.log_path), "JobWithdrawn")
    result = compliance(repo)
    assert result["ok"], result["violations"]
