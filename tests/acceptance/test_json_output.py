"""Every `--format json` command of the CLI prints exactly one JSON document, and nothing
else reaches stdout or stderr from the libraries below it (the HiGHS banner was one).

The commands are found by walking the CLI, so a new command with a json format fails
here until it has a case below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from gitsched.cli import main
from tests.support.cluster_repo import (
    ANA,
    POLICY_YAML,
    ClusterRepo,
    git,
    gitsched,
    job_yaml,
)
from tests.support.kube import ENV_VAR as KUBE_ENV
from tests.support.openb import write_trace

HIGHS_POLICY = POLICY_YAML.replace("{name: greedy}", "{name: highs}")
DCGM_SCRAPE = str(Path(__file__).parents[1] / "unit" / "telemetry" / "dcgm_scrape.prom")


def json_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        path = (*prefix, name)
        if isinstance(command, click.Group):
            yield from json_commands(command, path)
            continue
        for param in command.params:
            if (
                isinstance(param, click.Option)
                and "--format" in param.opts
                and isinstance(param.type, click.Choice)
                and "json" in param.type.choices
            ):
                yield " ".join(path)


# The arguments of each command, with {repo} and {dir} filled in; the exit codes it may give.
CASES: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "validate": (("validate", "{repo}"), (0,)),
    "state": (("state", "--repo", "{repo}"), (0,)),
    "plan": (("plan", "{repo}", "main..pr"), (1,)),
    "audit history": (("audit", "history", "--team", "ml", "--repo", "{repo}"), (0,)),
    "audit at": (("audit", "at", "--seq", "3", "--repo", "{repo}"), (0,)),
    "audit usage": (("audit", "usage", "--repo", "{repo}"), (0,)),
    "audit waits": (("audit", "waits", "--by", "size", "--repo", "{repo}"), (0,)),
    "audit fairshare": (("audit", "fairshare", "--repo", "{repo}"), (0,)),
    "audit solves": (("audit", "solves", "--repo", "{repo}"), (0,)),
    "telemetry ingest": (
        ("telemetry", "ingest", DCGM_SCRAPE, "--at", "2025-11-16T12:00:00Z", "--repo", "{repo}"),
        (0,),
    ),
    "audit changes": (("audit", "changes", "--repo", "{repo}"), (0,)),
    "demo": (("demo", "{dir}/demo-json"), (0,)),
    "audit compliance": (("audit", "compliance", "--repo", "{repo}"), (0, 1)),
    "log verify": (("log", "verify", "--repo", "{repo}"), (0,)),
    # the old name, hidden: its note goes to stderr, stdout stays one document
    "audit verify": (("audit", "verify", "--repo", "{repo}"), (0,)),
    "log info": (("log", "info", "--repo", "{repo}"), (0,)),
    "log snapshot": (("log", "snapshot", "--repo", "{repo}"), (0,)),
    "log snapshots": (("log", "snapshots", "--repo", "{repo}"), (0,)),
    "bench log": (("bench", "log", "--events", "40", "--jobs", "3"), (0,)),
    "bench synth": (("bench", "synth", "--size", "S", "--time-limit", "5"), (0,)),
    "bench reconcile": (
        ("bench", "reconcile", "--size", "S", "--commits", "1", "--jobs", "2", "--solver", "highs"),
        (0,),
    ),
    "bench openb": (
        (
            "bench",
            "openb",
            "--nodes",
            "{dir}/nodes.csv",
            "--pods",
            "{dir}/pods.csv",
            "--seeds",
            "1",
            "--mode",
            "batch",
            "--commit",
            "20",
        ),
        (0,),
    ),
    "bench audit": (
        ("bench", "audit", "--events", "2000", "--samples", "3", "--work-dir", "{dir}/audit"),
        (0,),
    ),
    "bench trace": (
        (
            "bench",
            "trace",
            "--trace",
            "{dir}/philly.csv",
            "--policy",
            "best-effort-fifo",
            "--limits",
            "known",
        ),
        (0,),
    ),
    "bench console": (
        (
            "bench",
            "console",
            "--nodes",
            "4",
            "--jobs",
            "12",
            "--queues",
            "2",
            "--requests",
            "2",
            "--work-dir",
            "{dir}/console",
        ),
        (0,),
    ),
    "bench serving": (
        (
            "bench",
            "serving",
            "--requests",
            "{dir}/conv.csv",
            "--philly",
            "{dir}/philly.csv",
            "--philly-day",
            "2017-10-02",
            "--warmup-hours",
            "0",
            "--preroll-minutes",
            "0",
        ),
        (0,),
    ),
    # On the test API server (scripts/kube up), as tests/kube does.
    "bench kube": (("bench", "kube", "--kubeconfig", "{kubeconfig}", "--nodes", "4"), (0,)),
    # Without an NVIDIA driver it fails (exit 2) and prints nothing on stdout.
    "inventory nvml": (("inventory", "nvml"), (0, 2)),
}


def test_every_json_command_has_a_case() -> None:
    assert set(json_commands(main)) == set(CASES)


@pytest.fixture(scope="module")
def highs_repo(tmp_path_factory: pytest.TempPathFactory) -> ClusterRepo:
    """A reconciled cluster whose Policy solves with HiGHS, and a branch `pr` to plan."""
    repo = ClusterRepo(tmp_path_factory.mktemp("json") / "cluster")
    repo.bootstrap()
    repo.write("policies/default.yaml", HIGHS_POLICY)
    repo.write("teams/ml/jobs/train.yaml", job_yaml("train", replicas=2, topology="nvlink"))
    repo.commit("ml: a 2x8 training gang on HiGHS", author=ANA)
    gitsched("reconcile", "--once", repo.path, expect=0)
    git(repo.path, "checkout", "-q", "-b", "pr")
    repo.write("teams/ml/jobs/eval.yaml", job_yaml("eval", gpu=4))
    repo.commit("ml: an evaluation job", author=ANA)
    git(repo.path, "checkout", "-q", "main")
    write_trace(repo.path.parent)
    (repo.path.parent / "philly.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:00,600,8,4800,a\n"
        "2017-10-02 00:01:00,300,1,300,b\n"
        "2017-10-02 00:02:00,60,16,960,a\n"
    )
    (repo.path.parent / "conv.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-13 00:0{i // 6}:{i % 6 * 10:02d}.0000000,900,60\n" for i in range(18))
    )
    return repo


@pytest.mark.parametrize("command", sorted(CASES))
def test_json_output_is_one_document_and_nothing_else(
    highs_repo: ClusterRepo, command: str
) -> None:
    args, codes = CASES[command]
    kubeconfig = os.environ.get(KUBE_ENV, "")
    if "{kubeconfig}" in args and not kubeconfig:
        pytest.fail(f"{command} needs the test API server: {KUBE_ENV} is unset (scripts/kube up)")
    filled = [
        a.format(repo=highs_repo.path, dir=highs_repo.path.parent, kubeconfig=kubeconfig)
        for a in args
    ]
    run = gitsched(*filled, "--format", "json")
    assert run.returncode in codes, str(run)
    assert "Running HiGHS" not in run.output, str(run)
    if run.returncode == 0 or run.stdout:
        json.loads(run.stdout)  # the whole of stdout: one document, no banner before it


def all_keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


def test_bench_synth_names_the_unit_of_every_gap_and_time() -> None:
    run = gitsched("bench", "synth", "--size", "S", "--gap", "0.01", "--format", "json", expect=0)
    result = json.loads(run.stdout)
    assert result["policy"] == {
        "fairness_weight": 1.0,  # the built-in policy's
        "gap_tolerance_pct": 1.0,
        "max_moves_per_solve": 8,
        "time_limit_s": 60.0,
        "levels": "weighted",  # the built-in policy's
    }
    assert result["milp"]["gap_pct"] is not None and result["greedy"]["gap_pct"] is None
    assert {"gap", "gap_tolerance", "better_by_percent", "phases"}.isdisjoint(all_keys(result))
    assert set(result["phases_seconds"]) >= {"build", "solve"}
