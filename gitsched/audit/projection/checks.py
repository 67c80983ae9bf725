"""The compliance checks the audit fold runs as it reads: each event judged against what
the log said before it, so a violation is found at the event that made it.

Isolation, residency, non-preemptible jobs, the preemption rules and quota approvals
are here; queue limits are the usage ledger's (`gitsched.audit.projection.ledger`), which also
numbers every violation. `gitsched.audit.compliance` lists the results and their counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gitsched.audit.projection import preemption_rules
from gitsched.audit.projection.ledger import Usage
from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import Envelope, JobInfo, ProjectionState, Running
from gitsched.audit.projection.vocabulary import (
    CHECK_APPROVAL,
    CHECK_ISOLATION,
    CHECK_MEMBERSHIP,
    CHECK_PREEMPTION,
    CHECK_PREEMPTION_RULES,
    CHECK_RESERVATIONS,
    CHECK_RESIDENCY,
    CHECK_STRICT_FIFO,
    KIND_PENDING,
    compact_json,
    email_of,
)
from gitsched.engine.model import Approval, Owner
from gitsched.engine.placement.explain import NEVER_RUNS
from gitsched.engine.placement.preemption import Rule, wait_key
from gitsched.engine.suspension import SUSPENDED
from gitsched.engine.timelimits import plus_minutes
from gitsched.policies.approval import (
    check_submitters,
    judge_team,
    may_approve,
    namespace_findings,
    recorded_vouches,
    team_label,
    trailer_vouches,
)

# Pending constraints of jobs the engine leaves out of a decision (engine.core's
# placement instance): a requeued job in its backoff, a suspended one.
_LEFT_OUT = frozenset(("backoff", SUSPENDED))


class ComplianceChecks:
    """The checks of one fold; violations go to its `Usage`, which numbers them in order."""

    def __init__(self, state: ProjectionState, usage: Usage) -> None:
        self.state = state
        self.usage = usage
        # Who runs on each dedicated node: what the isolation check needs to see. The
        # fold keeps it as intervals open and close.
        self.node_jobs: dict[str, set[str]] = {
            name: self.jobs_on(name) for name, node in state.nodes.items() if node.dedicated
        }

    def jobs_on(self, node: str) -> set[str]:
        return {job for job, run in self.state.running.items() if node in run.nodes}

    def _violation(
        self,
        check: str,
        stored: Envelope,
        time: str,
        subject: str,
        message: str,
        evidence: Iterable[int],
        batch: Batch,
    ) -> None:
        self.usage.violation(
            check, stored.seq, time, subject, message, compact_json(sorted(set(evidence))), batch
        )

    def placement(
        self, key: str, job: JobInfo, nodes: list[str], stored: Envelope, time: str, batch: Batch
    ) -> None:
        """Isolation and residency of a job placed on `nodes` (or of the jobs on a node
        registered again under them)."""
        s = self.state
        s.checked[CHECK_ISOLATION] += 1
        for name in nodes:
            node = s.nodes.get(name)
            if node is not None and not job.dedicated and not node.dedicated:
                continue  # shared job on a shared node: the common case
            holders = self.node_jobs.get(name) or self.jobs_on(name)
            evidence = [stored.seq, job.seq] + ([node.seq] if node else [])
            if job.dedicated and (node is None or not node.dedicated):
                self._violation(
                    CHECK_ISOLATION,
                    stored,
                    time,
                    key,
                    f"regulated job {key} placed on shared node {name}",
                    evidence,
                    batch,
                )
                continue
            if job.dedicated:
                others = sorted(holders - {key})
            else:
                others = sorted(
                    o
                    for o in holders
                    if o != key and (j := s.jobs.get(o)) is not None and j.dedicated
                )
            if not others:
                continue
            message = (
                f"regulated job {key} shares node {name} with {', '.join(others)}"
                if job.dedicated
                else f"job {key} placed next to regulated job {others[0]} on node {name}"
            )
            self._violation(
                CHECK_ISOLATION,
                stored,
                time,
                key if job.dedicated else others[0],
                message,
                evidence + [s.running[o].seq for o in others if o in s.running],
                batch,
            )
        if job.residency:
            s.checked[CHECK_RESIDENCY] += 1
            for name in nodes:
                node = s.nodes.get(name)
                region = node.region if node else None
                if region not in job.residency:
                    self._violation(
                        CHECK_RESIDENCY,
                        stored,
                        time,
                        key,
                        f"job {key} must stay in {', '.join(job.residency)} but ran on "
                        f"{name} in region {region or 'unknown'}",
                        [stored.seq, job.seq] + ([node.seq] if node else []),
                        batch,
                    )

    def reservations(
        self, key: str, job: JobInfo, nodes: list[str], stored: Envelope, time: str, batch: Batch
    ) -> None:
        """A job started at `time` must not delay a reservation held then: unless it is
        ahead of the reserved job in wait order, or its limit ends by the reservation's
        start, or its queue reclaims what the reservation borrows (the engine's rule,
        engine.placement.preemption.reservation_yields), it may not take a reserved node
        (engine.placement.reservations)."""
        s = self.state
        if not s.reservations:
            return
        s.checked[CHECK_RESERVATIONS] = s.checked.get(CHECK_RESERVATIONS, 0) + 1
        for r in s.reservations:
            held_for = s.jobs.get(r["job"])
            if r["job"] == key or held_for is None or r["start"] <= time:
                continue
            # the engine's wait order (greedy's priority_key is the same), on the view's
            # copy of the jobs
            if wait_key(job.priority, job.submission, job.submitted_at, key) < wait_key(
                held_for.priority, held_for.submission, held_for.submitted_at, r["job"]
            ):
                continue  # ahead of the reserved job: it may take what it fits in
            if job.time_limit_minutes is not None and (
                plus_minutes(time, job.time_limit_minutes) <= r["start"]
            ):
                continue  # it ends before the reservation starts
            taken = sorted(set(nodes) & set(r["nodes"]))
            if not taken:
                continue
            if preemption_rules.reservation_yields_to(s, key, job, r):
                continue  # its queue reclaims what the reservation borrows
            runs = (
                "no time limit"
                if job.time_limit_minutes is None
                else f"a limit of {job.time_limit_minutes} min"
            )
            self._violation(
                CHECK_RESERVATIONS,
                stored,
                time,
                key,
                f"job {key} started on {', '.join(taken)}, reserved for {r['job']} from"
                f" {r['start']}, with {runs}: it delays the reservation",
                [stored.seq, job.seq, held_for.seq],
                batch,
            )

    def strict_fifo(
        self, stored: Envelope, admitted: list[list[Any]], time: str, batch: Batch
    ) -> None:
        """The jobs one solve admitted (`admitted`: [seq, key]) in StrictFIFO queues, judged
        once the solve is read (its SolveCompleted), as `engine.placement.strict_fifo` holds
        them: none may start while a job ahead of it in its queue (`wait_key`, the engine's
        wait order) still waits, unless that job can never run, waits out a retry backoff
        or is suspended (the engine leaves those out of the decision)."""
        s = self.state
        s.checked[CHECK_STRICT_FIFO] = s.checked.get(CHECK_STRICT_FIFO, 0) + len(admitted)
        waiting: dict[str, list[tuple[tuple[int, int, str, str], str]]] = {}
        for seq, key in admitted:
            job = s.jobs.get(key)
            if job is None or key not in s.running:
                continue  # moved off again in the same solve: no start to judge
            if job.queue not in waiting:
                waiting[job.queue] = sorted(
                    (wait_key(o.priority, o.submission, o.submitted_at, other), other)
                    for other, o in s.jobs.items()
                    if o.queue == job.queue and other not in s.running and self._blocks(other)
                )
            mine = wait_key(job.priority, job.submission, job.submitted_at, key)
            ahead = [other for order, other in waiting[job.queue] if order < mine]
            if not ahead:
                continue
            first = ahead[0]
            self._violation(
                CHECK_STRICT_FIFO,
                stored,
                time,
                key,
                f"job {key} of StrictFIFO queue {job.queue} started while {first}"
                + (f" and {len(ahead) - 1} more" if len(ahead) > 1 else "")
                + " waited ahead of it",
                [seq, job.seq, s.jobs[first].seq],
                batch,
            )

    def _blocks(self, key: str) -> bool:
        """Whether a waiting job was in the decision, so it holds its StrictFIFO queue: not
        one that can never run (it would block the queue for good), nor one waiting out a
        retry backoff or suspended (left out of the decision, engine.core)."""
        version = self.state.versions.get(f"{KIND_PENDING}\x1f{key}")
        if version is None:
            return True  # submitted, not yet decided: it is in the decision
        constraint = str(json.loads(version[6]).get("constraint", ""))
        return not constraint.startswith(NEVER_RUNS) and constraint not in _LEFT_OUT

    def preemption_rules(
        self,
        stored: Envelope,
        key: str,
        d: dict[str, Any],
        open_run: Running,
        trouble: bool,
        time: str,
        batch: Batch,
    ) -> None:
        """A stop of a running job, judged by the engine's preemption rule."""
        s = self.state
        s.checked[CHECK_PREEMPTION_RULES] = s.checked.get(CHECK_PREEMPTION_RULES, 0) + 1
        broken = preemption_rules.check(s, key, d, open_run, trouble)
        if broken is not None:
            message, evidence = broken
            self._violation(
                CHECK_PREEMPTION_RULES, stored, time, key, message, [stored.seq, *evidence], batch
            )

    def non_preemptible(
        self,
        stored: Envelope,
        key: str,
        job: JobInfo,
        d: dict[str, Any],
        run: Running | None,
        node_caused: bool,
        reason: str,
        time: str,
        batch: Batch,
    ) -> None:
        """A non-preemptible job stopped by anything but its node going away, or a reclaim of
        borrowed capacity (a non-preemptible job does not borrow: what it holds beyond its
        queue's nominal quota is reclaimable, engine.placement.preemption.protected)."""
        s = self.state
        s.checked[CHECK_PREEMPTION] += 1
        borrowed = run is not None and preemption_rules.held_borrowed(
            s, key, job.queue, run.flavor, run
        )
        # Suspended (spec.suspend, or a workspace's own idle rule) is its owner's choice.
        suspended = d.get("rule") == Rule.SUSPEND
        if not job.preemptible and not node_caused and not borrowed and not suspended:
            by = d.get("preempted_by")
            self._violation(
                CHECK_PREEMPTION,
                stored,
                time,
                key,
                f"non-preemptible job {key} was preempted"
                + (f" by {by}" if by else "")
                + f": {reason}",
                [stored.seq, job.seq] + ([run.seq] if run else []),
                batch,
            )

    def approvals(
        self,
        stored: Envelope,
        commit: dict[str, Any],
        governed: list[list[Any]],
        records: list[dict[str, Any]],
        owners_base: dict[str, list[list[str]]],
        signed_base: bool | None,
        time: str,
        batch: Batch,
    ) -> None:
        """Every team whose queue or OWNERS a commit changed: was it approved by an owner
        at the commit's base?"""
        s = self.state
        s.checked[CHECK_APPROVAL] += 1
        base = {t: people for t, people in {**s.owners, **owners_base}.items() if people}
        signed = bool(signed_base) or bool(s.policy.get("require_signed_approval"))
        by_team = {r["team"]: r for r in records}
        for team in sorted({c[3] for c in governed if c[3]}):
            evidence = [stored.seq] + [c[0] for c in governed if c[3] == team]
            record = by_team.get(team)
            self._judge_approval(stored, time, commit, team, base, record, signed, evidence, batch)

    def namespaces(
        self, stored: Envelope, commit: dict[str, Any], new: list[str], time: str, batch: Batch
    ) -> None:
        """The teams a commit created may not take a namespace the platform keeps, nor one
        outside the Policy's approval.teamNamespaces (`gitsched.policies.approval.namespace_findings`)."""
        named = self.state.policy.get("team_namespaces")
        for finding in namespace_findings(new, named):
            team = finding.file.split("/")[1]
            self._violation(
                CHECK_APPROVAL,
                stored,
                time,
                team,
                f"{commit['sha'][:12]} created {finding.message}",
                [stored.seq],
                batch,
            )

    def membership(
        self,
        stored: Envelope,
        commit: dict[str, Any],
        jobs: dict[str, list[tuple[int, str]]],
        records: list[dict[str, Any]],
        owners_base: dict[str, list[list[str]]],
        members_base: dict[str, list[str]],
        signed: bool,
        time: str,
        batch: Batch,
    ) -> None:
        """approval.requireMemberForJobs, run again on the log: the jobs a commit changed,
        by team, against the members and owners at its base (`check_submitters`)."""
        s = self.state
        s.checked[CHECK_MEMBERSHIP] = s.checked.get(CHECK_MEMBERSHIP, 0) + 1
        owners = {
            t: [Owner(e, k) for e, k in people] for t, people in owners_base.items() if people
        }
        by_team = {r["team"]: r for r in records}
        for team in sorted(jobs):
            record = by_team.get(team)
            if record is not None:
                authors = [a.lower() for a in record.get("authors", ())]
                claims = recorded_vouches([Approval(**a) for a in record.get("approvals", ())])
            else:
                authors = [(commit.get("author_email") or "").lower()]
                claims = ()
            if not signed:
                claims += trailer_vouches(commit.get("approvers", ()), commit["sha"])
            (verdict,) = check_submitters(
                job_files={team: [file for _, file in jobs[team]]},
                base_owners=owners,
                base_members=members_base,
                authors=authors,
                vouches=claims,
                signed_required=signed,
            )
            if verdict.satisfied:
                continue
            self._violation(
                CHECK_MEMBERSHIP,
                stored,
                time,
                team,
                f"jobs of team {team} in {commit['sha'][:12]}: {verdict.missing_text()}",
                [stored.seq] + [seq for seq, _ in jobs[team]],
                batch,
            )

    def _judge_approval(
        self,
        stored: Envelope,
        time: str,
        commit: dict[str, Any],
        team: str,
        base: dict[str, list[list[str]]],
        record: dict[str, Any] | None,
        signed: bool,
        evidence: list[int],
        batch: Batch,
    ) -> None:
        """The reconciler's approval rule, run again on what the log holds: the team's
        owners at the base from OwnersChanged, authors and approvals from ApprovalChecked
        (for a log written before those, the commit's author and trailers)."""
        owners = {t: [Owner(e, k) for e, k in people] for t, people in base.items()}
        listed = list(may_approve(team, owners))
        if record is not None:
            authors = [a.lower() for a in record.get("authors", ())]
            recorded = [Approval(**a) for a in record.get("approvals", ())]
            claims = recorded_vouches(recorded)
            if not signed:
                # the commit's own trailers, so the verdict says why those did not count
                claims += trailer_vouches(commit.get("approvers", ()), commit["sha"])
        else:
            authors = [(commit.get("author_email") or "").lower()]
            recorded = []
            claims = trailer_vouches(commit.get("approvers", ()), commit["sha"])
        verdict = judge_team(
            team,
            listed,
            authors=authors,
            vouches=claims,
            signed_required=signed,
            all_owners=owners,
        )
        emails = {o.email for o in listed}
        counted = {a.approver for a in verdict.approvals}
        shown = [
            {
                "approver": a.approver,
                "owner_at_base": a.approver in emails,
                "counted": a.approver in counted,
                "via": a.via,
                "commit": a.commit,
                "fingerprint": a.fingerprint,
            }
            for a in verdict.approvals or recorded
        ]
        named = {row["approver"] for row in shown}
        for who in commit.get("approvers", ()):
            email = email_of(who)
            if email not in named:
                named.add(email)
                shown.append(
                    {
                        "approver": email,
                        "owner_at_base": email in emails,
                        "counted": email in counted,
                        "via": "trailer",
                        "commit": commit["sha"],
                        "fingerprint": "",
                    }
                )
        status = "bootstrap" if not listed else "approved" if verdict.approvals else "missing"
        batch.approvals.append(
            (
                stored.seq,
                team,
                status,
                compact_json(
                    {
                        "authors": authors,
                        "owners": sorted(emails),
                        "approvals": shown,
                        "refused": list(verdict.refused),
                        "signed_required": signed,
                    }
                ),
            )
        )
        if status != "missing":
            return
        who = ", ".join(authors) or "unknown"
        reasons = "; ".join(verdict.refused)
        self._violation(
            CHECK_APPROVAL,
            stored,
            time,
            team,
            f"change of {team_label(team)} in {commit['sha'][:12]} by {who} has no "
            + ("signed " if signed else "")
            + f"approval from an owner at the base ({', '.join(sorted(emails))})"
            + (f": {reasons}" if reasons else ""),
            evidence,
            batch,
        )
