"""Idle GPU reclamation: a running job whose GPUs stay below the policy's utilisation
threshold for its window is flagged idle, then made the first to stop (preemptible) or
stopped at once (reclaim), so waiting jobs get GPUs that do nothing.

Utilisation comes from telemetry events in the log (GpuUtilizationReported, aggregated
per node and window at the edge); every time here is a telemetry window's or a
placement's, never the clock, so a replay flags the same jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gitsched.engine import events as ev
from gitsched.engine.fairshare import moment
from gitsched.engine.model import IdleAction, IdlePolicy, Job, Placement


@dataclass(frozen=True, slots=True)
class IdleStreak:
    """A running job's GPUs below the threshold in every report from `since` to `until`;
    `percent`: the highest utilisation any of those reports gave it."""

    since: str
    until: str
    percent: float


def job_utilization(placement: Placement, report: ev.GpuUtilizationReported) -> float | None:
    """The job's utilisation in a node's report: its busiest GPU there (a job is idle only
    when all its GPUs are); None when the report covers none of its GPUs."""
    by_index = {g.index: g.mean_percent for g in report.gpus}
    values = [
        by_index[i]
        for replica in placement.replicas
        if replica.node == report.node
        for i in replica.gpus
        if i in by_index
    ]
    return max(values) if values else None


def observe(
    streaks: Mapping[str, IdleStreak],
    placements: Mapping[str, Placement],
    report: ev.GpuUtilizationReported,
    threshold_percent: float,
) -> dict[str, IdleStreak | None]:
    """The streaks the report changes: job -> its longer streak, or None where the job was
    busy (its streak ends). Jobs the report does not cover are left out."""
    changes: dict[str, IdleStreak | None] = {}
    for job, placement in placements.items():
        percent = job_utilization(placement, report)
        if percent is None:
            continue
        if percent >= threshold_percent:
            changes[job] = None
            continue
        old = streaks.get(job)
        if old is None or (moment(report.start) or 0.0) < (moment(old.since) or 0.0):
            changes[job] = IdleStreak(report.start, report.end, percent)
        else:
            changes[job] = IdleStreak(
                old.since, max(old.until, report.end), max(old.percent, percent)
            )
    return changes


def exempt(job: Job, policy: IdlePolicy) -> bool:
    return job.queue in policy.exempt_queues or job.priority_class in policy.exempt_priority_classes


def is_idle(job: Job, placement: Placement, streak: IdleStreak, policy: IdlePolicy) -> bool:
    """Below the threshold for the policy's whole window, past the grace after its placement."""
    if not policy.enabled or exempt(job, policy):
        return False
    since, until = moment(streak.since), moment(streak.until)
    placed = moment(placement.started_at)
    if since is None or until is None:
        return False
    if placed is not None and until - placed < policy.grace_minutes * 60.0:
        return False
    # The streak counts from the grace's end at the earliest: start-up is not idleness.
    start = since if placed is None else max(since, placed + policy.grace_minutes * 60.0)
    return until - start >= policy.window_minutes * 60.0


def suspend_rule(job: Job, policy: IdlePolicy) -> IdlePolicy | None:
    """The idle rule of a workspace that asks to be suspended when idle (spec.idle.
    suspendAfterMinutes), for `is_idle`: the Policy's threshold, the workspace's own window,
    counted from its start (it asked for this window; no grace on top), no exemptions (it
    asked). None for a job that does not ask."""
    minutes = job.idle_suspend_after_minutes
    if minutes is None:
        return None
    return IdlePolicy(
        enabled=True,
        threshold_percent=policy.threshold_percent,
        window_minutes=float(minutes),
        grace_minutes=0.0,
        action=IdleAction.RECLAIM,
    )


def idle_reason(flag: ev.JobIdle) -> str:
    """What the owner reads in `plan` and audit."""
    what = (
        "stopped so waiting jobs get its GPUs"
        if flag.action == IdleAction.RECLAIM
        else "ranks lowest: the first to stop for a waiting job"
    )
    return (
        f"idle: its GPUs stayed below {flag.threshold_percent:g}% utilisation "
        f"(at most {flag.utilization_percent:.1f}%) from {flag.since} to {flag.until}; {what}"
    )
