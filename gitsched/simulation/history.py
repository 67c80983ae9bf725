"""A month of a 1,536-GPU cluster, as the reconciler would log it: the history the audit
benchmark (`gitsched bench audit`) measures its views on.

A seeded simulation: teams commit jobs (some with quota changes, approved or not),
a first-fit scheduler admits, moves, preempts and leaves them pending, nodes fail
and recover, jobs finish. Its events go through the real SQLite `EventLog`, so
every one is sealed in the hash chain. It writes the log only: it does not decide
placements for the product (the audit views read what was decided, not how).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gitsched.engine.codec import to_data
from gitsched.engine.events import EVENT_TYPES
from gitsched.engine.model import (
    ClusterSpec,
    CommitInfo,
    FlavorQuota,
    GpuFlavor,
    Isolation,
    Node,
    Policy,
    PriorityClass,
    Queue,
)
from gitsched.engine.units import GPU_MILLI, milli_from_gpus
from gitsched.eventlog.envelope import GENESIS_HASH, NewEvent, StoredEvent, format_time, seal_batch
from gitsched.eventlog.sqlite import SQLiteEventLog

START = datetime(2025, 10, 1, tzinfo=UTC)
# Part of the cached log's file name: a change to the simulation makes a new log.
SIMULATION_VERSION = 2
FLAVORS = (
    ("h100-80g", "H100", 80, 8, 96),
    ("a100-80g", "A100", 80, 8, 64),
    ("l40s-48g", "L40S", 48, 4, 32),
)
PRIORITIES = (("low", 100), ("normal", 500), ("high", 900))
TEAMS = (
    ("vision", "research"),
    ("nlp", "research"),
    ("speech", "research"),
    ("robotics", "research"),
    ("rl", "research"),
    ("genai", "research"),
    ("search", "product"),
    ("ads", "product"),
    ("recsys", "product"),
    ("maps", "product"),
    ("video", "product"),
    ("infra", "product"),
    ("fraud", None),
    ("risk", None),
)
ADMINS = (("Priya Raman", "priya@platform.example"), ("Omar Haddad", "omar@platform.example"))


@dataclasses.dataclass
class SimJob:
    key: str
    queue: str
    flavor: str
    replicas: int
    gpus_each: int
    priority: int
    preemptible: bool
    dedicated: bool
    residency: tuple[str, ...]
    placed: list[dict[str, Any]] | None = None
    pending_reason: str | None = None

    @property
    def milli(self) -> int:
        return milli_from_gpus(self.replicas * self.gpus_each)


@dataclasses.dataclass
class SimNode:
    name: str
    flavor: str
    gpus: int
    region: str
    dedicated: bool
    free: list[int]
    ready: bool = True


Emitted = list[tuple[str, dict[str, Any]]]

# The chance that a running job ends at a finish step (about 40% of steps, 8 s apart).
FINISH_HAZARD = 1 / 150
# A team with this many jobs waiting holds back: the cluster stays busy, not swamped.
MAX_WAITING = 15


class Simulation:
    """A seeded, simplified cluster whose events have the shapes the reconciler writes."""

    def __init__(self, seed: int, mean_gap_s: float = 8.0) -> None:
        self.rng = random.Random(seed)
        self.mean_gap_s = mean_gap_s
        self.now = START
        self.stamp = format_time(START)
        self.batches = 0
        self.out: list[tuple[str, list[NewEvent]]] = []
        self.nodes: dict[str, SimNode] = {}
        self.by_flavor: dict[str, list[SimNode]] = {}
        self.running: dict[str, SimJob] = {}
        # waiting jobs by priority, oldest first within each
        self.waiting: dict[int, dict[str, SimJob]] = {p: {} for _, p in PRIORITIES}
        self.ceiling: dict[str, dict[str, int]] = {}
        self.use: dict[tuple[str, str], int] = {}
        self.users = {
            team: [(f"{team}-user{i}", f"{team}-user{i}@example.com") for i in range(4)]
            for team, _ in TEAMS
        }
        self.job_counter = 0
        self.down: list[str] = []

    @property
    def waiting_count(self) -> int:
        return sum(len(w) for w in self.waiting.values())

    # -- output ---------------------------------------------------------------------------

    def _sha(self) -> str:
        self.batches += 1
        return hashlib.sha1(f"synthetic-{self.batches}".encode()).hexdigest()

    def _emit(self, events: Emitted, actor: str, cause: str) -> None:
        self.batches += 1
        prefix = f"synth/{self.batches}"
        batch = [
            NewEvent(
                id=f"{prefix}/{i}",
                type=t,
                schema_version=EVENT_TYPES[t].schema_version,
                data=d,
                actor=actor,
                cause=cause,
            )
            for i, (t, d) in enumerate(events)
        ]
        self.out.append((self.stamp, batch))

    def _commit(
        self,
        events: Emitted,
        author: tuple[str, str],
        subject: str,
        approvers: tuple[str, ...] = (),
    ) -> str:
        sha = self._sha()
        commit = {
            "sha": sha,
            "author": author[0],
            "author_email": author[1],
            "committed_at": self.stamp,
            "subject": subject,
            "approvers": list(approvers),
            "authored_at": self.stamp,
            "committer": author[0],
            "committer_email": author[1],
        }
        events.append(("CommitApplied", {"commit": commit, "changes": len(events)}))
        actor = f"{author[0]} <{author[1]}>"
        if approvers:
            actor += f" (approved by {', '.join(approvers)})"
        self._emit(events, actor, sha)
        return sha

    # -- the cluster ----------------------------------------------------------------------

    def bootstrap(self) -> None:
        events: Emitted = []
        cluster = ClusterSpec(
            "synthetic",
            ("nvlink", "rack", "zone"),
            tuple(GpuFlavor(f, m, g) for f, m, g, _, _ in FLAVORS),
            tuple(PriorityClass(n, v) for n, v in PRIORITIES),
            "normal",
        )
        events.append(("ClusterConfigured", {"cluster": to_data(cluster)}))
        events.append(("PolicyChanged", {"policy": to_data(Policy())}))
        for flavor, _, _, gpus, count in FLAVORS:
            for i in range(count):
                dedicated = flavor == "h100-80g" and i >= count - 4
                name = f"{flavor.split('-')[0]}-{i:03d}"
                region = "eu-central" if dedicated or i % 5 == 0 else "eu-west"
                node = Node(
                    name=name,
                    flavor=flavor,
                    gpus=gpus,
                    cpu_milli=192_000,
                    memory_mib=2_097_152,
                    topology={
                        "nvlink": f"{name[:4]}-nvl-{i // 2}",
                        "rack": f"{name[:4]}-r{i // 16}",
                    },
                    region=region,
                    isolation=Isolation.DEDICATED if dedicated else Isolation.SHARED,
                )
                sim = SimNode(name, flavor, gpus, region, dedicated, list(range(gpus)))
                self.nodes[name] = sim
                self.by_flavor.setdefault(flavor, []).append(sim)
                events.append(("NodeRegistered", {"node": to_data(node)}))
        sha = self._commit(events, ADMINS[0], "Bootstrap the cluster")
        self._solve(sha)
        events = [
            ("QueueConfigured", {"queue": to_data(self._queue(team, cohort, 1.0))})
            for team, cohort in TEAMS
        ]
        sha = self._commit(
            events, ADMINS[0], "Add the teams' queues", (f"{ADMINS[1][0]} <{ADMINS[1][1]}>",)
        )
        self._solve(sha)

    def _queue(self, team: str, cohort: str | None, scale: float) -> Queue:
        quotas = []
        share = {"research": 0.6, "product": 0.35, None: 0.05}[cohort]
        members = sum(1 for _, c in TEAMS if c == cohort)
        for flavor, _, _, gpus, count in FLAVORS:
            if cohort is None and flavor != "h100-80g":
                continue
            capacity = gpus * count
            nominal = milli_from_gpus(max(8, int(capacity * share / members * scale)))
            borrowing = None if cohort is None else nominal
            quotas.append(FlavorQuota(flavor, nominal, borrowing, None))
        self.ceiling[team] = {q.flavor: q.nominal + (q.borrowing_limit or 0) for q in quotas}
        return Queue(name=team, team=team, cohort=cohort, quotas=tuple(quotas))

    # -- steps ----------------------------------------------------------------------------

    def step(self) -> None:
        self.now += timedelta(seconds=self.rng.expovariate(1 / self.mean_gap_s))
        self.stamp = format_time(self.now)
        roll = self.rng.random()
        if roll < 0.50:
            self._submit()
        elif roll < 0.93:
            self._finish()
        elif roll < 0.95:
            self._withdraw()
        elif roll < 0.965:
            self._node_event()
        elif roll < 0.98:
            self._priority_change()
        elif roll < 0.99:
            self._quota_change()
        elif roll < 0.995:
            self._reject()
        else:
            self._policy_change()

    def _spec(self, job: SimJob, pclass: str) -> dict[str, Any]:
        """`to_data` of the job's `Job`, written out: the generic codec is the slow part here."""
        name = job.key.split("/", 1)[1]
        return {
            "name": name,
            "queue": job.queue,
            "replicas": job.replicas,
            "resources": {
                "gpu_milli": milli_from_gpus(job.gpus_each),
                "cpu_milli": 8000 * job.gpus_each,
                "memory_mib": 65536 * job.gpus_each,
            },
            "priority_class": pclass,
            "priority": job.priority,
            "min_replicas": None,
            "gpu_flavors": [job.flavor],
            "topology": None,
            "preemptible": job.preemptible,
            "checkpoint_interval_minutes": None,
            "isolation": "dedicated" if job.dedicated else "shared",
            "residency": list(job.residency),
            "file": f"teams/{job.queue}/jobs/{name}.yaml",
            "submitted_at": self.stamp,
            "submission": 0,
            "template": None,
            "retry": None,
            "time_limit_minutes": None,
            "service": "",
            "spread": [],
            "kind": "Job",
            "suspend": False,
            "idle_suspend_after_minutes": None,
            "resume": "",
        }

    def _submit(self) -> None:
        team, _ = self.rng.choice(TEAMS)
        waiting = sum(1 for w in self.waiting.values() for j in w.values() if j.queue == team)
        if waiting >= MAX_WAITING:
            return
        user = self.rng.choice(self.users[team])
        events: Emitted = []
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            self.job_counter += 1
            flavor = "h100-80g" if team in ("fraud", "risk") else self.rng.choice(FLAVORS)[0]
            per_node = {f: g for f, _, _, g, _ in FLAVORS}[flavor]
            gpus_each = self.rng.choice([g for g in (1, 2, 4, 8) if g <= per_node])
            replicas = self.rng.choice((1, 1, 1, 2, 4)) if gpus_each == per_node else 1
            pclass, priority = self.rng.choice(PRIORITIES)
            job = SimJob(
                key=f"{team}/job-{self.job_counter}",
                queue=team,
                flavor=flavor,
                replicas=replicas,
                gpus_each=per_node if team == "fraud" else gpus_each,
                priority=priority,
                preemptible=self.rng.random() > 0.1,
                dedicated=team == "fraud",
                residency=("eu-central",) if team in ("fraud", "risk") else (),
            )
            self.waiting[priority][job.key] = job
            events.append(("JobSubmitted", {"job": self._spec(job, pclass)}))
        sha = self._commit(events, user, f"{team}: {len(events)} job(s)")
        self._solve(sha)

    def _finish(self) -> None:
        if not self.running:
            return
        # Each running job ends with the same chance at every finish step (jobs last about
        # an hour), so the cluster settles where arrivals and endings balance.
        expected = len(self.running) * FINISH_HAZARD
        count = int(expected) + (1 if self.rng.random() < expected % 1 else 0)
        if count == 0:
            return
        keys = list(self.running)
        done = {keys[self.rng.randrange(len(keys))] for _ in range(count)}
        events: Emitted = []
        for key in sorted(done):
            self._release(self.running[key])
            events.append(("JobFinished", {"job": key, "at": ""}))
        cause = f"kubernetes/{self.batches}"
        self._emit(events, "kubernetes", cause)
        self._solve(cause)

    def _withdraw(self) -> None:
        pool = [j for w in self.waiting.values() for j in list(w.values())[:5]]
        pool += list(self.running.values())[:5]
        if not pool:
            return
        job = self.rng.choice(pool)
        self._release(job)
        self.waiting[job.priority].pop(job.key, None)
        user = self.rng.choice(self.users[job.queue])
        sha = self._commit([("JobWithdrawn", {"job": job.key})], user, f"withdraw {job.key}")
        self._solve(sha)

    def _node_event(self) -> None:
        """A node fails or is drained; or, more often, one that is down comes back."""
        if self.down and (self.rng.random() < 0.6 or len(self.down) >= 3):
            node = self.nodes[self.down.pop(0)]
            node.ready = True
        else:
            node = self.nodes[
                self.rng.choice([n for n in sorted(self.nodes) if self.nodes[n].ready])
            ]
            node.ready = False
            self.down.append(node.name)
        state = "Ready" if node.ready else self.rng.choice(("Failed", "Failed", "Drained"))
        cause = f"inventory/{self.batches}"
        self._emit(
            [("NodeStateChanged", {"node": node.name, "state": state, "reason": "inventory"})],
            "inventory:static",
            cause,
        )
        self._solve(cause, displaced=None if node.ready else node.name)

    def _priority_change(self) -> None:
        pool = [j for w in self.waiting.values() for j in list(w.values())[:5]]
        pool += list(self.running.values())[:5]
        if not pool:
            return
        job = self.rng.choice(pool)
        pclass, priority = self.rng.choice(PRIORITIES)
        if job.key in self.waiting[job.priority]:
            del self.waiting[job.priority][job.key]
            self.waiting[priority][job.key] = job
        job.priority = priority
        user = self.rng.choice(self.users[job.queue])
        sha = self._commit(
            [
                (
                    "JobChanged",
                    {
                        "job": self._spec(job, pclass),
                        "fields": ["priority_class", "priority"],
                    },
                )
            ],
            user,
            f"reprioritise {job.key}",
        )
        self._solve(sha)

    def _quota_change(self) -> None:
        team, cohort = self.rng.choice(TEAMS)
        queue = self._queue(team, cohort, self.rng.choice((0.8, 1.0, 1.2)))
        author = self.rng.choice(ADMINS)
        other = ADMINS[1] if author == ADMINS[0] else ADMINS[0]
        approvers = (f"{other[0]} <{other[1]}>",) if self.rng.random() < 0.9 else ()
        sha = self._commit(
            [("QueueConfigured", {"queue": to_data(queue)})],
            author,
            f"{team}: new quota",
            approvers,
        )
        self._solve(sha)

    def _reject(self) -> None:
        team, _ = self.rng.choice(TEAMS)
        user = self.rng.choice(self.users[team])
        sha = self._sha()
        info = CommitInfo(sha, user[0], user[1], format_time(self.now), "broken spec")
        error = {
            "file": f"teams/{team}/jobs/x.yaml",
            "line": 3,
            "column": 13,
            "path": "$.spec.replicas",
            "message": "'four' is not of type 'integer'",
            "code": "schema",
        }
        self._emit(
            [("CommitRejected", {"commit": to_data(info), "errors": [error]})], info.actor, sha
        )

    def _policy_change(self) -> None:
        policy = Policy(move_cost=self.rng.choice((0.5, 1.0, 2.0)))
        sha = self._commit(
            [("PolicyChanged", {"policy": to_data(policy)})],
            ADMINS[0],
            "tune the move cost",
            (f"{ADMINS[1][0]} <{ADMINS[1][1]}>",),
        )
        self._solve(sha)

    # -- placement ------------------------------------------------------------------------

    def _release(self, job: SimJob) -> None:
        if job.placed is None:
            return
        for r in job.placed:
            self.nodes[r["node"]].free.extend(r["gpus"])
        self.use[(job.queue, job.flavor)] -= job.milli
        job.placed = None
        self.running.pop(job.key, None)

    def _fit(self, job: SimJob) -> list[dict[str, Any]] | None:
        if self.use.get((job.queue, job.flavor), 0) + job.milli > self.ceiling[job.queue].get(
            job.flavor, 0
        ):
            return None
        placed: list[dict[str, Any]] = []
        for node in self.by_flavor[job.flavor]:
            free = node.free
            if len(free) < job.gpus_each or not node.ready or node.dedicated != job.dedicated:
                continue
            if job.dedicated and len(free) < node.gpus:
                continue
            if job.residency and node.region not in job.residency:
                continue
            room = len(free) // job.gpus_each
            for _ in range(min(room, job.replicas - len(placed))):
                placed.append({"node": node.name, "gpus": [], "gpu_milli": GPU_MILLI})
            if len(placed) == job.replicas:
                break
        if len(placed) < job.replicas:
            return None
        for r in placed:
            free = self.nodes[r["node"]].free
            taken = sorted(free[: job.gpus_each])
            del free[: job.gpus_each]
            r["gpus"] = taken
        return placed

    def _place(self, job: SimJob, placed: list[dict[str, Any]]) -> None:
        job.placed = placed
        key = (job.queue, job.flavor)
        self.use[key] = self.use.get(key, 0) + job.milli
        job.pending_reason = None
        self.running[job.key] = job
        self.waiting[job.priority].pop(job.key, None)

    def _solve(self, cause: str, displaced: str | None = None) -> None:
        events: Emitted = []
        solve_id = f"{cause}/solve"
        at = self.stamp
        counts = {"placed": 0, "moved": 0, "preempted": 0, "pending": 0}
        if displaced is not None:
            hit = [
                j
                for j in self.running.values()
                if j.placed and any(r["node"] == displaced for r in j.placed)
            ]
            for job in sorted(hit, key=lambda j: j.key):
                self._release(job)
                fit = self._fit(job)
                if fit is not None:
                    self._place(job, fit)
                    counts["moved"] += 1
                    events.append(
                        (
                            "PlacementDecided",
                            self._decided(
                                job, "moved", f"node {displaced} is not Ready", solve_id, at
                            ),
                        )
                    )
                else:
                    counts["preempted"] += 1
                    job.pending_reason = "preempted"
                    self.waiting[job.priority][job.key] = job
                    events.append(
                        (
                            "JobPreempted",
                            {
                                "job": job.key,
                                "reason": f"node {displaced} is not Ready; no other place",
                                "preempted_by": None,
                                "lost_gpu_seconds": 0.0,
                                "solve_id": solve_id,
                                "rule": "place-gone",
                                "at": at,
                            },
                        )
                    )
        # The oldest few of each priority, and a few at random: a blocked head does not stall all.
        attempts: list[SimJob] = []
        for _, priority in reversed(PRIORITIES):
            attempts += list(itertools.islice(self.waiting[priority].values(), 3))
        everyone = [j for w in self.waiting.values() for j in itertools.islice(w.values(), 40)]
        if everyone:
            attempts += self.rng.sample(everyone, min(4, len(everyone)))
        attempts = list({j.key: j for j in attempts}.values())
        for job in attempts:
            fit = self._fit(job)
            if fit is None and job.priority >= 900 and self.rng.random() < 0.3:
                victim = self._victim(job)
                if victim is not None:
                    self._release(victim)
                    victim.pending_reason = "preempted"
                    self.waiting[victim.priority][victim.key] = victim
                    counts["preempted"] += 1
                    events.append(
                        (
                            "JobPreempted",
                            {
                                "job": victim.key,
                                "reason": f"preempted by {job.key} (priority {job.priority} > {victim.priority})",
                                "preempted_by": job.key,
                                "lost_gpu_seconds": 60.0,
                                "solve_id": solve_id,
                                "rule": "within-queue",
                                "at": at,
                            },
                        )
                    )
                    fit = self._fit(job)
            if fit is not None:
                self._place(job, fit)
                counts["placed"] += 1
                events.append(
                    ("PlacementDecided", self._decided(job, "admitted", "admitted", solve_id, at))
                )
            else:
                reason = (
                    f"no room for {job.replicas} x {job.gpus_each} {job.flavor} GPU "
                    f"within queue {job.queue}'s quota"
                )
                if job.pending_reason != reason:
                    job.pending_reason = reason
                    counts["pending"] += 1
                    events.append(
                        (
                            "JobPending",
                            {
                                "job": job.key,
                                "reason": reason,
                                "constraint": f"quota__{job.queue}__{job.flavor}",
                                "solve_id": solve_id,
                            },
                        )
                    )
        events.append(
            (
                "SolveCompleted",
                {
                    "solve_id": solve_id,
                    "solver": "greedy",
                    "status": "heuristic",
                    "objective": float(len(self.running)),
                    "bound": None,
                    "gap": None,
                    "seconds": 0.001,
                    "variables": 0,
                    "constraints": 0,
                    "placed": counts["placed"],
                    "kept": len(self.running) - counts["placed"] - counts["moved"],
                    "moved": counts["moved"],
                    "preempted": counts["preempted"],
                    "pending": counts["pending"],
                    "broken_soft": [],
                    "plan_source": "greedy",
                    "fallback": "",
                    "levels": "",  # greedy: no objective levels (SolveCompleted v3)
                },
            )
        )
        self._emit(events, "solver", cause)

    def _victim(self, job: SimJob) -> SimJob | None:
        for other in self.running.values():
            if (
                other.queue == job.queue
                and other.flavor == job.flavor
                and other.priority < job.priority
                and (other.preemptible or self.rng.random() < 0.02)
            ):
                return other
        return None

    @staticmethod
    def _decided(job: SimJob, action: str, reason: str, solve_id: str, at: str) -> dict[str, Any]:
        return {
            "job": job.key,
            "flavor": job.flavor,
            "replicas": job.placed,
            "action": action,
            "reason": reason,
            "solve_id": solve_id,
            "at": at,
            # PlacementDecided v2: the simulated moves are a lost node's (place-gone); its
            # jobs restart from their last checkpoint, which the simulation does not track.
            "rule": "place-gone" if action == "moved" else "",
            "lost_gpu_seconds": 0.0,
        }


def synthetic_events(events: int, seed: int, mean_gap_s: float = 8.0) -> Iterator[StoredEvent]:
    """Exactly `events` sealed events of the simulation, each batch with its own time;
    `mean_gap_s` between steps (the default makes a million events about a month)."""
    sim = Simulation(seed, mean_gap_s)
    sim.bootstrap()
    last, prev_hash = 0, GENESIS_HASH
    while last < events:
        while not sim.out:
            sim.step()
        when, batch = sim.out.pop(0)
        sealed = seal_batch(
            batch[: events - last], first_seq=last + 1, time=when, prev_hash=prev_hash
        )
        last, prev_hash = sealed[-1].seq, sealed[-1].hash
        yield from sealed


def synthetic_log(
    path: Path, events: int, seed: int, *, echo: Callable[[str], None] | None = None
) -> SQLiteEventLog:
    """A SQLite log of `synthetic_events`, made once per (events, seed) and cached.

    Batches go in through `EventLog.import_events` thousands at a time: one
    `append` per batch, one transaction each, would take minutes for a million.
    """
    done_marker = path.with_name(path.name + ".done")
    if path.exists() and done_marker.exists():
        return SQLiteEventLog(path)
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), done_marker):
        leftover.unlink(missing_ok=True)
    log = SQLiteEventLog(path)
    written = 0
    pending: list[StoredEvent] = []
    started = time.perf_counter()
    for event in synthetic_events(events, seed):
        pending.append(event)
        if len(pending) >= 5000 or event.seq == events:
            log.import_events(pending, expected_last_seq=written)
            written = event.seq
            pending = []
            if echo is not None and written % 100_000 == 0:
                echo(f"  generated {written:,} events ({time.perf_counter() - started:.0f}s)")
    done_marker.write_text(json.dumps({"events": written, "seed": seed}))
    return log
