"""Owner approval, with git: the evidence for the one rule in `gitsched.policies.approval`.

The rule is pure; this module fetches what it judges: the base commit's OWNERS (and
keys), the commits a change consists of (for a merge, every commit it brings in),
their trailers, and their signatures as `git verify-commit` finds them against an
allowed-signers file built from OWNERS at the base. `plan` (what is still missing),
the reconcile loop (reject, or record the approvals in the log) and `audit verify
--repo` (check recorded signatures again) all come through here.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gitsched.engine.core import DesiredState
from gitsched.engine.events import ApprovalChecked
from gitsched.engine.model import CommitInfo, Job, Owner, Queue
from gitsched.engine.services import InferenceService, is_replica_key
from gitsched.engine.state import ClusterState
from gitsched.findings import Finding
from gitsched.policies.approval import (
    PLATFORM,
    JobSubmission,
    Signature,
    SignatureStatus,
    TeamApproval,
    Vouch,
    approval_findings,
    check_approvals,
    check_submitters,
    email_of,
    namespace_findings,
    platform_changes,
    submitter_findings,
    teams_of,
)
from gitsched.reconciler.git import (
    ChangeCommit,
    GitRepo,
    change_commits,
    merge_edits,
    tree_of,
    verify_commit,
)
from gitsched.reconciler.specs import LoadedSpecs, SpecCache, load_commit

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


def commits_of_change(repo: GitRepo, sha: str, base: str | None) -> list[ChangeCommit]:
    """The commits one commit on the branch stands for: every commit since `base`, the
    log's last applied commit (`SHA ^BASE`, every parent followed), so a change made by
    commits the reconciler rejected is still theirs; without a base, all of `sha`'s
    history. For a merge commit that is what it brings in, as GitHub and GitLab count
    the approvals of a merged pull request (and what a rejected commit before it left)."""
    if base is None:
        return change_commits(repo, sha)
    return change_commits(repo, sha, f"^{base}")


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


def approved_tree(repo: GitRepo, head: ChangeCommit, base: str | None) -> str:
    """The tree a signed approval on the branch must have for it to cover the whole change
    `head` ends: `head`'s own tree; for a two-parent merge whose first parent is `base`
    (nothing else comes in from the main line) and that makes no edits of its own
    (`git diff-tree --cc`), the merged branch's tip. An octopus merge brings in more than
    one branch, and `--cc` does not show what the third parent changed: only an approval
    of its own tree (or an owner's signed merge) covers it."""
    if not head.is_merge:
        return head.tree
    if len(head.parents) == 2 and head.parents[0] == base and not merge_edits(repo, head.sha):
        return tree_of(repo, head.parents[1])
    return head.tree


def vouches_of(
    repo: GitRepo,
    commits: Sequence[ChangeCommit],
    base_owners: Mapping[str, Sequence[Owner]],
    head: str,
    base: str | None = None,
) -> tuple[Vouch, ...]:
    """Every trailer and merge commit of a change whose last commit is `head`, from
    `base`; signatures checked when any owner has a key.

    A trailer's commit is *current* when its tree is the tree of everything the change
    brings in (`approved_tree`): a signature covers only its own commit's tree.
    """
    signers = allowed_signers(base_owners)
    last = next((c for c in commits if c.sha == head), None)
    final = approved_tree(repo, last, base) if last is not None else ""
    out: list[Vouch] = []
    for c in commits:
        if not c.approvers and not c.is_merge:
            continue
        signature = signature_of(repo, c.sha, signers) if signers else None
        current = c.sha == head or c.tree == final
        out.extend(Vouch(c.sha, "trailer", email_of(a), signature, current) for a in c.approvers)
        if c.is_merge:
            out.append(Vouch(c.sha, "merge", "", signature, c.sha == head))
    return tuple(out)


def team_approvals(
    repo: GitRepo,
    *,
    base: LoadedSpecs | None,
    base_queues: Mapping[str, Queue],
    head: LoadedSpecs,
    commits: Sequence[ChangeCommit],
    head_sha: str,
    base_sha: str | None = None,
    signed_required: bool,
    platform: Sequence[tuple[str, str]] = (),
) -> tuple[TeamApproval, ...]:
    """The rule for a change made of `commits` (the last `head_sha`), from `base` (its
    OWNERS; the commit `base_sha`) to `head`."""
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
            platform=platform,
            base_members=(base.members or {}) if base is not None else {},
            head_members=head.members or {},
        )

    checks = rule(())
    if all(c.unowned for c in checks):
        return checks  # nothing to approve, or bootstrap: no need to ask git for signatures
    return rule(vouches_of(repo, commits, base_owners, head_sha, base_sha))


@dataclass(frozen=True, slots=True)
class CommitApproval:
    """The approval rule's answer for one commit on the branch."""

    checks: tuple[TeamApproval, ...] = ()
    enforced: bool = False
    forbidden: tuple[Finding, ...] = ()  # refused whatever the Policy: a reserved namespace
    # work files (jobs, workspaces, services) from outside their team, judged when
    # approval.requireMemberForJobs is on
    submissions: tuple[JobSubmission, ...] = ()

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Why the commit must be rejected; () when it need not."""
        return (
            self.forbidden
            + (approval_findings(self.checks) if self.enforced else ())
            + submitter_findings(self.submissions)
        )

    @property
    def records(self) -> tuple[ApprovalChecked, ...]:
        """What the log keeps of it, so `audit` can judge the change again: one record a
        team, its queue's and its jobs' changes judged by the same approvals."""
        records = {c.team: ApprovalChecked(c.team, c.authors, c.approvals) for c in self.checks}
        for s in self.submissions:
            records.setdefault(s.team, ApprovalChecked(s.team, s.authors, s.approvals))
        return tuple(records[team] for team in sorted(records))


def changed_nodes(state: ClusterState, desired: DesiredState) -> tuple[str, ...]:
    """The nodes a commit registers, changes or removes: those `gitsched.engine.core.decide` emits
    an event for (a repo without inventory leaves the nodes to the live inventory)."""
    removed = sorted(set(state.nodes) - set(desired.nodes)) if desired.nodes else []
    changed = [n for n in sorted(desired.nodes) if state.nodes.get(n) != desired.nodes[n]]
    return (*removed, *changed)


def commit_platform_changes(
    state: ClusterState, desired: DesiredState
) -> tuple[tuple[str, str], ...]:
    """What a commit changes of the platform's own files, against the log's state."""
    return platform_changes(
        cluster_changed=state.cluster is not None and state.cluster != desired.cluster,
        policy_changed=state.policy != desired.policy,
        nodes_changed=changed_nodes(state, desired),
    )


def new_team_findings(state: ClusterState, desired: DesiredState) -> tuple[Finding, ...]:
    """The teams a commit creates may not take a namespace the platform keeps; the Policy
    at the base and the commit's own must both allow it, when they name a list."""
    new = teams_of(desired.queues, desired.owners) - teams_of(state.queues, state.owners)
    allowed: set[str] | None = None
    for policy in (state.policy, desired.policy):
        if policy.team_namespaces is not None:
            named = set(policy.team_namespaces)
            allowed = named if allowed is None else allowed & named
    return namespace_findings(new, None if allowed is None else sorted(allowed))


_JOB_SPEC = operator.attrgetter(
    *(f.name for f in dataclasses.fields(Job) if f.compare and f.name != "submitted_at")
)
# What a commit says of a service: all but when and in which event the log first saw it
# (what `gitsched.engine.core.decide` compares before it emits a ServiceChanged).
_SERVICE_SPEC = operator.attrgetter(
    *(
        f.name
        for f in dataclasses.fields(InferenceService)
        if f.name not in ("submitted_at", "submission")
    )
)


def changed_work_files(state: ClusterState, desired: DesiredState) -> dict[str, list[str]]:
    """Team -> the files of its work a commit adds, changes or removes: jobs, workspaces
    (one-replica jobs) and inference services, the ones `decide` submits, changes or
    withdraws. Every kind runs on its queue's quota, so the team is its queue's. A
    service's replicas are jobs of the log, not files: its service's file stands for them."""
    out: dict[str, list[str]] = {}

    def team_of(queue: str) -> str:
        found = desired.queues.get(queue) or state.queues.get(queue)
        return found.team if found is not None else queue

    for key, job in desired.jobs.items():
        if key in state.ended:
            continue  # its file stays a record of a job that ended: it runs nothing
        old = state.jobs.get(key)
        if old is None or _JOB_SPEC(old) != _JOB_SPEC(job):
            out.setdefault(team_of(job.queue), []).append(job.file)
    # (a job that ended is not in state.jobs: removing its file needs nobody)
    for key in set(state.jobs) - set(desired.jobs):
        if is_replica_key(key):
            continue  # a replica: its service's events add and remove it
        old = state.jobs[key]
        out.setdefault(team_of(old.queue), []).append(old.file)
    for key, service in desired.services.items():
        known = state.services.get(key)
        if known is None or _SERVICE_SPEC(known.service) != _SERVICE_SPEC(service):
            out.setdefault(team_of(service.queue), []).append(service.file)
    for key in set(state.services) - set(desired.services):
        gone = state.services[key].service
        out.setdefault(team_of(gone.queue), []).append(gone.file)
    return out


def job_submissions(
    repo: GitRepo,
    *,
    base: LoadedSpecs | None,
    job_files: Mapping[str, Sequence[str]],
    commits: Sequence[ChangeCommit],
    head_sha: str,
    base_sha: str | None,
    signed_required: bool,
) -> tuple[JobSubmission, ...]:
    """The membership rule for a change's work files (`changed_work_files`), with the
    base's MEMBERS and OWNERS."""
    base_owners = (base.owners or {}) if base is not None else {}
    base_members = (base.members or {}) if base is not None else {}

    def rule(vouches: Sequence[Vouch]) -> tuple[JobSubmission, ...]:
        return check_submitters(
            job_files=job_files,
            base_owners=base_owners,
            base_members=base_members,
            authors=change_authors(commits),
            vouches=vouches,
            signed_required=signed_required,
        )

    checks = rule(())
    if all(c.satisfied for c in checks):
        return checks
    return rule(vouches_of(repo, commits, base_owners, head_sha, base_sha))


def commit_approval(
    repo: GitRepo,
    state: ClusterState,
    commit: CommitInfo,
    loaded: LoadedSpecs,
    cache: SpecCache | None = None,
) -> CommitApproval:
    """The rule for a commit the reconciler is about to apply, from the log's last good one.

    It is enforced when the Policy in force (the log's) or the commit's own asks for it,
    so a commit can neither switch it off for itself nor dodge it while switching it on
    (a commit that weakens approval is judged by the rule it weakens); either way the
    approvals are recorded for the audit. A team named after a namespace the platform
    keeps is refused whatever the Policy says.
    """
    desired = loaded.desired
    if desired is None:
        return CommitApproval()
    forbidden = new_team_findings(state, desired)
    # With no platform owners in the log (bootstrap) there is nobody to ask for these.
    platform = commit_platform_changes(state, desired) if state.owners.get(PLATFORM) else ()
    policies = (state.policy, desired.policy)
    job_files = (
        changed_work_files(state, desired)
        if any(p.require_member_for_jobs for p in policies)
        else {}
    )
    governed = (
        platform
        or dict(state.queues) != dict(desired.queues)
        or dict(state.owners) != dict(desired.owners)
        or dict(state.members) != dict(desired.members)
    )
    if not governed and not job_files:
        # neither a queue, OWNERS, the platform's files nor any work changed: nothing to approve
        return CommitApproval(forbidden=forbidden)
    signed = any(p.require_signed_approval for p in policies)
    enforced = signed or any(p.require_owner_approval for p in policies)
    base_sha = state.last_good_commit.sha if state.last_good_commit is not None else None
    base = load_commit(repo, base_sha, cache=cache) if base_sha is not None else None
    commits = commits_of_change(repo, commit.sha, base_sha)
    checks = (
        team_approvals(
            repo,
            base=base,
            base_queues=state.queues,
            head=loaded,
            commits=commits,
            head_sha=commit.sha,
            base_sha=base_sha,
            signed_required=signed,
            platform=platform,
        )
        if governed
        else ()
    )
    submissions = job_submissions(
        repo,
        base=base,
        job_files=job_files,
        commits=commits,
        head_sha=commit.sha,
        base_sha=base_sha,
        signed_required=signed,
    )
    return CommitApproval(checks, enforced, forbidden, submissions)


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
