"""`gitsched plan` as text for a terminal, Markdown for a pull-request comment, and JSON.

The Markdown starts with a fixed marker line and then one summary line, and lists
everything in a stable order, so a CI job can find its own comment and update it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from gitsched import __version__
from gitsched.engine.fairshare import FairShareRow
from gitsched.engine.model import FlavorQuota, Queue, Reservation
from gitsched.engine.placement.plan import SolveStats
from gitsched.engine.placement.reservations import clock_text, when_text
from gitsched.engine.units import gpus_or_none, gpus_text
from gitsched.exit_codes import plan_exit_code
from gitsched.policies.approval import TeamApproval, owners_file
from gitsched.reconciler.plan import (
    TIME_LIMIT_WARNING,
    Action,
    Baseline,
    FieldChange,
    JobEffect,
    PullRequestPlan,
    QueueChange,
    QueueUsage,
    clock_stopped,
)
from gitsched.reconciler.plan_fairness import FairShareView
from gitsched.render import table

MARKER = "<!-- gitsched-plan -->"

_SIGNS = {
    Action.ADMITTED: "+",
    Action.MOVED: "~",
    Action.PREEMPTED: "-",
    Action.WITHDRAWN: "-",
    Action.NEWLY_PENDING: "!",
    Action.STILL_PENDING: ".",
}
_ORDER = (
    Action.ADMITTED,
    Action.MOVED,
    Action.PREEMPTED,
    Action.WITHDRAWN,
    Action.NEWLY_PENDING,
    Action.STILL_PENDING,
)


# -- shared wording --------------------------------------------------------------------------


def _limit(milli: int | None) -> str:
    return "-" if milli is None else gpus_text(milli)


def _arrow(before: str, after: str, arrow: str = "->") -> str:
    return before if before == after else f"{before} {arrow} {after}"


def _weight(q: Queue | None) -> str:
    return "-" if q is None else f"{q.weight:g}"


def quota_rows(change: QueueChange, arrow: str = "->") -> list[list[str]]:
    """One row per flavor: nominal, borrowing limit, lending limit and weight, before -> after."""
    rows = []

    def cells(fq: FlavorQuota | None) -> tuple[str, str, str]:
        if fq is None:
            return ("-", "-", "-")
        return (gpus_text(fq.nominal), _limit(fq.borrowing_limit), _limit(fq.lending_limit))

    for flavor in change.flavors or ("-",):
        before = cells(change.before.quota(flavor) if change.before else None)
        after = cells(change.after.quota(flavor) if change.after else None)
        rows.append(
            [
                change.queue,
                flavor,
                *(_arrow(b, a, arrow) for b, a in zip(before, after, strict=True)),
                _arrow(_weight(change.before), _weight(change.after), arrow),
            ]
        )
    return rows


def queue_field_changes(change: QueueChange) -> list[str]:
    """What else changed in a queue besides its quotas: cohort, priority ceiling, team."""
    if change.before is None or change.after is None:
        return [f"queue {change.queue} {change.status}"]
    out = []
    for label, old, new in (
        ("cohort", change.before.cohort, change.after.cohort),
        ("maxPriorityClass", change.before.max_priority_class, change.after.max_priority_class),
        ("team", change.before.team, change.after.team),
    ):
        if old != new:
            out.append(f"queue {change.queue}: {label} {old or '-'} -> {new or '-'}")
    return out


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def policy_line(c: FieldChange) -> str:
    return f"{c.field}: {_value(c.before)} -> {_value(c.after)}"


def _hours(seconds: float) -> str:
    if seconds < 360:
        return f"{seconds / 60:.0f} GPU-min"
    return f"{seconds / 3600:.1f} GPU-h"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def usage_rows(usage: Sequence[QueueUsage], arrow: str = "->") -> list[list[str]]:
    return [
        [
            u.queue,
            _arrow(_num(u.weight_before), _num(u.weight_after), arrow),
            _arrow(gpus_text(u.gpu_before), gpus_text(u.gpu_after), arrow),
            _arrow(_share(u.share_before), _share(u.share_after), arrow),
        ]
        for u in usage
    ]


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def solve_text(stats: SolveStats | None) -> str:
    if stats is None:
        return "no solve: the change does not touch what placement reads"
    gap = "n/a" if stats.gap is None else f"{stats.gap * 100:.2f}%"
    bound = "" if stats.bound is None else f", bound {stats.bound:.2f}"
    text = (
        f"solver {stats.solver} ({stats.status}), gap {gap}, {stats.seconds:.3f} s, "
        f"objective {stats.objective:.2f}{bound}"
    )
    if stats.fallback:
        text += f"; greedy's plan taken: {stats.fallback}"
    if clock_stopped(stats):
        text += f"; {TIME_LIMIT_WARNING}"
    return text


def lost_total_text(plan: PullRequestPlan) -> str:
    """What the plan's preemptions lose in all, since each job's last checkpoint."""
    stopped = plan.of(Action.PREEMPTED)
    lost = sum(e.lost_gpu_seconds for e in stopped)
    return f"{len(stopped)} preemption(s) lose {lost / 3600:.2f} GPU-h of work since their last checkpoints"


def fair_share_rows_text(view: FairShareView) -> list[list[str]]:
    return [
        [
            r.name,
            r.cohort or "-",
            _share(r.share),
            f"{r.usage_gpu_hours:.1f}",
            _share(r.usage_share),
        ]
        for r in view.queues
    ] + [
        [f"cohort {r.name}", "", _share(r.share), f"{r.usage_gpu_hours:.1f}", _share(r.usage_share)]
        for r in view.cohorts
    ]


# Two tables, two meanings, two names: what each queue holds now for its weight (WEIGHTED
# SHARE), and the share history entitles it to when GPUs are contended (ENTITLED SHARE).
FAIR_HEADERS = [
    "QUEUE",
    "COHORT",
    "ENTITLED SHARE",
    "USED GPU-H (DECAYED)",
    "USED SHARE",
]


def counts_text(plan: PullRequestPlan) -> str:
    parts = [f"{len(plan.of(a))} {a.value}" for a in _ORDER if plan.of(a)]
    return ", ".join(parts) if parts else "no job changes"


def summary_line(plan: PullRequestPlan) -> str:
    """The one line a reviewer reads first."""
    return f"{plan.base.rev} -> {plan.head.rev}: {summary_text(plan)}"


def summary_text(plan: PullRequestPlan) -> str:
    """What the plan amounts to, in one line: counts, queues, approvals, staleness."""
    if not plan.valid:
        files = len({e.file for e in plan.errors})
        return f"HEAD is invalid, {len(plan.errors)} error(s) in {files} file(s)"
    if not plan.changed:
        return "no changes"
    parts = [counts_text(plan)]
    if plan.queue_changes:
        parts.append(f"{len(plan.queue_changes)} queue(s) changed")
    if plan.policy_changes:
        parts.append(f"{len(plan.policy_changes)} policy field(s) changed")
    missing = plan.missing_approvals
    if missing:
        parts.append(f"{len(missing)} approval(s) missing")
    if plan.stale:
        parts.append("STALE base")
    return "; ".join(parts)


def _base_text(plan: PullRequestPlan) -> str:
    if plan.baseline is Baseline.LOG:
        return f"the cluster's current commit (log seq {plan.log_seq})"
    if plan.baseline is Baseline.FRESH:
        return "no log: a fresh solve"
    return "STALE, see below"


def effect_detail(e: JobEffect) -> tuple[str, str]:
    """(where, why) of one job's effect, in words."""
    gpus = f"{gpus_text(e.gpu_milli)} GPU {e.flavor}" if e.flavor else ""
    if e.action is Action.ADMITTED:
        where = f"{gpus} on {', '.join(e.nodes_after)}"
    elif e.action is Action.MOVED:
        where = f"{gpus}: {', '.join(e.nodes_before)} -> {', '.join(e.nodes_after)}"
        if e.rule:
            where += f"; {e.rule}, loses {_hours(e.lost_gpu_seconds)} since its last checkpoint"
    elif e.action in (Action.PREEMPTED, Action.WITHDRAWN) and e.nodes_before:
        where = f"{gpus} on {', '.join(e.nodes_before)}"
        if e.action is Action.PREEMPTED:
            where += f"; loses {_hours(e.lost_gpu_seconds)} since its last checkpoint"
    else:
        where = ""
    why = e.reason
    if e.previous_reason:
        why += f" (was: {e.previous_reason})"
    return where, why


def approval_text(a: TeamApproval) -> str:
    files = ", ".join(a.files)
    if a.unowned:
        return f"{a.team} ({files}): no {owners_file(a.team)} at the base, no approval needed"
    if a.satisfied:
        how = ", ".join(
            f"{x.approver} ({x.via}{', key ' + x.fingerprint if x.fingerprint else ''})"
            for x in a.approvals
        )
        return f"{a.team} ({files}): approved by {how or ', '.join(a.approved_by)}"
    return f"{a.team} ({files}): MISSING, {a.missing_text()}"


# -- text ------------------------------------------------------------------------------------


def reservation_line(r: Reservation) -> str:
    what = f"{gpus_text(r.gpu_milli)} × {r.flavor} GPU" if r.flavor else "its replicas"
    return f"{r.job} from {clock_text(r.start)} on {', '.join(r.nodes)} ({what}){when_text(r)}"


def plan_text(plan: PullRequestPlan) -> str:
    out = [
        f"gitsched plan {plan.base.rev}..{plan.head.rev}",
        f"base  {plan.base.short}  {plan.base.subject}  [{_base_text(plan)}]",
        f"head  {plan.head.short}  {plan.head.subject}",
    ]
    if plan.stale:
        out += ["", f"STALE BASE: {plan.stale}"]
    out += [f"note: {n}" for n in plan.notes]
    if not plan.valid:
        files = len({e.file for e in plan.errors})
        out += ["", "HEAD is invalid; the reconciler would reject it:"]
        out += [f"  {e.format()}" for e in plan.errors]
        out += ["", f"{len(plan.errors)} error(s) in {files} file(s)"]
        return "\n".join(out)
    if plan.warnings:
        out += ["", "Warnings: valid, but can never run as written"]
        out += [f"  {w.format()}" for w in plan.warnings]

    if plan.queue_changes or plan.policy_changes:
        out += ["", "Quota and policy changes"]
        if plan.queue_changes:
            rows = [r for c in plan.queue_changes for r in quota_rows(c)]
            out.append(
                table(
                    ["QUEUE", "FLAVOR", "NOMINAL", "BORROWING LIMIT", "LENDING LIMIT", "WEIGHT"],
                    rows,
                )
            )
        out += [f"  {line}" for c in plan.queue_changes for line in queue_field_changes(c)]
        out += [f"  policy {policy_line(c)}" for c in plan.policy_changes]
    others = [c for c in plan.spec_changes if c.kind not in ("queue", "policy")]
    if others:
        out += ["", "Other spec changes"]
        out += [
            f"  {c.kind} {c.name} {c.action}" + (f" ({c.detail})" if c.detail else "")
            for c in others
        ]

    out += ["", f"Placement effect ({solve_text(plan.solve)}; {plan.kept} job(s) keep their place)"]
    effects = [e for a in _ORDER for e in plan.of(a)]
    if not effects:
        out.append("  nothing moves")
    width = max((len(e.job) for e in effects), default=0)
    for e in effects:
        where, why = effect_detail(e)
        out.append(f"  {_SIGNS[e.action]} {e.action.value:<14} {e.job:<{width}}  {where}".rstrip())
        if why and (e.action is not Action.ADMITTED or why != "admitted"):
            out.append(f"      why: {why}")

    if plan.of(Action.PREEMPTED):
        out.append(f"  {lost_total_text(plan)}")

    if plan.reservations:
        out += ["", "Reservations (expected starts; docs/time.md)"]
        out += [f"  {reservation_line(r)}" for r in plan.reservations]

    if plan.usage:
        out += ["", "GPUs and weighted share per queue now (dominant GPU share / weight)"]
        out.append(table(["QUEUE", "WEIGHT", "GPUS", "WEIGHTED SHARE"], usage_rows(plan.usage)))

    view = plan.fairness
    if view is not None and view.queues:
        out += [
            "",
            f"Entitled share from past usage (usage halves every {view.half_life_hours:g} h; "
            "a queue that used less lately is placed first when GPUs are contended)",
        ]
        out.append(table(FAIR_HEADERS, fair_share_rows_text(view)))
    if view is not None and view.idle:
        out += ["", "Idle GPUs"]
        out += [f"  {n.job}: {n.reason}" for n in view.idle]

    if plan.approvals:
        rule = (
            "enforced: the reconciler rejects the commit without them"
            if plan.approval_enforced
            else "not enforced: approval.requireOwnerApproval is off"
        )
        out += ["", f"Approvals ({rule})"]
        for a in plan.approvals:
            out += [f"  {approval_text(a)}", *(f"    {c}" for c in a.changes)]

    out += ["", f"Plan: {summary_text(plan)}."]
    return "\n".join(out)


# -- markdown --------------------------------------------------------------------------------

_MD_SPECIAL = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "|": "\\|",
        "\\": "\\\\",
        "`": "\\`",
        "*": "\\*",
        "_": "\\_",
        "[": "\\[",
        "]": "\\]",
        "\n": " ",
    }
)


def md(text: object) -> str:
    """Text from the repo, safe in a Markdown table cell: no HTML, no formatting, no links."""
    return str(text).translate(_MD_SPECIAL)


def code(text: object) -> str:
    """Text as a Markdown code span: shown as is, so no escapes (a backtick cannot occur)."""
    return "`" + str(text).replace("`", "'").replace("\n", " ") + "`"


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    return lines


def _details(summary: str, body: list[str], *, open_: bool = False) -> list[str]:
    return [
        f"<details{' open' if open_ else ''}><summary>{summary}</summary>",
        "",
        *body,
        "",
        "</details>",
        "",
    ]


def _fence(lines: Sequence[str]) -> list[str]:
    """A code block whose fence no line of the content can close."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [ticks + "text", *lines, ticks]


def plan_markdown(plan: PullRequestPlan) -> str:
    head = f"{code(plan.base.rev)} → {code(plan.head.rev)}"
    if not plan.valid:
        files = len({e.file for e in plan.errors})
        summary = f"❌ **HEAD is invalid**: {len(plan.errors)} error(s) in {files} file(s)"
    elif not plan.changed:
        summary = "no changes"
    else:
        summary = md(summary_text(plan))
    out = [MARKER, f"**gitsched plan** {head}: {summary}", ""]
    if plan.stale:
        out += [f"> ⚠️ **Stale base.** {md(plan.stale)}", ""]
    out += [f"> {md(n)}", ""] if (n := "; ".join(plan.notes)) else []

    if not plan.valid:
        out += _details(
            f"Errors ({len(plan.errors)})",
            [
                "The reconciler would reject this commit; `gitsched validate` reports the same:",
                "",
                *_fence([e.format() for e in plan.errors]),
            ],
            open_=True,
        )
        return _footer(out, plan)

    if plan.warnings:
        out += _details(
            f"⚠️ Warnings ({len(plan.warnings)})",
            [
                "Valid, but can never run as written (`gitsched validate` shows the same):",
                "",
                *_fence([w.format() for w in plan.warnings]),
            ],
            open_=True,
        )

    if plan.queue_changes or plan.policy_changes:
        body: list[str] = []
        if plan.queue_changes:
            body += _md_table(
                ["queue", "flavor", "nominal", "borrowing limit", "lending limit", "weight"],
                [r for c in plan.queue_changes for r in quota_rows(c, "→")],
            )
        extra = [line for c in plan.queue_changes for line in queue_field_changes(c)]
        extra += [f"policy {policy_line(c)}" for c in plan.policy_changes]
        bullets = [f"- {md(line)}" for line in extra]
        body += ["", *bullets] if body and bullets else bullets
        out += _details(
            f"Quota and policy changes ({len(plan.queue_changes)} queue(s), "
            f"{len(plan.policy_changes)} policy field(s))",
            body,
        )

    others = [c for c in plan.spec_changes if c.kind not in ("queue", "policy")]
    if others:
        out += _details(
            f"Other spec changes ({len(others)})",
            [
                f"- {md(c.kind)} {code(c.name)} {md(c.action)}"
                + (f" ({md(c.detail)})" if c.detail else "")
                for c in others
            ],
        )

    effects = [e for a in _ORDER for e in plan.of(a)]
    rows = []
    for e in effects:
        where, why = effect_detail(e)
        rows.append([e.action.value, e.job, where, "" if why == "admitted" else why])
    body = _md_table(["effect", "job", "where", "why"], rows) if rows else ["Nothing moves."]
    body += ["", f"{plan.kept} job(s) keep their place; {md(solve_text(plan.solve))}."]
    out += _details(f"Placement effect: {md(counts_text(plan))}", body, open_=bool(rows))

    if plan.usage:
        out += _details(
            "GPUs and weighted share per queue now",
            [
                *_md_table(
                    ["queue", "weight", "GPUs", "weighted share"], usage_rows(plan.usage, "→")
                ),
                "",
                "Fair share: the queue's dominant GPU share (the largest fraction of any flavor's "
                "Ready GPUs it uses), divided by its weight.",
            ],
        )

    view = plan.fairness
    if view is not None and view.queues:
        out += _details(
            f"Entitled share from past usage (half-life {view.half_life_hours:g} h)",
            _md_table([h.lower() for h in FAIR_HEADERS], fair_share_rows_text(view)),
        )
    if view is not None and view.idle:
        out += _details(
            f"Idle GPUs: {len(view.idle)} job(s)",
            [f"- {code(n.job)}: {md(n.reason)}" for n in view.idle],
            open_=True,
        )

    if plan.approvals:
        missing = len(plan.missing_approvals)
        rule = "" if plan.approval_enforced else " (not enforced by the Policy)"
        mark = "⚠️ " if missing else ""
        out += _details(
            f"{mark}Approvals: {missing} missing{rule}",
            [f"- {md(approval_text(a))}: {md('; '.join(a.changes))}" for a in plan.approvals],
            open_=bool(missing),
        )
    return _footer(out, plan)


def _footer(out: list[str], plan: PullRequestPlan) -> str:
    out.append(
        f"<sub>base {plan.base.short} · head {plan.head.short} · "
        f"{md(_base_text(plan))} · gitsched {__version__}</sub>"
    )
    return "\n".join(out) + "\n"


# -- json ------------------------------------------------------------------------------------


def _quota_dict(q: Queue | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {
        "team": q.team,
        "cohort": q.cohort,
        "weight": q.weight,
        "maxPriorityClass": q.max_priority_class,
        "quotas": {
            fq.flavor: {
                "nominal": gpus_or_none(fq.nominal),
                "borrowingLimit": gpus_or_none(fq.borrowing_limit),
                "lendingLimit": gpus_or_none(fq.lending_limit),
            }
            for fq in q.quotas
        },
    }


def plan_to_dict(plan: PullRequestPlan) -> dict[str, Any]:
    stats = plan.solve
    return {
        "summary": summary_line(plan),
        "exit_code": plan_exit_code(plan),
        "valid": plan.valid,
        "changed": plan.changed,
        "base": {"rev": plan.base.rev, "sha": plan.base.sha, "subject": plan.base.subject},
        "head": {"rev": plan.head.rev, "sha": plan.head.sha, "subject": plan.head.subject},
        "baseline": plan.baseline.value,
        "applied": plan.applied.sha if plan.applied else None,
        "log_seq": plan.log_seq,
        "stale": plan.stale,
        "notes": list(plan.notes),
        "errors": [e.to_dict() for e in plan.errors],
        "warnings": [w.to_dict() for w in plan.warnings],
        "spec_changes": [
            {"kind": c.kind, "name": c.name, "action": c.action, "detail": c.detail}
            for c in plan.spec_changes
        ],
        "queue_changes": [
            {
                "queue": c.queue,
                "status": c.status,
                "before": _quota_dict(c.before),
                "after": _quota_dict(c.after),
            }
            for c in plan.queue_changes
        ],
        "policy_changes": [
            {"field": c.field, "before": _json_value(c.before), "after": _json_value(c.after)}
            for c in plan.policy_changes
        ],
        "effects": [
            {
                "job": e.job,
                "action": e.action.value,
                "reason": e.reason,
                "previous_reason": e.previous_reason or None,
                "flavor": e.flavor,
                "gpus": gpus_or_none(e.gpu_milli),
                "from": list(e.nodes_before),
                "to": list(e.nodes_after),
                "lost_gpu_hours": round(e.lost_gpu_seconds / 3600, 3),
                "preempted_by": e.preempted_by,
                "rule": e.rule or None,
            }
            for a in _ORDER
            for e in plan.of(a)
        ],
        "counts": {a.value: len(plan.of(a)) for a in _ORDER} | {"kept": plan.kept},
        "queues": [
            {
                "queue": u.queue,
                "weight": {"before": u.weight_before, "after": u.weight_after},
                "gpus": {"before": gpus_or_none(u.gpu_before), "after": gpus_or_none(u.gpu_after)},
                "fair_share": {"before": u.share_before, "after": u.share_after},
            }
            for u in plan.usage
        ],
        "reservations": [
            {
                "job": r.job,
                "start": r.start,
                "nodes": list(r.nodes),
                "flavor": r.flavor,
                "gpus": gpus_or_none(r.gpu_milli),
                "waits_for": list(r.waits_for),
            }
            for r in plan.reservations
        ],
        "solve": None
        if stats is None
        else {
            "solver": stats.solver,
            "status": stats.status,
            "objective": stats.objective,
            "bound": stats.bound,
            "gap": stats.gap,
            "seconds": stats.seconds,
            "plan_source": stats.plan_source,
            "fallback": stats.fallback or None,
            # False: the wall-clock backstop stopped it; reconcile may place differently.
            "reproducible": not clock_stopped(stats),
        },
        "lost_gpu_hours": round(
            sum(e.lost_gpu_seconds for e in plan.of(Action.PREEMPTED)) / 3600, 3
        ),
        "fair_share": None
        if plan.fairness is None
        else {
            "half_life_hours": plan.fairness.half_life_hours,
            "at": plan.fairness.at,
            "queues": [_fair_row(r) for r in plan.fairness.queues],
            "cohorts": [_fair_row(r) for r in plan.fairness.cohorts],
        },
        "idle": []
        if plan.fairness is None
        else [
            {
                "job": n.job,
                "action": n.action,
                "since": n.since,
                "until": n.until,
                "reason": n.reason,
            }
            for n in plan.fairness.idle
        ],
        "approvals": {
            "enforced": plan.approval_enforced,
            "teams": [
                {
                    "team": a.team,
                    "files": list(a.files),
                    "changes": list(a.changes),
                    "owners": list(a.owners),
                    "eligible": list(a.eligible),
                    "approved_by": list(a.approved_by),
                    "satisfied": a.satisfied,
                    "bootstrap": a.unowned,
                    "signed_required": a.signed_required,
                    "authors": list(a.authors),
                    "approvals": [
                        {
                            "approver": x.approver,
                            "via": x.via,
                            "commit": x.commit,
                            "fingerprint": x.fingerprint,
                        }
                        for x in a.approvals
                    ],
                    "refused": list(a.refused),
                }
                for a in plan.approvals
            ],
        },
        "commits": [
            {
                "sha": c.sha,
                "author": c.author_email,
                "subject": c.subject,
                "approvers": list(c.approvers),
            }
            for c in plan.commits
        ],
    }


def _fair_row(r: FairShareRow) -> dict[str, Any]:
    return {
        "name": r.name,
        "cohort": r.cohort,
        "fair_share": round(r.share, 6),
        "used_gpu_hours_decayed": round(r.usage_gpu_hours, 3),
        "used_share": round(r.usage_share, 6),
    }


def _json_value(v: object) -> object:
    if isinstance(v, bool | int | float) or v is None:
        return v
    return str(v)


def plan_json(plan: PullRequestPlan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2) + "\n"


RENDERERS = {"text": plan_text, "markdown": plan_markdown, "json": plan_json}
