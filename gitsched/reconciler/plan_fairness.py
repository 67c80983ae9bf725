"""What `plan` shows of fair share over time and of idle GPUs: each queue's and cohort's
share of the cluster against its decayed recent usage, and the jobs flagged idle, with
the reason their owners read. Kept apart from reconciler/plan.py, which composes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gitsched.engine.fairshare import FairShareRow, capacity_gpus, fair_share_rows, moment, usage_at
from gitsched.engine.idle import idle_reason
from gitsched.engine.state import ClusterState


@dataclass(frozen=True, slots=True)
class IdleNote:
    job: str
    action: str
    since: str
    until: str
    reason: str


@dataclass(frozen=True, slots=True)
class FairShareView:
    half_life_hours: float
    at: str
    queues: tuple[FairShareRow, ...]
    cohorts: tuple[FairShareRow, ...]
    idle: tuple[IdleNote, ...]


def fair_share_view(state: ClusterState, now: str) -> FairShareView:
    """Fair share and decayed usage at `now` (the decision time of the plan's head)."""
    half_life = state.policy.usage_half_life_hours
    at = max(moment(now) or 0.0, state.clock)
    usage = usage_at(state.usage, at, half_life)
    queues, cohorts = fair_share_rows(
        dict(state.queues), usage, capacity_gpus(state.nodes), half_life
    )
    idle = tuple(
        IdleNote(key, flag.action, flag.since, flag.until, idle_reason(flag))
        for key in sorted(state.idle)
        if (flag := state.idle[key]) is not None
    )
    return FairShareView(half_life, now, queues, cohorts, idle)
