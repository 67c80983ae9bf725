"""Who must approve a change: a team's queue (and its OWNERS) only moves with an owner's yes.

Pure: the caller brings the queues and OWNERS of the base and the head, and the people
who wrote and approved the change; `plan` lists what is missing, the reconciler rejects
a merged commit that lacks it when the Policy says `approval.requireOwnerApproval`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from engine.model import Finding, FlavorQuota, Queue
from policies.rules import place_of
from schemas import Document

APPROVAL_CODE = "approval"
TRAILER_HINT = "Approved-by: Name <e-mail>"


def email_of(person: str) -> str:
    """'Li Wei <li@nlp.example>' -> 'li@nlp.example'; a bare address is its own e-mail."""
    text = person.strip()
    if "<" in text and text.endswith(">"):
        text = text[text.rindex("<") + 1 : -1]
    return text.strip().lower()


def owners_file(team: str) -> str:
    return f"teams/{team}/OWNERS"


@dataclass(frozen=True, slots=True)
class TeamApproval:
    """What a change does to one team's governed files, and whether an owner approved it."""

    team: str
    files: tuple[str, ...]
    changes: tuple[str, ...]
    owners: tuple[str, ...]  # e-mails in the team's OWNERS at the base commit
    approved_by: tuple[str, ...]  # those owners who approved
    authors_among_owners: tuple[str, ...] = ()  # owners who wrote the change: they cannot approve
    line: int | None = None

    @property
    def unowned(self) -> bool:
        return not self.owners

    @property
    def satisfied(self) -> bool:
        return self.unowned or bool(self.approved_by)

    @property
    def eligible(self) -> tuple[str, ...]:
        """Owners whose approval would do: every owner but the change's authors."""
        return tuple(o for o in self.owners if o not in self.authors_among_owners)

    def missing_text(self) -> str:
        who = ", ".join(self.eligible) or "nobody (every owner wrote the change)"
        text = f"needs an approval from one of {who} ({owners_file(self.team)} at the base commit)"
        if self.authors_among_owners:
            text += (
                f"; {', '.join(self.authors_among_owners)} wrote the change and cannot approve it"
            )
        return text


def _quota_text(fq: FlavorQuota | None) -> str:
    if fq is None:
        return "none"

    def gpus(milli: int | None) -> str:
        return "-" if milli is None else f"{milli / 1000:g}"

    return f"{gpus(fq.nominal)}/{gpus(fq.borrowing_limit)}/{gpus(fq.lending_limit)}"


def describe_queue_change(before: Queue | None, after: Queue | None) -> str:
    """One line a reviewer reads: what changed in a queue, before -> after."""
    if before is None and after is not None:
        return f"adds queue {after.name}"
    if after is None and before is not None:
        return f"removes queue {before.name}"
    assert before is not None and after is not None
    parts: list[str] = []
    for label, old, new in (
        ("cohort", before.cohort, after.cohort),
        ("weight", f"{before.weight:g}", f"{after.weight:g}"),
        ("maxPriorityClass", before.max_priority_class, after.max_priority_class),
        ("team", before.team, after.team),
    ):
        if old != new:
            parts.append(f"{label} {old or '-'} -> {new or '-'}")
    flavors = sorted({q.flavor for q in (*before.quotas, *after.quotas)})
    for flavor in flavors:
        old_q, new_q = before.quota(flavor), after.quota(flavor)
        if old_q != new_q:
            parts.append(
                f"{flavor} nominal/borrowing/lending {_quota_text(old_q)} -> {_quota_text(new_q)}"
            )
    return f"changes queue {after.name}: " + ("; ".join(parts) or "spec")


def _queue_homes(documents: Iterable[Document]) -> dict[str, tuple[str, int | None]]:
    """Queue name -> (its file, the line of its spec), for the queues these documents define."""
    homes: dict[str, tuple[str, int | None]] = {}
    for doc in documents:
        if doc.kind == "Queue" and doc.name:
            homes.setdefault(doc.name, (doc.file, doc.position(("spec",))[0]))
    return homes


def _team_of(file: str) -> str | None:
    place = place_of(file)
    if place.area == "queue":
        return place.team
    parts = PurePosixPath(file).parts
    if len(parts) == 3 and parts[0] == "teams" and parts[2] == "OWNERS":
        return parts[1]
    return None


def check_approvals(
    *,
    base_queues: Mapping[str, Queue],
    head_queues: Mapping[str, Queue],
    base_documents: Sequence[Document],
    head_documents: Sequence[Document],
    base_owners: Mapping[str, Sequence[str]],
    head_owners: Mapping[str, Sequence[str]],
    approvers: Sequence[str],
    authors: Sequence[str],
) -> tuple[TeamApproval, ...]:
    """One TeamApproval for each team whose queue or OWNERS the change touches.

    The team is the folder the queue file sits in (teams/<team>/queue.yaml), and the
    owners are that folder's OWNERS *at the base*: a change cannot approve itself by
    editing OWNERS. Approvers and authors are matched by e-mail, case-insensitively;
    an author never counts as an approver of their own change. A team without OWNERS
    at the base has nobody to ask, so its changes need no approval.
    """
    base_homes = _queue_homes(base_documents)
    head_homes = _queue_homes(head_documents)
    touched: dict[str, list[tuple[str, str, int | None]]] = {}

    for name in sorted(set(base_queues) | set(head_queues)):
        before, after = base_queues.get(name), head_queues.get(name)
        if before == after:
            continue
        file, line = head_homes.get(name) or base_homes.get(name) or (_default_home(before, after))
        team = _team_of(file)
        if team is None:
            continue
        touched.setdefault(team, []).append((file, describe_queue_change(before, after), line))

    for team in sorted(set(base_owners) | set(head_owners)):
        old = tuple(email_of(o) for o in base_owners.get(team, ()))
        new = tuple(email_of(o) for o in head_owners.get(team, ()))
        if old != new:
            added = sorted(set(new) - set(old))
            removed = sorted(set(old) - set(new))
            what = "; ".join(
                part
                for part in (
                    f"adds {', '.join(added)}" if added else "",
                    f"removes {', '.join(removed)}" if removed else "",
                )
                if part
            )
            touched.setdefault(team, []).append(
                (owners_file(team), f"changes the team's owners: {what or 'reorders them'}", None)
            )

    approving = {email_of(a) for a in approvers}
    writing = {email_of(a) for a in authors}
    out: list[TeamApproval] = []
    for team in sorted(touched):
        owners = tuple(dict.fromkeys(email_of(o) for o in base_owners.get(team, ())))
        entries = touched[team]
        out.append(
            TeamApproval(
                team=team,
                files=tuple(dict.fromkeys(f for f, _, _ in entries)),
                changes=tuple(c for _, c, _ in entries),
                owners=owners,
                approved_by=tuple(o for o in owners if o in approving and o not in writing),
                authors_among_owners=tuple(o for o in owners if o in writing),
                line=next((line for _, _, line in entries if line is not None), None),
            )
        )
    return tuple(out)


def _default_home(before: Queue | None, after: Queue | None) -> tuple[str, int | None]:
    queue = after or before
    assert queue is not None
    return (f"teams/{queue.team}/queue.yaml", None)


def approval_findings(checks: Iterable[TeamApproval]) -> tuple[Finding, ...]:
    """The errors of a merged commit that lacks an owner's approval: one per team, at its file."""
    findings: list[Finding] = []
    for check in checks:
        if check.satisfied:
            continue
        findings.append(
            Finding(
                file=check.files[0],
                line=check.line,
                column=None,
                path="$.spec" if check.line is not None else "$",
                message=(
                    f"{'; '.join(check.changes)}: the commit {check.missing_text()}; "
                    f"add a trailer '{TRAILER_HINT}' naming one of them "
                    "(the Policy sets approval.requireOwnerApproval)"
                ),
                code=APPROVAL_CODE,
            )
        )
    return tuple(findings)


__all__ = [
    "APPROVAL_CODE",
    "TeamApproval",
    "approval_findings",
    "check_approvals",
    "describe_queue_change",
    "email_of",
    "owners_file",
]
