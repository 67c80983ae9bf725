"""gitsched/cluster/prometheus.py against a real Prometheus scraping an exporter the test
controls: a value goes through; NaN and negative values are ignored with a warning; an
empty answer, a bad expression or a range are typed failures; a server that is down is
retried with backoff, then a typed failure."""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path

import pytest

from gitsched.cluster.prometheus import (
    MetricMissing,
    PrometheusAnswerInvalid,
    PrometheusClient,
    PrometheusUnavailable,
)
from tests.support.prometheus import Exporter, wait_for, wait_for_series

pytestmark = pytest.mark.prometheus


def test_a_value_goes_through_and_several_series_are_summed(
    prometheus: tuple[str, Path], exporter: tuple[Exporter, str]
) -> None:
    url, _ = prometheus
    source, test = exporter
    source.set(
        f'vllm:num_requests_waiting{{service="ml/chat",pod="a",test="{test}"}} 12\n'
        f'vllm:num_requests_waiting{{service="ml/chat",pod="b",test="{test}"}} 3\n'
    )
    wait_for_series(url, f'sum(vllm:num_requests_waiting{{test="{test}"}})', "15")
    client = PrometheusClient(url)
    before = time.time()
    summed = client.query(f'sum(vllm:num_requests_waiting{{test="{test}",service="ml/chat"}})')
    assert (summed.value, summed.series, summed.warning) == (15.0, 1, "")
    # Prometheus' evaluation time, the moment the value is for.
    assert before - 5 <= summed.at <= time.time() + 5
    both = client.query(f'vllm:num_requests_waiting{{test="{test}"}}')
    assert (both.value, both.series) == (15.0, 2)
    scalar = client.query(f'scalar(sum(vllm:num_requests_waiting{{test="{test}"}}))')
    assert (scalar.value, scalar.series) == (15.0, 1)


@pytest.mark.parametrize("bad", ["NaN", "-3", "+Inf"])
def test_a_nan_or_negative_value_is_ignored_with_a_warning(
    prometheus: tuple[str, Path], exporter: tuple[Exporter, str], bad: str
) -> None:
    url, _ = prometheus
    source, test = exporter
    source.set(f'vllm:num_requests_waiting{{test="{test}"}} {bad}\n')
    promql = f'vllm:num_requests_waiting{{test="{test}"}}'
    client = PrometheusClient(url)

    def ignored() -> str | None:
        answer = client.query(promql)
        return answer.warning if answer.value is None else None

    warning = wait_for(f"{promql} answering {bad}", ignored)
    assert str(float(bad)) in warning and "ignored" in warning
    assert math.isnan(float(bad)) or "nan" not in warning


def test_no_series_is_a_missing_value_not_zero(prometheus: tuple[str, Path]) -> None:
    url, _ = prometheus
    with pytest.raises(MetricMissing, match="no series"):
        PrometheusClient(url).query('vllm:num_requests_waiting{test="no-such-test"}')


@pytest.mark.parametrize(
    ("promql", "match"),
    [
        ("sum(vllm:num_requests_waiting", r"HTTP 400.*bad_data"),
        ('vllm:num_requests_waiting{test="x"}[1m]', "'matrix' answer"),
        ('"a string"', "'string' answer"),
    ],
)
def test_an_expression_that_gives_no_number_is_an_invalid_answer(
    prometheus: tuple[str, Path], promql: str, match: str
) -> None:
    url, _ = prometheus
    sleeps: list[float] = []
    with pytest.raises(PrometheusAnswerInvalid, match=match):
        PrometheusClient(url, sleep=sleeps.append).query(promql)
    assert sleeps == []  # a wrong answer is not retried: it would be as wrong again


def test_a_server_that_is_down_is_retried_with_backoff_then_a_typed_failure() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    client = PrometheusClient(
        f"http://127.0.0.1:{port}", retries=3, backoff_s=0.25, sleep=sleeps.append
    )
    with pytest.raises(PrometheusUnavailable, match="did not answer"):
        client.query("up")
    assert sleeps == [0.25, 0.5, 1.0]
