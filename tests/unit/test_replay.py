"""The trace replay (simulation.replay): the trace's readers, the cluster it sizes, and
waits measured through the reconciler's own step at the events' times."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gitsched.cli import main
from gitsched.engine.model import Policy
from gitsched.engine.units import GPU_MILLI
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from gitsched.simulation.replay import (
    OVERESTIMATE,
    ReplayPolicy,
    TraceError,
    TraceJob,
    figures,
    jain,
    policies,
    read_philly,
    replay,
    size_cluster,
    time_limits,
)
from gitsched.simulation.tail import tail_report

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
FIFO = ReplayPolicy("best-effort-fifo", Policy(solver="greedy", preemption_enabled=False))
BUILTIN = ReplayPolicy("gitsched", policy_of(default_policy()))


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "philly.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def test_a_malformed_row_names_its_file_and_line(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        ["2017-10-02 00:00:00,60,1,60,a", "2017-10-02 00:01:00,sixty,1,60,a"],
    )
    with pytest.raises(TraceError, match=r"philly\.csv:3: duration: not a number"):
        read_philly(path)
    bad_time = _csv(tmp_path, ["2017-10-02T00:00,60,1,60,a"])
    with pytest.raises(TraceError, match=r":2: timestamp"):
        read_philly(bad_time)
    short = _csv(tmp_path, ["2017-10-02 00:00:00,60,1"])
    with pytest.raises(TraceError, match=r":2: "):
        read_philly(short)


def test_the_window_keeps_the_jobs_submitted_in_it(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        [
            "2017-10-01 23:59:59,60,1,60,a",
            "2017-10-02 00:00:00,60,1,60,a",
            "2017-10-02 23:59:59,60,2,120,b",
            "2017-10-03 00:00:00,60,1,60,a",
        ],
    )
    jobs = read_philly(path, "2017-10-02", 1)
    assert [(j.gpus, j.team) for j in jobs] == [(1, "a"), (2, "b")]
    assert [j.index for j in jobs] == [0, 1]


def test_the_cluster_holds_the_largest_job_and_quotas_add_up() -> None:
    jobs = [
        TraceJob(0, 0.0, 3600.0, 32 * GPU_MILLI, "a"),
        TraceJob(1, 7200.0, 3600.0, 1 * GPU_MILLI, "b"),
        TraceJob(2, 7200.0, 3600.0, 1 * GPU_MILLI, "c"),
    ]
    cluster = size_cluster(jobs, load=1.0)
    assert cluster.gpus >= 32 and cluster.gpus % 8 == 0
    nominal = sum(fq.nominal for q in cluster.queues for fq in q.quotas)
    assert nominal == cluster.gpus * GPU_MILLI
    assert {q.cohort for q in cluster.queues} == {"philly"}
    shares = {q.name: q.quotas[0].nominal for q in cluster.queues}
    assert shares["a"] > shares["b"] == shares["c"]


@pytest.mark.parametrize("rp", [FIFO, BUILTIN], ids=lambda rp: rp.name)
def test_a_job_waits_until_the_gpus_it_needs_free_up(rp: ReplayPolicy) -> None:
    """One 8-GPU node: a full-node job runs 100 s from t=0; a one-GPU job committed at
    t=10 starts at t=100, when the first finishes (its JobFinished's time)."""
    jobs = [
        TraceJob(0, 0.0, 100.0, 8 * GPU_MILLI, "a"),
        TraceJob(1, 10.0, 50.0, 1 * GPU_MILLI, "a"),
    ]
    cluster = size_cluster(jobs, load=100.0)
    assert cluster.gpus == 8
    result = replay(jobs, cluster, rp)
    runs = {r.trace.index: r for r in result.jobs}
    assert (runs[0].first_start, runs[0].finish) == (0.0, 100.0)
    assert (runs[1].first_start, runs[1].finish) == (100.0, 150.0)
    out = figures(result)
    assert out["mean_wait_s"] == 45.0
    assert out["max_wait_s"] == 90.0
    assert out["makespan_s"] == 150.0
    assert out["mean_jct_s"] == (100.0 + 140.0) / 2
    assert out["jobs_never_started"] == 0
    # 8 GPUs for 100 s, then 1 for 50, over a makespan of 150 s.
    assert out["gpu_utilisation_makespan"] == pytest.approx((800 + 50) / (8 * 150))


def test_time_limits_over_estimate_each_run_by_a_seeded_factor() -> None:
    jobs = [TraceJob(i, float(i), 600.0 * (i + 1), GPU_MILLI, "a") for i in range(50)]
    limits = time_limits(jobs, seed=3)
    assert limits == time_limits(jobs, seed=3)
    assert limits != time_limits(jobs, seed=4)
    low, high = OVERESTIMATE
    for j in jobs:
        assert low * j.duration_s / 60 <= limits[j.index] <= high * j.duration_s / 60 + 1


def test_jain_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_bench_trace_prints_one_json_document_per_run(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        [
            "2017-10-02 00:00:00,600,8,4800,a",
            "2017-10-02 00:01:00,300,1,300,b",
            "2017-10-02 00:02:00,60,1,60,b",
            "2017-10-02 00:03:00,1200,2,2400,a",
        ],
    )
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "trace",
            "--trace",
            str(path),
            "--start",
            "2017-10-02",
            "--days",
            "1",
            "--policy",
            "best-effort-fifo",
            "--policy",
            "sjf-oracle",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [p["policy"] for p in doc["policies"]] == ["best-effort-fifo", "sjf-oracle"] * 2
    assert [p["limits_known"] for p in doc["policies"]] == [True, True, False, False]
    for p in doc["policies"]:
        assert p["jobs"] == 4 and p["jobs_never_started"] == 0
        assert {"mean_wait_s", "p99_wait_s", "gpu_utilisation_window", "p99_decision_cpu_s"} <= set(
            p
        )


@pytest.mark.parametrize("engine", ["cbc", "cpsat"])
def test_bench_trace_runs_the_built_in_policy_on_the_engine_asked(
    tmp_path: Path, engine: str
) -> None:
    """Issue 29: the time replay per engine. The decisions say which engine made them."""
    path = _csv(
        tmp_path,
        [
            "2017-10-02 00:00:00,600,8,4800,a",
            "2017-10-02 00:01:00,300,1,300,b",
            "2017-10-02 00:03:00,1200,2,2400,a",
        ],
    )
    args = ["bench", "trace", "--trace", str(path), "--start", "2017-10-02", "--days", "1"]
    args += ["--policy", "gitsched", "--limits", "known", "--solver", engine, "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["solver"] == engine
    (run,) = doc["policies"]
    assert run["jobs"] == 3 and run["jobs_never_started"] == 0
    assert set(run["solvers"]) <= {engine, "greedy"} and engine in run["solvers"]


def test_bench_trace_stops_at_a_malformed_row(tmp_path: Path) -> None:
    path = _csv(tmp_path, ["2017-10-02 00:00:00,600,eight,4800,a"])
    result = CliRunner().invoke(main, ["bench", "trace", "--trace", str(path)])
    assert result.exit_code == 2
    assert "philly.csv:2: num_gpus" in result.output


def test_easy_backfill_holds_the_job_that_would_delay_the_gangs_reservation() -> None:
    """Two 8-GPU nodes. A (8 GPUs, limit 2,000 s) runs from t=0 and ends at 1,000; B asks
    16 GPUs at t=1; C asks 8 at t=2 and runs 5,000 s. Best-effort FIFO starts C at once on
    the free node, so B waits for C; EASY backfill reserves both nodes for B from A's limit,
    holds C (it would run past it), starts B when A ends, then C."""
    jobs = [
        TraceJob(0, 0.0, 1000.0, 8 * GPU_MILLI, "a"),
        TraceJob(1, 1.0, 100.0, 16 * GPU_MILLI, "a"),
        TraceJob(2, 2.0, 5000.0, 8 * GPU_MILLI, "a"),
    ]
    cluster = size_cluster(jobs, load=1000.0)
    assert cluster.gpus == 16
    limits = {0: 34, 1: 10, 2: 167}  # minutes: each a little above its run
    by_name = {rp.name: rp for rp in policies(policy_of(default_policy()))}

    def starts(name: str) -> dict[int, float | None]:
        result = replay(jobs, cluster, by_name[name], limits)
        return {r.trace.index: r.first_start for r in result.jobs}

    assert starts("best-effort-fifo") == {0: 0.0, 1: 5002.0, 2: 2.0}
    assert starts("easy-backfill") == {0: 0.0, 1: 1000.0, 2: 1100.0}
    assert starts("gitsched") == {0: 0.0, 1: 1000.0, 2: 1100.0}


def test_strict_fifo_holds_a_queue_behind_its_head_other_queues_go_on() -> None:
    """Two 8-GPU nodes, no limits known. a/0 (8 GPUs) runs 0-1,000; a/1 asks 16 at t=1;
    a/2 asks 8 at t=2 for 5,000 s; b/3 asks 8 at t=3 for 50 s. Best-effort FIFO starts a/2
    at once, and a/1 waits for it; strict FIFO holds a/2 behind a/1, lets b/3 (another
    queue) start, and starts a/1 when a/0 ends, then a/2."""
    jobs = [
        TraceJob(0, 0.0, 1000.0, 8 * GPU_MILLI, "a"),
        TraceJob(1, 1.0, 100.0, 16 * GPU_MILLI, "a"),
        TraceJob(2, 2.0, 5000.0, 8 * GPU_MILLI, "a"),
        TraceJob(3, 3.0, 50.0, 8 * GPU_MILLI, "b"),
    ]
    cluster = size_cluster(jobs, load=1000.0)
    assert cluster.gpus == 16
    by_name = {rp.name: rp for rp in policies(policy_of(default_policy()))}

    def starts(name: str) -> dict[int, float | None]:
        result = replay(jobs, cluster, by_name[name], None)
        return {r.trace.index: r.first_start for r in result.jobs}

    assert starts("best-effort-fifo") == {0: 0.0, 1: 5002.0, 2: 2.0, 3: 1000.0}
    assert starts("strict-fifo") == {0: 0.0, 1: 1000.0, 2: 1100.0, 3: 3.0}


def test_bench_trace_draws_utilisation_and_the_wait_cdf(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        ["2017-10-02 00:00:00,600,8,4800,a", "2017-10-02 00:01:00,300,1,300,b"],
    )
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "trace",
            "--trace",
            str(path),
            "--policy",
            "best-effort-fifo",
            "--limits",
            "unknown",
            "--plot",
            str(out),
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert sorted(Path(p).name for p in doc["plots"]) == ["utilisation.png", "wait-cdf.png"]
    for name in ("utilisation.png", "wait-cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_an_openb_window_replays_the_gpu_pods_created_in_it(tmp_path: Path) -> None:
    path = tmp_path / "openb.csv"
    day = 86400
    path.write_text(
        OPENB_HEADER
        + f"p0,8000,1024,1,1000,,LS,Running,{day - 1},{day + 600},0\n"  # before the window
        + f"p1,8000,1024,1,500,,LS,Running,{day},{day + 600},0\n"  # half a GPU, 600 s
        + f"p2,8000,1024,2,1000,,BE,Running,{day + 60},{day + 3660},0\n"
        + f"p3,8000,1024,0,0,,BE,Running,{day + 90},{day + 900},0\n"  # no GPU
        + f"p4,8000,1024,1,1000,,BE,Running,{day + 120},,0\n"  # never deleted
        + f"p5,8000,1024,1,1000,,LS,Running,{2 * day},{2 * day + 60},0\n"  # after it
    )
    args = ["bench", "trace", "--trace", str(path), "--start", "1", "--days", "1"]
    result = CliRunner().invoke(
        main, [*args, "--policy", "best-effort-fifo", "--limits", "unknown", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    [p] = doc["policies"]
    assert (doc["jobs"], p["jobs_never_started"]) == (2, 0)
    assert sorted(p["queues"]) == ["BE", "LS"]
    bad = CliRunner().invoke(main, [*args[:4], "--start", "2017-10-09"])
    assert bad.exit_code == 2
    assert "an openb window starts at a number of days" in bad.output


def test_the_total_wait_counts_the_wait_after_a_preemption() -> None:
    """One 8-GPU node, queues a and b with 4 GPUs nominal each in one cohort. a's 8-GPU job
    borrows b's half from t=0; b's 4-GPU job at t=100 reclaims it (the built-in policy
    preempts), so a's job waits again until b's ends at t=1,100. Its first wait is 0, its
    total queue time 1,000 s: the figure the total-wait keys report."""
    jobs = [
        TraceJob(0, 0.0, 5000.0, 8 * GPU_MILLI, "a"),
        TraceJob(1, 100.0, 1000.0, 4 * GPU_MILLI, "b"),
    ]
    sized = size_cluster(jobs, load=100.0)
    assert sized.gpus == 8
    halves = tuple(
        replace(q, quotas=(replace(q.quotas[0], nominal=4 * GPU_MILLI),)) for q in sized.queues
    )
    cluster = replace(sized, queues=halves)
    result = replay(jobs, cluster, BUILTIN, record=True)
    runs = {r.trace.index: r for r in result.jobs}
    assert runs[0].preemptions == 1 and runs[0].first_start == 0.0
    assert runs[0].queued_s == 1000.0  # stopped at t=100, started again at t=1,100
    assert runs[1].queued_s == 0.0
    out = figures(result)
    assert out["mean_wait_s"] == 0.0
    assert out["mean_total_wait_s"] == 500.0
    assert out["max_total_wait_s"] == 1000.0
    # The decision log says who stopped it and why.
    stops = [s for d in result.log for s in d.stopped]
    assert stops == [("a/j000000", "b/j000001", "reclaim")]
    # The tail's diagnosis: the worst job's whole queue time came after its preemption.
    tail = tail_report(result, share=0.5)
    assert (tail.jobs, tail.preempted_jobs, tail.rewait_share) == (1, 1, 1.0)
    assert dict(tail.preempted_by) == {"reclaim": 1}


def test_bench_trace_tail_says_what_passed_the_worst_jobs(tmp_path: Path) -> None:
    """`--tail`: per policy, the worst 1% of jobs by total wait and who started ahead of
    them, in the JSON document and in one line of text per policy. One 8-GPU node: an
    8-GPU job waits behind the first, while a younger 1-GPU job that fits starts."""
    path = _csv(
        tmp_path,
        [
            "2017-10-02 00:00:00,4000,4,16000,a",
            "2017-10-02 00:00:10,600,8,4800,a",
            "2017-10-02 00:00:20,600,1,600,b",
        ],
    )
    args = ["bench", "trace", "--trace", str(path), "--policy", "best-effort-fifo"]
    result = CliRunner().invoke(
        main, [*args, "--limits", "unknown", "--load", "100", "--tail", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    [p] = json.loads(result.output)["policies"]
    tail = p["tail"]
    assert tail["jobs"] == 1 and tail["mean_total_wait_s"] == pytest.approx(3990.0)
    assert tail["younger_started"] == 1
    text = CliRunner().invoke(main, [*args, "--limits", "unknown", "--load", "100", "--tail"])
    assert text.exit_code == 0, text.output
    assert (
        "tail of best-effort-fifo (limits unknown): the worst 1 jobs waited 3990 s" in text.output
    )
    plain = CliRunner().invoke(main, [*args, "--limits", "unknown", "--format", "json"])
    assert "tail" not in json.loads(plain.output)["policies"][0]
