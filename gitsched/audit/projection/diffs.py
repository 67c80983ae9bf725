"""What a configuration change did, in words: the `summary` column of `audit changes`.

`queue created in cohort research: h100-80g nominal 8`, `owner a@x removed`,
`require signed approval False -> True`: written once by the fold, read as is.
"""

from __future__ import annotations

from typing import Any

from gitsched.engine.units import gpus_text as gpus


def quotas_of(queue: dict[str, Any]) -> dict[str, list[int | None]]:
    return {
        q["flavor"]: [int(q["nominal"]), q.get("borrowing_limit"), q.get("lending_limit")]
        for q in queue.get("quotas", ())
    }


def limit_text(milli: int | None) -> str:
    return "unlimited" if milli is None else gpus(milli)


def queue_diff(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """What a queue change did, in words: `h100-80g borrowing limit 8 -> 16`."""
    if new is None:
        return "queue removed"
    if old is None:
        parts = [
            f"{flavor} nominal {gpus(q[0] or 0)}"
            + (f", borrowing limit {gpus(q[1])}" if q[1] is not None else "")
            + (f", lending limit {gpus(q[2])}" if q[2] is not None else "")
            for flavor, q in sorted(quotas_of(new).items())
        ]
        cohort = f" in cohort {new['cohort']}" if new.get("cohort") else ""
        return f"queue created{cohort}: " + ("; ".join(parts) or "no quota")
    out: list[str] = []
    before, after = quotas_of(old), quotas_of(new)
    labels = ("nominal", "borrowing limit", "lending limit")
    for flavor in sorted(set(before) | set(after)):
        if flavor not in before:
            out.append(f"{flavor} quota added: nominal {gpus(after[flavor][0] or 0)}")
            continue
        if flavor not in after:
            out.append(f"{flavor} quota removed")
            continue
        for i, label in enumerate(labels):
            if before[flavor][i] != after[flavor][i]:
                out.append(
                    f"{flavor} {label} {limit_text(before[flavor][i])} -> {limit_text(after[flavor][i])}"
                )
    for key in ("cohort", "weight", "max_priority_class", "team", "owners", "queueing_strategy"):
        if old.get(key) != new.get(key):
            out.append(f"{key.replace('_', ' ')} {old.get(key)} -> {new.get(key)}")
    none = {"default_minutes": None, "max_minutes": None}  # a queue logged before limits
    limits_before, limits_after = old.get("time_limits") or none, new.get("time_limits") or none
    if limits_before != limits_after:
        out.append(
            "time limits "
            + " -> ".join(
                f"default {t['default_minutes'] or '-'}/max {t['max_minutes'] or '-'} min"
                for t in (limits_before, limits_after)
            )
        )
    return "; ".join(out) or "no effective change"


def owners_diff(old: list[list[str]], new: list[list[str]]) -> str:
    """What an OWNERS change did: who was added or removed, whose key changed."""
    before: dict[str, str] = {e: k for e, k in old}
    after: dict[str, str] = {e: k for e, k in new}
    parts = [
        f"owner {e} added" + (" with a key" if after[e] else "") for e in after if e not in before
    ]
    parts += [f"owner {e} removed" for e in before if e not in after]
    parts += [
        f"key of {e} " + ("added" if not before[e] else "removed" if not after[e] else "changed")
        for e in after
        if e in before and before[e] != after[e]
    ]
    return "; ".join(parts) or "no effective change"


def _value_text(value: Any) -> str:
    """A value as the change summary prints it; a nested mapping (the policy's `idle`) with
    its keys sorted, so a summary never depends on the order a payload was read in."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value_text(value[k])}" for k in sorted(value)) + "}"
    return str(value)


def dict_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if not old:
        return "set: " + ", ".join(f"{k}={_value_text(new.get(k))}" for k in sorted(new))
    return "; ".join(
        f"{k.replace('_', ' ')} {_value_text(old.get(k))} -> {_value_text(new.get(k))}"
        for k in keys
    ) or ("no effective change")
