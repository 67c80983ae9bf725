"""Who must approve a change, and what counts as their approval: the one approval rule.

A team's queue (and its OWNERS) only moves with an owner's yes. Pure: the caller brings
the queues and OWNERS of the base and the head, who wrote the change, and the approvals
found for it (trailers, and signatures as git verified them). `plan`, the reconciler
and `audit compliance` all call `check_approvals`/`judge_team`, so they cannot disagree.
The rule in words is in docs/approvals.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

from gitsched.engine.model import Approval, FlavorQuota, Owner, Queue
from gitsched.engine.units import gpus_text
from gitsched.findings import Finding
from gitsched.policies.rules import place_of
from gitsched.schemas import Document

APPROVAL_CODE = "approval"
MEMBERSHIP_CODE = "membership"
TRAILER_HINT = "Approved-by: Name <e-mail>"
# How an OWNERS key line starts its key: the key types ssh-keygen writes and reads.
KEY_TYPE_PREFIXES = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-")

VIA_TRAILER, VIA_SIGNED_TRAILER, VIA_SIGNED_MERGE = "trailer", "signed-trailer", "signed-merge"


def email_of(person: str) -> str:
    """'Li Wei <li@nlp.example>' -> 'li@nlp.example'; a bare address is its own e-mail."""
    text = person.strip()
    if "<" in text and text.endswith(">"):
        text = text[text.rindex("<") + 1 : -1]
    return text.strip().lower()


# The platform owners: the OWNERS file at the repo's root, kept in the log like a team's
# OWNERS under this key (no team folder can be named "/").
PLATFORM = "/"
# Namespaces no team may take: Kubernetes' own and gitsched's (deploy/kustomization.yaml).
RESERVED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "gitsched-system")


def owners_file(team: str) -> str:
    return "OWNERS" if team == PLATFORM else f"teams/{team}/OWNERS"


def members_file(team: str) -> str:
    return f"teams/{team}/MEMBERS"


def team_label(team: str) -> str:
    return "the platform" if team == PLATFORM else f"team {team}"


def may_approve(team: str, owners: Mapping[str, Sequence[Owner | str]]) -> tuple[Owner, ...]:
    """Who may approve a change of `team`, from the OWNERS at the base: the team's owners
    and the platform owners (OWNERS at the repo root); for the platform, its owners."""
    listed = [_as_owner(o) for o in owners.get(team, ())]
    if team != PLATFORM:
        listed += [_as_owner(o) for o in owners.get(PLATFORM, ())]
    return tuple(dict.fromkeys(listed))


def key_fingerprint(key: str) -> str:
    """'ssh-ed25519 AAAA...' -> 'SHA256:...', as `ssh-keygen -l` prints it; '' if no key."""
    parts = key.split()
    if len(parts) < 2:
        return ""
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return ""
    if not blob:
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def parse_owners(text: str) -> tuple[tuple[Owner, ...], tuple[tuple[int, str], ...]]:
    """An OWNERS file -> its owners, and (line, message) for each line that is not one.

    A line is an e-mail ("li@nlp.example" or "Li Wei <li@nlp.example>"), optionally
    followed by the owner's public key in git's allowed-signers form:
    "li@nlp.example ssh-ed25519 AAAA... [comment]" (options such as namespaces="git"
    between the two are accepted and ignored). '#' starts a comment.
    """
    owners: list[Owner] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        at = next(
            (i for i, t in enumerate(tokens) if i > 0 and t.startswith(KEY_TYPE_PREFIXES)), None
        )
        if at is None:
            email = email_of(line)
            if "@" not in email or any(c in email for c in "*?,! <>"):
                # e.g. a Prow-style OWNERS ("approvers:", "- alice") at the root: gitsched's
                # OWNERS names e-mails, and a line that is none must not pass for an owner
                problems.append((number, f"{line!r} is not an e-mail: a line is 'e-mail [key]'"))
            else:
                owners.append(Owner(email))
            continue
        # allowed-signers options (namespaces="git", valid-after=...) sit before the key
        who = " ".join(t for t in tokens[:at] if "=" not in t)
        email = email_of(who)
        key = " ".join(tokens[at : at + 2])
        if "@" not in email or any(c in email for c in "*?,! "):
            problems.append(
                (number, f"{who!r} is not an e-mail: a key line is 'e-mail keytype key'")
            )
        elif not key_fingerprint(key):
            problems.append((number, f"the {tokens[at]} key of {email} is not a valid public key"))
        else:
            owners.append(Owner(email, key))
    return tuple(owners), tuple(problems)


def parse_members(text: str) -> tuple[tuple[str, ...], tuple[tuple[int, str], ...]]:
    """A MEMBERS file -> its members' e-mails, and (line, message) for each line that is
    not one. A line is an e-mail ("li@nlp.example" or "Li Wei <li@nlp.example>"); '#'
    starts a comment."""
    members: list[str] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        email = email_of(line)
        if "@" not in email or any(c in email for c in "*?,! <>"):
            problems.append((number, f"{line!r} is not an e-mail: a line is one member's e-mail"))
        else:
            members.append(email)
    return tuple(dict.fromkeys(members)), tuple(problems)


def _as_owner(owner: Owner | str) -> Owner:
    return owner if isinstance(owner, Owner) else Owner(email_of(owner))


class SignatureStatus(StrEnum):
    GOOD = "good"  # the signature verifies; whose key it is, the rule decides by fingerprint
    BAD = "bad"  # signed, but the signature does not verify (altered commit, broken key)
    NONE = "none"  # not signed


@dataclass(frozen=True, slots=True)
class Signature:
    """What git said of one commit's signature."""

    status: SignatureStatus
    fingerprint: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Vouch:
    """One claim that someone approved a change: a trailer, or a merge commit.

    `approver` is the e-mail a trailer names ("" for a merge: its signer approves);
    `signature` is the carrying commit's, as git verified it (None: not checked);
    `current` is False when the change goes on after the carrying commit (later
    commits, or a merge commit's own edits): a signature covers only its own tree.
    """

    commit: str
    via: str  # "trailer" | "merge"
    approver: str = ""
    signature: Signature | None = None
    current: bool = True


def trailer_vouches(approvers: Iterable[str], commit: str = "") -> tuple[Vouch, ...]:
    """Plain Approved-by/Reviewed-by trailers of `commit`, unverified."""
    return tuple(Vouch(commit, "trailer", email_of(a)) for a in approvers)


def recorded_vouches(approvals: Iterable[Approval]) -> tuple[Vouch, ...]:
    """The approvals the log recorded, as vouches the rule can judge again (audit).

    A recorded fingerprint stands for a signature git verified when the change was
    applied; the rule still checks it against the owners' keys at the base, and
    `audit verify --repo` can ask git again.
    """
    out: list[Vouch] = []
    for a in approvals:
        signature = Signature(SignatureStatus.GOOD, a.fingerprint) if a.fingerprint else None
        if a.via == VIA_SIGNED_MERGE:
            out.append(Vouch(a.commit, "merge", "", signature))
        else:
            out.append(Vouch(a.commit, "trailer", email_of(a.approver), signature))
    return tuple(out)


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
    approvals: tuple[Approval, ...] = ()  # the evidence that counted
    refused: tuple[str, ...] = ()  # why each other claim of approval did not count
    authors: tuple[str, ...] = ()  # e-mails of who wrote the change
    signed_required: bool = False
    team_owners: tuple[
        str, ...
    ] = ()  # the team's own OWNERS at the base (owners adds the platform's)

    @property
    def unowned(self) -> bool:
        """Bootstrap: the team has no OWNERS at the base, so nobody can be asked."""
        return not self.owners

    @property
    def satisfied(self) -> bool:
        return self.unowned or bool(self.approved_by)

    @property
    def eligible(self) -> tuple[str, ...]:
        """Owners whose approval would do: every owner but the change's authors."""
        return tuple(o for o in self.owners if o not in self.authors_among_owners)

    def missing_text(self) -> str:
        kind = "a signed approval" if self.signed_required else "an approval"
        platform = tuple(o for o in self.owners if o not in self.team_owners)
        where = owners_file(self.team) + (
            " or OWNERS at the repo root" if platform and self.team != PLATFORM else ""
        )
        if not self.eligible:
            return f"needs {kind}, and nobody may give it: {self._nobody_text()}" + (
                "; not counted: " + "; ".join(self.refused) if self.refused else ""
            )
        text = f"needs {kind} from one of {', '.join(self.eligible)} ({where} at the base commit)"
        if self.authors_among_owners:
            text += (
                f"; {', '.join(self.authors_among_owners)} wrote the change and cannot approve it"
            )
        if self.refused:
            text += "; not counted: " + "; ".join(self.refused)
        return text

    def _nobody_text(self) -> str:
        """Every owner who may approve wrote the change: say so, and what the team can do."""
        wrote = ", ".join(self.authors_among_owners)
        if self.team == PLATFORM:
            only = len(self.owners) == 1
            return (
                f"{wrote}, {'the only platform owner' if only else 'every platform owner'} "
                "(OWNERS at the repo root), wrote the change, and an author cannot approve "
                "their own change; add a second platform owner to OWNERS (a change another "
                "platform owner approves)"
            )
        only = len(self.team_owners) == 1
        text = (
            f"{wrote}, {'the only owner' if only else 'every owner'} of team {self.team} "
            f"({owners_file(self.team)}), wrote the change, and an author cannot approve "
            f"their own change; add a second owner to {owners_file(self.team)} (a change "
            f"someone else writes and {wrote} approves), or "
        )
        if self.owners == self.team_owners:
            return text + (
                "have the platform name its owners in OWNERS at the repo root, who may then "
                "approve any team's change"
            )
        return text + "ask a platform owner (OWNERS at the repo root) who did not write it"


@dataclass(frozen=True, slots=True)
class Judgement:
    approvals: tuple[Approval, ...]
    refused: tuple[str, ...]


def judge_team(
    team: str,
    owners: Sequence[Owner | str],
    *,
    authors: Iterable[str],
    vouches: Iterable[Vouch],
    signed_required: bool,
    all_owners: Mapping[str, Sequence[Owner | str]] | None = None,
) -> Judgement:
    """Which claims of approval count for a change to `team`, and why the others do not.

    `owners` are the team's OWNERS at the base. A trailer counts when it names an owner
    who did not write the change. With `signed_required`, it counts only on a commit
    signed by that owner's key as listed in `owners`; an owner's signed merge commit
    counts too (with or without the requirement). A key is matched by fingerprint, so
    a key added on the branch, or listed for another team, is not that owner's key.
    """
    listed = tuple(_as_owner(o) for o in owners)
    emails = {o.email for o in listed}
    key_owner = {key_fingerprint(o.key): o.email for o in listed if o.key}
    writers = {email_of(a) for a in authors}
    elsewhere: dict[str, str] = {}
    for other, people in sorted((all_owners or {}).items()):
        for o in map(_as_owner, people):
            if o.key and other != team:
                elsewhere.setdefault(key_fingerprint(o.key), f"{o.email} of team {other}")
    approvals: list[Approval] = []
    refused: list[str] = []

    def not_listed(fingerprint: str) -> str:
        whose = elsewhere.get(fingerprint)
        return f"key {fingerprint} is not listed for team {team} in {owners_file(team)}" + (
            f" at the base (it is the key of {whose})" if whose else " at the base"
        )

    for v in vouches:
        short = v.commit[:12] or "the commit"
        sig = v.signature
        good = sig is not None and sig.status is SignatureStatus.GOOD
        signer = key_owner.get(sig.fingerprint) if good and sig is not None else None
        if v.via == "merge":
            if not good or sig is None:
                continue  # an unsigned merge commit vouches for nothing
            if signer is None:
                refused.append(f"merge {short} is signed, but its {not_listed(sig.fingerprint)}")
            elif signer in writers:
                refused.append(
                    f"merge {short} is signed by the change's own author {signer}: "
                    "an author cannot approve their own change"
                )
            elif not v.current and signed_required:
                refused.append(
                    f"{signer}'s signed merge {short} is stale: the change goes on after it, "
                    "and a signature covers only its own commit"
                )
            else:
                approvals.append(Approval(signer, VIA_SIGNED_MERGE, v.commit, sig.fingerprint))
            continue
        named = email_of(v.approver)
        if named not in emails:
            refused.append(f"{named} (trailer on {short}) is not in {owners_file(team)}")
            continue
        if named in writers:
            if signer == named:
                refused.append(
                    f"{short} is signed by the change's own author {named}: "
                    "an author cannot approve their own change"
                )
            continue  # missing_text names the owners who wrote the change
        if signer == named and sig is not None and (v.current or not signed_required):
            approvals.append(Approval(named, VIA_SIGNED_TRAILER, v.commit, sig.fingerprint))
        elif signer == named:
            refused.append(
                f"{named}'s signed approval on {short} is stale: its tree is not the tree of "
                "everything the change brings in (later commits, the merge commit's own "
                "edits, commits from the main line the log has not applied, or another "
                "branch of an octopus merge), and a signature covers only its own commit; "
                "sign again at the end, or sign the merge"
            )
        elif not signed_required:
            approvals.append(Approval(named, VIA_TRAILER, v.commit))
        elif sig is None or sig.status is SignatureStatus.NONE:
            refused.append(
                f"the trailer naming {named} on {short} has no valid signature (unsigned commit)"
            )
        elif sig.status is SignatureStatus.BAD:
            refused.append(
                f"the trailer naming {named} on {short} has no valid signature"
                + (f" ({sig.detail})" if sig.detail else "")
            )
        elif signer is None:
            refused.append(
                f"the trailer naming {named} on {short} is signed, but its "
                + not_listed(sig.fingerprint)
            )
        else:
            refused.append(
                f"the trailer on {short} names {named}, but the commit is signed by {signer}'s key"
            )
    return Judgement(tuple(dict.fromkeys(approvals)), tuple(dict.fromkeys(refused)))


def _quota_text(fq: FlavorQuota | None) -> str:
    if fq is None:
        return "none"

    def gpus(milli: int | None) -> str:
        return "-" if milli is None else gpus_text(milli)

    return f"{gpus(fq.nominal)}/{gpus(fq.borrowing_limit)}/{gpus(fq.lending_limit)}"


def _limits_text(queue: Queue) -> str | None:
    """A queue's time limits as default/max minutes (docs/time.md); None when it has none."""
    limits = queue.time_limits
    if limits.default_minutes is None and limits.max_minutes is None:
        return None
    return f"default {limits.default_minutes or '-'}/max {limits.max_minutes or '-'} min"


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
        ("timeLimits", _limits_text(before), _limits_text(after)),
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


def touched_teams(
    *,
    base_queues: Mapping[str, Queue],
    head_queues: Mapping[str, Queue],
    base_documents: Sequence[Document] = (),
    head_documents: Sequence[Document] = (),
    base_owners: Mapping[str, Sequence[Owner | str]],
    head_owners: Mapping[str, Sequence[Owner | str]],
    base_members: Mapping[str, Sequence[str]] | None = None,
    head_members: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[tuple[str, str, int | None]]]:
    """Team -> (file, what changed, line) for each change to the team's queue or OWNERS.

    The team is the folder the queue file sits in (teams/<team>/queue.yaml, which the
    schema makes equal to the queue's `team`); documents only locate the line.
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
        old = tuple(_as_owner(o) for o in base_owners.get(team, ()))
        new = tuple(_as_owner(o) for o in head_owners.get(team, ()))
        if old != new:
            old_emails, new_emails = [o.email for o in old], [o.email for o in new]
            added = sorted(set(new_emails) - set(old_emails))
            removed = sorted(set(old_emails) - set(new_emails))
            rekeyed = sorted(
                {o.email for o in new if o.email in old_emails} - {o.email for o in old if o in new}
            )
            what = "; ".join(
                part
                for part in (
                    f"adds {', '.join(added)}" if added else "",
                    f"removes {', '.join(removed)}" if removed else "",
                    f"changes the key of {', '.join(rekeyed)}" if rekeyed else "",
                )
                if part
            )
            whose = "the platform's owners" if team == PLATFORM else "the team's owners"
            touched.setdefault(team, []).append(
                (owners_file(team), f"changes {whose}: {what or 'reorders them'}", None)
            )
    old_members, new_members = base_members or {}, head_members or {}
    for team in sorted(set(old_members) | set(new_members)):
        had = {email_of(m) for m in old_members.get(team, ())}
        has = {email_of(m) for m in new_members.get(team, ())}
        if had != has:
            what = "; ".join(
                part
                for part in (
                    f"adds {', '.join(sorted(has - had))}" if has - had else "",
                    f"removes {', '.join(sorted(had - has))}" if had - has else "",
                )
                if part
            )
            touched.setdefault(team, []).append(
                (members_file(team), f"changes the team's members: {what}", None)
            )
    return touched


def check_approvals(
    *,
    base_queues: Mapping[str, Queue],
    head_queues: Mapping[str, Queue],
    base_documents: Sequence[Document] = (),
    head_documents: Sequence[Document] = (),
    base_owners: Mapping[str, Sequence[Owner | str]],
    head_owners: Mapping[str, Sequence[Owner | str]],
    authors: Sequence[str],
    approvers: Sequence[str] = (),
    vouches: Sequence[Vouch] = (),
    signed_required: bool = False,
    platform: Sequence[tuple[str, str]] = (),
    base_members: Mapping[str, Sequence[str]] | None = None,
    head_members: Mapping[str, Sequence[str]] | None = None,
) -> tuple[TeamApproval, ...]:
    """One TeamApproval for each team whose queue or OWNERS the change touches.

    The owners are the team's OWNERS *at the base*: a change cannot approve itself by
    editing OWNERS, nor sign with a key it adds. Approvers and authors are matched by
    e-mail, case-insensitively; an author never counts as an approver of their own
    change. A team without OWNERS at the base has nobody to ask (bootstrap: the commit
    that creates a team's queue and OWNERS), so its changes need no approval.
    `approvers` are plain trailers (unverified); `vouches` carry where they come from.

    The platform owners (OWNERS at the repo root, under `PLATFORM`) may approve any
    team's change, and a team with no OWNERS is theirs (so creating a team needs them).
    `platform` (from `platform_changes`), a change of the root OWNERS and the removal
    of a team are the platform's own changes, judged as a team `PLATFORM`.
    """
    touched = touched_teams(
        base_queues=base_queues,
        head_queues=head_queues,
        base_documents=base_documents,
        head_documents=head_documents,
        base_owners=base_owners,
        head_owners=head_owners,
        base_members=base_members,
        head_members=head_members,
    )
    touched = {team: list(entries) for team, entries in touched.items()}
    if not base_owners.get(PLATFORM):
        # No platform owners at the base (bootstrap): nobody to ask, nothing to record.
        platform = ()
    for file, what in platform:
        touched.setdefault(PLATFORM, []).append((file, what, None))
    removed = teams_of(base_queues, base_owners) - teams_of(head_queues, head_owners)
    for team in sorted(removed if base_owners.get(PLATFORM) else ()):
        touched.setdefault(PLATFORM, []).append((f"teams/{team}/", f"removes team {team}", None))
    claims = (*trailer_vouches(approvers), *vouches)
    writing = tuple(dict.fromkeys(email_of(a) for a in authors))
    out: list[TeamApproval] = []
    for team in sorted(touched):
        listed = may_approve(team, base_owners)
        owners = tuple(dict.fromkeys(o.email for o in listed))
        team_owners = tuple(dict.fromkeys(_as_owner(o).email for o in base_owners.get(team, ())))
        entries = touched[team]
        verdict = judge_team(
            team,
            listed,
            authors=writing,
            vouches=claims,
            signed_required=signed_required,
            all_owners=base_owners,
        )
        out.append(
            TeamApproval(
                team=team,
                files=tuple(dict.fromkeys(f for f, _, _ in entries)),
                changes=tuple(c for _, c, _ in entries),
                owners=owners,
                approved_by=tuple(dict.fromkeys(a.approver for a in verdict.approvals)),
                authors_among_owners=tuple(o for o in owners if o in writing),
                line=next((line for _, _, line in entries if line is not None), None),
                approvals=verdict.approvals,
                refused=verdict.refused,
                authors=writing,
                signed_required=signed_required,
                team_owners=team_owners,
            )
        )
    return tuple(out)


def teams_of(queues: Mapping[str, Queue], owners: Mapping[str, Sequence[Owner | str]]) -> set[str]:
    """The teams that exist: those with a queue or an OWNERS file (not the platform)."""
    return ({q.team for q in queues.values()} | set(owners)) - {PLATFORM}


def platform_changes(
    *,
    cluster_changed: bool,
    policy_changed: bool,
    nodes_changed: Iterable[str],
) -> tuple[tuple[str, str], ...]:
    """(file, what) for each change of the platform's own files the platform owners
    approve: cluster.yaml, inventory/ and policies/ (OWNERS at the root and the removal
    of a team are found by `check_approvals`). Judged on what the commit changes in the
    cluster, not on its bytes, so the reconciler and `audit compliance` see the same."""
    out: list[tuple[str, str]] = []
    if cluster_changed:
        out.append(("cluster.yaml", "changes the cluster"))
    nodes = sorted(set(nodes_changed))
    if nodes:
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        out.append(("inventory/", f"changes nodes {shown}"))
    if policy_changed:
        out.append(("policies/", "changes the Policy"))
    return tuple(out)


def namespace_findings(teams: Iterable[str], allowed: Sequence[str] | None) -> tuple[Finding, ...]:
    """A team is a namespace its pods run in: never Kubernetes' or gitsched's own, and one
    of the Policy's `approval.teamNamespaces` when the Policy names them."""
    findings: list[Finding] = []
    for team in sorted(set(teams)):
        why = ""
        if team in RESERVED_NAMESPACES or team.startswith("kube-"):
            why = (
                f"team {team} would run its pods in namespace {team}, which belongs to "
                f"{'gitsched' if team == 'gitsched-system' else 'Kubernetes'}; no team may "
                "take it"
            )
        elif allowed is not None and team not in allowed:
            why = (
                f"team {team} is not one of the namespaces the Policy allows teams "
                f"(approval.teamNamespaces: {', '.join(allowed) or 'none'})"
            )
        if why:
            findings.append(Finding(f"teams/{team}/", None, None, "$", why, "namespace"))
    return tuple(findings)


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
                    + (
                        "an owner signs the merge commit, or signs a commit carrying "
                        f"'{TRAILER_HINT}' naming them (the Policy sets "
                        "approval.requireSignedApproval)"
                        if check.signed_required
                        else f"add a trailer '{TRAILER_HINT}' naming one of them "
                        "(the Policy sets approval.requireOwnerApproval)"
                    )
                ),
                code=APPROVAL_CODE,
            )
        )
    return tuple(findings)


@dataclass(frozen=True, slots=True)
class JobSubmission:
    """Who changed a team's work files, and whether they may (approval.requireMemberForJobs).

    A job, workspace or inference service under teams/<team>/ runs on that team's quota:
    only a member or owner of the team at the base writes it, unless an owner (or a
    platform owner) approves. One rule for every kind of work a team owns.
    """

    team: str
    files: tuple[str, ...]
    allowed: tuple[str, ...]  # members and owners of the team at the base
    outsiders: tuple[str, ...]  # the change's authors who are neither
    owners: tuple[str, ...]  # who may approve: the team's owners and the platform's
    authors: tuple[str, ...] = ()
    approvals: tuple[Approval, ...] = ()
    refused: tuple[str, ...] = ()
    signed_required: bool = False

    @property
    def open_team(self) -> bool:
        """Bootstrap: the team names no member or owner at the base; anyone submits."""
        return not self.allowed

    @property
    def satisfied(self) -> bool:
        return self.open_team or not self.outsiders or bool(self.approvals)

    def missing_text(self) -> str:
        people = ", ".join(self.outsiders)
        shown = ", ".join(self.files[:3]) + (
            f" and {len(self.files) - 3} more" if len(self.files) > 3 else ""
        )
        eligible = ", ".join(o for o in self.owners if o not in self.authors) or "nobody"
        kind = "a signed approval" if self.signed_required else "an approval"
        text = (
            f"{people} {'is' if len(self.outsiders) == 1 else 'are'} not a member or owner of "
            f"team {self.team} ({members_file(self.team)} and {owners_file(self.team)} at the "
            f"base commit) and may not add, change or remove its work ({shown}): it runs on "
            f"team {self.team}'s quota; a member or owner of team {self.team} commits it, "
            f"or the change needs {kind} from one of {eligible}"
        )
        if self.refused:
            text += "; not counted: " + "; ".join(self.refused)
        return text


def check_submitters(
    *,
    job_files: Mapping[str, Sequence[str]],
    base_owners: Mapping[str, Sequence[Owner | str]],
    base_members: Mapping[str, Sequence[str]],
    authors: Sequence[str],
    vouches: Sequence[Vouch] = (),
    signed_required: bool = False,
) -> tuple[JobSubmission, ...]:
    """One JobSubmission for each team whose work files (`job_files`: team -> files of
    its jobs, workspaces and services) the change adds, changes or removes. Members and owners are those at the base; an
    approval is judged by `judge_team`, as for a change of the team's queue."""
    writing = tuple(dict.fromkeys(email_of(a) for a in authors))
    out: list[JobSubmission] = []
    for team in sorted(job_files):
        team_owners = [_as_owner(o).email for o in base_owners.get(team, ())]
        allowed = tuple(dict.fromkeys([*map(email_of, base_members.get(team, ())), *team_owners]))
        listed = may_approve(team, base_owners)
        outsiders = tuple(a for a in writing if a not in allowed)
        verdict = (
            judge_team(
                team,
                listed,
                authors=writing,
                vouches=vouches,
                signed_required=signed_required,
                all_owners=base_owners,
            )
            if outsiders and allowed
            else Judgement((), ())
        )
        out.append(
            JobSubmission(
                team=team,
                files=tuple(sorted(set(job_files[team]))),
                allowed=allowed,
                outsiders=outsiders,
                owners=tuple(dict.fromkeys(o.email for o in listed)),
                authors=writing,
                approvals=verdict.approvals,
                refused=verdict.refused,
                signed_required=signed_required,
            )
        )
    return tuple(out)


def submitter_findings(checks: Iterable[JobSubmission]) -> tuple[Finding, ...]:
    """The errors of a commit whose work files come from outside their team: one per team."""
    return tuple(
        Finding(
            file=check.files[0],
            line=None,
            column=None,
            path="$",
            message=f"{check.missing_text()} (the Policy sets approval.requireMemberForJobs)",
            code=MEMBERSHIP_CODE,
        )
        for check in checks
        if not check.satisfied
    )


__all__ = [
    "APPROVAL_CODE",
    "MEMBERSHIP_CODE",
    "PLATFORM",
    "JobSubmission",
    "Judgement",
    "Signature",
    "SignatureStatus",
    "TeamApproval",
    "Vouch",
    "approval_findings",
    "check_approvals",
    "check_submitters",
    "describe_queue_change",
    "email_of",
    "judge_team",
    "key_fingerprint",
    "may_approve",
    "members_file",
    "namespace_findings",
    "owners_file",
    "parse_members",
    "parse_owners",
    "platform_changes",
    "recorded_vouches",
    "submitter_findings",
    "team_label",
    "teams_of",
    "touched_teams",
    "trailer_vouches",
]
