"""`gitsched bench openb` on a file of the trace's format: every mode, every plan checked,
no figure above the bounds it is measured against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cluster_repo import gitsched
from tests.support.openb import write_trace


@pytest.mark.parametrize("mode", ["online", "batch", "reoptimise"])
def test_each_mode_stays_under_its_bounds_and_every_plan_is_checked(
    tmp_path: Path, mode: str
) -> None:
    nodes, pods = write_trace(tmp_path)
    run = gitsched(
        "bench", "openb", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "2",
        "--mode", mode, "--commit", "10", "--budget", "2", "--format", "json", expect=0,
    )  # fmt: skip
    result = json.loads(run.stdout)
    assert result["checked"] is True and result["mode"] == mode
    assert [s["seed"] for s in result["seeds"]] == [42, 43]
    eps = 1e-6
    for seed in result["seeds"]:
        assert seed["arrivals"] > 0
        assert 0 < seed["gitsched"] <= seed["bound_kept"] + eps <= seed["bound"] + 2 * eps
        assert seed["greedy"] <= seed["bound"] + eps
        # What is not allocated is free, on part-used GPUs or whole ones (rounded to 0.01).
        free = seed["free_in_shared_gpus"] + seed["free_whole_gpus"]
        assert seed["free_in_shared_gpus"] >= 0 and seed["free_whole_gpus"] >= 0
        assert abs(seed["gitsched"] + free - 100) <= 0.02, seed
        if mode == "reoptimise":
            # It starts from the batch plan and never stops a running pod: it can only gain.
            assert seed["start"] <= seed["gitsched"] + eps
        else:
            assert seed["start"] == seed["gitsched"]


def test_cpu_scale_builds_a_cpu_heavy_variant_and_says_so(tmp_path: Path) -> None:
    """Pods asking 2.5 times their CPU: CPU runs out first, so no more GPU is allocated
    than on the trace as published, and the output names the variant."""
    nodes, pods = write_trace(tmp_path)
    args = ("bench", "openb", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1")
    plain = json.loads(gitsched(*args, "--format", "json", expect=0).stdout)
    heavy = json.loads(gitsched(*args, "--cpu-scale", "2.5", "--format", "json", expect=0).stdout)
    assert plain["cpu_scale"] == 1.0 and heavy["cpu_scale"] == 2.5
    assert heavy["checked"] is True
    assert heavy["mean"]["bound"] <= plain["mean"]["bound"]
    text = gitsched(*args, "--cpu-scale", "2.5", expect=0).stdout
    assert "CPU x2.5" in text
    gitsched(*args, "--cpu-scale", "0", expect=2)
