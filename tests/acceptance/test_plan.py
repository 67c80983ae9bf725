"""`gitsched plan` against real git repositories: what a pull request would do, before merge.

Each scenario reconciles `main` into the embedded log, opens a branch with one change
and runs the real command, as a CI job would. The plan must never write to the log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cluster_repo import (
    ANA,
    CLUSTER_YAML,
    LI,
    POLICY_YAML,
    POOL_YAML,
    PRIYA,
    ClusterRepo,
    git,
    gitsched,
    job_yaml,
    queue_yaml,
    read_events,
)
from tests.support.plan import PR, effects, open_pr, plan_json, reconcile

# -- fixtures of this file -----------------------------------------------------------------


def cohort_queue(name: str, nominal: float, *, borrowing: float | None = None) -> str:
    limit = "" if borrowing is None else f", borrowingLimit: {borrowing:g}"
    return (
        "apiVersion: gitsched.io/v1\nkind: Queue\n"
        f"metadata:\n  name: {name}\nspec:\n  cohort: research\n  quotas:\n"
        f"    - {{flavor: h100-80g, nominal: {nominal:g}{limit}}}\n"
    )


def log_fingerprint(repo: ClusterRepo) -> list[tuple[int, str, str]]:
    return [(e.seq, e.id, e.hash) for e in read_events(repo.log_path)]


# -- the scenarios -----------------------------------------------------------------


def test_a_quota_raise_admits_a_pending_gang(repo: ClusterRepo) -> None:
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": POLICY_YAML,
            "teams/ml/queue.yaml": queue_yaml(nominal=16),
            "teams/ml/jobs/train.yaml": job_yaml("train", replicas=2, topology="nvlink"),
        }
    )
    repo.commit("Bootstrap: ml may use 16 GPUs, and a 2x8 gang uses them")
    repo.write("teams/ml/jobs/gang.yaml", job_yaml("gang", replicas=2, topology="nvlink"))
    repo.commit("ml: a second 2x8 gang, pending for quota", author=ANA)
    reconcile(repo)
    before = log_fingerprint(repo)
    open_pr(repo, {"teams/ml/queue.yaml": queue_yaml(nominal=32)}, "ml: nominal 16 -> 32")

    plan = plan_json(repo)

    assert plan["baseline"] == "log" and plan["stale"] is None
    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/gang"]
    assert effects(plan, "preempted") == [] and effects(plan, "still pending") == []
    (queue,) = plan["queue_changes"]
    assert queue["queue"] == "ml"
    assert queue["before"]["quotas"]["h100-80g"]["nominal"] == 16
    assert queue["after"]["quotas"]["h100-80g"]["nominal"] == 32
    (ml,) = plan["queues"]
    assert ml["gpus"] == {"before": 16, "after": 32}
    assert ml["fair_share"] == {"before": 0.5, "after": 1.0}
    assert plan["solve"]["solver"] == "greedy" and plan["solve"]["seconds"] >= 0

    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert "+ admitted" in text and "ml/gang" in text
    assert "16 -> 32" in text  # the quota table, before -> after
    assert "Plan: 1 admitted; 1 queue(s) changed." in text
    assert log_fingerprint(repo) == before, "plan must not append to the log"


def test_a_quota_cut_preempts_borrowed_capacity(repo: ClusterRepo) -> None:
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": POLICY_YAML,
            "teams/vision/queue.yaml": cohort_queue("vision", 16),
            "teams/nlp/queue.yaml": cohort_queue("nlp", 16),
            # vision runs 32 GPUs: its own 16 and 16 borrowed from nlp, which is idle.
            "teams/vision/jobs/first.yaml": job_yaml("first", replicas=2, topology="nvlink"),
        }
    )
    repo.commit("Bootstrap the research cohort")
    repo.write("teams/vision/jobs/second.yaml", job_yaml("second", replicas=2, topology="nvlink"))
    repo.commit("vision: a second gang, on borrowed GPUs", author=ANA)
    reconcile(repo)
    open_pr(
        repo,
        {"teams/vision/queue.yaml": cohort_queue("vision", 16, borrowing=0)},
        "vision may not borrow",
    )

    plan = plan_json(repo)

    (preempted,) = effects(plan, "preempted")
    assert preempted["job"] == "vision/second"
    assert "borrowing limit 0" in preempted["reason"]
    assert preempted["gpus"] == 16 and len(preempted["from"]) == 2
    assert preempted["lost_gpu_hours"] >= 0
    assert effects(plan, "admitted") == []
    usage = {q["queue"]: q for q in plan["queues"]}
    assert usage["vision"]["gpus"] == {"before": 32, "after": 16}

    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert "- preempted" in text and "since its last checkpoint" in text
    assert "why: " in text


def test_a_priority_change_preempts_a_lower_job(repo: ClusterRepo) -> None:
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": POLICY_YAML,
            "teams/ml/queue.yaml": queue_yaml(nominal=32),
            "teams/ml/jobs/a.yaml": job_yaml("a", replicas=2, topology="nvlink"),
            "teams/ml/jobs/b.yaml": job_yaml("b", replicas=2, topology="nvlink"),
            "teams/ml/jobs/urgent.yaml": job_yaml("urgent"),
        }
    )
    repo.commit("Bootstrap: two gangs fill the cluster, urgent waits")
    reconcile(repo)
    open_pr(
        repo,
        {"teams/ml/jobs/urgent.yaml": job_yaml("urgent", priority="high")},
        "ml: urgent is high priority",
        author=LI,
    )

    plan = plan_json(repo)

    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/urgent"]
    (victim,) = effects(plan, "preempted")
    assert victim["job"] in ("ml/a", "ml/b")
    assert victim["preempted_by"] == "ml/urgent"
    assert "priority 900 > 500" in victim["reason"]
    assert {
        "kind": "job",
        "name": "ml/urgent",
        "action": "changed",
        "detail": "priority_class, priority",
    } in plan["spec_changes"]


def test_a_change_with_no_effect_exits_0(tmp_path: Path, reconciled: ClusterRepo) -> None:
    commented = queue_yaml() + "# raised in Q3, see the capacity plan\n"
    open_pr(reconciled, {"README.md": "# our cluster\n", "teams/ml/queue.yaml": commented})

    run = gitsched("plan", reconciled.path, f"main..{PR}", expect=0)
    assert "Plan: no changes." in run.stdout
    assert plan_json(reconciled, expect=0)["changed"] is False
    md = gitsched("plan", reconciled.path, f"main..{PR}", "--format", "markdown", expect=0)
    assert md.stdout.splitlines()[:2] == [
        "<!-- gitsched-plan -->",
        f"**gitsched plan** `main` → `{PR}`: no changes",
    ]


def test_an_invalid_head_is_reported_like_validate_and_exits_2(reconciled: ClusterRepo) -> None:
    broken = job_yaml("broken").replace("replicas: 1", "replicas: four")
    broken = broken.replace("gpu: 8,", "gpus: 8,")
    open_pr(reconciled, {"teams/ml/jobs/broken.yaml": broken})
    validate = gitsched("validate", reconciled.path, "--rev", PR, expect=1)
    expected = [line for line in validate.stdout.splitlines() if line.startswith("teams/")]
    assert len(expected) == 2

    run = gitsched("plan", reconciled.path, f"main..{PR}", expect=2)
    for line in expected:
        assert f"  {line}" in run.stdout  # file:line:column: $.path: message [code]
    assert "teams/ml/jobs/broken.yaml:6:" in run.stdout

    plan = plan_json(reconciled, expect=2)
    assert plan["valid"] is False
    assert {e["path"] for e in plan["errors"]} == {"$.spec.replicas", "$.spec.resources.gpus"}
    assert all(e["file"] == "teams/ml/jobs/broken.yaml" and e["line"] for e in plan["errors"])

    md = gitsched("plan", reconciled.path, f"main..{PR}", "--format", "markdown", expect=2)
    assert "HEAD is invalid" in md.stdout.splitlines()[1]
    assert expected[0] in md.stdout


def test_a_stale_base_says_so_and_against_what(reconciled: ClusterRepo) -> None:
    applied = reconciled.head("main")
    open_pr(reconciled, {"teams/ml/queue.yaml": queue_yaml(nominal=64)})

    plan = plan_json(reconciled, f"main~1..{PR}")

    assert plan["baseline"] == "log-at-base"
    assert plan["applied"] == applied
    assert applied[:12] in plan["stale"] and "not the cluster's current commit" in plan["stale"]
    # At main~1 the training gang did not exist yet: from there, the branch submits it.
    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/train"]

    text = gitsched("plan", reconciled.path, f"main~1..{PR}", expect=1).stdout
    assert "STALE BASE" in text and applied[:12] in text
    md = gitsched("plan", reconciled.path, f"main~1..{PR}", "--format", "markdown", expect=1)
    assert "Stale base" in md.stdout and "STALE base" in md.stdout.splitlines()[1]

    current = plan_json(reconciled, f"main..{PR}")
    assert current["stale"] is None and current["baseline"] == "log"


# -- the base, the log and the output ------------------------------------------------------


def test_base_defaults_to_the_logs_last_applied_commit(reconciled: ClusterRepo) -> None:
    applied = reconciled.head("main")
    open_pr(reconciled, {"teams/ml/queue.yaml": queue_yaml(nominal=8)})
    for revisions in (PR, f"..{PR}"):
        plan = plan_json(reconciled, revisions)
        assert plan["base"]["sha"] == applied and plan["stale"] is None
        # nominal 8 leaves no room for the running 2x8 gang
        assert [e["job"] for e in effects(plan, "preempted")] == ["ml/train"]


def test_a_base_the_log_never_applied_is_simulated_and_stale(reconciled: ClusterRepo) -> None:
    reconciled.write("teams/ml/jobs/extra.yaml", job_yaml("extra"))
    reconciled.commit("ml: one more job (not reconciled yet)")
    open_pr(reconciled, {"teams/ml/queue.yaml": queue_yaml(nominal=64)})

    plan = plan_json(reconciled)

    assert plan["baseline"] == "simulated"
    assert "has not been applied" in plan["stale"]
    assert effects(plan, "admitted") == []  # extra is already placed in the simulated base


def test_a_rejected_newest_commit_as_base_plans_from_the_last_applied_one(
    reconciled: ClusterRepo,
) -> None:
    applied = reconciled.head("main")
    reconciled.write(
        "teams/ml/jobs/bad.yaml", job_yaml("bad").replace("replicas: 1", "replicas: 0")
    )
    reconciled.commit("ml: a job the schema refuses")
    gitsched("reconcile", "--once", reconciled.path, expect=1)
    open_pr(reconciled, {"teams/ml/jobs/bad.yaml": job_yaml("bad")}, "ml: fix the job")

    plan = plan_json(reconciled)

    assert plan["baseline"] == "log" and plan["stale"] is None
    assert plan["applied"] == applied
    assert "was rejected by the reconciler" in plan["notes"][0]
    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/bad"]


def test_without_a_log_plan_solves_the_base_afresh_and_creates_nothing(
    bootstrapped: ClusterRepo,
) -> None:
    bootstrapped.write("teams/ml/jobs/train.yaml", job_yaml("train", replicas=2))
    bootstrapped.commit("ml: training")
    open_pr(bootstrapped, {"teams/ml/jobs/more.yaml": job_yaml("more", replicas=2)})

    plan = plan_json(bootstrapped)
    assert plan["baseline"] == "fresh" and "fresh solve" in plan["notes"][0]
    assert [e["job"] for e in effects(plan, "admitted")] == ["ml/more"]
    assert not (bootstrapped.path / ".gitsched").exists(), "plan created a log"

    run = gitsched("plan", bootstrapped.path, PR, expect=2)
    assert "name the base" in run.stderr
    missing = gitsched(
        "plan", bootstrapped.path, f"main..{PR}", "--log", "sqlite:////nonexistent/log.db", expect=2
    )
    assert "no event log" in missing.stderr


def test_unknown_revisions_and_ranges_are_usage_errors(reconciled: ClusterRepo) -> None:
    assert "unknown revision" in gitsched("plan", reconciled.path, "main..nope", expect=2).stderr
    assert "two dots" in gitsched("plan", reconciled.path, "main...main", expect=2).stderr


def test_output_file_and_markdown_for_a_pr_comment(reconciled: ClusterRepo, tmp_path: Path) -> None:
    open_pr(
        reconciled, {"teams/ml/jobs/more.yaml": job_yaml("more", replicas=2, topology="nvlink")}
    )
    out = tmp_path / "plan.md"

    run = gitsched(
        "plan", reconciled.path, f"main..{PR}", "--format", "markdown", "--output", out, expect=1
    )

    lines = out.read_text().splitlines()
    assert lines[0] == "<!-- gitsched-plan -->"
    assert lines[1] == f"**gitsched plan** `main` → `{PR}`: 1 admitted"
    assert run.stdout.strip() == f"main -> {PR}: 1 admitted"
    assert any(line.startswith("<details open><summary>Placement effect") for line in lines)
    assert lines[-1].startswith("<sub>base ")
    # Stable: the same plan twice reads the same, but for the solve's measured time.
    again = gitsched("plan", reconciled.path, f"main..{PR}", "--format", "markdown", expect=1)
    solve_free = [line for line in lines if "solver " not in line]
    assert [line for line in again.stdout.splitlines() if "solver " not in line] == solve_free


# -- owners and approvals ------------------------------------------------------------------

OWNERS = "# who approves changes to teams/ml/queue.yaml\nana@ml.example\nli@ml.example\n"
ENFORCING_POLICY = POLICY_YAML + "  approval: {requireOwnerApproval: true}\n"


def owned_cluster(repo: ClusterRepo, *, enforce: bool) -> ClusterRepo:
    repo.bootstrap()
    repo.write("teams/ml/OWNERS", OWNERS)
    if enforce:
        repo.write("policies/default.yaml", ENFORCING_POLICY)
    repo.commit("ml: owners" + (", and owner approval is required" if enforce else ""))
    reconcile(repo)
    return repo


def test_plan_lists_the_approvals_still_missing(repo: ClusterRepo) -> None:
    owned_cluster(repo, enforce=False)
    open_pr(repo, {"teams/ml/queue.yaml": queue_yaml(nominal=24)}, author=ANA)

    plan = plan_json(repo)

    assert plan["approvals"]["enforced"] is False
    (team,) = plan["approvals"]["teams"]
    assert team["team"] == "ml" and team["files"] == ["teams/ml/queue.yaml"]
    assert team["satisfied"] is False
    assert team["eligible"] == ["li@ml.example"]  # ana wrote it: she cannot approve it
    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert "MISSING, needs an approval from one of li@ml.example" in text
    assert "ana@ml.example wrote the change and cannot approve it" in text


def test_an_owners_approval_trailer_satisfies_plan(repo: ClusterRepo) -> None:
    owned_cluster(repo, enforce=False)
    open_pr(
        repo,
        {"teams/ml/queue.yaml": queue_yaml(nominal=24)},
        author=PRIYA,
        trailers=(("Approved-by", "Li Wei <LI@ml.example>"),),
    )
    (team,) = plan_json(repo)["approvals"]["teams"]
    assert team["satisfied"] is True and team["approved_by"] == ["li@ml.example"]


def test_a_pr_cannot_approve_itself_by_editing_owners(repo: ClusterRepo) -> None:
    owned_cluster(repo, enforce=False)
    open_pr(
        repo,
        {
            "teams/ml/queue.yaml": queue_yaml(nominal=24),
            "teams/ml/OWNERS": OWNERS + "priya@platform.example\n",
        },
        author=ANA,
        trailers=(("Approved-by", "Priya Raman <priya@platform.example>"),),
    )
    (team,) = plan_json(repo)["approvals"]["teams"]
    assert team["satisfied"] is False
    assert team["files"] == ["teams/ml/queue.yaml", "teams/ml/OWNERS"]
    assert team["owners"] == ["ana@ml.example", "li@ml.example"]  # the base's OWNERS


def test_the_reconciler_rejects_a_merged_queue_change_without_an_owners_approval(
    repo: ClusterRepo,
) -> None:
    owned_cluster(repo, enforce=True)
    repo.write("teams/ml/queue.yaml", queue_yaml(nominal=24))
    unapproved = repo.commit(
        "ml: nominal 24, self-approved",
        author=ANA,
        trailers=(("Approved-by", "Ana Souza <ana@ml.example>"),),
    )

    run = gitsched("reconcile", "--once", repo.path, expect=1)

    assert "REJECTED" in run.stdout and "teams/ml/queue.yaml" in run.stdout
    rejected = [e for e in read_events(repo.log_path) if e.type == "CommitRejected"]
    assert rejected[-1].cause == unapproved
    (finding,) = rejected[-1].data["errors"]
    assert finding["file"] == "teams/ml/queue.yaml" and finding["code"] == "approval"
    assert "li@ml.example" in finding["message"]
    assert "ana@ml.example wrote the change and cannot approve it" in finding["message"]

    repo.commit(
        "ml: nominal 24, approved",
        author=ANA,
        trailers=(("Approved-by", "Li Wei <li@ml.example>"),),
        allow_empty=True,
    )
    run = gitsched("reconcile", "--once", repo.path, expect=0)
    assert "applied" in run.stdout
    queues = [e for e in read_events(repo.log_path) if e.type == "QueueConfigured"]
    assert queues[-1].data["queue"]["quotas"][0]["nominal"] == 24_000


def test_a_change_that_touches_no_queue_needs_no_approval(repo: ClusterRepo) -> None:
    owned_cluster(repo, enforce=True)
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train"))
    repo.commit("ml: a job, no approval needed", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)


# -- the demo ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_demo_shows_an_open_pull_request_and_its_plan(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    run = gitsched("demo", demo, expect=0)
    assert "== open pull request pr/vision-quota, not merged" in run.stdout
    assert "+ admitted       vision/video-gen" in run.stdout
    assert "- preempted      nlp/moe-gang" in run.stdout
    pr = git(demo, "rev-parse", "pr/vision-quota").strip()
    assert git(demo, "branch", "--show-current").strip() == "main"
    assert pr not in git(demo, "rev-list", "main")
    assert all(pr != e.cause for e in read_events(demo / ".gitsched" / "log.db"))
    plan = json.loads(
        gitsched("plan", demo, "main..pr/vision-quota", "--format", "json", expect=1).stdout
    )
    assert [e["job"] for e in plan["effects"] if e["action"] == "admitted"] == ["vision/video-gen"]


def test_plan_says_when_the_clock_stopped_a_solve(repo: ClusterRepo) -> None:
    """A time limit too short for the solve's steps: the wall-clock backstop, not the node
    budget, ends the solve, so reconcile on another machine may place otherwise."""
    repo.write_all(
        {
            "cluster.yaml": CLUSTER_YAML,
            "inventory/pool.yaml": POOL_YAML,
            "policies/default.yaml": POLICY_YAML,
            "teams/ml/queue.yaml": queue_yaml(nominal=32),
            "teams/ml/jobs/train.yaml": job_yaml("train", replicas=2, topology="nvlink"),
        }
    )
    repo.commit("Bootstrap: ml runs a 2x8 gang")
    reconcile(repo)
    rushed = POLICY_YAML.replace(
        "solver: {name: greedy}", "solver: {name: highs, timeLimitSeconds: 0.001}"
    )
    open_pr(
        repo,
        {
            "policies/default.yaml": rushed,
            "teams/ml/jobs/gang.yaml": job_yaml("gang", replicas=2, topology="nvlink"),
        },
        "MILP with a 1 ms time limit, and a second gang",
    )
    warning = "the solve stopped at its time limit: reconcile may place differently"

    plan = plan_json(repo)

    assert plan["solve"]["status"] == "time_limit"
    assert plan["solve"]["reproducible"] is False
    assert any(note.startswith(warning) for note in plan["notes"])
    text = gitsched("plan", repo.path, f"main..{PR}", expect=1).stdout
    assert f"note: {warning}" in text
    assert "(time_limit)" in text


def test_a_solve_within_its_budget_is_reproducible(reconciled: ClusterRepo) -> None:
    open_pr(
        reconciled,
        {
            "policies/default.yaml": POLICY_YAML.replace(
                "solver: {name: greedy}", "solver: {name: highs, timeLimitSeconds: 60}"
            ),
            "teams/ml/jobs/gang.yaml": job_yaml("gang", replicas=2, topology="nvlink"),
        },
    )
    plan = plan_json(reconciled)
    assert plan["solve"]["solver"] == "highs"
    assert plan["solve"]["reproducible"] is True
    assert not any("time limit" in note for note in plan["notes"])
