"""What the fold keeps of a suspended job (engine/suspend.py decides them): why, since
when, by whom, in words. Apart from the rule so the fold and the snapshot stand without
the placement package (pyproject's import contracts).
"""

from __future__ import annotations

from dataclasses import dataclass

from gitsched.engine import events as ev

BY_COMMIT = "commit"  # Suspension.cause: spec.suspend: true
BY_IDLE = "idle"  # Suspension.cause: a workspace's idle.suspendAfterMinutes
SUSPENDED = "suspended"  # the pending constraint of a suspended job


@dataclass(frozen=True, slots=True)
class Suspension:
    """Why a job is suspended, since when, by whom ("" for the idle rule), in words."""

    cause: str
    since: str
    by: str
    reason: str


def commit_suspension(e: ev.JobSuspended) -> Suspension:
    return Suspension(
        BY_COMMIT,
        e.at,
        e.by,
        f"suspended (spec.suspend: true) by {e.by} at {e.at}: set suspend: false to queue it again",
    )


def idle_suspension(e: ev.WorkspaceSuspended) -> Suspension:
    return Suspension(
        BY_IDLE,
        e.until,
        "",
        f"suspended: idle, its GPUs stayed below {e.threshold_percent:g}% utilisation "
        f"(at most {e.utilization_percent:.1f}%) from {e.since} to {e.until}, "
        f"idle.suspendAfterMinutes {e.after_minutes}: change spec.resume to queue it again",
    )


def resumed_reason(e: ev.JobResumed) -> str:
    how = "spec.suspend: false" if e.how == "suspend" else "spec.resume changed"
    return f"resumed ({how}) by {e.by} at {e.at}"
