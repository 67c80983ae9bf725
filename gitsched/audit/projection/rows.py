"""The row operations one catch-up batch hands the sink (`gitsched.audit.store` or its writer process).

A `Batch` is plain lists and dicts of tuples, in the column order of `gitsched.audit.store`'s
tables, so the writer process can take it as a marshal frame.
"""

from __future__ import annotations

from typing import Any


class Batch:
    """Row operations for the sink.

    A row is written once, when it is complete (an interval or version when it
    ends); rows still open are `open_*`, a snapshot the sink writes in place of the
    last one. Only violation episodes are updated, after every insert.
    """

    __slots__ = (
        "approvals",
        "changes",
        "checkpoint_marks",
        "checkpoints",
        "cluster_events",
        "commits",
        "effects",
        "events",
        "fairshare_clock",
        "fairshare_globals",
        "fairshare_queues",
        "marks",
        "open_placements",
        "open_segments",
        "open_versions",
        "placement_nodes",
        "placements",
        "rates",
        "segments",
        "service_counts",
        "solves",
        "usage_calls",
        "usage_days",
        "user_days",
        "versions",
        "violation_close",
        "violations",
    )

    def __init__(self) -> None:
        self.events = 0
        self.placements: list[tuple[Any, ...]] = []
        self.placement_nodes: list[tuple[Any, ...]] = []
        self.versions: list[tuple[Any, ...]] = []
        self.segments: list[tuple[Any, ...]] = []
        # (queue, team, flavor, UTC day) -> used, quota, borrowed, idle, lent
        self.usage_days: dict[tuple[str, str, str, int], list[int]] = {}
        # (user, team, flavor, UTC day) -> milli-GPU-microseconds used, placements started
        self.user_days: dict[tuple[str, str, str, int], list[int]] = {}
        self.rates: list[tuple[Any, ...]] = []
        self.marks: list[tuple[Any, ...]] = []
        self.commits: list[tuple[Any, ...]] = []
        self.changes: list[tuple[Any, ...]] = []
        self.approvals: list[tuple[Any, ...]] = []
        self.effects: list[tuple[Any, ...]] = []
        self.violations: list[tuple[Any, ...]] = []
        self.violation_close: list[tuple[Any, ...]] = []
        self.checkpoints: list[tuple[Any, ...]] = []
        self.checkpoint_marks: list[tuple[Any, ...]] = []
        self.open_placements: list[tuple[Any, ...]] = []
        self.open_versions: list[tuple[Any, ...]] = []
        self.open_segments: list[tuple[Any, ...]] = []
        # the engine's fold (`cluster_fold`): fair share's inputs as they change, and solves
        self.fairshare_clock: list[tuple[Any, ...]] = []
        self.fairshare_globals: list[tuple[Any, ...]] = []
        self.fairshare_queues: list[tuple[Any, ...]] = []
        self.solves: list[tuple[Any, ...]] = []
        # every service's counts after each event that moves them (`service_rows`)
        self.service_counts: list[tuple[Any, ...]] = []
        # a `DeferredClusterFold`'s events, for the `ClusterFold` of another process
        self.cluster_events: list[tuple[Any, ...]] = []
        # a `DeferredUsage`'s calls, for the `UsageLedger` of another process
        self.usage_calls: list[tuple[Any, ...]] = []
