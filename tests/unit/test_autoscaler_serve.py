"""`serve`'s autoscaler options, checked before anything is started, and the
autoscaler's poll loop on its own (cluster/autoscaler.py) with Prometheus' answers
given by a fake client: windows only when they could change a decision."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gitsched.cli import main
from gitsched.cluster.autoscaler import Autoscaler, ScaledService
from gitsched.cluster.prometheus import MetricAnswer, PrometheusAnswerInvalid, PrometheusClient
from gitsched.engine import events as ev
from gitsched.engine.autoscaling import AutoscalingSpec, ScalingPolicy, ScalingRules
from gitsched.eventlog.codec import decode
from gitsched.eventlog.sqlite import SQLiteEventLog
from gitsched.exit_codes import EXIT_ERROR


def test_a_prometheus_url_that_is_not_http_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["serve", str(tmp_path), "--prometheus-url", "file:///etc/passwd"]
    )
    assert result.exit_code == EXIT_ERROR
    assert "--prometheus-url" in result.output and "not an http(s) URL" in result.output


def test_a_poll_interval_of_zero_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["serve", str(tmp_path), "--prometheus-url", "http://p:9090", "--autoscale-seconds", "0"],
    )
    assert result.exit_code == EXIT_ERROR and "--autoscale-seconds" in result.output


class Answers(PrometheusClient):
    """Prometheus' answers, one per query, as the test lists them (a value, None for NaN,
    or an exception); the client's own parsing is tested against real servers."""

    def __init__(self, answers: list[float | Exception | None]) -> None:
        super().__init__("http://127.0.0.1:1")
        self.answers = answers
        self.t = 1764324000.0

    def query(self, promql: str) -> MetricAnswer:
        self.t += 15
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return MetricAnswer(promql, answer, self.t, 1, "" if answer is not None else "NaN")


def test_windows_are_appended_only_when_they_could_change_a_decision(tmp_path: Path) -> None:
    spec = AutoscalingSpec(
        "q",
        target=10.0,
        scale_down=ScalingRules(60, "Max", (ScalingPolicy("Percent", 100, 15),)),
    )
    current = [4]
    client = Answers([40, 41, 39, 40, 20, 20, 20, 20, 20, None, PrometheusAnswerInvalid("x"), 20])
    log = SQLiteEventLog(tmp_path / "log.db")
    autoscaler = Autoscaler(
        client, lambda: [ScaledService("ml/chat", current[0], 1, 10, spec)], interval_s=0
    )
    for _ in range(12):
        for e in autoscaler.poll(log):
            if isinstance(e, ev.ServiceScaled):
                current[0] = e.to_replicas
    events = [decode(s) for s in log.read(0)]
    kinds = [(type(e).__name__, getattr(e, "samples", None)) for e in events]
    # Four answers at the target are one window, appended when the load halves (it holds
    # the scale-down for the 60 s window); the lower window is appended with the
    # decision 60 s after the higher one stopped holding.
    assert kinds[:3] == [
        ("ServiceMetricObserved", 4),
        ("ServiceMetricObserved", 5),
        ("ServiceScaled", None),
    ]
    scaled = events[2]
    assert isinstance(scaled, ev.ServiceScaled)
    assert (scaled.from_replicas, scaled.to_replicas, scaled.bound_by) == (4, 2, "hpa")
    # After it: NaN and a garbage answer decide nothing; the count stays at 2.
    assert not [e for e in events[3:] if isinstance(e, ev.ServiceScaled)]
    assert current[0] == 2
    assert autoscaler.status.ignored == 1
    assert autoscaler.status.failures == {"PrometheusAnswerInvalid": 1}
    assert autoscaler.status.up  # the last poll answered
