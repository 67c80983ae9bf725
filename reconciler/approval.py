"""Owner approval, with git: the evidence for the one rule in `policies.approval`.

The rule is pure; this module fetches what it judges: the base commit's OWNERS (and
keys), the commits a change consists of (for a merge, every commit it brings in),
their trailers, and their signatures as `git verify-commit` finds them against an
allowed-signers file built from OWNERS at the base. `plan` (what is still missing),
the reconcile loop (reject, or record the approvals in the log) and `audit verify
--repo` (check recorded signatures again) all come through here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.events import ApprovalChecked
from engine.model import CommitInfo, Owner, Queue
from engine.state import ClusterState
from findings import Finding
from policies.approval import (
    Signature,
    SignatureStatus,
    TeamApproval,
    Vouch,
    approval_findings,
    check_approvals,
    email_of,
)
from reconciler.git import (
    ChangeCommit,
    GitRepo,
    change_commits,
    merge_edits,
    tree_of,
    verify_commit,
)
from reconciler.specs import LoadedSpecs, SpecCache, load_commit

# ssh-keygen, through git: 'Good "git" signature for li@x with ED25519 key SHA256:...',
# or '... signature with ED25519 key SHA256:...' when the key is in no OWNERS.
_GOOD = re.compile(r'Good "git" signature (?:for .* )?with \S+ key (SHA256:[A-Za-z0-9+/=]+)')


def allowed_signers(owners: Mapping[str, Sequence[Owner]]) -> str:
    """git's allowed-signers file for every owner with a key, every team."""
    lines = {
        f"{o.email} {o.key}" for team in sorted(owners) for o in owners[team] if o.key and o.email
    }
    return "".join(f"{line}\n" for line in sorted(lines))


def signature_of(repo: GitRepo, sha: str, signers: str) -> Signature:
    """What git says of `sha`'s signature; whose key it is, the rule decides by fingerprint."""
    _, said = verify_commit(repo, sha, signers)
    good = _GOOD.search(said)
    if good is not None:
        return Signature(SignatureStatus.GOOD, good.group(1))
    if not said:
        return Signature(SignatureStatus.NONE)
    return Signature(SignatureStatus.BAD, detail=said.splitlines()[0][:200])


def commits_of_change(repo: GitRepo, sha: str) -> list[ChangeCommit]:
    """The commits one commit on the branch stands for: itself, or for a merge commit,
    itself and every commit it brings in (`SHA^1..SHA`), as GitHub and GitLab count
    the approvals of a merged pull request."""
    (commit,) = change_commits(repo, f"{sha}^!")
    if not commit.is_merge:
        return [commit]
    return change_commits(repo, sha, f"^{commit.parents[0]}")


def change_authors(commits: Sequence[ChangeCommit]) -> tuple[str, ...]:
    """Who wrote a change: the authors of its commits that change files. A merge commit's
    author merged it; an empty commit (one that only carries an approval) wrote nothing."""
    for chosen in (
        [c for c in commits if not c.is_merge and c.changes_files],
        [c for c in commits if not c.is_merge],
        list(commits),
    ):
        if chosen:
            return tuple(dict.fromkeys(c.author_email for c in chosen))
    return ()


def vouches_of(
    repo: GitRepo,
    commits: Sequence[ChangeCommit],
    base_owners: Mapping[str, Sequence[Owner]],
    head: str,
) -> tuple[Vouch, ...]:
    """Every trailer and merge commit of a change whose last commit is `head`; signatures
    checked when any owner has a key.

    A trailer's commit is *current* when its tree is what the change ends with: `head`'s
    own, or for a merge `head`, the merged branch's tip, with no edits in the merge itself.
    """
    signers = allowed_signers(base_owners)
    last = next((c for c in commits if c.sha == head), None)
    final, edited = "", False
    if last is not None and last.is_merge:
        final = tree_of(repo, last.parents[1])
        edited = any(c.approvers for c in commits if c.sha != head) and merge_edits(repo, head)
    elif last is not None:
        final = last.tree
    out: list[Vouch] = []
    for c in commits:
        if not c.approvers and not c.is_merge:
            continue
        signature = signature_of(repo, c.sha, signers) if signers else None
        current = c.sha == head or (c.tree == final and not edited)
        out.extend(Vouch(c.sha, "trailer", email_of(a), signature, current) for a in c.approvers)
        if c.is_merge:
            out.append(Vouch(c.sha, "merge", "", signature))
    return tuple(out)


def team_approvals(
    repo: GitRepo,
    *,
    base: LoadedSpecs | None,
    base_queues: Mapping[str, Queue],
    head: LoadedSpecs,
    commits: Sequence[ChangeCommit],
    head_sha: str,
    signed_required: bool,
) -> tuple[TeamApproval, ...]:
    """The rule for a change made of `commits` (the last `head_sha`), from `base` (its
    OWNERS) to `head`."""
    base_owners = (base.owners or {}) if base is not None else {}

    def rule(vouches: Sequence[Vouch]) -> tuple[TeamApproval, ...]:
        return check_approvals(
            base_queues=base_queues,
            head_queues=head.desired.queues if head.desired is not None else {},
            base_documents=base.documents if base is not None else (),
            head_documents=head.documents,
            base_owners=base_owners,
            head_owners=head.owners or {},
            authors=change_authors(commits),
            vouches=vouches,
            signed_required=signed_required,
        )

    checks = rule(())
    if all(c.unowned for c in checks):
        return checks  # nothing to approve, or bootstrap: no need to ask git for signatures
    return rule(vouches_of(repo, commits, base_owners, head_sha))


@dataclass(frozen=True, slots=True)
class CommitApproval:
    """The approval rule's answer for one commit on the branch."""

    checks: tuple[TeamApproval, ...] = ()
    enforced: bool = False

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Why the commit must be rejected; () when it need not."""
        return approval_findings(self.checks) if self.enforced else ()

    @property
    def records(self) -> tuple[ApprovalChecked, ...]:
        """What the log keeps of it, so `audit` can judge the change again."""
        return tuple(ApprovalChecked(c.team, c.authors, c.approvals) for c in self.checks)


def commit_approval(
    repo: GitRepo,
    state: ClusterState,
    commit: CommitInfo,
    loaded: LoadedSpecs,
    cache: SpecCache | None = None,
) -> CommitApproval:
    """The rule for a commit the reconciler is about to apply, from the log's last good one.

    It is enforced when the Policy in force (the log's) or the commit's own asks for it,
    so a commit can neither switch it off for itself nor dodge it while switching it on;
    either way the approvals are recorded for the audit.
    """
    desired = loaded.desired
    if desired is None:
        return CommitApproval()
    if dict(state.queues) == dict(desired.queues) and dict(state.owners) == dict(desired.owners):
        return CommitApproval()  # neither a queue nor OWNERS changed: nothing to approve
    policies = (state.policy, desired.policy)
    signed = any(p.require_signed_approval for p in policies)
    enforced = signed or any(p.require_owner_approval for p in policies)
    base_sha = state.last_good_commit.sha if state.last_good_commit is not None else None
    base = load_commit(repo, base_sha, cache=cache) if base_sha is not None else None
    checks = team_approvals(
        repo,
        base=base,
        base_queues=state.queues,
        head=loaded,
        commits=commits_of_change(repo, commit.sha),
        head_sha=commit.sha,
        signed_required=signed,
    )
    return CommitApproval(checks, enforced)


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """One signed approval the log records, asked of git again."""

    seq: int
    team: str
    approver: str
    commit: str
    fingerprint: str
    found: Signature

    @property
    def ok(self) -> bool:
        return (
            self.found.status is SignatureStatus.GOOD and self.found.fingerprint == self.fingerprint
        )


def recheck_signatures(
    repo: GitRepo, recorded: Iterable[tuple[int, ApprovalChecked]]
) -> list[SignatureCheck]:
    """For every approval the log says was signed: does the commit, in this repository,
    carry a valid signature by the key with the recorded fingerprint? (Whether that key
    was the approver's, listed at the base, `audit compliance` checks from the log.)"""
    checks: list[SignatureCheck] = []
    seen: dict[str, Signature] = {}
    for seq, event in recorded:
        for a in event.approvals:
            if not a.fingerprint:
                continue
            if a.commit not in seen:
                if repo.has_revision(a.commit):
                    seen[a.commit] = signature_of(repo, a.commit, "")
                else:
                    seen[a.commit] = Signature(
                        SignatureStatus.BAD, detail="the commit is not in this repository"
                    )
            checks.append(
                SignatureCheck(seq, event.team, a.approver, a.commit, a.fingerprint, seen[a.commit])
            )
    return checks
