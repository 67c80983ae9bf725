"""`gitsched bench serving` (simulation/serving.py): the model of a replica and its
request queues, and the benchmark end to end on a few minutes of requests with a burst,
beside a handful of training jobs on a small cluster."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from gitsched.bench.serving import run_config
from gitsched.cli import main
from gitsched.engine.autoscaling import rejudge
from gitsched.engine.events import ServiceScaled
from gitsched.engine.fairshare import moment
from gitsched.exit_codes import EXIT_ERROR
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from gitsched.simulation.replay import TraceError, read_philly
from gitsched.simulation.serving import (
    ReplicaModel,
    Request,
    RequestQueues,
    configurations,
    minute_need,
    read_azure,
    setup,
    training_window,
    with_preroll,
)

T0 = 1_700_158_500.0  # 2023-11-16 18:15:00 UTC, a Thursday
MODEL = ReplicaModel(
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=10.0, max_concurrency=2, startup_s=60.0
)


def _req(i: int, at: float, prompt: int = 1000, output: int = 10) -> Request:
    return Request(i, T0 + at, prompt, output)


# -- the model of one replica ------------------------------------------------------------


def test_a_request_takes_its_prefill_then_its_decode() -> None:
    r = _req(0, 0.0, prompt=2500, output=40)
    assert MODEL.prefill_s(r) == 2.5
    assert MODEL.service_s(r) == 2.5 + 4.0


def test_a_replica_runs_its_concurrency_at_once_and_queues_the_rest_first_come() -> None:
    # Each request: 1 s prefill + 1 s decode = 2 s; three at once on a replica of two slots.
    requests = [_req(i, 0.0) for i in range(3)]
    q = RequestQueues(requests, MODEL)
    q.placed(0)
    q.ready(0, T0 - 1)
    q.advance(T0)
    assert q.in_flight() == 3
    q.advance(math.inf)
    assert q.latency_s == [2.0, 2.0, 4.0]  # the third waited 2 s for a slot
    assert q.first_token_s == [1.0, 1.0, 3.0]  # queueing + its prefill


def test_the_router_sends_each_request_to_the_replica_with_the_fewest_in_flight() -> None:
    requests = [_req(i, 0.1 * i) for i in range(4)]
    q = RequestQueues(requests, MODEL)
    for i in (0, 1):
        q.placed(i)
        q.ready(i, T0 - 1)
    q.advance(T0 + 0.35)
    assert [q.replicas[i].in_flight for i in (0, 1)] == [2, 2]
    q.advance(math.inf)
    assert q.latency_s == [2.0, 2.0, 2.0, 2.0]  # four slots, no waiting


def test_requests_wait_at_the_router_until_a_replica_is_ready() -> None:
    requests = [_req(0, 0.0), _req(1, 1.0)]
    q = RequestQueues(requests, MODEL)
    q.placed(0)  # placed, still starting
    q.advance(T0 + 5)
    assert q.in_flight() == 2 and len(q.held) == 2
    q.ready(0, T0 + 10)
    q.advance(math.inf)
    assert q.latency_s == [12.0, 11.0]
    assert q.first_token_s == [11.0, 10.0]


def test_a_removed_replica_gives_its_waiting_requests_back_and_drains_its_running_ones() -> None:
    requests = [_req(i, 0.0) for i in range(3)]
    q = RequestQueues(requests, MODEL)
    q.placed(0)
    q.ready(0, T0 - 1)
    q.advance(T0)  # two run on 0, one waits on 0
    q.placed(1)
    q.ready(1, T0)
    q.removed(0, T0 + 0.5)  # the waiting one moves to 1; the running ones finish
    q.advance(math.inf)
    assert q.latency_s == [2.0, 2.0, 2.5]
    assert 0 not in q.replicas


def test_a_minute_needs_its_requests_in_flight_over_the_target() -> None:
    # 60 requests of 2 s in minute 0 (2 in flight on average), 300 in minute 1 (10).
    requests = [_req(i, i) for i in range(60)] + [_req(60 + i, 60 + i * 0.2) for i in range(300)]
    assert minute_need(requests, MODEL, target=1.5) == [2, 7]


def test_the_preroll_replays_the_first_minutes_before_the_hour() -> None:
    requests = [_req(0, 10.0), _req(1, 70.0), _req(2, 200.0)]
    served, preroll = with_preroll(requests, 2)
    assert preroll == 2
    assert [r.arrival_s - T0 for r in served] == [-110.0, -50.0, 10.0, 70.0, 200.0]
    assert [r.index for r in served] == [0, 1, 2, 3, 4]


def test_a_malformed_request_row_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "conv.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,-3,109\n"
    )
    with pytest.raises(TraceError, match=r"conv\.csv:3: ContextTokens"):
        read_azure(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(TraceError, match=r"conv\.csv:2: TIMESTAMP"):
        read_azure(path)


# -- end to end -----------------------------------------------------------------------------

BURST = (5 * 60, 8 * 60)  # seconds from the hour's start


def _requests_csv(path: Path) -> Path:
    """15 minutes: 12 requests a minute, 120 a minute from minute 5 to 8 (the burst)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    while t < 15 * 60:
        at = T0 + t
        whole = int(at)
        stamp = f"2023-11-16 18:{(whole // 60) % 60:02d}:{whole % 60:02d}.{int((at % 1) * 1e7):07d}"
        lines.append(f"{stamp},800,20")
        t += 0.5 if BURST[0] <= t < BURST[1] else 5.0
    path.write_text("\n".join(lines) + "\n")
    return path


def _philly_csv(path: Path) -> Path:
    """A Thursday of training: 1- to 8-GPU jobs from 17:00, some running past the hour."""
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(10):
        gpus = (1, 2, 4, 8)[i % 4]
        duration = 1800 + 600 * i
        rows.append(f"2017-10-19 17:{i * 5:02d}:00,{duration},{gpus},{duration * gpus},vc{i % 2}")
    for i in range(6):
        rows.append(f"2017-10-19 18:{20 + i:02d}:00,900,1,900,vc0")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_static_never_scales_and_the_autoscaler_follows_the_burst_as_its_rule_says(
    tmp_path: Path,
) -> None:
    requests = read_azure(_requests_csv(tmp_path / "conv.csv"))
    day, training = training_window(
        read_philly(_philly_csv(tmp_path / "philly.csv")),
        T0,
        T0 + 15 * 60,
        warmup_s=1.5 * 3600,
    )
    assert day == "2017-10-19" and len(training) == 16
    assert all(j.submit_s >= T0 - 1.5 * 3600 for j in training)  # shifted onto the day
    configs = {c.name: c for c in configurations(requests, MODEL, policy_of(default_policy()), 1)}
    static, auto = configs["static-peak"], configs["gitsched"]
    peak = max(minute_need(requests, MODEL, 0.75 * MODEL.max_concurrency))
    assert static.min_replicas == static.max_replicas == peak > 1
    s = setup(requests, training, MODEL, 2 * peak, 1.5 * 3600, 1.0)

    fixed = run_config(s, static)
    assert fixed.scaled == [] and fixed.windows == []
    assert [c for _, c in fixed.replicas_over_time] == [peak]
    span = s.hour_end_s - s.hour_start_s
    assert fixed.replica_gpu_s == peak * span
    # Training's GPU-seconds count each job's GPUs: the jobs submitted from 17:20 to 17:45
    # (1, 2, 4, 8, 1, 2 GPUs) run through the quarter hour; nothing holds more than there is.
    assert 18 * span <= fixed.training_gpu_s <= (sum(n.gpus for n in s.nodes) - peak) * span

    scaled = run_config(s, auto)
    ups = [e for e in scaled.scaled if e.to_replicas > e.from_replicas]
    downs = [e for e in scaled.scaled if e.to_replicas < e.from_replicas]
    at = [_seconds(e) for e in ups]
    assert ups and min(at) >= BURST[0] and min(at) < BURST[1] + 60  # up in the burst
    # ... and down after it, no sooner than the 300 s down-stabilisation allows.
    assert downs and min(_seconds(e) for e in downs) >= BURST[1] + 300 - 15
    assert max(e.to_replicas for e in ups) > auto.min_replicas
    # Every decision in its log is the one the product's rule makes again from the log.
    assert auto.autoscaling is not None
    for e in scaled.scaled:
        again = rejudge(
            e, auto.min_replicas, auto.max_replicas, auto.autoscaling, scaled.windows, scaled.scaled
        )
        assert again == e
    # Before the burst it holds its minimum; every request is served.
    assert not [e for e in scaled.scaled if _seconds(e) < BURST[0]]
    assert not any(math.isnan(v) for v in scaled.queues.latency_s)


def _seconds(e: ServiceScaled) -> float:
    at = moment(e.at)
    assert at is not None
    return at - T0


def test_bench_serving_prints_one_json_document_with_every_configuration(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "serving",
            "--requests",
            str(_requests_csv(tmp_path / "conv.csv")),
            "--philly",
            str(_philly_csv(tmp_path / "philly.csv")),
            "--minutes",
            "4",
            "--preroll-minutes",
            "1",
            "--warmup-hours",
            "1.5",
            "--min-replicas",
            "1",
            "--max-concurrency",
            "2",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {c["configuration"]: c for c in doc["configurations"]}
    assert list(rows) == ["static-peak", "hpa", "gitsched", "service-at-min"]
    assert doc["philly_day"] == "2017-10-19"
    for row in rows.values():
        assert row["requests"] == 4 * 12
        assert row["scaling_actions_rejudged_equal"] == row["scaling_actions_with_preroll"]
        assert row["service_gpu_hours"] > 0 and "p99_ttft_s" in row
    assert rows["static-peak"]["scaling_actions"] == 0


def test_bench_serving_stops_at_a_malformed_row(tmp_path: Path) -> None:
    bad = tmp_path / "conv.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,ten,1\n")
    result = CliRunner().invoke(
        main,
        ["bench", "serving", "--requests", str(bad), "--philly", str(_philly_csv(tmp_path / "p"))],
    )
    assert result.exit_code == EXIT_ERROR
    assert "conv.csv:2: ContextTokens" in result.output


def test_the_training_day_is_the_same_weekday_with_the_most_submissions_in_those_hours(
    tmp_path: Path,
) -> None:
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-12 18:{m:02d}:00,60,1,60,a" for m in (20, 30)]  # Thursday: 2
    rows += [f"2017-10-19 18:{m:02d}:00,60,1,60,a" for m in (20, 30, 40)]  # Thursday: 3
    rows += [f"2017-10-20 18:{m:02d}:00,60,1,60,a" for m in range(20, 50)]  # Friday: 30
    rows += [f"2017-10-26 {h}:30:00,60,1,60,a" for h in range(2, 12)]  # Thursday, other hours
    path = tmp_path / "philly.csv"
    path.write_text("\n".join(rows) + "\n")
    day, jobs = training_window(read_philly(path), T0, T0 + 3600, warmup_s=600)
    assert day == "2017-10-19"
    assert [j.submit_s - T0 for j in jobs] == [300.0, 900.0, 1500.0]
    day, jobs = training_window(read_philly(path), T0, T0 + 3600, 600, day="2017-10-12")
    assert day == "2017-10-12" and len(jobs) == 2
    with pytest.raises(TraceError, match="--philly-day"):
        training_window(read_philly(path), T0, T0 + 3600, 600, day="Thursday")


def test_a_replica_placed_again_is_not_freed_by_its_old_lifes_requests() -> None:
    requests = [_req(i, 0.0) for i in range(4)]
    q = RequestQueues(requests, MODEL)
    q.placed(0)
    q.ready(0, T0 - 1)
    q.advance(T0)  # 0 and 1 run, 2 and 3 wait
    q.removed(0, T0 + 0.5)  # moved: the waiting two wait at the router
    q.placed(0)
    q.ready(0, T0 + 1)
    q.advance(T0 + 2.5)  # the old life's two finish at T0 + 2: no slot of the new life frees
    assert q.replicas[0].running == 2
    q.advance(math.inf)
    assert q.latency_s == [2.0, 2.0, 3.0, 3.0]
