"""What the cluster did to the jobs the log placed: started, finished, failed, interrupted.

Pure: the folded state and the pods as they are now in, the events that tell
the log out. Level-based like the actuator, so an observation missed while the
daemon was down is made on the next pass, and one made twice appends nothing
(the fold remembers what it was told: `started`, and ended jobs leave).
"""

from __future__ import annotations

from collections.abc import Mapping

from gitsched.cluster.actuator import is_bound, is_deleting
from gitsched.cluster.api import Obj
from gitsched.cluster.pods import PLACEMENT_LABEL, desired_pods
from gitsched.engine import events as ev
from gitsched.engine.model import utc_time
from gitsched.engine.state import ClusterState


def _failure(pod: Obj) -> tuple[str, int | None]:
    """Why a Failed pod failed, and its first non-zero exit code."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
            "terminated"
        )
        if term and term.get("exitCode", 0) != 0:
            reason = term.get("reason") or "Error"
            message = term.get("message")
            return (f"{reason}: {message}" if message else reason), int(term["exitCode"])
    reason = status.get("reason") or "Failed"
    message = status.get("message")
    return (f"{reason}: {message}" if message else reason), None


def _finished_at(pods: list[Obj]) -> str:
    """When the last of the pods' containers ended, as the cluster recorded it ("" if none
    says): fair share counts the job's GPU-seconds up to then, never to the clock."""
    times = [
        utc_time(str(term["finishedAt"]))
        for pod in pods
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if (term := (cs.get("state") or {}).get("terminated")) and term.get("finishedAt")
    ]
    return max((t for t in times if t), default="")


def job_events(state: ClusterState, pods: Mapping[tuple[str, str], Obj]) -> list[ev.Event]:
    """JobStarted / JobFinished / JobFailed / JobInterrupted for each placed job, as the pods say."""
    out: list[ev.Event] = []
    by_job: dict[str, list[tuple[int, str, Obj | None]]] = {}
    for key, want in desired_pods(state).items():
        pod = pods.get(key)
        if (
            pod is not None
            and (pod["metadata"].get("labels") or {}).get(PLACEMENT_LABEL) != want.placement
        ):
            pod = None  # an older placement's pod: not this placement's
        by_job.setdefault(want.job, []).append((want.replica, f"{key[0]}/{key[1]}", pod))
    for job in sorted(by_job):
        replicas = sorted(by_job[job], key=lambda r: r[0])
        placement = state.placements[job]
        started = state.started.get(job) == placement.started_at
        failed = next(
            (
                (i, pod)
                for i, _, pod in replicas
                if pod is not None and pod.get("status", {}).get("phase") == "Failed"
            ),
            None,
        )
        if failed is not None:
            reason, code = _failure(failed[1])
            out.append(
                ev.JobFailed(
                    job=job,
                    reason=reason,
                    exit_code=code,
                    replica=failed[0],
                    at=_finished_at([failed[1]]),
                )
            )
            continue
        gone = next((name for _, name, pod in replicas if pod is None or is_deleting(pod)), None)
        if gone is not None:
            if started:
                # It ran, and now a pod is missing or going: gitsched never deletes the pods
                # of a placement that stands, so someone (or something) else did.
                out.append(
                    ev.JobInterrupted(job=job, reason=f"pod {gone} deleted outside gitsched")
                )
            continue  # not started yet: the actuator is still making its pods
        phases = [pod.get("status", {}).get("phase") for _, _, pod in replicas if pod is not None]
        if not started and all(
            is_bound(pod) and phase in ("Running", "Succeeded")
            for (_, _, pod), phase in zip(replicas, phases, strict=True)
            if pod is not None
        ):
            out.append(ev.JobStarted(job=job, placement_at=placement.started_at))
            started = True
        if started and all(phase == "Succeeded" for phase in phases):
            out.append(
                ev.JobFinished(
                    job=job, at=_finished_at([pod for _, _, pod in replicas if pod is not None])
                )
            )
    return out
