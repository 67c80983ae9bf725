"""Suspend and resume (Kueue's `suspend`): a job or workspace that is not to run keeps
its spec and its place in line, and gives its GPUs back.

One rule for every way in: a commit that sets spec.suspend (JobSuspended), the idle rule
for a workspace (WorkspaceSuspended, engine/idle.py decides when), and a commit that
resumes (JobResumed). A running job stops as a preemption does (a JobPreempted with rule
"suspend", its lost work from engine.placement.objective), so quota, fair share, audit
and the actuator treat it as they treat any stop. Every time here is the commit's or the
telemetry's, never the clock. What the fold keeps of a suspension is engine/suspension.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from gitsched.engine import events as ev
from gitsched.engine.model import CommitInfo, Job, Placement
from gitsched.engine.placement.objective import lost_gpu_seconds
from gitsched.engine.placement.preemption import Rule
from gitsched.engine.suspension import BY_COMMIT, Suspension, commit_suspension


def stop(job: Job, placement: Placement, reason: str, at: str, solve_id: str) -> ev.JobPreempted:
    """The stop of a running job that is suspended: a preemption by nobody, under rule
    "suspend", its lost work since the last checkpoint counted as any preemption's."""
    return ev.JobPreempted(
        job=job.key,
        reason=reason,
        preempted_by=None,
        lost_gpu_seconds=lost_gpu_seconds(job, placement, at),
        solve_id=solve_id,
        rule=Rule.SUSPEND.value,
        at=at,
    )


def commit_transitions(
    jobs: Mapping[str, Job],
    old_jobs: Mapping[str, Job],
    suspended: Mapping[str, Suspension],
    placements: Mapping[str, Placement],
    commit: CommitInfo,
    now: str,
) -> list[ev.Event]:
    """The suspensions and resumptions a commit makes, for the jobs it declares (`jobs`,
    those still to run), given the jobs as they were (`old_jobs`) and the suspensions in
    force. `now`: the commit's decision time.

    spec.suspend true suspends (a running job stops); false resumes a job suspended by a
    commit. A workspace suspended by the idle rule still says suspend: false: a commit
    that changes its spec.resume resumes it (docs/workspaces.md says why)."""
    out: list[ev.Event] = []
    who = f"{commit.author} <{commit.author_email}>"
    for key in sorted(jobs):
        job, old, held = jobs[key], old_jobs.get(key), suspended.get(key)
        if job.suspend:
            if held is not None and held.cause == BY_COMMIT:
                continue
            flag = ev.JobSuspended(job=key, at=now, by=who, commit=commit.sha)
            out.append(flag)
            placement = placements.get(key)
            if placement is not None and old is not None:
                reason = commit_suspension(flag).reason
                out.append(stop(old, placement, reason, now, f"suspend/{commit.sha}"))
        elif held is not None:
            if held.cause == BY_COMMIT:
                how = "suspend"
            elif old is not None and job.resume != old.resume:
                how = "resume"
            else:
                continue  # idle-suspended, and this commit does not ask to resume it
            out.append(ev.JobResumed(job=key, at=now, by=who, commit=commit.sha, how=how))
    return out
