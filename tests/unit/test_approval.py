"""The owner-approval rule on plain data: which team must approve, and whether one did."""

from __future__ import annotations

import dataclasses

import pytest

from engine.model import FlavorQuota, Queue
from policies.approval import (
    TeamApproval,
    approval_findings,
    check_approvals,
    describe_queue_change,
    email_of,
)
from reconciler.plan import parse_range
from schemas import Document, parse_documents

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
    from engine.errors import UsageError

    with pytest.raises(UsageError):
        parse_range(text)
