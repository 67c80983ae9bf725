"""Hand-written audit logs: real domain events, encoded and sealed as the reconciler's
are, each batch at a chosen time (as tests/unit/test_audit_projection.py builds them),
for tests that check the views and controls on known numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gitsched.audit import compliance as compliance_query
from gitsched.audit.catchup import catch_up
from gitsched.audit.store import AuditStore, EventList
from gitsched.engine import events as ev
from gitsched.engine.model import CommitInfo, Isolation, Policy, ReplicaPlacement
from gitsched.eventlog.codec import encode
from gitsched.eventlog.envelope import GENESIS_HASH, StoredEvent, format_time, seal_batch
from tests.support.factories import CLUSTER, node, queue

T0 = datetime(2025, 11, 16, 9, 0, tzinfo=UTC)
PRIYA = ("Priya Raman", "priya@platform.example")
ANA = ("Ana Souza", "ana@ml.example")
LI = "Li Wei <li@cv.example>"


def hours(h: float) -> datetime:
    return T0 + timedelta(hours=h)


def ts(h: float) -> float:
    return hours(h).timestamp()


@dataclass
class LogBuilder:
    """Seals batches of domain events into a hash-chained log, each at a chosen time."""

    events: list[StoredEvent] = field(default_factory=list)
    commits: int = 0

    def batch(self, at: float, items: list[ev.Event], *, actor: str, cause: str) -> list[int]:
        first = len(self.events) + 1
        new = [
            encode(e, id=f"{cause}/{first + i}", actor=actor, cause=cause)
            for i, e in enumerate(items)
        ]
        prev = self.events[-1].hash if self.events else GENESIS_HASH
        self.events.extend(
            seal_batch(new, first_seq=first, time=format_time(hours(at)), prev_hash=prev)
        )
        return list(range(first, first + len(items)))

    def commit(
        self,
        at: float,
        items: list[ev.Event],
        *,
        author: tuple[str, str] = PRIYA,
        approvers: tuple[str, ...] = (),
    ) -> str:
        self.commits += 1
        sha = f"{self.commits:040x}"
        info = CommitInfo(
            sha, author[0], author[1], format_time(hours(at)), f"commit {self.commits}", approvers
        )
        self.batch(at, [*items, ev.CommitApplied(info, len(items))], actor=info.actor, cause=sha)
        return sha

    def solve(self, at: float, cause: str, items: list[ev.Event]) -> list[int]:
        done = ev.SolveCompleted(
            f"{cause}/solve", "greedy", "heuristic", 0.0, None, None, 0.0, 0, 0, 0, 0, 0, 0, 0
        )
        return self.batch(at, [*items, done], actor="solver", cause=cause)

    def view(self, path: Path | None = None) -> AuditStore:
        store = AuditStore(path or ":memory:")
        catch_up(EventList(self.events), store)
        return store


def placed(
    job_key: str,
    *nodes_gpus: tuple[str, int],
    flavor: str = "h100",
    action: str = "admitted",
    reason: str = "admitted",
) -> ev.PlacementDecided:
    return ev.PlacementDecided(
        job=job_key,
        flavor=flavor,
        replicas=tuple(ReplicaPlacement(n, tuple(range(g)), 1000) for n, g in nodes_gpus),
        action=action,
        reason=reason,
        solve_id="s",
        at="",
    )


def bootstrap(log: LogBuilder, *, approvers: tuple[str, ...] = ()) -> str:
    """Two shared eu nodes, one dedicated node in eu-central; queues a and b in cohort c, r alone."""
    return log.commit(
        0,
        [
            ev.ClusterConfigured(CLUSTER),
            ev.PolicyChanged(Policy()),
            ev.NodeRegistered(node("n1", region="eu")),
            ev.NodeRegistered(node("n2", region="eu")),
            ev.NodeRegistered(node("s1", region="eu-central", isolation=Isolation.DEDICATED)),
            ev.QueueConfigured(queue("a", cohort="c", quotas={"h100": (8, 8, None)})),
            ev.QueueConfigured(queue("b", cohort="c", quotas={"h100": (8, None, None)})),
            ev.QueueConfigured(queue("r", quotas={"h100": (8, None, None)})),
        ],
        approvers=approvers,
    )


def submit(log: LogBuilder, at: float, *jobs: object, author: tuple[str, str] = ANA) -> str:
    return log.commit(at, [ev.JobSubmitted(j) for j in jobs], author=author)  # type: ignore[arg-type]


def violations(store: AuditStore) -> list[tuple[str, str, list[int]]]:
    return [
        (v["check"], v["subject"], v["evidence"])
        for v in compliance_query.compliance(store)["violations"]
    ]
