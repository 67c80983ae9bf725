"""The one question autoscaling asks Prometheus: the value of a PromQL expression now
(`/api/v1/query`). A server that is down, slow or answers anything but one number is a
typed failure, never a value, so the autoscaler keeps the current count instead of
scaling on a guess; a value that is NaN or negative is ignored with a warning.

The time of an answer is Prometheus' own evaluation time (the edge's clock, where the
clock belongs): the sample the log records is the value at that time.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gitsched.engine.errors import TemporaryError

MAX_ANSWER_BYTES = 1 << 20  # one number with its labels: kilobytes; a megabyte is no answer
DEFAULT_TIMEOUT_S = 5.0


class PrometheusError(TemporaryError):
    """No value from Prometheus: the autoscaler keeps the count and asks again later."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus did not answer in time: refused, unreachable, too slow, or a 5xx."""


class PrometheusAnswerInvalid(PrometheusError):
    """An answer that is not Prometheus' API answer of one number: not JSON, too large,
    an error status, or a result that is no scalar and no vector."""


class MetricMissing(PrometheusError):
    """The query is valid but has no series now (an empty vector): there is no value."""


@dataclass(frozen=True, slots=True)
class MetricAnswer:
    """One answer: `value` at `at` (seconds since the epoch, Prometheus' evaluation time)
    from `series` series (a vector's values summed). `value` is None when the answer was
    ignored (NaN, infinite or negative), `warning` saying why."""

    query: str
    value: float | None
    at: float
    series: int
    warning: str = ""


class PrometheusClient:
    """`/api/v1/query` of one server, with a bounded answer, a deadline per try and
    retries with exponential backoff. `sleep` is injectable for tests."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = MAX_ANSWER_BYTES,
        retries: int = 2,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"not an http(s) URL of a Prometheus server: {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep

    def query(self, promql: str) -> MetricAnswer:
        """The expression's value now; raises a PrometheusError when there is none.
        Only an outage is retried: a wrong answer will be as wrong a moment later."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return self._query_once(promql)
            except PrometheusUnavailable:
                if attempt == self.retries:
                    raise
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _query_once(self, promql: str) -> MetricAnswer:
        body = urllib.parse.urlencode(
            # Prometheus' own limit on the evaluation, a little below ours on the answer
            # (a duration in whole units: 2.x refuses "4.0s").
            {"query": promql, "timeout": f"{max(100, int(self.timeout_s * 800))}ms"}
        ).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/query",
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        deadline = time.monotonic() + self.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                raw = _read_bounded(answer, self.max_bytes, deadline, self.url)
        except urllib.error.HTTPError as e:
            # 400 (bad expression) and 422 (cannot execute) carry Prometheus' JSON error;
            # a 5xx or a 503 from a proxy is an outage.
            if e.code >= 500:
                raise PrometheusUnavailable(f"{self.url} answered HTTP {e.code}") from e
            try:
                raw = _read_bounded(e, self.max_bytes, deadline, self.url)
            except PrometheusError:
                raw = b""
            raise PrometheusAnswerInvalid(
                f"{self.url} refused the query (HTTP {e.code}): {_error_text(raw)}"
            ) from e
        except (TimeoutError, urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise PrometheusUnavailable(f"{self.url} did not answer: {reason}") from e
        return parse_answer(promql, raw)


def _read_bounded(answer: Any, max_bytes: int, deadline: float, url: str) -> bytes:
    """The body, or a failure when it is larger than `max_bytes` or comes slower than
    the deadline (a server trickling bytes passes every per-read timeout)."""
    chunks: list[bytes] = []
    size = 0
    # read1: at most one read of the socket, so the deadline is checked between them
    # (read(n) waits for all n bytes, however slowly they come).
    read = getattr(answer, "read1", answer.read)
    while True:
        if time.monotonic() > deadline:
            raise PrometheusUnavailable(f"{url} answered too slowly")
        try:
            chunk = read(min(65536, max_bytes + 1 - size))
        except (TimeoutError, OSError) as e:
            raise PrometheusUnavailable(f"{url} answered too slowly: {e}") from e
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise PrometheusAnswerInvalid(f"{url} answered more than {max_bytes} bytes")


def _error_text(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', '')}: {doc.get('error', '')}"[:500]
    except (ValueError, AttributeError):
        return raw[:200].decode("utf-8", "replace") or "no body"


def _number(value: Any, where: str) -> tuple[float, float]:
    """A [time, "value"] pair of the API as (seconds, value)."""
    if not isinstance(value, list) or len(value) != 2:
        raise PrometheusAnswerInvalid(f"{where}: expected [time, value], got {str(value)[:80]}")
    at, text = value
    if isinstance(at, bool) or not isinstance(at, int | float) or not isinstance(text, str):
        raise PrometheusAnswerInvalid(f'{where}: expected [time, "value"], got {str(value)[:80]}')
    try:
        number = float(text)  # Prometheus writes NaN, +Inf, -Inf as such
    except ValueError as e:
        raise PrometheusAnswerInvalid(f"{where}: {text[:40]!r} is not a number") from e
    if not math.isfinite(float(at)):
        raise PrometheusAnswerInvalid(f"{where}: the time {at!r} is not a time")
    return float(at), number


def parse_answer(query: str, raw: bytes) -> MetricAnswer:
    """Prometheus' JSON answer to an instant query as one value: a scalar, or the sum of
    a vector's series. Anything else is PrometheusAnswerInvalid; an empty vector is
    MetricMissing; NaN, infinite or negative values give value None and a warning."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise PrometheusAnswerInvalid(f"the answer is not JSON: {raw[:80]!r}") from e
    if not isinstance(doc, dict):
        raise PrometheusAnswerInvalid("the answer is not a JSON object")
    if doc.get("status") != "success":
        raise PrometheusAnswerInvalid(f"query failed: {_error_text(raw)}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise PrometheusAnswerInvalid("the answer has no data")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        at, value = _number(result, "scalar")
        points = [(at, value)]
    elif kind == "vector":
        if not isinstance(result, list):
            raise PrometheusAnswerInvalid("a vector answer without a list of series")
        if not result:
            raise MetricMissing(f"no series for {query!r} now")
        points = []
        for i, series in enumerate(result):
            if not isinstance(series, dict):
                raise PrometheusAnswerInvalid(f"series {i} is not an object")
            points.append(_number(series.get("value"), f"series {i}"))
    else:
        raise PrometheusAnswerInvalid(
            f"a {kind!r} answer: the query must give one number (a scalar or an instant vector)"
        )
    at = max(p[0] for p in points)
    bad = [v for _, v in points if not math.isfinite(v) or v < 0]
    if bad:
        return MetricAnswer(
            query,
            None,
            at,
            len(points),
            f"ignored: {query!r} gave {', '.join(sorted({repr(v) for v in bad}))}"
            " (a rate of requests or a queue length is never NaN or negative)",
        )
    return MetricAnswer(query, math.fsum(v for _, v in points), at, len(points))
