"""What makes a replay's wait tail: for the jobs that waited longest in all (every wait,
the first and each after a preemption), who started ahead of them while they waited.

Read from a replay's decision log (`replay(..., record=True)`): for each of the worst jobs
and each decision while it waited, the younger jobs that started (submitted after it;
the replay's jobs are all of one priority unless the oracle ranks them) and whether the
worst job would have fitted in the place one took (its GPUs there and the GPUs still free
on those nodes after the decision; quota aside), split by how the younger job started
(the solver's plan or the backfill pass) and whether it was of the same queue; and the
preemptions the worst jobs suffered, by rule. A diagnosis for docs/time.md, not a figure
of the benchmark.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gitsched.engine.units import GPU_MILLI
from gitsched.simulation.replay import GPUS_PER_NODE, ReplayResult


@dataclass(slots=True)
class TailReport:
    """The worst jobs' waits and what passed them over (counts of (job, decision) pairs)."""

    jobs: int = 0
    mean_total_wait_s: float = 0.0
    mean_first_wait_s: float = 0.0
    preempted_jobs: int = 0  # of the worst, those preempted at least once
    rewait_share: float = 0.0  # of their total queue time, the share after a preemption
    preempted_by: Counter[str] = field(default_factory=Counter)  # rule -> count
    passed_over: Counter[str] = field(default_factory=Counter)  # how / queue -> pairs
    younger_started: int = 0  # pairs: a younger job started while a worst job waited
    held: Counter[str] = field(default_factory=Counter)  # its pending constraint when passed

    def as_dict(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "mean_total_wait_s": self.mean_total_wait_s,
            "mean_first_wait_s": self.mean_first_wait_s,
            "preempted_jobs": self.preempted_jobs,
            "rewait_share": self.rewait_share,
            "preempted_by_rule": dict(sorted(self.preempted_by.items())),
            "younger_started": self.younger_started,
            "passed_over_fitting": dict(sorted(self.passed_over.items())),
            "constraint_when_passed": dict(sorted(self.held.items())),
        }


def _fits(gpu_milli: int, took: tuple[tuple[str, int], ...], free: dict[str, int]) -> bool:
    """Whether a job of `gpu_milli` in all would fit where a started job took `took`, with
    what stays free on those nodes: on one node for a job of a node or less; else as many
    whole nodes as its 8-GPU replicas."""
    room = [milli + free.get(node, 0) for node, milli in took]
    node = GPUS_PER_NODE * GPU_MILLI
    if gpu_milli <= node:
        return any(r >= gpu_milli for r in room)
    whole = sum(1 for r in room if r >= node) + sum(
        1 for n, f in free.items() if f >= node and n not in dict(took)
    )
    return whole * node >= gpu_milli


def tail_report(result: ReplayResult, share: float = 0.01) -> TailReport:
    """The worst `share` of the started jobs by total queue time, and what passed them."""
    runs = sorted(
        (r for r in result.jobs if r.first_start is not None),
        key=lambda r: (-r.queued_s, r.trace.index),
    )
    worst = runs[: max(1, int(len(runs) * share))] if runs else []
    report = TailReport(jobs=len(worst))
    if not worst:
        return report
    submit = {r.key: r.trace.submit_s for r in result.jobs}
    milli = {r.key: r.trace.gpu_milli for r in result.jobs}
    queue = {r.key: r.trace.team for r in result.jobs}
    watched = {r.key for r in worst}
    # Each worst job's waiting intervals, from its arrival and its stops to its starts.
    waiting: dict[str, list[list[float]]] = {k: [[submit[k], -1.0]] for k in watched}
    constraint: dict[str, str] = {}
    for d in result.log:
        free = dict(d.free_milli)
        for key, c in d.pending:
            if key in watched:
                constraint[key] = c
        now_started = {key for key, _, _ in d.started}
        for key in sorted(watched - now_started):
            if waiting[key][-1][1] >= 0:
                continue  # running
            for younger, reason, took in d.started:
                if younger == key or submit[younger] <= submit[key]:
                    continue
                report.younger_started += 1
                if _fits(milli[key], took, free):
                    how = "backfill" if "backfilled" in reason else d.source
                    same = "same-queue" if queue[younger] == queue[key] else "other-queue"
                    size = (
                        "younger-larger"
                        if milli[younger] > milli[key]
                        else "younger-smaller"
                        if milli[younger] < milli[key]
                        else "same-size"
                    )
                    report.passed_over[f"{how}/{same}/{size}"] += 1
                    report.held[constraint.get(key, "?") or "none"] += 1
        for key, _, _ in d.started:
            if key in watched and waiting[key][-1][1] < 0:
                waiting[key][-1][1] = d.at
        for key, _, rule in d.stopped:
            if key in watched:
                waiting[key].append([d.at, -1.0])
                report.preempted_by[rule] += 1
    report.mean_total_wait_s = sum(r.queued_s for r in worst) / len(worst)
    report.mean_first_wait_s = sum(
        r.first_start - r.trace.submit_s for r in worst if r.first_start is not None
    ) / len(worst)
    report.preempted_jobs = sum(1 for r in worst if r.preemptions)
    total = sum(r.queued_s for r in worst) or 1.0
    first = sum(r.first_start - r.trace.submit_s for r in worst if r.first_start is not None)
    report.rewait_share = max(0.0, total - first) / total
    return report
