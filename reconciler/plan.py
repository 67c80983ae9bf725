"""`plan`: what merging a branch would do to the cluster, computed without touching it.

The plan starts from what the cluster really runs (the log, folded), applies the head's
specs exactly as the reconciler would (`decide`, then the Policy's solver) and compares:
quotas and policy before -> after, jobs admitted, moved, preempted or left pending, GPUs
and fair share per queue, and the owner approvals still missing. It reads the log and
git and appends nothing.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from engine import events as ev
from engine.core import ApplyCommit, ApplyPlan, decide, decision_time, placement_instance
from engine.errors import UsageError
from engine.model import GPU_MILLI, CommitInfo, Placement, Policy, Queue
from engine.placement.plan import OutcomeStatus, PlacementPlan, SolveStats
from engine.placement.solvers import solve
from engine.state import ClusterState, evolve, fold
from eventlog.base import EventLog
from eventlog.codec import decode
from policies.approval import TeamApproval
from reconciler.approval import team_approvals
from reconciler.git import GitRepo, change_commits
from reconciler.plan_fairness import FairShareView, fair_share_view
from reconciler.specs import LoadedSpecs, load_commit
from schemas import SpecError

# Policy fields as the Policy YAML spells them, so a reviewer can find the line.
POLICY_FIELD_NAMES = {
    "solver": "solver.name",
    "time_limit_s": "solver.timeLimitSeconds",
    "gap_tolerance": "solver.gapTolerance",
    "priority_weight": "objective.priorityWeight",
    "move_cost": "objective.moveCost",
    "preemption_cost": "objective.preemptionCost",
    "fragmentation_weight": "objective.fragmentationWeight",
    "fairness_weight": "objective.fairnessWeight",
    "compactness_weight": "objective.compactnessWeight",
    "preemption_enabled": "preemption.enabled",
    "preempt_within_queue": "preemption.withinQueue",
    "reclaim_within_cohort": "preemption.reclaimWithinCohort",
    "require_owner_approval": "approval.requireOwnerApproval",
    "require_signed_approval": "approval.requireSignedApproval",
    "usage_half_life_hours": "fairness.usageHalfLifeHours",
}
IDLE_FIELD_NAMES = {
    "enabled": "idle.enabled",
    "threshold_percent": "idle.thresholdPercent",
    "window_minutes": "idle.windowMinutes",
    "grace_minutes": "idle.graceMinutes",
    "exempt_priority_classes": "idle.exemptPriorityClasses",
    "exempt_queues": "idle.exemptQueues",
    "action": "idle.action",
}


class Baseline(StrEnum):
    """Where the plan's "before" comes from."""

    LOG = "log"  # the cluster now: BASE is the log's last applied commit
    LOG_AT_BASE = "log-at-base"  # the log replayed to where it applied BASE (stale)
    SIMULATED = "simulated"  # BASE never applied: applied to the log's state here (stale)
    FRESH = "fresh"  # no log at all: BASE solved from an empty cluster


class Action(StrEnum):
    ADMITTED = "admitted"
    MOVED = "moved"
    PREEMPTED = "preempted"
    WITHDRAWN = "withdrawn"
    NEWLY_PENDING = "newly pending"
    STILL_PENDING = "still pending"


@dataclass(frozen=True, slots=True)
class Revision:
    rev: str
    sha: str
    subject: str = ""

    @property
    def short(self) -> str:
        return self.sha[:12]


@dataclass(frozen=True, slots=True)
class SpecChange:
    kind: str  # cluster | node | queue | job
    name: str
    action: str  # added | changed | removed | submitted | withdrawn | state
    detail: str = ""


@dataclass(frozen=True, slots=True)
class QueueChange:
    queue: str
    before: Queue | None
    after: Queue | None

    @property
    def status(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed"

    @property
    def flavors(self) -> tuple[str, ...]:
        quotas = (
            *(self.before.quotas if self.before else ()),
            *(self.after.quotas if self.after else ()),
        )
        return tuple(sorted({q.flavor for q in quotas}))


@dataclass(frozen=True, slots=True)
class FieldChange:
    field: str
    before: object
    after: object


@dataclass(frozen=True, slots=True)
class JobEffect:
    job: str
    action: Action
    reason: str = ""
    flavor: str | None = None
    gpu_milli: int = 0
    nodes_before: tuple[str, ...] = ()
    nodes_after: tuple[str, ...] = ()
    lost_gpu_seconds: float = 0.0
    preempted_by: str | None = None
    previous_reason: str = ""
    rule: str = ""  # what allowed a preemption (engine.placement.preemption.Rule)


@dataclass(frozen=True, slots=True)
class QueueUsage:
    queue: str
    weight_before: float | None
    weight_after: float | None
    gpu_before: int
    gpu_after: int
    share_before: float | None  # dominant GPU share / weight; None when the queue is absent
    share_after: float | None


@dataclass(frozen=True, slots=True)
class PullRequestPlan:
    base: Revision
    head: Revision
    baseline: Baseline
    applied: Revision | None  # the log's last applied commit
    log_seq: int
    stale: str | None = None
    notes: tuple[str, ...] = ()
    errors: tuple[SpecError, ...] = ()
    warnings: tuple[SpecError, ...] = ()  # HEAD is valid, but some of it can never run
    spec_changes: tuple[SpecChange, ...] = ()
    queue_changes: tuple[QueueChange, ...] = ()
    policy_changes: tuple[FieldChange, ...] = ()
    effects: tuple[JobEffect, ...] = ()
    kept: int = 0
    usage: tuple[QueueUsage, ...] = ()
    solve: SolveStats | None = None
    approvals: tuple[TeamApproval, ...] = ()
    approval_enforced: bool = False
    commits: tuple[CommitInfo, ...] = field(default=())
    # fair share over time and idle jobs after the change (reconciler/plan_fairness.py)
    fairness: FairShareView | None = None

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> bool:
        return bool(self.spec_changes or self.policy_changes or self.approvals)

    def of(self, action: Action) -> tuple[JobEffect, ...]:
        return tuple(e for e in self.effects if e.action is action)

    @property
    def missing_approvals(self) -> tuple[TeamApproval, ...]:
        return tuple(a for a in self.approvals if not a.satisfied)


def parse_range(text: str) -> tuple[str | None, str]:
    """'BASE..HEAD' -> (BASE, HEAD); '..HEAD' or 'HEAD' -> (None, HEAD): BASE from the log."""
    if "..." in text:
        raise UsageError(
            f"{text!r}: use BASE..HEAD (two dots); BASE is the cluster's state, HEAD the branch"
        )
    base, sep, head = text.partition("..")
    if not sep:
        base, head = "", text
    if not head:
        raise UsageError(f"{text!r} names no HEAD: use BASE..HEAD, e.g. main..my-branch")
    return (base or None), head


# -- the log -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LogView:
    current: ClusterState
    last_seq: int
    at_base: ClusterState | None  # right after the last event the base commit caused


def _read_log(event_log: EventLog | None, base_sha: str | None) -> _LogView:
    state = ClusterState()
    last_seq = 0
    at_base: ClusterState | None = None
    if event_log is None:
        return _LogView(state, 0, None)
    for stored in event_log.read(0):
        state = evolve(state, decode(stored))
        last_seq = stored.seq
        if base_sha is not None and stored.cause == base_sha:
            at_base = state
    return _LogView(state, last_seq, at_base)


def _commit_info(repo: GitRepo, sha: str) -> CommitInfo:
    commits = repo.commits(f"{sha}^!")
    if not commits:
        raise UsageError(f"cannot read commit {sha[:12]}")
    return commits[-1]


def _settle(state: ClusterState, cause: CommitInfo) -> ClusterState:
    """Run the solve a reconciler would run after `state`'s last commit, if one is owed,
    at that commit's time (as the reconciler does)."""
    if not state.needs_placement or state.cluster is None:
        return state
    now = decision_time(cause)
    plan = solve(placement_instance(state, now))
    return fold(decide(state, ApplyPlan(plan, solve_id=f"{cause.sha}/plan", at=now)), state)


def _simulate(state: ClusterState, commit: CommitInfo, loaded: LoadedSpecs) -> ClusterState:
    if loaded.desired is None:
        return state
    state = fold(decide(state, ApplyCommit(commit, loaded.desired)), state)
    return _settle(state, commit)


# -- the plan ------------------------------------------------------------------------------


def plan_change(
    repo: GitRepo,
    event_log: EventLog | None,
    base_rev: str | None,
    head_rev: str,
    *,
    log_name: str = "the log",
) -> PullRequestPlan:
    """What applying HEAD would do, starting from the cluster as it is at BASE."""
    head_sha = repo.resolve(head_rev)
    base_sha = repo.resolve(base_rev) if base_rev is not None else None
    view = _read_log(event_log, base_sha)
    applied_info = view.current.last_good_commit
    applied = Revision("applied", applied_info.sha, applied_info.subject) if applied_info else None
    if base_sha is None:
        if applied is None:
            raise UsageError(
                f"{log_name} has no applied commit to start from: name the base, as BASE..HEAD"
            )
        base_sha = applied.sha
        base_rev = applied.sha[:12]
    assert base_rev is not None
    base_info = _commit_info(repo, base_sha)
    base = Revision(base_rev, base_sha, base_info.subject)
    head_info = _commit_info(repo, head_sha)
    head = Revision(head_rev, head_sha, head_info.subject)
    base_loaded = load_commit(repo, base_sha)

    notes: list[str] = []
    stale: str | None = None
    newest = view.current.last_commit
    if applied is not None and base_sha == applied.sha:
        baseline, before = Baseline.LOG, _settle(view.current, base_info)
    elif applied is not None and newest is not None and base_sha == newest.sha:
        # The log's newest commit was rejected: the cluster still runs the last good one.
        baseline, before = Baseline.LOG, _settle(view.current, base_info)
        notes.append(
            f"base {base.short} was rejected by the reconciler; the cluster runs "
            f"{applied.short} ({applied.subject}), the last commit it applied"
        )
    elif applied is not None and view.at_base is not None:
        baseline, before = Baseline.LOG_AT_BASE, _settle(view.at_base, base_info)
        stale = (
            f"base {base.short} is not the cluster's current commit: {log_name} has applied "
            f"{applied.short} ({applied.subject}) since. This plan starts from the placements "
            f"the log recorded at {base.short}; rebase the branch, or plan against "
            f"{applied.short}, to see the effect on the cluster as it is."
        )
    elif applied is not None:
        baseline = Baseline.SIMULATED
        before = _simulate(view.current, base_info, base_loaded)
        stale = (
            f"base {base.short} has not been applied to the cluster: {log_name}'s last applied "
            f"commit is {applied.short} ({applied.subject}). The placements at {base.short} "
            "are simulated by applying it to the cluster's current state."
        )
    else:
        baseline = Baseline.FRESH
        before = _simulate(ClusterState(), base_info, base_loaded)
        notes.append(
            f"{log_name} is empty or absent: the placements before are a fresh solve of "
            f"{base.short}, not what the cluster runs"
        )
    if base_loaded.desired is None and baseline is not Baseline.LOG:
        notes.append(
            f"base {base.short} is itself invalid ({len(base_loaded.errors)} error(s)); "
            "the state before is the last valid one"
        )

    commits = tuple(repo.commits(f"{base_sha}..{head_sha}")) if base_sha != head_sha else ()
    skeleton = PullRequestPlan(
        base=base,
        head=head,
        baseline=baseline,
        applied=applied,
        log_seq=view.last_seq,
        stale=stale,
        notes=tuple(notes),
        commits=commits,
    )
    head_loaded = load_commit(repo, head_sha)
    if head_loaded.desired is None:
        return dataclasses.replace(skeleton, errors=head_loaded.errors)
    desired = head_loaded.desired

    events = decide(before, ApplyCommit(head_info, desired))
    after = fold(events, before)
    plan = (
        solve(placement_instance(after, decision_time(head_info)))
        if after.needs_placement
        else None
    )
    effects, kept = _effects(before, after, plan)
    after_placements = plan.placements() if plan is not None else dict(after.placements)

    # The change as one merge of HEAD into BASE: every commit in BASE..HEAD (the rule a
    # merge commit meets in the reconciler); HEAD itself when BASE is HEAD.
    signed = before.policy.require_signed_approval or desired.policy.require_signed_approval
    approvals = team_approvals(
        repo,
        base=base_loaded,
        base_queues=before.queues,
        head=head_loaded,
        commits=change_commits(repo, head_sha, f"^{base_sha}")
        if base_sha != head_sha
        else change_commits(repo, f"{head_sha}^!"),
        head_sha=head_sha,
        signed_required=signed,
    )
    return dataclasses.replace(
        skeleton,
        warnings=head_loaded.warnings,
        spec_changes=tuple(_spec_changes(before, events)),
        queue_changes=tuple(
            QueueChange(name, before.queues.get(name), after.queues.get(name))
            for name in sorted(set(before.queues) | set(after.queues))
            if before.queues.get(name) != after.queues.get(name)
        ),
        policy_changes=_policy_changes(before.policy, after.policy),
        effects=effects,
        kept=kept,
        usage=_usage(before, after, after_placements),
        solve=plan.stats if plan is not None else None,
        approvals=approvals,
        approval_enforced=signed
        or before.policy.require_owner_approval
        or desired.policy.require_owner_approval,
        fairness=fair_share_view(after, decision_time(head_info)),
    )


def _spec_changes(before: ClusterState, events: Iterable[ev.Event]) -> list[SpecChange]:
    out: list[SpecChange] = []
    for e in events:
        if isinstance(e, ev.ClusterConfigured):
            out.append(SpecChange("cluster", e.cluster.name, "changed"))
        elif isinstance(e, ev.NodeRegistered):
            known = e.node.name in before.nodes
            out.append(SpecChange("node", e.node.name, "changed" if known else "added"))
        elif isinstance(e, ev.NodeRemoved):
            out.append(SpecChange("node", e.node, "removed"))
        elif isinstance(e, ev.NodeStateChanged):
            out.append(SpecChange("node", e.node, "state", f"-> {e.state}"))
        elif isinstance(e, ev.QueueConfigured):
            known = e.queue.name in before.queues
            out.append(SpecChange("queue", e.queue.name, "changed" if known else "added"))
        elif isinstance(e, ev.QueueRemoved):
            out.append(SpecChange("queue", e.queue, "removed"))
        elif isinstance(e, ev.JobSubmitted):
            out.append(SpecChange("job", e.job.key, "submitted", e.job.file))
        elif isinstance(e, ev.JobChanged):
            out.append(SpecChange("job", e.job.key, "changed", ", ".join(e.fields)))
        elif isinstance(e, ev.JobWithdrawn):
            out.append(SpecChange("job", e.job, "withdrawn"))
        elif isinstance(e, ev.PolicyChanged):
            out.append(SpecChange("policy", "policy", "changed"))
    return out


def _policy_changes(before: Policy, after: Policy) -> tuple[FieldChange, ...]:
    changes = [
        FieldChange(
            POLICY_FIELD_NAMES.get(f.name, f.name), getattr(before, f.name), getattr(after, f.name)
        )
        for f in dataclasses.fields(Policy)
        if f.name != "idle" and getattr(before, f.name) != getattr(after, f.name)
    ]
    changes.extend(
        FieldChange(
            IDLE_FIELD_NAMES[f.name], getattr(before.idle, f.name), getattr(after.idle, f.name)
        )
        for f in dataclasses.fields(type(before.idle))
        if getattr(before.idle, f.name) != getattr(after.idle, f.name)
    )
    return tuple(changes)


def _effects(
    before: ClusterState, after: ClusterState, plan: PlacementPlan | None
) -> tuple[tuple[JobEffect, ...], int]:
    effects: list[JobEffect] = []
    for key in sorted(set(before.jobs) - set(after.jobs)):
        was = before.placements.get(key)
        effects.append(
            JobEffect(
                key,
                Action.WITHDRAWN,
                reason="withdrawn by the change" + (": it stops" if was else " (was not running)"),
                flavor=was.flavor if was else None,
                gpu_milli=was.gpu_milli if was else 0,
                nodes_before=was.nodes if was else (),
            )
        )
    if plan is None:
        for key in sorted(after.pending):
            effects.append(JobEffect(key, Action.STILL_PENDING, after.pending[key].reason))
        return tuple(effects), len(after.placements)
    kept = 0
    for o in plan.outcomes:
        was = before.placements.get(o.job)
        nodes_after = tuple(sorted({r.node for r in o.replicas}))
        gpu = sum(r.gpu_milli * len(r.gpus) for r in o.replicas)
        if o.status is OutcomeStatus.KEPT:
            kept += 1
        elif o.status is OutcomeStatus.PLACED:
            effects.append(
                JobEffect(o.job, Action.ADMITTED, o.reason, o.flavor, gpu, (), nodes_after)
            )
        elif o.status is OutcomeStatus.MOVED:
            effects.append(
                JobEffect(
                    o.job,
                    Action.MOVED,
                    o.reason,
                    o.flavor,
                    gpu,
                    was.nodes if was else (),
                    nodes_after,
                )
            )
        elif o.status is OutcomeStatus.PREEMPTED:
            effects.append(
                JobEffect(
                    o.job,
                    Action.PREEMPTED,
                    o.reason,
                    was.flavor if was else None,
                    was.gpu_milli if was else 0,
                    was.nodes if was else (),
                    (),
                    o.lost_gpu_seconds,
                    o.preempted_by,
                    rule=o.rule,
                )
            )
        else:
            known = o.job in before.jobs
            old = before.pending.get(o.job)
            previous = old.reason if old is not None and old.reason != o.reason else ""
            effects.append(
                JobEffect(
                    o.job,
                    Action.STILL_PENDING if known else Action.NEWLY_PENDING,
                    o.reason,
                    previous_reason=previous,
                )
            )
    return tuple(effects), kept


def _usage(
    before: ClusterState, after: ClusterState, after_placements: Mapping[str, Placement]
) -> tuple[QueueUsage, ...]:
    used_before = _per_queue(before, before.placements)
    used_after = _per_queue(after, after_placements)
    out = []
    for name in sorted(set(before.queues) | set(after.queues)):
        qb, qa = before.queues.get(name), after.queues.get(name)
        out.append(
            QueueUsage(
                queue=name,
                weight_before=qb.weight if qb else None,
                weight_after=qa.weight if qa else None,
                gpu_before=sum(used_before.get(name, {}).values()),
                gpu_after=sum(used_after.get(name, {}).values()),
                share_before=_share(qb, used_before.get(name, {}), before) if qb else None,
                share_after=_share(qa, used_after.get(name, {}), after) if qa else None,
            )
        )
    return tuple(out)


def _per_queue(
    state: ClusterState, placements: Mapping[str, Placement]
) -> dict[str, dict[str, int]]:
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for key, p in placements.items():
        job = state.jobs.get(key)
        if job is None or p.flavor is None:
            continue
        used[job.queue][p.flavor] += p.gpu_milli
    return used


def _share(queue: Queue, used: Mapping[str, int], state: ClusterState) -> float:
    """Dominant resource share over GPU flavors, divided by the queue's weight (DRF)."""
    capacity: dict[str, int] = defaultdict(int)
    for node in state.nodes.values():
        if node.flavor is not None and node.schedulable:
            capacity[node.flavor] += node.gpus * GPU_MILLI
    dominant = max(
        (amount / capacity[flavor] for flavor, amount in used.items() if capacity[flavor]),
        default=0.0,
    )
    return dominant / queue.weight if queue.weight > 0 else dominant
