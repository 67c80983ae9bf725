"""HPA v2's rule (engine/autoscaling.py) against the examples of Kubernetes' HPA docs
and the edge cases of horizontal.go: tolerance, stabilisation windows, rate policies
over their periods, selectPolicy Min and Disabled, and the [min, max] clamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.engine import events as ev
from gitsched.engine.autoscaling import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    AutoscalingSpec,
    ScalingPolicy,
    ScalingRules,
    autoscaling_block,
    decide,
    horizon_seconds,
    metric_recommendation,
    parse_autoscaling,
    prune,
    recommend,
)
from gitsched.eventlog import codec

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
SERVICE = "ml/chat"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def window(
    start: float, end: float, value: float, replicas: int, service: str = SERVICE
) -> ev.ServiceMetricObserved:
    return ev.ServiceMetricObserved(
        service=service,
        query="sum(vllm:num_requests_waiting)",
        start=at(start),
        end=at(end),
        value=value,
        samples=1,
        replicas=replicas,
    )


def scaled(when: float, before: int, after: int, service: str = SERVICE) -> ev.ServiceScaled:
    return ev.ServiceScaled(service, before, after, None, 100.0, "hpa", at(when))


def spec(
    target: float = 100.0,
    up: ScalingRules = DEFAULT_SCALE_UP,
    down: ScalingRules = DEFAULT_SCALE_DOWN,
    tolerance: float = 0.1,
) -> AutoscalingSpec:
    return AutoscalingSpec("sum(vllm:num_requests_waiting)", target, tolerance, up, down)


NO_DOWN_WINDOW = ScalingRules(0, "Max", (ScalingPolicy("Percent", 100, 15),))


def run(
    current: int,
    samples: list[ev.ServiceMetricObserved],
    history: list[ev.ServiceScaled] | None = None,
    *,
    now: float,
    s: AutoscalingSpec | None = None,
    lo: int = 1,
    hi: int = 100,
) -> ev.ServiceScaled | None:
    return decide(SERVICE, current, lo, hi, s or spec(), samples, history or [], at(now))


# -- the spec ---------------------------------------------------------------------------------


def test_a_block_with_only_metric_and_target_gets_hpa_v2_defaults() -> None:
    parsed = parse_autoscaling({"metric": {"query": "q"}, "target": 5})
    assert parsed == AutoscalingSpec("q", 5.0)
    assert parsed.tolerance == 0.1
    assert parsed.scale_up == ScalingRules(
        0, "Max", (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15))
    )
    assert parsed.scale_down == ScalingRules(300, "Max", (ScalingPolicy("Percent", 100, 15),))


def test_a_direction_given_in_part_keeps_the_defaults_of_the_fields_left_out() -> None:
    parsed = parse_autoscaling(
        {
            "metric": {"query": "q"},
            "target": 2.5,
            "tolerance": 0.05,
            "scaleDown": {"stabilizationWindowSeconds": 60},
            "scaleUp": {
                "selectPolicy": "Min",
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}],
            },
        }
    )
    assert parsed.tolerance == 0.05
    assert parsed.scale_down == ScalingRules(60, "Max", DEFAULT_SCALE_DOWN.policies)
    assert parsed.scale_up == ScalingRules(0, "Min", (ScalingPolicy("Pods", 2, 30),))
    # Written out in full, the block parses to the same spec.
    assert parse_autoscaling(autoscaling_block(parsed)) == parsed


def test_the_horizon_is_the_longest_window_or_period() -> None:
    assert horizon_seconds(spec()) == 300
    long_up = ScalingRules(0, "Max", (ScalingPolicy("Pods", 1, 900),))
    assert horizon_seconds(spec(up=long_up)) == 900


# -- the metric's own count (replica_calculator.go) ----------------------------------------


def test_the_docs_example_200_against_100_doubles_and_50_halves() -> None:
    # "if the current metric value is 200m, and the desired value is 100m, the number of
    # replicas will be doubled ... If the current value is instead 50m, you'll halve it".
    assert metric_recommendation(4 * 200, 4, 100, 0.1) == 8
    assert metric_recommendation(4 * 50, 4, 100, 0.1) == 2
    # desired = ceil(current x value / target): 3 replicas at 130 against 100 -> 3.9 -> 4.
    assert metric_recommendation(3 * 130, 3, 100, 0.1) == 4


def test_within_the_tolerance_the_count_stays() -> None:
    assert metric_recommendation(4 * 109, 4, 100, 0.1) == 4  # ratio 1.09
    assert metric_recommendation(4 * 91, 4, 100, 0.1) == 4  # ratio 0.91
    assert metric_recommendation(4 * 111, 4, 100, 0.1) == 5  # 1.11 > 1.1: ceil(4.44)
    assert metric_recommendation(4 * 89, 4, 100, 0.1) == 4  # 0.89: ceil(3.56) = 4 still
    assert metric_recommendation(4 * 74, 4, 100, 0.1) == 3
    assert metric_recommendation(4 * 109, 4, 100, 0.0) == 5  # no tolerance at all


def test_a_service_at_zero_replicas_scales_to_the_metric_s_own_count() -> None:
    assert metric_recommendation(250, 0, 100, 0.1) == 3


# -- decisions ----------------------------------------------------------------------------------


def test_scaling_up_records_its_inputs_and_the_rule_that_decided() -> None:
    got = run(2, [window(0, 0, 400, 2)], now=0)
    assert got == ev.ServiceScaled(SERVICE, 2, 4, 200.0, 100.0, "hpa", at(0))


def test_no_value_no_decision() -> None:
    assert run(2, [], now=0) is None
    # A window that ends after `now` is not known yet at `now`.
    assert run(2, [window(10, 20, 900, 2)], now=15) is None
    # Nor is a `now` that is not a time.
    assert decide(SERVICE, 2, 1, 10, spec(), [window(0, 0, 900, 2)], [], "yesterday") is None


def test_within_the_tolerance_there_is_no_decision_and_the_reason_is_tolerance() -> None:
    samples = [window(0, 0, 4 * 108, 4)]
    assert run(4, samples, now=0) is None
    r = recommend(4, 1, 10, spec(), samples, [], at(0))
    assert r is not None and (r.desired, r.bound_by, r.metric_count) == (4, "tolerance", 4)


def test_the_newest_window_ending_by_now_is_the_value_decided_on() -> None:
    samples = [window(0, 10, 800, 4), window(15, 30, 400, 4), window(35, 40, 1600, 4)]
    got = run(4, samples, now=30, s=spec(down=NO_DOWN_WINDOW))
    assert got is None  # 400 for 4 replicas is the target exactly
    got = run(4, samples, now=40)  # asks for 16; 100 % a period allows 8
    assert got is not None and (got.to_replicas, got.bound_by) == (8, "policy:Percent")
    assert got.metric_value == 400.0  # 1600 over 4 replicas


# -- stabilisation (stabilizeRecommendationWithBehaviors) --------------------------------------


def test_scale_down_waits_for_the_highest_recommendation_of_the_last_five_minutes() -> None:
    # 8 replicas recommended until t=100 (that window holds until the next starts); from
    # then on the metric asks for 3.
    samples = [window(0, 90, 800, 8), window(100, 100, 300, 8)]
    got = run(8, samples, now=100)
    assert got is None
    r = recommend(8, 1, 10, spec(), samples, [], at(100))
    assert r is not None and (r.metric_count, r.stabilized, r.bound_by) == (3, 8, "stabilization")
    # 300 s after the 8 stopped holding (t=100), it no longer counts.
    later = [*samples, window(105, 399, 300, 8)]
    assert run(8, later, now=399) is None
    got = run(8, [*later, window(400, 401, 300, 8)], now=401)
    assert got is not None and (got.to_replicas, got.bound_by) == (3, "hpa")


def test_a_lower_recommendation_in_the_window_holds_a_scale_down_part_way() -> None:
    samples = [window(0, 50, 600, 8), window(60, 60, 300, 8)]
    down = ScalingRules(120, "Max", (ScalingPolicy("Percent", 100, 15),))
    # Within 120 s: the highest is 6, so 8 -> 6 (stabilisation bounded it, not the metric's 3).
    got = run(8, samples, now=60, s=spec(down=down))
    assert got is not None and (got.to_replicas, got.bound_by) == (6, "stabilization")


def test_scale_up_stabilisation_takes_the_lowest_recommendation_of_its_window() -> None:
    up = ScalingRules(60, "Max", (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)))
    samples = [window(0, 20, 4 * 150, 4), window(30, 30, 4 * 250, 4)]  # 6, then 10
    got = run(4, samples, now=30, s=spec(up=up))
    assert got is not None and (got.to_replicas, got.bound_by) == (6, "stabilization")
    # Once the 6 is older than the window, the policy is what bounds: 4 -> 8.
    got = run(4, [*samples, window(31, 100, 4 * 250, 4)], now=100, s=spec(up=up))
    assert got is not None and (got.to_replicas, got.bound_by) == (8, "policy:Percent")


def test_a_window_of_zero_for_scaling_up_reacts_at_once() -> None:
    samples = [window(0, 20, 4 * 100, 4), window(30, 30, 4 * 200, 4)]
    got = run(4, samples, now=30)
    assert got is not None and got.to_replicas == 8


# -- rate policies (calculateScaleUpLimitWithScalingRules and its scale-down twin) -------------


def test_the_default_scale_up_allows_the_larger_of_4_pods_and_100_percent() -> None:
    got = run(2, [window(0, 0, 2000, 2)], now=0)  # asks for 20
    assert got is not None and (got.to_replicas, got.bound_by) == (6, "policy:Pods")
    got = run(10, [window(0, 0, 4000, 10)], now=0)  # asks for 40
    assert got is not None and (got.to_replicas, got.bound_by) == (20, "policy:Percent")


def test_select_policy_min_allows_the_smaller_change() -> None:
    up = ScalingRules(0, "Min", DEFAULT_SCALE_UP.policies)
    got = run(2, [window(0, 0, 2000, 2)], now=0, s=spec(up=up))
    assert got is not None and (got.to_replicas, got.bound_by) == (4, "policy:Percent")


def test_the_docs_example_80_to_10_removes_ten_percent_a_minute() -> None:
    # scaleDown: Pods 4 / 60 s, Percent 10 / 60 s, no window: the change that removes
    # more replicas wins (Max), so 8 go first, then 8 again (72 x 10% = 7.2 rounds up).
    down = ScalingRules(0, "Max", (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)))
    s = spec(down=down)
    first = run(80, [window(0, 0, 1000, 80)], now=0, s=s)
    assert first is not None and (first.to_replicas, first.bound_by) == (72, "policy:Percent")
    history = [first]
    # Within the minute, the 8 already removed count against the period: no change.
    assert run(72, [window(0, 0, 1000, 80), window(15, 15, 1000, 72)], history, now=15, s=s) is None
    second = run(72, [window(61, 61, 1000, 72)], history, now=61, s=s)
    assert second is not None and (second.to_replicas, second.bound_by) == (64, "policy:Percent")
    # Below 40 replicas, 4 pods is the larger change.
    third = run(30, [window(200, 200, 1000, 30)], history, now=200, s=s)
    assert third is not None and (third.to_replicas, third.bound_by) == (26, "policy:Pods")


def test_scale_ups_within_the_period_count_against_it() -> None:
    # 2 -> 6 at t=0 (4 pods): at t=10 the period started at 2, so 2+4 = 6 is the limit.
    history = [scaled(0, 2, 6)]
    assert run(6, [window(10, 10, 3000, 6)], history, now=10) is None
    # At t=15 the event is exactly one period old: it no longer counts (HPA: after the cutoff).
    got = run(6, [window(15, 15, 3000, 6)], history, now=15)
    assert got is not None and (got.to_replicas, got.bound_by) == (12, "policy:Percent")


def test_disabled_never_scales_in_that_direction() -> None:
    off = ScalingRules(0, "Disabled", DEFAULT_SCALE_DOWN.policies)
    s = spec(down=off)
    assert run(8, [window(0, 0, 100, 8)], now=0, s=s) is None
    r = recommend(8, 1, 10, s, [window(0, 0, 100, 8)], [], at(0))
    assert r is not None and r.bound_by == "policy:Disabled" and r.desired == 8
    got = run(8, [window(0, 0, 1600, 8)], now=0, s=s)  # up is still allowed
    assert got is not None and got.to_replicas == 16


# -- [min, max] ----------------------------------------------------------------------------------


def test_max_bounds_a_scale_up_the_policy_would_allow() -> None:
    got = run(3, [window(0, 0, 2000, 3)], now=0, hi=5)
    assert got is not None and (got.to_replicas, got.bound_by) == (5, "max")


def test_min_bounds_a_scale_down_to_nothing() -> None:
    got = run(4, [window(0, 0, 0, 4)], now=0, s=spec(down=NO_DOWN_WINDOW), lo=2)
    assert got is not None and (got.to_replicas, got.bound_by) == (2, "min")


def test_a_count_outside_the_bounds_is_brought_back_without_a_metric() -> None:
    assert run(7, [], now=0, hi=5) == ev.ServiceScaled(SERVICE, 7, 5, None, None, "max", at(0))
    assert run(1, [], now=0, lo=3) == ev.ServiceScaled(SERVICE, 1, 3, None, None, "min", at(0))


def test_other_services_events_are_not_read() -> None:
    others = [window(0, 0, 5000, 2, service="ml/other")]
    assert run(2, others, [scaled(0, 2, 10, service="ml/other")], now=0) is None
    got = run(2, [*others, window(0, 0, 400, 2)], [scaled(-5, 1, 2, service="ml/other")], now=0)
    assert got is not None and got.to_replicas == 4


def test_a_decision_is_an_event_the_log_can_store_and_read_back() -> None:
    got = run(2, [window(0, 0, 400, 2)], now=0)
    assert got is not None
    stored = codec.encode(got, id="autoscaler/1/0", actor="autoscaler", cause="autoscaler")
    from gitsched.eventlog.envelope import GENESIS_HASH, seal

    sealed = seal(stored, seq=1, time=at(0), prev_hash=GENESIS_HASH)
    assert codec.decode(sealed) == got
    observed = window(0, 0, 400, 2)
    sealed = seal(
        codec.encode(observed, id="a/1/1", actor="a", cause="a"),
        seq=2,
        time=at(0),
        prev_hash=sealed.hash,
    )
    assert codec.decode(sealed) == observed


def test_prune_keeps_what_the_horizon_can_read_and_the_newest_window() -> None:
    samples = [window(0, 10, 100, 1), window(20, 30, 200, 1), window(400, 410, 300, 1)]
    history = [scaled(0, 1, 2), scaled(405, 2, 3)]
    kept, recent = prune(samples, history, at(410), 300)
    # The first window's hold ended at t=20, before the cutoff (t=110); the second holds
    # until t=400, within the horizon.
    assert kept == tuple(samples[1:]) and recent == (history[1],)


# -- invariants -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    current=st.integers(0, 60),
    lo=st.integers(0, 20),
    span=st.integers(0, 40),
    values=st.lists(st.floats(0, 10_000, allow_nan=False), min_size=1, max_size=5),
    gaps=st.lists(st.integers(1, 200), min_size=5, max_size=5),
    target=st.floats(0.5, 500, allow_nan=False),
    select=st.sampled_from(["Max", "Min"]),
)
def test_a_decision_stays_in_bounds_and_never_moves_against_the_metric(
    current: int,
    lo: int,
    span: int,
    values: list[float],
    gaps: list[int],
    target: float,
    select: str,
) -> None:
    hi = lo + span
    if not lo <= current <= hi:
        return
    rules = ScalingRules(30, select, DEFAULT_SCALE_UP.policies)  # type: ignore[arg-type]
    s = spec(target=target, up=rules)
    t = 0.0
    samples = []
    for value, gap in zip(values, gaps, strict=False):
        samples.append(window(t, t, value, current))
        t += gap
    now = samples[-1].end
    got = decide(SERVICE, current, lo, hi, s, samples, [], now)
    raw = metric_recommendation(values[-1], current, target, 0.1)
    if got is None:
        return
    assert lo <= got.to_replicas <= hi
    assert got.from_replicas == current and got.to_replicas != current
    # The direction is the metric's: the rule only slows or bounds it.
    assert (got.to_replicas > current) == (raw > current)


def test_two_windows_with_the_same_times_are_read_without_error() -> None:
    # Two writers' windows of one moment (a replayed append, a second replica's poll).
    samples = [window(0, 0, 400, 2), window(0, 0, 410, 2)]
    got = run(2, samples, now=0)
    assert got is not None and got.to_replicas == 4
