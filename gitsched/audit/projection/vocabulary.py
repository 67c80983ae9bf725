"""The audit views' words: how intervals start and end, the compliance checks, the kinds of
versioned facts, and the few formatters every view and query shares.

One place for them, so the fold that writes a word and the query that reads it
cannot drift apart; nothing here holds state.
"""

from __future__ import annotations

import json
from datetime import datetime

FORMAT_VERSION = "12"  # 7: the attempt (retries); 8: reservations; 9: the platform owners'
# approvals; 10: services; 11: suspend and resume (a job's kind, who resumed it)
# 12: services judged by approval.requireMemberForJobs, their counts (service_counts) and
# their replicas' kind of work; StrictFIFO order re-judged

# How a placement interval started and ended; `history` shows them like sacct's State.
START_ADMITTED, START_MOVED = "admitted", "moved"
END_MOVED, END_PREEMPTED, END_STOPPED = "moved", "preempted", "stopped"
END_FINISHED, END_WITHDRAWN, END_FAILED = "finished", "withdrawn", "failed"
END_TIMED_OUT = "timed_out"  # stopped at its time limit (JobTimedOut, docs/time.md)
END_NODE_FAILED, END_NODE_DRAINED, END_NODE_REMOVED = "node_failed", "node_drained", "node_removed"
NODE_ENDS = (END_NODE_FAILED, END_NODE_DRAINED, END_NODE_REMOVED)

# Compliance checks, in the order the report lists them.
CHECK_ISOLATION = "isolation"
CHECK_RESIDENCY = "residency"
CHECK_PREEMPTION = "non-preemptible"
CHECK_LIMITS = "queue-limits"
CHECK_APPROVAL = "quota-approval"
CHECK_PREEMPTION_RULES = "preemption-rules"
CHECK_RESERVATIONS = "reservations"
CHECK_MEMBERSHIP = "job-membership"
CHECK_STRICT_FIFO = "strict-fifo"
CHECKS = (
    CHECK_ISOLATION,
    CHECK_RESIDENCY,
    CHECK_PREEMPTION,
    CHECK_LIMITS,
    CHECK_APPROVAL,
    CHECK_PREEMPTION_RULES,
    CHECK_RESERVATIONS,
    CHECK_MEMBERSHIP,
    CHECK_STRICT_FIFO,
)

# Versioned facts for point-in-time queries: one row per stretch of seqs a fact held.
KIND_NODE, KIND_QUEUE, KIND_PENDING, KIND_POLICY, KIND_CLUSTER = (
    "node",
    "queue",
    "pending",
    "policy",
    "cluster",
)
# The kind of work of a job that is not a plain Job (a Workspace), while the log knows it:
# `audit usage --by kind` (docs/workspaces.md). Plain jobs have none: most jobs cost nothing.
KIND_WORK = "work"
# A workspace the idle rule suspended, with the WorkspaceSuspended evidence, until resumed.
KIND_IDLE_SUSPENDED = "idle-suspended"
# The kind of work a service's replicas count as (their `work` version's kind).
SERVICE_KIND = "InferenceService"

# A checkpoint lists every open row, so a point-in-time query reads that list plus
# at most this many events' worth of rows; spacing grows with the open set so
# checkpoints never cost more than about one row per event.
CHECKPOINT_MIN_EVENTS = 4096

DAY = 86_400.0


def person(actor: str) -> str:
    """`Name <email>` of a git actor, without the `(approved by ...)` suffix."""
    return actor.split(" (approved by ", 1)[0]


def email_of(who: str) -> str:
    start, end = who.rfind("<"), who.rfind(">")
    if 0 <= start < end:
        return who[start + 1 : end].strip().lower()
    return who.strip().lower()


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# json.dumps with options builds an encoder per call; these are built once.
compact_json = json.JSONEncoder(separators=(",", ":")).encode
canonical_json = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
