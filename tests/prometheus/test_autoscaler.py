"""The whole chain but the pods: an exporter the test controls -> a real Prometheus ->
cluster/prometheus.py -> serve's autoscaler -> windows and ServiceScaled in a real event
log -> the same decisions again from the log alone. Prometheus down or a NaN metric:
the count stays, /metrics says so."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from gitsched.cluster.autoscaler import Autoscaler, ScaledService
from gitsched.cluster.prometheus import PrometheusClient
from gitsched.engine import events as ev
from gitsched.engine.autoscaling import AutoscalingSpec, ScalingPolicy, ScalingRules, rejudge
from gitsched.eventlog.base import EventLog
from gitsched.eventlog.codec import decode
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.metrics import Metrics
from tests.support.prometheus import Exporter, wait_for, wait_for_series

pytestmark = pytest.mark.prometheus

SERVICE = "ml/chat"
LOW, HIGH = 1, 10


class Fleet:
    """The InferenceService fold's part the autoscaler reads: the service's current count,
    which follows every ServiceScaled in the log."""

    def __init__(self, spec: AutoscalingSpec, current: int) -> None:
        self.spec, self.current = spec, current

    def services(self) -> Sequence[ScaledService]:
        return (ScaledService(SERVICE, self.current, LOW, HIGH, self.spec),)

    def follow(self, appended: list[ev.Event]) -> None:
        for e in appended:
            if isinstance(e, ev.ServiceScaled):
                self.current = e.to_replicas


def logged(log: EventLog) -> list[ev.Event]:
    return [decode(s) for s in log.read(0)]


def poll_until_scaled(
    autoscaler: Autoscaler, log: EventLog, fleet: Fleet, to: int
) -> ev.ServiceScaled:
    def scaled() -> ev.ServiceScaled | None:
        appended = autoscaler.poll(log)
        fleet.follow(appended)
        return next(
            (e for e in appended if isinstance(e, ev.ServiceScaled) and e.to_replicas == to),
            None,
        )

    return wait_for(f"{SERVICE} scaled to {to}", scaled)


def test_a_real_metric_scales_a_service_up_and_down_and_the_log_explains_each_step(
    prometheus: tuple[str, Path], exporter: tuple[Exporter, str], tmp_path: Path
) -> None:
    url, _ = prometheus
    source, test = exporter
    query = f'sum(vllm:num_requests_waiting{{service="{SERVICE}",test="{test}"}})'
    # HPA's rule with short periods, so a test sees several steps in seconds.
    spec = AutoscalingSpec(
        query,
        target=5.0,
        scale_up=ScalingRules(0, "Max", (ScalingPolicy("Pods", 4, 1),)),
        scale_down=ScalingRules(2, "Max", (ScalingPolicy("Percent", 100, 1),)),
    )
    fleet = Fleet(spec, current=2)
    log = SQLiteEventLog(tmp_path / "log.db")
    autoscaler = Autoscaler(PrometheusClient(url), fleet.services, interval_s=0)

    source.set(f'vllm:num_requests_waiting{{service="{SERVICE}",pod="a",test="{test}"}} 40\n')
    wait_for_series(url, query, "40")
    # 40 waiting against 5 per replica asks for 8; 4 pods a second is the limit.
    first = poll_until_scaled(autoscaler, log, fleet, 6)
    assert (first.from_replicas, first.bound_by, first.metric_value, first.target) == (
        2,
        "policy:Pods",
        20.0,
        5.0,
    )
    second = poll_until_scaled(autoscaler, log, fleet, 8)
    assert second.bound_by == "hpa" and second.metric_value == round(40 / 6, 6)

    # The load falls: 10 waiting asks for 2, held at 8 for the 2 s down-window.
    source.set(f'vllm:num_requests_waiting{{service="{SERVICE}",pod="a",test="{test}"}} 10\n')
    wait_for_series(url, query, "10")
    down = poll_until_scaled(autoscaler, log, fleet, 2)
    assert down.from_replicas == 8 and down.bound_by == "hpa"

    events = logged(log)
    windows = [e for e in events if isinstance(e, ev.ServiceMetricObserved)]
    decisions = [e for e in events if isinstance(e, ev.ServiceScaled)]
    assert decisions == [first, second, down]
    assert all(w.service == SERVICE and w.query == query for w in windows)
    # Every decision follows the window it was decided on, ending at its time.
    for d in decisions:
        i = events.index(d)
        assert isinstance(events[i - 1], ev.ServiceMetricObserved) and events[i - 1].end == d.at
    # A stretch of equal recommendations is one window, not one event per answer.
    assert sum(w.samples for w in windows) >= len(windows)

    # From the log alone, the rule gives every decision again (replay, plan, audit).
    for d in decisions:
        assert rejudge(d, LOW, HIGH, spec, windows, decisions) == d
    # And a decision the log does not explain is told apart: a target it was not made with.
    assert rejudge(first, LOW, HIGH, replace(spec, target=2.5), windows, decisions) != first

    # NaN: ignored with a warning, nothing decided, the count stays.
    source.set(f'vllm:num_requests_waiting{{service="{SERVICE}",pod="a",test="{test}"}} NaN\n')
    wait_for_series(url, query, "NaN")
    appended = autoscaler.poll(log)
    assert not [e for e in appended if isinstance(e, ev.ServiceScaled)]
    assert autoscaler.status.ignored >= 1 and fleet.current == 2


def test_prometheus_down_keeps_the_count_says_so_on_metrics_and_backs_off(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = AutoscalingSpec("sum(vllm:num_requests_waiting)", target=5.0)
    fleet = Fleet(spec, current=3)
    log = SQLiteEventLog(tmp_path / "log.db")
    clock = [100.0]
    autoscaler = Autoscaler(
        PrometheusClient(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01),
        fleet.services,
        interval_s=15,
        monotonic=lambda: clock[0],
    )
    metrics = Metrics()
    assert autoscaler.tick(log) == []
    metrics.record_autoscaler(autoscaler.status)
    assert log.last_seq() == 0 and fleet.current == 3
    assert not autoscaler.status.up and "did not answer" in autoscaler.status.last_error
    assert metrics.registry.get_sample_value("gitsched_autoscaler_up") == 0
    assert (
        metrics.registry.get_sample_value(
            "gitsched_autoscaler_query_failures_total", {"reason": "PrometheusUnavailable"}
        )
        == 1
    )
    # Backoff: 15 s, then 30 s, then 60 s between tries while it stays down.
    tries = []
    for t in range(100, 220):
        clock[0] = float(t)
        before = sum(autoscaler.status.failures.values())
        autoscaler.tick(log)
        if sum(autoscaler.status.failures.values()) > before:
            tries.append(t)
    assert tries == [115, 145, 205]
