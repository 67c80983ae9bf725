"""The owner-approval rule on plain data: which team must approve, and whether one did."""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine.model import Approval, FlavorQuota, Owner, Queue
from gitsched.policies.approval import (
    PLATFORM,
    JobSubmission,
    Judgement,
    Signature,
    SignatureStatus,
    TeamApproval,
    Vouch,
    approval_findings,
    check_approvals,
    check_submitters,
    describe_queue_change,
    email_of,
    judge_team,
    key_fingerprint,
    namespace_findings,
    parse_members,
    parse_owners,
    platform_changes,
    recorded_vouches,
    submitter_findings,
    trailer_vouches,
)
from gitsched.reconciler.plan import parse_range
from gitsched.schemas import Document, parse_documents

VISION = Queue(
    name="vision",
    team="vision",
    cohort="research",
    quotas=(FlavorQuota("h100", 24_000, 16_000),),
)
RAISED = dataclasses.replace(VISION, quotas=(FlavorQuota("h100", 40_000, 16_000),))
NLP = Queue(name="nlp", team="nlp", quotas=(FlavorQuota("h100", 32_000),))

QUEUE_FILE = """apiVersion: gitsched.io/v1
kind: Queue
metadata:
  name: {name}
spec:
  quotas:
    - {{flavor: h100, nominal: 1}}
"""


def docs(*names: str) -> tuple[Document, ...]:
    out: list[Document] = []
    for name in names:
        parsed, errors = parse_documents(
            QUEUE_FILE.format(name=name).encode(), f"teams/{name}/queue.yaml"
        )
        assert not errors
        out.extend(parsed)
    return tuple(out)


OWNERS = {"vision": ("ana@vision.example", "Kai <kai@vision.example>"), "nlp": ("li@nlp.example",)}


def check(
    base: dict[str, Queue],
    head: dict[str, Queue],
    *,
    approvers: tuple[str, ...] = (),
    authors: tuple[str, ...] = ("priya@platform.example",),
    base_owners: dict[str, tuple[str, ...]] | None = None,
    head_owners: dict[str, tuple[str, ...]] | None = None,
) -> tuple[TeamApproval, ...]:
    owners = OWNERS if base_owners is None else base_owners
    return check_approvals(
        base_queues=base,
        head_queues=head,
        base_documents=docs(*base),
        head_documents=docs(*head),
        base_owners=owners,
        head_owners=owners if head_owners is None else head_owners,
        approvers=approvers,
        authors=authors,
    )


def test_email_of_reads_trailers_and_bare_addresses() -> None:
    assert email_of("Li Wei <Li@NLP.example>") == "li@nlp.example"
    assert email_of("  li@nlp.example ") == "li@nlp.example"


def test_an_unchanged_queue_needs_nobody() -> None:
    assert check({"vision": VISION, "nlp": NLP}, {"vision": VISION, "nlp": NLP}) == ()


def test_a_quota_change_needs_an_owner_of_that_team_only() -> None:
    (team,) = check({"vision": VISION, "nlp": NLP}, {"vision": RAISED, "nlp": NLP})
    assert team.team == "vision" and team.files == ("teams/vision/queue.yaml",)
    assert team.owners == ("ana@vision.example", "kai@vision.example")
    assert not team.satisfied and team.eligible == team.owners
    assert "h100 nominal/borrowing/lending 24/16/- -> 40/16/-" in team.changes[0]


def test_an_owner_approves_by_e_mail_whatever_the_name_or_case() -> None:
    (team,) = check(
        {"vision": VISION}, {"vision": RAISED}, approvers=("Kai Someone <KAI@vision.example>",)
    )
    assert team.satisfied and team.approved_by == ("kai@vision.example",)


def test_an_approver_who_is_not_an_owner_does_not_count() -> None:
    (team,) = check({"vision": VISION}, {"vision": RAISED}, approvers=("li@nlp.example",))
    assert not team.satisfied


def test_the_author_cannot_approve_their_own_change() -> None:
    (team,) = check(
        {"vision": VISION},
        {"vision": RAISED},
        approvers=("Ana <ana@vision.example>",),
        authors=("ana@vision.example",),
    )
    assert not team.satisfied
    assert team.authors_among_owners == ("ana@vision.example",)
    assert team.eligible == ("kai@vision.example",)
    assert "ana@vision.example wrote the change and cannot approve it" in team.missing_text()


def test_a_team_without_owners_at_the_base_needs_no_approval() -> None:
    (team,) = check({"vision": VISION}, {"vision": RAISED}, base_owners={})
    assert team.unowned and team.satisfied
    assert approval_findings([team]) == ()


def test_a_change_cannot_approve_itself_by_editing_owners() -> None:
    (team,) = check(
        {"vision": VISION},
        {"vision": RAISED},
        approvers=("priya@platform.example",),
        authors=("ana@vision.example",),
        head_owners={**OWNERS, "vision": ("priya@platform.example",)},
    )
    assert not team.satisfied
    assert team.files == ("teams/vision/queue.yaml", "teams/vision/OWNERS")
    assert team.owners == ("ana@vision.example", "kai@vision.example")
    assert "adds priya@platform.example" in team.changes[1]


def test_adding_and_removing_queues_need_approval_too() -> None:
    added = check({}, {"vision": VISION})
    removed = check({"nlp": NLP}, {})
    assert added[0].changes == ("adds queue vision",)
    assert removed[0].files == ("teams/nlp/queue.yaml",) and removed[0].changes == (
        "removes queue nlp",
    )


def test_findings_name_the_file_the_line_and_who_may_approve() -> None:
    checks = check({"vision": VISION}, {"vision": RAISED}, authors=("ana@vision.example",))
    (finding,) = approval_findings(checks)
    assert finding.file == "teams/vision/queue.yaml"
    assert finding.line == 5 and finding.path == "$.spec"
    assert finding.code == "approval"
    assert "kai@vision.example" in finding.message and "Approved-by:" in finding.message


def test_describe_queue_change_names_every_changed_field() -> None:
    changed = dataclasses.replace(RAISED, weight=2.0, cohort=None, max_priority_class="high")
    text = describe_queue_change(VISION, changed)
    assert text.startswith("changes queue vision: ")
    assert "cohort research -> -" in text and "weight 1 -> 2" in text
    assert "maxPriorityClass - -> high" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("main..pr/x", ("main", "pr/x")),
        ("..pr/x", (None, "pr/x")),
        ("pr/x", (None, "pr/x")),
    ],
)
def test_parse_range(text: str, expected: tuple[str | None, str]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["main...pr/x", "main.."])
def test_parse_range_refuses_what_it_cannot_mean(text: str) -> None:
    from gitsched.engine.errors import UsageError

    with pytest.raises(UsageError):
        parse_range(text)


# -- owners' keys and signed approvals ------------------------------------------------------

# A real ed25519 public key and the fingerprint `ssh-keygen -l` prints for it.
KAI_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH4PbxmZZsrfyTChxErb7JtWf0pFr7FW+oqo9BndFkbw"
KAI_FP = "SHA256:FIGfNECVGz8Z/l29ekVqaWKlR22KbNO186tZ1P/Fp+o"
OTHER_FP = "SHA256:" + "A" * 43


def test_key_fingerprint_is_the_one_ssh_keygen_prints() -> None:
    assert key_fingerprint(KAI_KEY) == KAI_FP
    assert key_fingerprint("ssh-ed25519 not*base64") == ""
    assert key_fingerprint("") == ""


def test_parse_owners_reads_e_mails_keys_and_names_the_bad_line() -> None:
    text = (
        "# vision's owners\n"
        "Ana <ana@vision.example>\n"
        f"kai@vision.example {KAI_KEY} kai@laptop\n"
        f'li@nlp.example namespaces="git" {KAI_KEY}\n'
        f"Sam Lee <sam@vision.example> {KAI_KEY}\n"
        "bob@vision.example ssh-ed25519 !!!\n"
        f"*@vision.example {KAI_KEY}\n"
    )
    owners, problems = parse_owners(text)
    assert owners == (
        Owner("ana@vision.example"),
        Owner("kai@vision.example", KAI_KEY),
        Owner("li@nlp.example", KAI_KEY),
        Owner("sam@vision.example", KAI_KEY),
    )
    assert [n for n, _ in problems] == [6, 7]
    assert "the ssh-ed25519 key of bob@vision.example is not a valid public key" in problems[0][1]
    assert "is not an e-mail" in problems[1][1]


SIGNED_OWNERS = {
    "vision": (Owner("ana@vision.example"), Owner("kai@vision.example", KAI_KEY)),
    "nlp": (Owner("li@nlp.example", "ssh-ed25519 " + "A" * 8),),
}


def signed(fp: str) -> Signature:
    return Signature(SignatureStatus.GOOD, fp)


def judge(*vouches: Vouch, authors: tuple[str, ...] = ("priya@platform.example",)) -> Judgement:
    return judge_team(
        "vision",
        SIGNED_OWNERS["vision"],
        authors=authors,
        vouches=vouches,
        signed_required=True,
        all_owners=SIGNED_OWNERS,
    )


def test_a_signed_trailer_by_the_owners_listed_key_counts() -> None:
    verdict = judge(Vouch("c" * 40, "trailer", "kai@vision.example", signed(KAI_FP)))
    assert verdict.approvals == (
        Approval("kai@vision.example", "signed-trailer", "c" * 40, KAI_FP),
    )


def test_each_failure_of_a_signed_approval_says_which_it_is() -> None:
    kai = "kai@vision.example"
    unsigned = judge(Vouch("a" * 40, "trailer", kai, Signature(SignatureStatus.NONE)))
    assert unsigned.approvals == ()
    assert "has no valid signature (unsigned commit)" in unsigned.refused[0]
    bad = judge(Vouch("a" * 40, "trailer", kai, Signature(SignatureStatus.BAD, detail="broken")))
    assert "has no valid signature (broken)" in bad.refused[0]
    nlp_fp = key_fingerprint(SIGNED_OWNERS["nlp"][0].key)
    other = judge(Vouch("a" * 40, "trailer", kai, signed(nlp_fp)))
    assert f"key {nlp_fp} is not listed for team vision" in other.refused[0]
    assert "it is the key of li@nlp.example of team nlp" in other.refused[0]
    own = judge(Vouch("a" * 40, "trailer", kai, signed(KAI_FP)), authors=(kai,))
    assert "signed by the change's own author kai@vision.example" in own.refused[0]
    merge_own = judge(Vouch("m" * 40, "merge", "", signed(KAI_FP)), authors=(kai,))
    assert "merge mmmmmmmmmmmm is signed by the change's own author" in merge_own.refused[0]


def test_a_signed_merge_counts_an_unsigned_one_vouches_for_nothing() -> None:
    assert judge(Vouch("m" * 40, "merge", "", signed(KAI_FP))).approvals == (
        Approval("kai@vision.example", "signed-merge", "m" * 40, KAI_FP),
    )
    assert judge(Vouch("m" * 40, "merge", "", None)) == Judgement((), ())
    unknown = judge(Vouch("m" * 40, "merge", "", signed(OTHER_FP)))
    assert unknown.approvals == () and "not listed for team vision" in unknown.refused[0]


def test_without_the_signing_rule_a_trailer_of_an_owner_counts_as_before() -> None:
    verdict = judge_team(
        "vision",
        SIGNED_OWNERS["vision"],
        authors=("priya@platform.example",),
        vouches=trailer_vouches(["Ana <ana@vision.example>"], "c" * 40),
        signed_required=False,
    )
    assert verdict.approvals == (Approval("ana@vision.example", "trailer", "c" * 40),)


def test_recorded_approvals_are_judged_again_against_the_owners_at_the_base() -> None:
    recorded = (
        Approval("kai@vision.example", "signed-merge", "m" * 40, KAI_FP),
        Approval("ana@vision.example", "trailer", "c" * 40),
    )
    verdict = judge(*recorded_vouches(recorded))
    # signed approvals required: ana's unsigned trailer does not count, kai's merge does
    assert [a.approver for a in verdict.approvals] == ["kai@vision.example"]
    # had kai's key not been listed at the base, the recorded merge would not count
    rekeyed = judge_team(
        "vision",
        (Owner("kai@vision.example", SIGNED_OWNERS["nlp"][0].key),),
        authors=(),
        vouches=recorded_vouches(recorded[:1]),
        signed_required=True,
    )
    assert rekeyed.approvals == ()


def test_a_key_change_in_owners_is_a_change_that_needs_approval() -> None:
    rekeyed = {
        **SIGNED_OWNERS,
        "vision": (Owner("ana@vision.example"), Owner("kai@vision.example")),
    }
    (team,) = check_approvals(
        base_queues={},
        head_queues={},
        base_owners=SIGNED_OWNERS,
        head_owners=rekeyed,
        authors=("priya@platform.example",),
        signed_required=True,
    )
    assert team.changes == ("changes the team's owners: changes the key of kai@vision.example",)
    assert not team.satisfied and "needs a signed approval" in team.missing_text()


def test_a_signed_approval_the_change_goes_on_after_does_not_count() -> None:
    stale = Vouch("a" * 40, "trailer", "kai@vision.example", signed(KAI_FP), current=False)
    verdict = judge(stale)
    assert verdict.approvals == () and "is stale" in verdict.refused[0]


# -- the trust boundary (issue 32): platform owners, members, namespaces


def test_the_only_owner_who_wrote_the_change_is_told_what_to_do() -> None:
    owners = {"vision": ("carol@vision.example",)}
    (team,) = check(
        {"vision": VISION},
        {"vision": RAISED},
        approvers=("carol@vision.example",),
        authors=("carol@vision.example",),
        base_owners=owners,
    )
    assert not team.satisfied and team.eligible == ()
    text = team.missing_text()
    assert "carol@vision.example, the only owner of team vision" in text
    assert "add a second owner to teams/vision/OWNERS" in text
    assert "have the platform name its owners in OWNERS at the repo root" in text
    with_platform = {**owners, PLATFORM: ("olga@platform.example",)}
    (team,) = check(
        {"vision": VISION},
        {"vision": RAISED},
        authors=("carol@vision.example",),
        base_owners=with_platform,
    )
    assert team.eligible == ("olga@platform.example",)
    assert "or OWNERS at the repo root" in team.missing_text()


def test_a_platform_owner_approves_any_team_and_owns_the_unowned_ones() -> None:
    owners = {**OWNERS, PLATFORM: ("olga@platform.example",)}
    (team,) = check(
        {"vision": VISION}, {"vision": RAISED}, approvers=("olga@platform.example",),
        base_owners=owners,
    )  # fmt: skip
    assert team.satisfied
    # a new team: nobody owns it at the base but the platform
    (new,) = check({}, {"nlp": NLP}, base_owners={PLATFORM: ("olga@platform.example",)})
    assert not new.unowned and not new.satisfied and new.owners == ("olga@platform.example",)


def test_the_platforms_own_changes_need_a_platform_owner_once_there_is_one() -> None:
    changes = platform_changes(cluster_changed=True, policy_changed=True, nodes_changed=["n-1"])
    assert [f for f, _ in changes] == ["cluster.yaml", "inventory/", "policies/"]

    def judge(owners: dict[str, tuple[str, ...]]) -> tuple[TeamApproval, ...]:
        return check_approvals(
            base_queues={"vision": VISION},
            head_queues={},
            base_owners=owners,
            head_owners={t: o for t, o in owners.items() if t != "vision"},  # the team goes
            authors=("mallory@x.example",),
            platform=changes,
        )

    assert [t.team for t in judge(OWNERS)] == ["vision"]  # bootstrap: no platform owners yet
    judged = {t.team: t for t in judge({**OWNERS, PLATFORM: ("olga@platform.example",)})}
    assert set(judged) == {PLATFORM, "vision"}
    assert "removes team vision" in judged[PLATFORM].changes
    assert not judged[PLATFORM].satisfied


def test_reserved_and_unlisted_namespaces_are_refused() -> None:
    found = namespace_findings(["kube-system", "kube-flannel", "gitsched-system", "ml"], None)
    assert [f.file for f in found] == [
        "teams/gitsched-system/",
        "teams/kube-flannel/",
        "teams/kube-system/",
    ]
    (unlisted,) = namespace_findings(["ml", "vision"], ["ml"])
    assert "team vision is not one of the namespaces" in unlisted.message


def test_members_file_lines_and_who_may_submit_jobs() -> None:
    members, problems = parse_members("# alpha\nLin <LIN@alpha.example>\n\nnot mail\n")
    assert members == ("lin@alpha.example",) and problems[0][0] == 4
    base_owners = {"alpha": ("ana@alpha.example",)}
    base_members = {"alpha": members}

    def submit(author: str, approvers: tuple[str, ...] = ()) -> JobSubmission:
        (verdict,) = check_submitters(
            job_files={"alpha": ["teams/alpha/jobs/x.yaml"]},
            base_owners=base_owners,
            base_members=base_members,
            authors=(author,),
            vouches=trailer_vouches(approvers),
        )
        return verdict

    assert submit("lin@alpha.example").satisfied
    assert submit("ana@alpha.example").satisfied
    outsider = submit("bob@beta.example")
    assert not outsider.satisfied
    (finding,) = submitter_findings([outsider])
    assert finding.file == "teams/alpha/jobs/x.yaml"
    assert "bob@beta.example is not a member or owner of team alpha" in finding.message
    assert submit("bob@beta.example", ("ana@alpha.example",)).satisfied
    assert not submit("bob@beta.example", ("lin@alpha.example",)).satisfied  # members don't approve


def test_a_prow_style_owners_file_is_not_read_as_owners() -> None:
    owners, problems = parse_owners("approvers:\n- alice\nana@ml.example\n")
    assert owners == (Owner("ana@ml.example"),)
    assert [n for n, _ in problems] == [1, 2]
    assert "'approvers:' is not an e-mail" in problems[0][1]
