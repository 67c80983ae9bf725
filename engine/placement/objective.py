"""The one objective every solver is scored by, so plans from different solvers compare.

Value of a running job: its GPUs (a CPU-only job counts one tenth of a GPU per
replica), scaled up by priority; minus the cost of moves and of preemptions.
"""

from __future__ import annotations

from datetime import datetime

from engine.model import GPU_MILLI, Job, Placement, Policy

CPU_JOB_VALUE_MILLI = 100


def job_value(job: Job, replicas: int, policy: Policy) -> float:
    """What running `replicas` replicas of `job` is worth."""
    milli = job.resources.gpu_milli or CPU_JOB_VALUE_MILLI
    return replicas * milli / GPU_MILLI * (1.0 + policy.priority_weight * job.priority / 1000.0)


def move_penalty(job: Job, policy: Policy) -> float:
    return (
        policy.move_cost
        * job.replicas
        * max(job.resources.gpu_milli, CPU_JOB_VALUE_MILLI)
        / GPU_MILLI
        * 0.1
    )


def lost_gpu_seconds(job: Job, placement: Placement, now: str) -> float:
    """Work lost if the job stops now: GPU-seconds since its last checkpoint (or its start)."""
    if not placement.started_at or not now:
        return 0.0
    try:
        elapsed = (
            datetime.fromisoformat(now) - datetime.fromisoformat(placement.started_at)
        ).total_seconds()
    except ValueError:
        return 0.0
    elapsed = max(0.0, elapsed)
    if job.checkpoint_interval_minutes is not None:
        elapsed = min(elapsed, job.checkpoint_interval_minutes * 60.0)
    return elapsed * placement.gpu_milli / GPU_MILLI


def preemption_penalty(job: Job, lost_seconds: float, policy: Policy) -> float:
    """Preempting costs the job's value plus the lost work, in GPU-hours."""
    return policy.preemption_cost * (
        0.5 * job_value(job, job.replicas, policy) + lost_seconds / 3600.0
    )
