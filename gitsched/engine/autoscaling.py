"""HorizontalPodAutoscaler's rule for an inference service's replica count, on a metric
the log holds: desired = ceil(current x value / target), no change within the tolerance,
stabilisation over past recommendations, rate policies over past scaling events, then
[min, max]. The names and defaults are HPA v2's (Kubernetes' horizontal.go and
replica_calculator.go), so a user's HPA `behavior` means the same here.

Pure: the inputs are events (ServiceMetricObserved windows, ServiceScaled history) and
`now`, the time of the event being decided, so `serve`, a replay, `plan` and `audit`
meet the same decision (docs/autoscaling.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gitsched.engine.events import ServiceMetricObserved, ServiceScaled
from gitsched.engine.fairshare import moment

PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]
# What bounded a decision (ServiceScaled.bound_by): the metric's own count ("hpa"), the
# tolerance that kept the count, the stabilisation window, a rate policy, or [min, max].
BOUNDS = ("hpa", "tolerance", "stabilization", "policy:Pods", "policy:Percent", "min", "max")
DEFAULT_TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """At most `value` pods (Pods) or `value` % of the count at the period's start
    (Percent) added or removed within any `period_seconds`."""

    type: PolicyType
    value: int
    period_seconds: int


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction's `behavior` (HPAScalingRules)."""

    stabilization_window_seconds: int
    select_policy: SelectPolicy
    policies: tuple[ScalingPolicy, ...]


# HPA v2's defaults (the API's and the docs' "Default Behavior").
DEFAULT_SCALE_UP = ScalingRules(
    0, "Max", (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15))
)
DEFAULT_SCALE_DOWN = ScalingRules(300, "Max", (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True, slots=True)
class AutoscalingSpec:
    """A service's `autoscaling` block: the PromQL query whose value is the service's
    total (e.g. requests waiting, summed over its pods), the target average per replica
    (HPA's `averageValue`), the tolerance, and the behaviour in each direction."""

    query: str
    target: float
    tolerance: float = DEFAULT_TOLERANCE
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


def _rules(block: Mapping[str, Any] | None, default: ScalingRules) -> ScalingRules:
    """A direction's rules; a field left out takes HPA's default for that field alone."""
    if not block:
        return default
    policies = block.get("policies")
    return ScalingRules(
        stabilization_window_seconds=int(
            block.get("stabilizationWindowSeconds", default.stabilization_window_seconds)
        ),
        select_policy=block.get("selectPolicy", default.select_policy),
        policies=default.policies
        if policies is None
        else tuple(
            ScalingPolicy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in policies
        ),
    )


def parse_autoscaling(block: Mapping[str, Any]) -> AutoscalingSpec:
    """The spec of a block that passed schemas/autoscaling.schema.json (which rejects
    what this does not check: a target of 0, a query that is not a string, unknown
    fields), with HPA's defaults filled in."""
    return AutoscalingSpec(
        query=str(block["metric"]["query"]),
        target=float(block["target"]),
        tolerance=float(block.get("tolerance", DEFAULT_TOLERANCE)),
        scale_up=_rules(block.get("scaleUp"), DEFAULT_SCALE_UP),
        scale_down=_rules(block.get("scaleDown"), DEFAULT_SCALE_DOWN),
    )


def _rules_block(rules: ScalingRules) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_seconds,
        "selectPolicy": rules.select_policy,
        "policies": [
            {"type": p.type, "value": p.value, "periodSeconds": p.period_seconds}
            for p in rules.policies
        ],
    }


def autoscaling_block(spec: AutoscalingSpec) -> dict[str, Any]:
    """The spec as a block with every default written out (what `state` and docs show)."""
    return {
        "metric": {"query": spec.query},
        "target": spec.target,
        "tolerance": spec.tolerance,
        "scaleUp": _rules_block(spec.scale_up),
        "scaleDown": _rules_block(spec.scale_down),
    }


# -- the rule ------------------------------------------------------------------------------


def metric_recommendation(value: float, replicas: int, target: float, tolerance: float) -> int:
    """HPA's count for an External metric with an AverageValue target
    (GetExternalPerPodMetricReplicas): ceil(total / target), unless the average per
    replica is within the tolerance of the target, where the count stays."""
    if replicas > 0 and abs(value / (target * replicas) - 1.0) <= tolerance:
        return replicas
    return math.ceil(value / target)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The rule's answer at one moment, with each step's count: the metric's own
    (`metric_count`), after stabilisation (`stabilized`), and the count it settles on
    (`desired`), and what bounded it. `metric_value` is the average per replica (the
    quantity `target` is compared with); None when not from a metric."""

    current: int
    desired: int
    bound_by: str
    metric_value: float | None
    target: float | None
    metric_count: int | None = None
    stabilized: int | None = None
    limits: tuple[int, int] = (0, 0)  # the (min, max) it was judged against


def _window_recommendations(
    samples: Sequence[ServiceMetricObserved], spec: AutoscalingSpec, now: float
) -> list[tuple[float, int]]:
    """(until when it held, recommendation) of each past window: a window holds from its
    start until the next window's start (or its own end, for the newest), since a window
    is appended only when its recommendation differs from the one before."""
    timed = sorted(
        (
            (start, end, s)
            for s in samples
            if (start := moment(s.start)) is not None
            and (end := moment(s.end)) is not None
            and end <= now
        ),
        key=lambda t: (t[0], t[1]),  # windows are never compared: two may share their times
    )
    out: list[tuple[float, int]] = []
    for i, (_, end, s) in enumerate(timed):
        held_until = max(end, timed[i + 1][0]) if i + 1 < len(timed) else end
        out.append(
            (held_until, metric_recommendation(s.value, s.replicas, spec.target, spec.tolerance))
        )
    return out


def _change_in_period(
    history: Sequence[ServiceScaled], now: float, period_s: int
) -> tuple[int, int]:
    """Replicas added and removed by scaling events after now - period (HPA's
    getReplicasChangePerPeriod, over its scaleUpEvents and scaleDownEvents)."""
    cutoff = now - period_s
    added = removed = 0
    for e in history:
        at = moment(e.at)
        if at is None or at <= cutoff or at > now:
            continue
        change = e.to_replicas - e.from_replicas
        if change > 0:
            added += change
        else:
            removed -= change
    return added, removed


def _rate_limit(
    current: int, history: Sequence[ServiceScaled], now: float, rules: ScalingRules, up: bool
) -> tuple[int, str]:
    """The furthest the count may go this moment in one direction, and the policy that
    set it (HPA's calculateScaleUpLimitWithScalingRules / ...ScaleDownLimitWithBehaviors).
    Max picks the policy allowing the biggest change, Min the smallest; Disabled: none."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current, "policy:Disabled"
    best: tuple[int, str] | None = None
    for policy in rules.policies:
        added, removed = _change_in_period(history, now, policy.period_seconds)
        start = current - added + removed
        if up:
            proposed = (
                start + policy.value
                if policy.type == "Pods"
                # Rounded up, as HPA does, so a small service can always grow.
                else math.ceil(start * (1 + policy.value / 100))
            )
        else:
            proposed = (
                start - policy.value
                if policy.type == "Pods"
                else int(start * (1 - policy.value / 100))
            )
        # Biggest change: the highest limit going up, the lowest going down; Min: the reverse.
        wants_higher = up == (rules.select_policy == "Max")
        if (
            best is None
            or (wants_higher and proposed > best[0])
            or (not wants_higher and proposed < best[0])
        ):
            best = (proposed, f"policy:{policy.type}")
    assert best is not None
    return best


def recommend(
    current: int,
    min_replicas: int,
    max_replicas: int,
    spec: AutoscalingSpec,
    samples: Sequence[ServiceMetricObserved],
    history: Sequence[ServiceScaled],
    now: str,
) -> Recommendation | None:
    """HPA's answer for one service at `now` (an ISO-8601 time with an offset): `samples`
    are the service's metric windows, `history` its past ServiceScaled, both from the log.
    None when there is nothing to decide on: no window ending by `now` (never scale on a
    missing value) or a `now` that is not a time."""
    at = moment(now)
    if at is None:
        return None
    limits = (min_replicas, max_replicas)
    # HPA corrects a count outside [min, max] first, whatever the metric says.
    if current > max_replicas:
        return Recommendation(current, max_replicas, "max", None, None, limits=limits)
    if current < min_replicas:
        return Recommendation(current, min_replicas, "min", None, None, limits=limits)
    windows = _window_recommendations(samples, spec, at)
    latest = max(
        (s for s in samples if (end := moment(s.end)) is not None and end <= at),
        key=lambda s: (moment(s.end) or 0.0, moment(s.start) or 0.0),
        default=None,
    )
    if latest is None or not windows:
        return None
    raw = metric_recommendation(latest.value, current, spec.target, spec.tolerance)
    average = latest.value / current if current > 0 else latest.value
    within_tolerance = raw == current and math.ceil(latest.value / spec.target) != current

    # Stabilisation (stabilizeRecommendationWithBehaviors): up to the lowest recommendation
    # of the up-window, down to the highest of the down-window; the newest always counts.
    up_cutoff = at - spec.scale_up.stabilization_window_seconds
    down_cutoff = at - spec.scale_down.stabilization_window_seconds
    up_rec = min([raw, *(r for held, r in windows if held > up_cutoff)])
    down_rec = max([raw, *(r for held, r in windows if held > down_cutoff)])
    stabilized = min(max(current, up_rec), down_rec)

    desired, bound = stabilized, "stabilization" if stabilized != raw else "hpa"
    if within_tolerance and stabilized == raw:
        bound = "tolerance"
    # Rate policies and [min, max] (convertDesiredReplicasWithBehaviorRate).
    if stabilized > current:
        limit, policy = _rate_limit(current, history, at, spec.scale_up, up=True)
        limit = max(limit, current)
        if max_replicas > limit:
            ceiling, why = limit, policy
        else:
            ceiling, why = max_replicas, "max"
        if stabilized > ceiling:
            desired, bound = ceiling, why
    elif stabilized < current:
        limit, policy = _rate_limit(current, history, at, spec.scale_down, up=False)
        limit = min(limit, current)
        if min_replicas < limit:
            floor, why = limit, policy
        else:
            floor, why = min_replicas, "min"
        if stabilized < floor:
            desired, bound = floor, why
    return Recommendation(
        current, desired, bound, average, spec.target, raw, stabilized, limits=limits
    )


def decide(
    service: str,
    current: int,
    min_replicas: int,
    max_replicas: int,
    spec: AutoscalingSpec,
    samples: Sequence[ServiceMetricObserved],
    history: Sequence[ServiceScaled],
    now: str,
) -> ServiceScaled | None:
    """The ServiceScaled the rule asks for at `now`, or None when the count stays.
    `samples` and `history` may hold other services' events: only `service`'s count."""
    mine = [s for s in samples if s.service == service]
    past = [h for h in history if h.service == service]
    r = recommend(current, min_replicas, max_replicas, spec, mine, past, now)
    if r is None or r.desired == current:
        return None
    return ServiceScaled(
        service=service,
        from_replicas=current,
        to_replicas=r.desired,
        metric_value=None if r.metric_value is None else round(r.metric_value, 6),
        target=r.target,
        bound_by=r.bound_by,
        at=now,
    )


def horizon_seconds(spec: AutoscalingSpec) -> int:
    """How far back the rule reads the log: the longest stabilisation window or policy
    period. Older windows and scaling events may be forgotten (`prune`)."""
    periods = [p.period_seconds for p in (*spec.scale_up.policies, *spec.scale_down.policies)]
    windows = (
        spec.scale_up.stabilization_window_seconds,
        spec.scale_down.stabilization_window_seconds,
    )
    return max((*windows, *periods))


def prune(
    samples: Iterable[ServiceMetricObserved],
    history: Iterable[ServiceScaled],
    now: str,
    horizon_s: float,
) -> tuple[tuple[ServiceMetricObserved, ...], tuple[ServiceScaled, ...]]:
    """The windows and events the rule can still read at `now`: a window is kept while
    it, or the one after it (whose start ends its hold), is within the horizon, and the
    newest window always; scaling events within the horizon."""
    at = moment(now)
    if at is None:
        return tuple(samples), tuple(history)
    cutoff = at - horizon_s
    ordered = sorted(samples, key=lambda s: (moment(s.start) or 0.0, moment(s.end) or 0.0))
    kept = [
        s
        for i, s in enumerate(ordered)
        if i + 1 == len(ordered)
        or (moment(s.end) or 0.0) > cutoff
        or (moment(ordered[i + 1].start) or 0.0) > cutoff
    ]
    recent = [h for h in history if (moment(h.at) or 0.0) > cutoff]
    return tuple(kept), tuple(recent)


def rejudge(
    scaled: ServiceScaled,
    min_replicas: int,
    max_replicas: int,
    spec: AutoscalingSpec,
    samples: Iterable[ServiceMetricObserved],
    history: Iterable[ServiceScaled],
) -> ServiceScaled | None:
    """The decision the rule makes at `scaled.at` from the log's windows and scaling
    events before it (those after are left out here), for `audit` and replays to compare
    with what was recorded: equal when the log explains the decision."""
    at = moment(scaled.at)
    if at is None:
        return None
    before = [s for s in samples if (moment(s.end) or at + 1) <= at]
    earlier = [h for h in history if h is not scaled and (moment(h.at) or at + 1) < at]
    return decide(
        scaled.service,
        scaled.from_replicas,
        min_replicas,
        max_replicas,
        spec,
        before,
        earlier,
        scaled.at,
    )
