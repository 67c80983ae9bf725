"""`plan`: what merging a branch would do to the cluster, computed without touching it.

The plan starts from what the cluster really runs (the log's tip, as the reconciler
reads it), runs the reconciler's own step (reconciler.step) over the branch's commits
with appending off, and compares:
quotas and policy before -> after, jobs admitted, moved, preempted or left pending, GPUs
and fair share per queue, and the owner approvals still missing. It reads the log and
git and appends nothing.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gitsched.engine import events as ev
from gitsched.engine.core import ApplyCommit, RejectCommit, decide, decision_time
from gitsched.engine.errors import UsageError
from gitsched.engine.model import CommitInfo, Placement, Policy, Queue, Reservation
from gitsched.engine.placement.milp import TIME_LIMIT_STATUS
from gitsched.engine.placement.plan import SolveStats
from gitsched.engine.state import ClusterState, evolve, fold
from gitsched.engine.timelimits import timed_out_reason
from gitsched.engine.units import milli_from_gpus
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode
from gitsched.eventlog.replay import replay
from gitsched.findings import Finding
from gitsched.policies.approval import TeamApproval
from gitsched.reconciler.approval import commit_platform_changes, team_approvals
from gitsched.reconciler.git import GitRepo, change_commits
from gitsched.reconciler.plan_fairness import FairShareView, fair_share_view
from gitsched.reconciler.specs import SpecCache, load_commit
from gitsched.reconciler.step import EventGroup, commit_steps, owed_solve

# What plan says of a solve the wall clock stopped (docs/placement.md, "Deterministic solves").
TIME_LIMIT_WARNING = "the solve stopped at its time limit: reconcile may place differently"


def clock_stopped(stats: SolveStats | None) -> bool:
    """Whether the wall-clock backstop, not the node budget or the gap, ended the solve: the
    plan is then not a prediction of what reconcile appends."""
    return stats is not None and stats.status == TIME_LIMIT_STATUS


# Policy fields as the Policy YAML spells them, so a reviewer can find the line.
POLICY_FIELD_NAMES = {
    "solver": "solver.name",
    "time_limit_s": "solver.timeLimitSeconds",
    "gap_tolerance": "solver.gapTolerance",
    "node_limit": "solver.nodeLimit",
    "levels": "solver.levels",
    "priority_weight": "objective.priorityWeight",
    "move_cost": "objective.moveCost",
    "preemption_cost": "objective.preemptionCost",
    "fragmentation_weight": "objective.fragmentationWeight",
    "fairness_weight": "objective.fairnessWeight",
    "compactness_weight": "objective.compactnessWeight",
    "preemption_enabled": "preemption.enabled",
    "max_moves_per_solve": "preemption.maxMovesPerSolve",
    "preempt_within_queue": "preemption.withinQueue",
    "reclaim_within_cohort": "preemption.reclaimWithinCohort",
    "require_owner_approval": "approval.requireOwnerApproval",
    "require_signed_approval": "approval.requireSignedApproval",
    "usage_half_life_hours": "fairness.usageHalfLifeHours",
}
POD_SECURITY_FIELD_NAMES = {
    "level": "podSecurity.level",
    "teams": "podSecurity.teams",
    "service_accounts": "podSecurity.serviceAccounts",
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
    kind: str  # cluster | node | queue | job | service
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
    # What allowed a preemption (engine.placement.preemption.Rule), or why a job moved
    # (engine.placement.moves.MoveReason).
    rule: str = ""


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
    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()  # HEAD is valid, but some of it can never run
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
    # What the reconciler's step appends for the branch, in order (with the LOG
    # baseline: exactly what `reconcile` appends once HEAD is merged as it is).
    groups: tuple[EventGroup, ...] = ()
    # fair share over time and idle jobs after the change (reconciler/plan_fairness.py)
    fairness: FairShareView | None = None
    # the reservations the cluster holds after the change: expected starts (docs/time.md)
    reservations: tuple[Reservation, ...] = ()

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


# -- the log ------------------------------------------------------------------------------


def _state_at(event_log: EventLog, sha: str) -> ClusterState | None:
    """The state right after the last event `sha` caused; None if it caused none."""
    state = ClusterState()
    at: ClusterState | None = None
    for stored in event_log.read(0):
        state = evolve(state, decode(stored))
        if stored.cause == sha:
            at = state
    return at


def _commit_info(repo: GitRepo, sha: str) -> CommitInfo:
    commits = repo.commits(f"{sha}^!")
    if not commits:
        raise UsageError(f"cannot read commit {sha[:12]}")
    return commits[-1]


def _since(repo: GitRepo, last: CommitInfo | None, rev: str, base_sha: str) -> list[CommitInfo]:
    """The commits up to `rev` the reconciler would read after `last`, the log's newest
    (as `commits_since`); those after `base_sha` when `rev` does not descend from `last`."""
    if last is not None and last.sha == rev:
        return []  # the log holds it already
    if last is not None and repo.is_ancestor(last.sha, rev):
        return repo.commits(f"{last.sha}..{rev}")
    if base_sha == rev:
        return []
    return repo.commits(f"{base_sha}..{rev}")


@dataclass(frozen=True, slots=True)
class _Start:
    """Where the reconciler's steps start, and the commits that lead from there to BASE."""

    baseline: Baseline
    state: ClusterState
    to_base: tuple[CommitInfo, ...] = ()
    stale: str | None = None
    note: str | None = None


def _start(
    repo: GitRepo,
    event_log: EventLog | None,
    current: ClusterState,
    base: Revision,
    base_info: CommitInfo,
    log_name: str,
) -> _Start:
    applied_info = current.last_good_commit
    newest = current.last_commit
    if applied_info is None:
        return _Start(
            Baseline.FRESH,
            ClusterState(),
            (base_info,),
            note=f"{log_name} is empty or absent: the placements before are a fresh solve of "
            f"{base.short}, not what the cluster runs",
        )
    applied = Revision("applied", applied_info.sha, applied_info.subject)
    if base.sha == applied.sha:
        return _Start(Baseline.LOG, current)
    if newest is not None and base.sha == newest.sha:
        # The log's newest commit was rejected: the cluster still runs the last good one.
        return _Start(
            Baseline.LOG,
            current,
            note=f"base {base.short} was rejected by the reconciler; the cluster runs "
            f"{applied.short} ({applied.subject}), the last commit it applied",
        )
    at_base = _state_at(event_log, base.sha) if event_log is not None else None
    if at_base is not None:
        return _Start(
            Baseline.LOG_AT_BASE,
            at_base,
            stale=f"base {base.short} is not the cluster's current commit: {log_name} has "
            f"applied {applied.short} ({applied.subject}) since. This plan starts from the "
            f"placements the log recorded at {base.short}; rebase the branch, or plan against "
            f"{applied.short}, to see the effect on the cluster as it is.",
        )
    to_base = _since(repo, newest, base.sha, base.sha) or [base_info]
    return _Start(
        Baseline.SIMULATED,
        current,
        tuple(to_base),
        stale=f"base {base.short} has not been applied to the cluster: {log_name}'s last "
        f"applied commit is {applied.short} ({applied.subject}). The placements at "
        f"{base.short} are simulated by reconciling up to it from the cluster's current state.",
    )


# -- the plan ------------------------------------------------------------------------------


def plan_change(
    repo: GitRepo,
    event_log: EventLog | None,
    base_rev: str | None,
    head_rev: str,
    *,
    log_name: str = "the log",
) -> PullRequestPlan:
    """What applying HEAD would do, starting from the cluster as it is at BASE.

    The "after" is the reconciler's own step (reconciler.step) run over the branch's
    commits from the log's tip, appending nothing: with the LOG baseline, `groups` are
    the events `reconcile` would append if HEAD were merged as it is (fast-forward).
    """
    head_sha = repo.resolve(head_rev)
    base_sha = repo.resolve(base_rev) if base_rev is not None else None
    tip = replay(event_log) if event_log is not None else None
    current = tip.state if tip is not None else ClusterState()
    applied_info = current.last_good_commit
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
    specs = SpecCache()
    base_loaded = load_commit(repo, base_sha, cache=specs)

    start = _start(repo, event_log, current, base, base_info, log_name)
    notes = [start.note] if start.note else []
    if base_loaded.desired is None and start.baseline is not Baseline.LOG:
        notes.append(
            f"base {base.short} is itself invalid ({len(base_loaded.errors)} error(s)); "
            "the state before is the last valid one"
        )
    commits = tuple(repo.commits(f"{base_sha}..{head_sha}")) if base_sha != head_sha else ()
    skeleton = PullRequestPlan(
        base=base,
        head=head,
        baseline=start.baseline,
        applied=applied,
        log_seq=tip.last_seq if tip is not None else 0,
        stale=start.stale,
        notes=tuple(notes),
        commits=commits,
    )
    # The reconciler's own steps: first a solve the log still owes, then each commit.
    before = start.state
    groups: list[EventGroup] = []
    if (owed := owed_solve(before)) is not None:
        before = owed.state
        groups.extend(owed.groups)
        if owed.plan is not None and clock_stopped(owed.plan.stats):
            notes.append(f"{TIME_LIMIT_WARNING} (the solve the log owes)")
    for step in commit_steps(repo, before, start.to_base, specs=specs):
        before = step.state
    if start.baseline is not Baseline.LOG:
        groups = []  # the events of a simulated base are no part of the change
    last = before.last_commit if start.baseline is Baseline.LOG else None
    steps = list(commit_steps(repo, before, _since(repo, last, head_sha, base_sha), specs=specs))
    after = steps[-1].state if steps else before
    groups.extend(g for step in steps for g in step.groups)
    head_loaded = load_commit(repo, head_sha, cache=specs)
    if head_loaded.desired is None:
        return dataclasses.replace(skeleton, errors=head_loaded.errors, groups=tuple(groups))
    desired = head_loaded.desired
    for step in steps:
        if isinstance(step.intent, RejectCommit):
            commit, (first, *more) = step.intent.commit, step.intent.errors or (None,)
            why = first.message if first is not None else "rejected"
            notes.append(
                f"merged as it is, the reconciler would reject {commit.sha[:12]} "
                f"({commit.subject}): {why}" + (f" (and {len(more)} more)" if more else "")
            )
    solved = [step.plan for step in steps if step.plan is not None]
    for step in steps:
        if step.plan is not None and clock_stopped(step.plan.stats):
            what = f"commit {step.intent.commit.sha[:12]}" if step.intent else "the cluster"
            notes.append(f"{TIME_LIMIT_WARNING} (the solve for {what})")

    # What HEAD declares, against BASE as the cluster runs it: one diff, however many
    # commits the branch has and whatever the reconciler makes of them.
    declared_events = decide(before, ApplyCommit(head_info, desired))
    declared = fold(declared_events, before)
    effects, kept = _effects(before, after, [e for step in steps for e in step.events])

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
        base_sha=base_sha,
        signed_required=signed,
        platform=commit_platform_changes(before, desired),
    )
    return dataclasses.replace(
        skeleton,
        notes=tuple(notes),
        warnings=head_loaded.warnings,
        spec_changes=(
            *_spec_changes(before, declared_events),
            *_service_changes(before, after, declared_events, effects),
        ),
        queue_changes=tuple(
            QueueChange(name, before.queues.get(name), declared.queues.get(name))
            for name in sorted(set(before.queues) | set(declared.queues))
            if before.queues.get(name) != declared.queues.get(name)
        ),
        policy_changes=_policy_changes(before.policy, declared.policy),
        effects=effects,
        kept=kept,
        usage=_usage(before, after, after.placements),
        solve=solved[-1].stats if solved else None,
        reservations=after.reservations,
        approvals=approvals,
        approval_enforced=signed
        or before.policy.require_owner_approval
        or desired.policy.require_owner_approval,
        groups=tuple(groups),
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


def _service_changes(
    before: ClusterState,
    after: ClusterState,
    declared: Iterable[ev.Event],
    effects: Sequence[JobEffect],
) -> list[SpecChange]:
    """Each service the change adds, edits or withdraws: its replica bounds, the replicas it
    runs before and after, and the jobs its replicas would preempt (docs/services.md)."""
    out: list[SpecChange] = []
    for e in declared:
        if isinstance(e, ev.ServiceWithdrawn):
            out.append(SpecChange("service", e.service, "withdrawn"))
            continue
        if not isinstance(e, ev.ServiceSubmitted | ev.ServiceChanged):
            continue
        service = e.service
        was = before.services.get(service.key)
        now = after.services.get(service.key)
        bounds = f"replicas {service.min_replicas}..{service.max_replicas}"
        if was is not None and (was.service.min_replicas, was.service.max_replicas) != (
            service.min_replicas,
            service.max_replicas,
        ):
            bounds += f" (was {was.service.min_replicas}..{was.service.max_replicas})"
        parts = [bounds]
        if isinstance(e, ev.ServiceChanged):
            parts.append("changed " + ", ".join(e.fields))
        count_before = len(was.replicas) if was is not None else 0
        count_after = len(now.replicas) if now is not None else 0
        parts.append(f"{count_before} -> {count_after} replicas")
        prefix = f"{service.queue}/{service.name}."
        stopped = sorted(
            x.job
            for x in effects
            if x.action is Action.PREEMPTED and (x.preempted_by or "").startswith(prefix)
        )
        if stopped:
            parts.append("would preempt " + ", ".join(stopped))
        action = "submitted" if isinstance(e, ev.ServiceSubmitted) else "changed"
        out.append(SpecChange("service", service.key, action, "; ".join(parts)))
    return out


def _policy_changes(before: Policy, after: Policy) -> tuple[FieldChange, ...]:
    changes = [
        FieldChange(
            POLICY_FIELD_NAMES.get(f.name, f.name), getattr(before, f.name), getattr(after, f.name)
        )
        for f in dataclasses.fields(Policy)
        if f.name not in ("idle", "pod_security")
        and getattr(before, f.name) != getattr(after, f.name)
    ]
    changes.extend(
        FieldChange(
            IDLE_FIELD_NAMES[f.name], getattr(before.idle, f.name), getattr(after.idle, f.name)
        )
        for f in dataclasses.fields(type(before.idle))
        if getattr(before.idle, f.name) != getattr(after.idle, f.name)
    )
    changes.extend(
        FieldChange(
            POD_SECURITY_FIELD_NAMES[f.name],
            _plain(f.name, getattr(before.pod_security, f.name)),
            _plain(f.name, getattr(after.pod_security, f.name)),
        )
        for f in dataclasses.fields(type(before.pod_security))
        if getattr(before.pod_security, f.name) != getattr(after.pod_security, f.name)
    )
    return tuple(changes)


def _plain(name: str, value: object) -> object:
    """A podSecurity value as its Policy document writes it: `{ml: restricted}`, `[default]`."""
    if name == "teams" and isinstance(value, tuple):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return value


def _effects(
    before: ClusterState, after: ClusterState, events: Iterable[ev.Event]
) -> tuple[tuple[JobEffect, ...], int]:
    """Each job's fate from BASE to HEAD, with the reasons the solver's last word on it
    gave; and how many running jobs keep their place."""
    last: dict[str, ev.PlacementDecided | ev.JobPreempted | ev.JobPending] = {}
    timed_out: dict[str, ev.JobTimedOut] = {}
    for e in events:
        if isinstance(e, ev.PlacementDecided | ev.JobPreempted | ev.JobPending):
            last[e.job] = e
        elif isinstance(e, ev.JobTimedOut):
            timed_out[e.job] = e
    effects: list[JobEffect] = []
    for key in sorted(set(before.jobs) - set(after.jobs)):
        was = before.placements.get(key)
        stop = timed_out.get(key)
        effects.append(
            JobEffect(
                key,
                Action.WITHDRAWN,
                reason=f"{timed_out_reason(stop)}: it stops (docs/time.md)"
                if stop is not None
                else "withdrawn by the change" + (": it stops" if was else " (was not running)"),
                flavor=was.flavor if was else None,
                gpu_milli=was.gpu_milli if was else 0,
                nodes_before=was.nodes if was else (),
            )
        )
    kept = 0
    for key in sorted(after.jobs):
        was, now, word = before.placements.get(key), after.placements.get(key), last.get(key)
        reason = word.reason if word is not None else ""
        if (
            now is not None
            and was is not None
            and (now.flavor, now.replicas)
            == (
                was.flavor,
                was.replicas,
            )
        ):
            kept += 1
        elif now is not None:
            decided = word if was is not None and isinstance(word, ev.PlacementDecided) else None
            effects.append(
                JobEffect(
                    key,
                    Action.ADMITTED if was is None else Action.MOVED,
                    reason,
                    now.flavor,
                    now.gpu_milli,
                    was.nodes if was else (),
                    now.nodes,
                    # A move's lost work and why it moved (engine/placement/moves.py).
                    lost_gpu_seconds=decided.lost_gpu_seconds if decided else 0.0,
                    rule=decided.rule if decided else "",
                )
            )
        elif was is not None and isinstance(word, ev.JobPreempted):
            effects.append(
                JobEffect(
                    key,
                    Action.PREEMPTED,
                    word.reason,
                    was.flavor,
                    was.gpu_milli,
                    was.nodes,
                    (),
                    word.lost_gpu_seconds,
                    word.preempted_by,
                    rule=word.rule,
                )
            )
        elif (waits := after.pending.get(key)) is not None:
            old = before.pending.get(key)
            previous = old.reason if old is not None and old.reason != waits.reason else ""
            effects.append(
                JobEffect(
                    key,
                    Action.STILL_PENDING if key in before.jobs else Action.NEWLY_PENDING,
                    waits.reason,
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
            capacity[node.flavor] += milli_from_gpus(node.gpus)
    dominant = max(
        (amount / capacity[flavor] for flavor, amount in used.items() if capacity[flavor]),
        default=0.0,
    )
    return dominant / queue.weight if queue.weight > 0 else dominant
