"""The audit report's pieces that need no browser: Gantt lanes and labels, and the
period it covers (the same definition as `audit usage`)."""

from __future__ import annotations

from datetime import UTC, datetime

from gitsched.audit import history
from gitsched.audit.report import (
    GANTT_ROW,
    gantt_figure,
    gantt_lanes,
    service_figure,
    service_series,
)
from gitsched.audit.store import AuditStore
from gitsched.audit.window import period

T0 = datetime(2025, 11, 16, 9, tzinfo=UTC).timestamp()


def interval(job: str, node: str, start_h: float, end_h: float | None) -> history.Interval:
    def iso(h: float) -> str:
        return datetime.fromtimestamp(T0 + h * 3600, UTC).isoformat()

    return history.Interval(
        job, job.split("/")[0], job.split("/")[0], "ana", "h100", (node,), 1, 4.0,
        iso(start_h), int(start_h * 10), "admitted", "admitted",
        iso(end_h) if end_h is not None else None, None, None, None, "c", None, None,
    )  # fmt: skip


def test_bars_that_share_a_node_at_once_get_their_own_lanes() -> None:
    lane, lanes = gantt_lanes(
        [("n1", 0, 10), ("n1", 5, 15), ("n1", 10, 20), ("n2", 0, 30), ("n1", 12, 13)]
    )
    assert lane == [0, 1, 0, 0, 2]
    assert lanes == {"n1": 3, "n2": 1}


def test_the_gantt_shows_both_jobs_on_a_shared_node_with_their_names() -> None:
    shared = [interval("ml/a", "n1", 0, 4), interval("cv/b", "n1", 1, None)]
    fig, shown, total = gantt_figure(shared, T0, T0 + 6 * 3600)
    assert shown == total == 2
    bars = {trace.text[0]: trace for trace in fig.data}
    assert set(bars) == {"ml/a", "cv/b"}  # each bar is labelled with its job
    a, b = bars["ml/a"], bars["cv/b"]
    assert a.width[0] == b.width[0] == GANTT_ROW / 2
    assert {a.offset[0], b.offset[0]} == {-GANTT_ROW / 2, 0.0}  # one above the other


def test_the_period_runs_from_the_first_to_the_last_event_unless_given() -> None:
    with AuditStore(":memory:") as store:
        store.db.execute("INSERT INTO marks (seq, time) VALUES (1, '2025-11-16T09:00:00Z')")
        store.db.execute("INSERT INTO marks (seq, time) VALUES (2, '2025-11-16T10:00:00Z')")
        now = T0 + 48 * 3600
        assert period(store, None, None, now) == (T0, T0 + 3600)  # the same whenever asked
        assert period(store, T0 + 60, T0 + 7200, now) == (T0 + 60, T0 + 7200)
        assert period(store, None, now + 3600, now) == (T0, now)  # not into the future


def service_row(service: str, hour: float, event: str, desired: int) -> dict[str, object]:
    when = datetime.fromtimestamp(T0 + hour * 3600, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "service": service,
        "time": when,
        "event": event,
        "desired": desired,
        "running": 0,
        "min": 1,
        "max": 3,
    }


def test_a_services_counts_in_the_period_start_from_its_last_row_before_it() -> None:
    found = [
        service_row("ml/chat", 0, "ServiceSubmitted", 1),
        service_row("ml/chat", 1, "ServiceScaled", 2),
        service_row("ml/chat", 3, "ServiceScaled", 3),
        service_row("ml/chat", 9, "ServiceScaled", 1),  # after the period
        service_row("ml/gone", 0, "ServiceSubmitted", 1),
        service_row("ml/gone", 1, "ServiceWithdrawn", 0),
    ]
    since, until = T0 + 2 * 3600, T0 + 5 * 3600
    series = service_series(found, since, until)
    # ml/gone was withdrawn before the period: nothing to draw
    assert list(series) == ["ml/chat"]
    assert [(t, r["desired"]) for t, r in series["ml/chat"]] == [(since, 2), (T0 + 3 * 3600, 3)]
    figure = service_figure(series["ml/chat"], until)
    desired = next(t for t in figure.data if t.name == "desired")
    assert list(desired.y) == [2, 3, 3]  # held to the end of the period
