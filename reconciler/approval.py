"""Owner approval, with git: the base commit's OWNERS against a change's queues and trailers.

The rule itself is `policies.approval` (pure); this module fetches what it needs from
the repository, for `plan` (what is still missing) and the reconcile loop (reject a
merged commit that lacks it when the Policy asks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.model import CommitInfo, Finding, Queue
from engine.state import ClusterState
from policies.approval import TeamApproval, approval_findings, check_approvals
from reconciler.git import GitRepo
from reconciler.specs import LoadedSpecs, SpecCache, load_commit


def team_approvals(
    *,
    base: LoadedSpecs | None,
    base_queues: Mapping[str, Queue],
    head: LoadedSpecs,
    approvers: Sequence[str],
    authors: Sequence[str],
) -> tuple[TeamApproval, ...]:
    head_queues = head.desired.queues if head.desired is not None else {}
    return check_approvals(
        base_queues=base_queues,
        head_queues=head_queues,
        base_documents=base.documents if base is not None else (),
        head_documents=head.documents,
        base_owners=(base.owners or {}) if base is not None else {},
        head_owners=head.owners or {},
        approvers=approvers,
        authors=authors,
    )


def missing_approvals(
    repo: GitRepo,
    state: ClusterState,
    commit: CommitInfo,
    loaded: LoadedSpecs,
    cache: SpecCache | None = None,
) -> tuple[Finding, ...]:
    """Why a valid commit must be rejected for want of an owner's approval; () when it need not.

    The rule applies when the Policy in force (the log's) or the commit's own asks for it,
    so a commit can neither switch it off for itself nor dodge it while switching it on.
    """
    desired = loaded.desired
    if desired is None:
        return ()
    if not (state.policy.require_owner_approval or desired.policy.require_owner_approval):
        return ()
    base_sha = state.last_good_commit.sha if state.last_good_commit is not None else None
    base = load_commit(repo, base_sha, cache=cache) if base_sha is not None else None
    checks = team_approvals(
        base=base,
        base_queues=state.queues,
        head=loaded,
        approvers=commit.approvers,
        authors=(commit.author_email,),
    )
    return approval_findings(checks)
