"""A pod template is not a way around the rules (issue 32, item 3): each escape a committer
might try through `spec.template` is refused by `validate`, by `plan` on the pull request,
and by `reconcile` once merged, with file, line and field, and nothing reaches the log but
the CommitRejected. The same suite runs on a real API server through `serve`
(tests/kube/test_hostile_templates.py)."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    git,
    gitsched,
    log_state,
    of_type,
    read_events,
)
from tests.support.hostile_templates import ESCAPES, gpus, hostile_job, job_doc, plain_template
from tests.support.plan import PR, open_pr, plan_json

JOB_FILE = "teams/ml/jobs/sneaky.yaml"


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_each_escape_is_refused_by_validate_plan_and_reconcile(
    reconciled: ClusterRepo, escape: str
) -> None:
    _, refused = ESCAPES[escape]
    before = log_state(reconciled.log_path)
    events_before = len(read_events(reconciled.log_path))
    text = hostile_job(escape)
    open_pr(reconciled, {JOB_FILE: text}, "ml: a job that asks for more", author=ANA)

    run = gitsched("validate", reconciled.path, "--rev", PR, "--format", "json", expect=1)
    errors = [e for e in run.json()["errors"] if e["file"] == JOB_FILE]
    assert sorted((e["path"], e["code"]) for e in errors) == sorted(refused), run.stdout
    for e in errors:
        # Each finding points at its own field's line in the committed file.
        assert e["line"] and e["line"] > 1, e

    plan = plan_json(reconciled, expect=2)
    assert plan["valid"] is False
    assert sorted((e["path"], e["code"]) for e in plan["errors"]) == sorted(refused)
    assert len(read_events(reconciled.log_path)) == events_before  # plan never writes

    git(reconciled.path, "merge", "-q", "--ff-only", PR)
    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert f"REJECTED {reconciled.head()[:12]}" in run.stdout
    events = read_events(reconciled.log_path)
    (rejected,) = of_type(events, "CommitRejected")
    assert sorted((e["path"], e["code"]) for e in rejected.data["errors"]) == sorted(refused)
    assert all(e["file"] == JOB_FILE for e in rejected.data["errors"])
    assert not [e for e in of_type(events, "JobSubmitted") if "sneaky" in str(e.data)]
    after = log_state(reconciled.log_path)
    assert after["placements"] == before["placements"]
    assert "ml/sneaky" not in after["pending"]


def test_a_team_held_to_restricted_and_one_allowed_privileged(reconciled: ClusterRepo) -> None:
    policy = (
        "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata:\n  name: security\nspec:\n"
        "  podSecurity:\n    teams: {ml: restricted}\n"
    )
    reconciled.write("policies/security.yaml", policy)
    reconciled.write(JOB_FILE, yaml.safe_dump(job_doc(plain_template()), sort_keys=False))
    reconciled.commit("platform: ml runs restricted", author=ANA)
    run = gitsched("validate", reconciled.path, "--format", "json", expect=1)
    paths = sorted(e["path"] for e in run.json()["errors"])
    at = "$.spec.template.spec.containers[0].securityContext"
    assert paths == [
        f"{at}.allowPrivilegeEscalation",
        f"{at}.capabilities.drop",
        f"{at}.runAsNonRoot",
        f"{at}.seccompProfile.type",
    ]
    hardened = plain_template()
    hardened["spec"]["containers"][0]["securityContext"] = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    reconciled.write(JOB_FILE, yaml.safe_dump(job_doc(hardened), sort_keys=False))
    reconciled.commit("ml: a hardened job", author=ANA)
    gitsched("validate", reconciled.path, expect=0)

    # A privileged team may run a privileged pod, but never more GPUs than it is granted.
    reconciled.write("policies/security.yaml", policy.replace("restricted", "privileged"))
    privileged = copy.deepcopy(plain_template())
    privileged["spec"]["hostNetwork"] = True
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    reconciled.write(JOB_FILE, yaml.safe_dump(job_doc(privileged), sort_keys=False))
    reconciled.commit("platform: ml may run privileged pods", author=ANA)
    gitsched("validate", reconciled.path, expect=0)
    gitsched("reconcile", "--once", reconciled.path, expect=0)
    state = log_state(reconciled.log_path)
    assert "ml/sneaky" in state["placements"] or "ml/sneaky" in state["pending"]

    gpus(0, "8")(privileged)
    reconciled.write(JOB_FILE, yaml.safe_dump(job_doc(privileged), sort_keys=False))
    reconciled.commit("ml: more GPUs", author=ANA)
    run = gitsched("reconcile", "--once", reconciled.path, expect=1)
    assert "containers[0].resources.limits['nvidia.com/gpu']" in run.stdout
    assert "grants 1 GPU" in run.stdout


def test_plan_shows_a_podsecurity_change_and_reconcile_applies_it(reconciled: ClusterRepo) -> None:
    policy = (
        "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata:\n  name: security\nspec:\n"
        "  podSecurity:\n    teams: {ml: restricted}\n    serviceAccounts: [default, trainer]\n"
    )
    open_pr(reconciled, {"policies/security.yaml": policy}, "platform: ml runs restricted")
    plan = plan_json(reconciled, expect=1)
    changes = {c["field"]: (c["before"], c["after"]) for c in plan["policy_changes"]}
    assert changes == {
        "podSecurity.teams": ("{}", "{ml: restricted}"),
        "podSecurity.serviceAccounts": ("[default]", "[default, trainer]"),
    }
    text = gitsched("plan", reconciled.path, f"main..{PR}", expect=1).stdout
    assert "podSecurity.teams: {} -> {ml: restricted}" in text
    git(reconciled.path, "merge", "-q", "--ff-only", PR)
    gitsched("reconcile", "--once", reconciled.path, expect=0)
    (*_, changed) = of_type(read_events(reconciled.log_path), "PolicyChanged")
    assert changed.data["policy"]["pod_security"] == {
        "level": "baseline",
        "teams": [["ml", "restricted"]],
        "service_accounts": ["default", "trainer"],
    }
