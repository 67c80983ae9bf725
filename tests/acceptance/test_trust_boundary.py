"""The trust boundary (issue 32) with real git, through the CLI: who may change what.

Each test is an attack seen on a cluster repo: an owner approving their own change
through someone else's commit, an approval stretched over an octopus merge or a
commit the log never applied, the platform's own files changed without its owners,
a team named after Kubernetes' own namespace. `reconcile`, `plan` and `audit` must
all refuse it, with the same words.
"""

from __future__ import annotations

from pathlib import Path

from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.reconciler.git import GitRepo
from gitsched.reconciler.loop import Reconciler
from gitsched.reconciler.plan import plan_change
from tests.support.approvals import (
    MALLORY,
    SigningRepo,
    applied_shas,
    plan_approvals,
    policy,
    raise_ml,
    reconcile,
)
from tests.support.cluster_repo import (
    MINIMAL_CLUSTER,
    H,
    git,
    gitsched,
    job_yaml,
    of_type,
    queue_yaml,
    read_events,
)
from tests.support.plan import payload, predicted

CAROL = ("Carol Diaz", "carol@ml.example")
PAT = ("Pat Kim", "pat@ml.example")
OLGA = ("Olga Platform", "olga@platform.example")


def one_owner_repo(tmp_path: Path, *, platform: tuple[str, str] | None = None) -> SigningRepo:
    """ml owned by carol alone; owner approval required; the platform's owners, if any."""
    r = SigningRepo(tmp_path / "cluster")
    r.write_all(MINIMAL_CLUSTER)
    r.write_all(
        {"policies/default.yaml": policy(owner=True), "teams/ml/OWNERS": "carol@ml.example\n"}
    )
    if platform is not None:
        r.write("OWNERS", f"# the platform owners\n{platform[1]}\n")
    r.commit("Bootstrap")
    gitsched("reconcile", "--once", r.path, expect=0)
    return r


# -- 32.1: the authors of a change are the authors of every commit since the last applied one


def test_the_only_owner_cannot_approve_her_change_through_someone_elses_empty_commit(
    tmp_path: Path,
) -> None:
    repo = one_owner_repo(tmp_path)
    raise_ml(repo)
    change = repo.commit("ml: nominal 40", author=CAROL)
    (first,) = reconcile(repo, expect=1)
    assert "carol@ml.example, the only owner of team ml" in first
    approval = repo.commit(
        "Approve",
        author=PAT,
        trailers=[("Approved-by", "Carol Diaz <carol@ml.example>")],
        allow_empty=True,
    )
    (message,) = reconcile(repo, expect=1)
    assert (
        "carol@ml.example, the only owner of team ml (teams/ml/OWNERS), wrote the change" in message
    )
    assert "add a second owner to teams/ml/OWNERS" in message
    assert "OWNERS at the repo root" in message  # no platform owners yet: say who to ask
    assert change not in applied_shas(repo) and approval not in applied_shas(repo)
    (checked,) = [
        e
        for e in of_type(read_events(repo.log_path), "CommitRejected")
        if e.data["commit"]["sha"] == approval
    ]
    assert checked.data["errors"][0]["file"] == "teams/ml/queue.yaml"


def test_with_platform_owners_the_message_names_them_and_their_approval_counts(
    tmp_path: Path,
) -> None:
    repo = one_owner_repo(tmp_path, platform=OLGA)
    raise_ml(repo)
    repo.commit("ml: nominal 40", author=CAROL)
    (message,) = reconcile(repo, expect=1)
    assert "needs an approval from one of olga@platform.example" in message
    approve = repo.commit(
        "Approve",
        author=PAT,
        trailers=[("Approved-by", "Olga <olga@platform.example>")],
        allow_empty=True,
    )
    assert reconcile(repo, expect=0) == []
    changes = gitsched("audit", "changes", "--repo", repo.path, "--format", "json").json()
    (change,) = [c for c in changes if c["commit"] == approve]
    assert change["approval"]["authors"] == ["carol@ml.example"]
    assert change["approvers"] == ["Olga <olga@platform.example>"]  # as the trailer names her
    result = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()
    assert result["ok"], result["violations"]


# -- 31.2: audit shows the approval the reconciler counted


def test_audit_changes_and_the_report_name_the_approver_of_a_no_ff_merge(tmp_path: Path) -> None:
    repo = one_owner_repo(tmp_path)
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None, trailers=[("Approved-by", "Carol Diaz <carol@ml.example>")])
    git(repo.path, "checkout", "-q", "main")
    merge = repo.merge("raise", None, by=PAT)
    assert reconcile(repo, expect=0) == []

    changes = gitsched("audit", "changes", "--repo", repo.path, "--format", "json").json()
    (change,) = [c for c in changes if c["commit"] == merge]
    assert [a["approver"] for a in change["approval"]["approvals"] if a["counted"]] == [
        "carol@ml.example"
    ]
    assert change["approvers"] == ["carol@ml.example"]
    table = gitsched("audit", "changes", "--repo", repo.path, "--wide").stdout
    (row,) = [line for line in table.splitlines() if merge[:12] in line]
    assert "carol@ml.example" in row.split("approved")[0]
    page = tmp_path / "report.html"
    gitsched("audit", "report", "--repo", repo.path, "--output", page, expect=0)
    html = page.read_text()
    section = html[html.index('id="changes"') :]
    (cells,) = [r for r in section.split("<tr>") if merge[:12] in r]
    assert "carol@ml.example" in cells and "nobody" not in cells


# -- 32.4: the platform's own files


def platform_repo(tmp_path: Path, *, owner: bool = True) -> SigningRepo:
    r = SigningRepo(tmp_path / "cluster")
    r.write_all(MINIMAL_CLUSTER)
    r.write_all(
        {
            "policies/default.yaml": policy(owner=owner),
            "OWNERS": "olga@platform.example\n",
            "teams/ml/OWNERS": "ana@ml.example\n",
        }
    )
    r.commit("Bootstrap: the platform and its owners")  # no owners at the base: applied
    assert reconcile(r, expect=0) == []
    return r


def test_the_policy_cannot_switch_approval_off_without_a_platform_owner(tmp_path: Path) -> None:
    repo = platform_repo(tmp_path)
    repo.write("policies/default.yaml", policy(owner=False))
    weaken = repo.commit("policy: no more approvals", author=MALLORY)
    raise_ml(repo)
    repo.commit("ml: nominal 40", author=MALLORY)
    rng = f"{repo.head('HEAD~2')}..HEAD"
    teams = {t["team"]: t for t in plan_approvals(repo, rng)}
    assert teams["/"]["satisfied"] is False
    messages = reconcile(repo, expect=1)
    assert any(
        "changes the Policy" in m and "olga@platform.example" in m and "OWNERS" in m
        for m in messages
    ), messages
    assert weaken not in applied_shas(repo)
    # approved by a platform owner, it is applied
    repo.commit(
        "Approve",
        author=PAT,
        trailers=[("Approved-by", "Olga <olga@platform.example>")],
        allow_empty=True,
    )
    assert reconcile(repo, expect=0) == []


def test_creating_removing_and_inventory_need_a_platform_owner(tmp_path: Path) -> None:
    repo = platform_repo(tmp_path)
    repo.write("teams/vision/queue.yaml", queue_yaml("vision", 8))
    repo.write("teams/vision/jobs/train.yaml", job_yaml("train", gpu=1))
    repo.commit("vision: a new team", author=MALLORY)
    (message,) = reconcile(repo, expect=1)
    assert "adds queue vision" in message and "olga@platform.example" in message
    repo.commit(
        "Approve",
        author=PAT,
        trailers=[("Approved-by", "olga@platform.example")],
        allow_empty=True,
    )
    assert reconcile(repo, expect=0) == []

    pool = (repo.path / "inventory/pool.yaml").read_text().replace("count: 4", "count: 5")
    repo.write("inventory/pool.yaml", pool)
    repo.remove("teams/vision/queue.yaml").remove("teams/vision/jobs/train.yaml")
    repo.commit("one more node; vision goes", author=MALLORY)
    messages = reconcile(repo, expect=1)
    assert any("changes nodes h100-" in m for m in messages), messages
    assert any("removes team vision" in m for m in messages), messages


def test_a_team_may_not_take_a_kubernetes_namespace_even_approved(tmp_path: Path) -> None:
    repo = platform_repo(tmp_path)
    repo.write("teams/kube-system/queue.yaml", queue_yaml("kube-system", 8))
    repo.commit(
        "kube-system: a team",
        author=MALLORY,
        trailers=[("Approved-by", "olga@platform.example")],
    )
    messages = reconcile(repo, expect=1)
    assert any(
        "team kube-system would run its pods in namespace kube-system" in m for m in messages
    ), messages
    run = gitsched("plan", repo.path, "HEAD~1..HEAD", "--format", "json")
    assert "kube-system" in run.stdout


def test_with_the_policy_off_audit_flags_an_unapproved_platform_change(tmp_path: Path) -> None:
    repo = platform_repo(tmp_path, owner=False)
    pool = (repo.path / "inventory/pool.yaml").read_text().replace("count: 4", "count: 5")
    repo.write("inventory/pool.yaml", pool)
    repo.commit("one more node", author=MALLORY)
    assert reconcile(repo, expect=0) == []
    result = gitsched(
        "audit", "compliance", "--repo", repo.path, "--format", "json", expect=1
    ).json()
    (violation,) = result["violations"]
    assert violation["check"] == "quota-approval"
    assert "change of the platform" in violation["message"]
    assert "olga@platform.example" in violation["message"]


def test_a_namespace_list_in_the_policy_limits_new_teams(tmp_path: Path) -> None:
    listed = (
        H
        + """kind: Policy
metadata:
  name: namespaces
spec:
  approval: {teamNamespaces: [ml, nlp]}
"""
    )
    repo = platform_repo(tmp_path)
    repo.write("policies/namespaces.yaml", listed)
    repo.commit("policy: teams ml and nlp", trailers=[("Approved-by", "olga@platform.example")])
    assert reconcile(repo, expect=0) == []
    repo.write("teams/vision/queue.yaml", queue_yaml("vision", 8))
    repo.commit("vision", trailers=[("Approved-by", "olga@platform.example")])
    (message,) = reconcile(repo, expect=1)
    assert "team vision is not one of the namespaces the Policy allows" in message


# -- 32.2: who may submit jobs to a team's queue

BOB = ("Bob Stone", "bob@beta.example")
LIN = ("Lin Wu", "lin@alpha.example")


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


def members_repo(tmp_path: Path) -> SigningRepo:
    """alpha: owner ana, member lin; beta: owner bob. Jobs only from their own team."""
    r = SigningRepo(tmp_path / "cluster")
    r.write_all(MINIMAL_CLUSTER)
    r.write_all(
        {
            "policies/default.yaml": member_policy(),
            "teams/alpha/queue.yaml": queue_yaml("alpha", 8),
            "teams/alpha/OWNERS": "ana@ml.example\n",
            "teams/alpha/MEMBERS": "# who submits alpha's jobs\nLin Wu <lin@alpha.example>\n",
            "teams/beta/queue.yaml": queue_yaml("beta", 8),
            "teams/beta/OWNERS": "bob@beta.example\n",
        }
    )
    r.commit("Bootstrap")
    assert reconcile(r, expect=0) == []
    return r


def test_a_member_of_another_team_cannot_submit_to_a_teams_queue(tmp_path: Path) -> None:
    repo = members_repo(tmp_path)
    repo.write("teams/alpha/jobs/sneaky.yaml", job_yaml("sneaky", gpu=8))
    sneaky = repo.commit("alpha: a job", author=BOB)
    run = gitsched("plan", repo.path, "HEAD~1..HEAD", "--format", "json")
    assert "bob@beta.example is not a member or owner of team alpha" in run.stdout
    (message,) = reconcile(repo, expect=1)
    assert "bob@beta.example is not a member or owner of team alpha" in message
    assert "teams/alpha/MEMBERS" in message and "ana@ml.example" in message
    assert sneaky not in applied_shas(repo)
    events = read_events(repo.log_path)
    assert not of_type(events, "JobSubmitted") or all(
        e.data["job"]["name"] != "sneaky" for e in of_type(events, "JobSubmitted")
    )

    # alpha's member submits; an owner's approval lets bob's job in
    repo.commit(
        "Approve", author=PAT, trailers=[("Approved-by", "Ana <ana@ml.example>")],
        allow_empty=True,
    )  # fmt: skip
    assert reconcile(repo, expect=0) == []
    repo.write("teams/alpha/jobs/mine.yaml", job_yaml("mine", gpu=1))
    assert repo.commit("alpha: lin's job", author=LIN) and reconcile(repo, expect=0) == []
    members = {
        e.data["team"]: e.data["members"]
        for e in of_type(read_events(repo.log_path), "MembersChanged")
    }
    assert members == {"alpha": ["lin@alpha.example"]}
    result = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()
    assert result["ok"], result["violations"]
    (check,) = [c for c in result["checks"] if c["check"] == "job-membership"]
    assert check["checked"] == 2 and check["status"] == "PASS"


def test_with_the_rule_off_anyone_submits(tmp_path: Path) -> None:
    repo = SigningRepo(tmp_path / "cluster")
    repo.write_all(MINIMAL_CLUSTER)
    repo.write_all(
        {"teams/ml/OWNERS": "ana@ml.example\n", "teams/ml/MEMBERS": "lin@alpha.example\n"}
    )
    repo.commit("Bootstrap")
    repo.write("teams/ml/jobs/any.yaml", job_yaml("any", gpu=1))
    repo.commit("ml: a job", author=BOB)
    assert reconcile(repo, expect=0) == []


def test_a_bad_line_in_members_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    repo = SigningRepo(tmp_path / "cluster")
    repo.write_all(MINIMAL_CLUSTER)
    repo.write("teams/ml/MEMBERS", "lin@alpha.example\nnot an e-mail\n")
    run = gitsched("validate", repo.path, expect=1)
    assert "teams/ml/MEMBERS:2: $: 'not an e-mail' is not an e-mail" in run.stdout


def test_joining_a_team_is_a_change_its_owners_approve(tmp_path: Path) -> None:
    repo = members_repo(tmp_path)
    repo.write(
        "policies/default.yaml",
        member_policy().replace("true}", "true, requireOwnerApproval: true}"),
    )
    repo.commit("policy: owners approve", trailers=[("Approved-by", "ana@ml.example")])
    assert reconcile(repo, expect=0) == []
    repo.write("teams/alpha/MEMBERS", "lin@alpha.example\nbob@beta.example\n")
    repo.commit("alpha: bob joins", author=BOB)
    (message,) = reconcile(repo, expect=1)
    assert "changes the team's members: adds bob@beta.example" in message
    assert "needs an approval from one of ana@ml.example" in message


# -- plan = reconcile on every refusal above


def test_plan_predicts_what_reconcile_appends_for_each_refusal(tmp_path: Path) -> None:
    repo = members_repo(tmp_path)
    repo.write("OWNERS", "olga@platform.example\n")
    repo.write(
        "policies/default.yaml",
        member_policy().replace("true}", "true, requireOwnerApproval: true}"),
    )
    repo.commit("the platform's owners")
    assert reconcile(repo, expect=0) == []
    steps: list[tuple[str, dict[str, object]]] = [
        ("teams/alpha/jobs/sneaky.yaml", {"author": BOB}),  # a job from outside alpha
        ("inventory/pool.yaml", {"author": MALLORY}),  # a node without the platform
        ("teams/kube-system/queue.yaml", {"author": MALLORY}),  # a reserved namespace
        ("", {"author": PAT, "trailers": [("Approved-by", "olga@platform.example")]}),
    ]
    contents = {
        "teams/alpha/jobs/sneaky.yaml": job_yaml("sneaky", gpu=1),
        "inventory/pool.yaml": (repo.path / "inventory/pool.yaml")
        .read_text()
        .replace("count: 4", "count: 5"),
        "teams/kube-system/queue.yaml": queue_yaml("kube-system", 8),
    }
    applied: list[bool] = []
    with SQLiteEventLog(repo.log_path) as event_log:
        reconciler = Reconciler(GitRepo(repo.path), event_log)
        for path, how in steps:
            if path == "":
                repo.remove("teams/kube-system/queue.yaml")
            else:
                repo.write(path, contents[path])
            sha = repo.commit(f"step {path or 'approve'}", allow_empty=True, **how)  # type: ignore[arg-type]
            plan = plan_change(GitRepo(repo.path), event_log, None, sha)
            seq = event_log.last_seq()
            report = reconciler.run_once()
            appended = [
                (s.id, s.type, s.actor, s.cause, payload(s.type, s.data))
                for s in event_log.read(seq)
            ]
            assert predicted(plan.groups) == appended, path
            applied.append(report.commits[-1].applied)
    assert applied == [False, False, False, True]
