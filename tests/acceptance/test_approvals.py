"""Approvals with real git: trailers, merges, and SSH signatures checked against OWNERS.

Keys are made with ssh-keygen in the test, commits and merges signed by git itself;
`plan`, `reconcile` and `audit` run as the CLI, and must agree on every change.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.approvals import (
    KAI,
    LI,
    MALLORY,
    Key,
    SigningRepo,
    applied_shas,
    make_key,
    owners_line,
    plan_approvals,
    policy,
    raise_ml,
    reconcile,
)
from tests.support.cluster_repo import (
    ANA,
    MINIMAL_CLUSTER,
    PRIYA,
    ClusterRepo,
    git,
    gitsched,
    of_type,
    queue_yaml,
    read_events,
)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Key]:
    probe = subprocess.run(["ssh-keygen", "-Y", "sign"], capture_output=True, text=True)
    if "-Y" in probe.stderr and "illegal option" in probe.stderr.lower():
        pytest.fail("ssh-keygen has no -Y (OpenSSH 8.2 or newer is needed to sign with SSH keys)")
    folder = tmp_path_factory.mktemp("keys")
    return {name: make_key(folder, name) for name in ("ana", "kai", "li", "mallory")}


@pytest.fixture
def repo(tmp_path: Path, keys: dict[str, Key]) -> SigningRepo:
    """ml owned by ana and kai, nlp by li, each with their key; signed approvals required."""
    r = SigningRepo(tmp_path / "cluster")
    r.write_all(MINIMAL_CLUSTER)
    r.write_all(
        {
            "policies/default.yaml": policy(signed=True),
            "teams/ml/OWNERS": owners_line(ANA, keys["ana"]) + owners_line(KAI, keys["kai"]),
            "teams/nlp/queue.yaml": queue_yaml("nlp", 8),
            "teams/nlp/OWNERS": "# nlp's owners, in allowed-signers form\n"
            + owners_line(LI, keys["li"]),
        }
    )
    r.commit("Bootstrap: queues and their owners")
    gitsched("reconcile", "--once", r.path, expect=0)
    return r


def test_the_bootstrap_commit_needs_no_approval_and_records_the_owners(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    events = read_events(repo.log_path)
    assert not of_type(events, "CommitRejected")
    owners = {e.data["team"]: e.data["owners"] for e in of_type(events, "OwnersChanged")}
    assert owners["nlp"] == [{"email": "li@nlp.example", "key": keys["li"].public}]
    assert [o["email"] for o in owners["ml"]] == ["ana@ml.example", "kai@ml.example"]
    compliance = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()
    assert compliance["ok"], compliance["violations"]
    changes = gitsched("audit", "changes", "--repo", repo.path, "--format", "json").json()
    assert {c["approval"]["status"] for c in changes if c["approval"]} == {"bootstrap"}


def test_a_forged_trailer_without_a_signature_is_rejected(repo: SigningRepo) -> None:
    raise_ml(repo)
    repo.signed("ml: nominal 40", None, trailers=[("Approved-by", "Kai Berg <kai@ml.example>")])
    (message,) = reconcile(repo, expect=1)
    assert "the trailer naming kai@ml.example" in message
    assert "has no valid signature (unsigned commit)" in message
    (ml,) = plan_approvals(repo, "HEAD~1..HEAD")
    assert ml["satisfied"] is False


def test_a_key_of_another_team_is_rejected(repo: SigningRepo, keys: dict[str, Key]) -> None:
    raise_ml(repo)
    repo.signed(
        "ml: nominal 40", keys["li"], trailers=[("Approved-by", "Kai Berg <kai@ml.example>")]
    )
    (message,) = reconcile(repo, expect=1)
    assert f"key {keys['li'].fingerprint} is not listed for team ml" in message
    assert "it is the key of li@nlp.example of team nlp" in message


def test_an_owner_cannot_approve_their_own_change_by_signing_it(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    raise_ml(repo)
    repo.signed(
        "ml: nominal 40",
        keys["kai"],
        author=KAI,
        trailers=[("Approved-by", "Kai Berg <kai@ml.example>")],
    )
    (message,) = reconcile(repo, expect=1)
    assert "is signed by the change's own author kai@ml.example" in message
    # another owner's signature is what it needs
    assert "needs a signed approval from one of ana@ml.example" in message


def test_a_key_added_on_the_branch_is_ignored(repo: SigningRepo, keys: dict[str, Key]) -> None:
    base = repo.head()
    git(repo.path, "checkout", "-q", "-b", "grab")
    raise_ml(repo)
    repo.write(
        "teams/ml/OWNERS",
        owners_line(ANA, keys["ana"])
        + owners_line(KAI, keys["kai"])
        + owners_line(MALLORY, keys["mallory"]),
    )
    repo.signed(
        "ml: nominal 40, and mallory co-owns ml",
        keys["mallory"],
        author=MALLORY,
        trailers=[("Approved-by", "Mallory <mallory@elsewhere.example>")],
    )
    (ml,) = plan_approvals(repo, f"{base}..grab")
    assert ml["satisfied"] is False
    git(repo.path, "checkout", "-q", "main")
    repo.merge("grab", keys["mallory"], by=MALLORY)
    (message,) = reconcile(repo, expect=1)
    assert "mallory@elsewhere.example (trailer on" in message
    assert "is not in teams/ml/OWNERS" in message
    assert f"key {keys['mallory'].fingerprint} is not listed for team ml" in message


def test_an_owners_signed_merge_approves_and_the_log_keeps_the_fingerprint(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    base = repo.head()
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None)  # priya's change, unsigned
    git(repo.path, "checkout", "-q", "main")
    merge = repo.merge("raise", keys["kai"], by=KAI)

    (ml,) = plan_approvals(repo, f"{base}..{merge}")
    assert ml["satisfied"] is True and ml["approved_by"] == ["kai@ml.example"]
    assert reconcile(repo, expect=0) == []
    (checked,) = [
        e for e in of_type(read_events(repo.log_path), "ApprovalChecked") if e.cause == merge
    ]
    assert checked.data == {
        "team": "ml",
        "authors": ["priya@platform.example"],  # who wrote it, not kai who merged it
        "approvals": [
            {
                "approver": "kai@ml.example",
                "via": "signed-merge",
                "commit": merge,
                "fingerprint": keys["kai"].fingerprint,
            }
        ],
    }
    changes = gitsched("audit", "changes", "--repo", repo.path, "--format", "json").json()
    (change,) = [c for c in changes if c["commit"] == merge]
    assert change["approval"]["status"] == "approved"
    assert change["approval"]["approvals"][0] | {"commit": "-"} == {
        "approver": "kai@ml.example",
        "owner_at_base": True,
        "counted": True,
        "via": "signed-merge",
        "commit": "-",
        "fingerprint": keys["kai"].fingerprint,
    }
    table = gitsched("audit", "changes", "--repo", repo.path, "--wide").stdout
    assert f"kai@ml.example (owner, signed {keys['kai'].fingerprint})" in table
    assert gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()["ok"]
    verified = gitsched(
        "audit", "verify", "--signatures", "--repo", repo.path, "--format", "json", expect=0
    ).json()
    assert verified["signatures"] == {"checked": 1, "failed": []}


def test_a_signed_approval_commit_on_the_branch_counts_through_an_unsigned_merge(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    base = repo.head()
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None)
    repo.signed(
        "Approve the ml raise",
        keys["ana"],
        author=ANA,
        trailers=[("Approved-by", "Ana Souza <ana@ml.example>")],
        allow_empty=True,  # ana wrote nothing: she only approves
    )
    (ml,) = plan_approvals(repo, f"{base}..raise")
    assert ml["satisfied"] is True
    git(repo.path, "checkout", "-q", "main")
    merge = repo.merge("raise", None)
    assert reconcile(repo, expect=0) == []
    (checked,) = [
        e for e in of_type(read_events(repo.log_path), "ApprovalChecked") if e.cause == merge
    ]
    assert checked.data["approvals"][0]["via"] == "signed-trailer"
    assert checked.data["approvals"][0]["fingerprint"] == keys["ana"].fingerprint


def test_a_tampered_signed_commit_fails_audit_verify(
    repo: SigningRepo, keys: dict[str, Key], tmp_path: Path
) -> None:
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None)
    git(repo.path, "checkout", "-q", "main")
    merge = repo.merge("raise", keys["kai"], by=KAI)
    reconcile(repo, expect=0)
    # The same log against a repository whose merge commit is not the signed one.
    other = SigningRepo(tmp_path / "other")
    other.write_all({"README": "x"}).commit("unrelated")
    (repo.path / ".gitsched").rename(other.path / ".gitsched")
    run = gitsched("audit", "verify", "--signatures", "--repo", other.path, expect=1)
    assert "FAILED seq" in run.stdout and merge[:12] in run.stdout
    assert "the commit is not in this repository" in run.stdout


def test_with_owner_approval_a_no_ff_merge_of_an_approved_branch_is_accepted_everywhere(
    tmp_path: Path,
) -> None:
    """Issue: plan said approved, the reconciler rejected the merge commit, and audit
    named the person who merged as the change's author."""
    repo = SigningRepo(tmp_path / "cluster")
    repo.write_all(MINIMAL_CLUSTER)
    repo.write_all(
        {"policies/default.yaml": policy(owner=True), "teams/ml/OWNERS": "ana@ml.example\n"}
    )
    repo.commit("Bootstrap")
    gitsched("reconcile", "--once", repo.path, expect=0)
    base = repo.head()
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None, trailers=[("Approved-by", "Ana Souza <ana@ml.example>")])
    git(repo.path, "checkout", "-q", "main")
    merge = repo.merge("raise", None, by=LI)

    (ml,) = plan_approvals(repo, f"{base}..{merge}")
    assert ml["satisfied"] is True and ml["approved_by"] == ["ana@ml.example"]
    assert reconcile(repo, expect=0) == []
    compliance = gitsched("audit", "compliance", "--repo", repo.path, "--format", "json").json()
    assert compliance["ok"], compliance["violations"]
    changes = gitsched("audit", "changes", "--repo", repo.path, "--format", "json").json()
    (change,) = [c for c in changes if c["commit"] == merge]
    assert change["approval"]["authors"] == ["priya@platform.example"]
    assert change["author"] == "priya@platform.example (merged by Li Wei <li@nlp.example>)"
    assert [a["approver"] for a in change["approval"]["approvals"]] == ["ana@ml.example"]


def test_with_the_policy_off_an_unapproved_change_is_applied_and_audit_flags_it(
    tmp_path: Path,
) -> None:
    repo = SigningRepo(tmp_path / "cluster")
    repo.write_all(MINIMAL_CLUSTER)
    repo.write_all({"teams/ml/OWNERS": "ana@ml.example\n"})
    repo.commit("Bootstrap")
    raise_ml(repo)
    repo.commit(
        "ml: nominal 40", trailers=[("Approved-by", "Priya Raman <priya@platform.example>")]
    )
    assert reconcile(repo, expect=0) == []
    compliance = gitsched(
        "audit", "compliance", "--repo", repo.path, "--format", "json", expect=1
    ).json()
    (violation,) = compliance["violations"]
    assert violation["subject"] == "ml"
    assert "has no approval from an owner at the base (ana@ml.example)" in violation["message"]


def test_the_fresh_demo_passes_audit_compliance(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    gitsched("demo", demo, expect=0)
    result = gitsched("audit", "compliance", "--repo", demo, "--format", "json").json()
    assert result["ok"], result["violations"]
    (approval,) = [c for c in result["checks"] if c["check"] == "quota-approval"]
    assert approval["checked"] >= 2 and approval["status"] == "PASS"


def test_a_bad_key_in_owners_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    repo = ClusterRepo(tmp_path / "cluster")
    repo.write_all(MINIMAL_CLUSTER)
    repo.write("teams/ml/OWNERS", "# ml\nana@ml.example\nkai@ml.example ssh-ed25519 !!notakey\n")
    run = gitsched("validate", repo.path, expect=1)
    assert (
        "teams/ml/OWNERS:3: $: the ssh-ed25519 key of kai@ml.example is not a valid public key"
        in run.stdout
    )


def test_a_signed_approval_followed_by_more_changes_is_stale(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    git(repo.path, "checkout", "-q", "-b", "raise")
    raise_ml(repo, 40)
    repo.signed("ml: nominal 40", None)
    repo.signed(
        "Approve the ml raise",
        keys["ana"],
        author=ANA,
        trailers=[("Approved-by", "Ana Souza <ana@ml.example>")],
        allow_empty=True,
    )
    raise_ml(repo, 64)  # after ana signed: her signature does not cover this
    repo.signed("ml: nominal 64 after all", None)
    git(repo.path, "checkout", "-q", "main")
    repo.merge("raise", None)
    (message,) = reconcile(repo, expect=1)
    assert "ana@ml.example's signed approval on" in message and "is stale" in message


# -- 32.6: a signed approval counts only for the tree it approves


def approved_branch(repo: SigningRepo, keys: dict[str, Key]) -> None:
    """Branch 'raise': priya raises ml's quota, ana signs an approval at its tip."""
    git(repo.path, "checkout", "-q", "-b", "raise", "main")
    raise_ml(repo)
    repo.signed("ml: nominal 40", None)
    repo.signed(
        "Approve the ml raise",
        keys["ana"],
        author=ANA,
        trailers=[("Approved-by", "Ana Souza <ana@ml.example>")],
        allow_empty=True,
    )
    git(repo.path, "checkout", "-q", "main")


def add_mallory(repo: SigningRepo, keys: dict[str, Key]) -> None:
    repo.write(
        "teams/ml/OWNERS",
        owners_line(ANA, keys["ana"])
        + owners_line(KAI, keys["kai"])
        + owners_line(MALLORY, keys["mallory"]),
    )


def test_an_octopus_merge_does_not_stretch_a_signed_approval_over_another_branch(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    base = repo.head()
    approved_branch(repo, keys)
    git(repo.path, "checkout", "-q", "-b", "grab", "main")
    add_mallory(repo, keys)
    repo.signed("ml: mallory co-owns ml", None, author=MALLORY)
    git(repo.path, "checkout", "-q", "main")
    git(
        repo.path, "-c", "commit.gpgsign=false", "merge", "-q", "--no-ff", "-m", "Merge",
        "raise", "grab",
        env={"GIT_AUTHOR_NAME": PRIYA[0], "GIT_AUTHOR_EMAIL": PRIYA[1],
             "GIT_COMMITTER_NAME": PRIYA[0], "GIT_COMMITTER_EMAIL": PRIYA[1]},
    )  # fmt: skip
    octopus = repo.head()
    assert len(git(repo.path, "rev-list", "--parents", "-n1", octopus).split()) == 4

    (ml,) = plan_approvals(repo, f"{base}..{octopus}")
    assert ml["satisfied"] is False
    (message,) = reconcile(repo, expect=1)
    assert "ana@ml.example's signed approval on" in message and "is stale" in message
    assert octopus not in applied_shas(repo)
    owners = [e.data for e in of_type(read_events(repo.log_path), "OwnersChanged")]
    assert all("mallory@elsewhere.example" not in str(o) for o in owners)


def test_a_stale_approval_on_an_unmerged_branch_does_not_carry_a_rejected_commit_in(
    repo: SigningRepo, keys: dict[str, Key]
) -> None:
    approved_branch(repo, keys)  # approved, but not merged yet
    add_mallory(repo, keys)
    rejected = repo.signed("ml: mallory co-owns ml", None, author=MALLORY)
    (first,) = reconcile(repo, expect=1)
    assert "changes the team's owners" in first
    merge = repo.merge("raise", None)  # its first parent is the rejected commit
    (message,) = reconcile(repo, expect=1)
    assert "is stale" in message
    assert rejected not in applied_shas(repo) and merge not in applied_shas(repo)
