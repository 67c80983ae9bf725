"""`gitsched bench synth --seeds N`: the seeds are drawn, not chosen, the same for
everyone, and the distribution is read from every run."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from gitsched.bench.synth import command, distribution, side_by_side, synth_seeds


def _run(
    seed: int, gap: float | None, seconds: float, moves: int, status: str = "optimal"
) -> dict[str, Any]:
    side = {
        "status": status,
        "gap_pct": gap,
        "seconds": seconds,
        "moves": moves,
        "lost_gpu_hours": moves * 0.5,
        "move_lost_gpu_hours": moves * 0.25,
    }
    return {"seed": seed, "milp": side, "greedy": {**side, "moves": 0}, "better_by_pct": 10.0}


def test_seeds_are_reproducible_distinct_and_not_the_hand_picked_ones() -> None:
    assert synth_seeds(10) == synth_seeds(10)
    assert synth_seeds(5) == synth_seeds(10)[:5]
    assert len(set(synth_seeds(50))) == 50
    assert not {1, 2, 3} & set(synth_seeds(10))


def test_the_distribution_reports_median_p90_and_worst() -> None:
    runs = [
        _run(s, gap, float(s), s)
        for s, gap in zip(range(1, 11), [0.1 * i for i in range(10)], strict=True)
    ]
    runs.append(_run(11, None, 11.0, 11, status="time_limit"))
    d = distribution("M", "highs", runs)
    assert d["seeds"] == list(range(1, 12))
    # A run with no gap (no bound) counts as the worst, 100%.
    assert d["gap_pct"]["worst"] == 100.0
    assert d["gap_pct"]["median"] == 0.5
    assert d["seconds"] == {"median": 6.0, "p90": 10.0, "worst": 11.0}
    assert d["moves"]["worst"] == 11.0
    assert d["move_lost_gpu_hours"]["worst"] == 2.75
    assert d["time_limit_stops"] == 1


def test_engines_side_by_side_on_the_same_seeds_name_the_lowest_p90_gap() -> None:
    seeds = [11, 12, 13]
    highs = distribution("M", "highs", [_run(s, 0.5, 9.0, 2) for s in seeds])
    cpsat = distribution("M", "cpsat", [_run(s, 0.2, 9.5, 1) for s in seeds])
    cbc = distribution("M", "cbc", [_run(s, None, 10.0, 0, "time_limit") for s in seeds])
    both = side_by_side("M", {"highs": highs, "cbc": cbc, "cpsat": cpsat})
    assert both["seeds"] == seeds
    assert list(both["engines"]) == ["highs", "cbc", "cpsat"]
    assert both["lowest_p90_gap"] == "cpsat"
    assert both["engines"]["cbc"]["time_limit_stops"] == 3
    # Equal gaps: the faster engine at p90, then the order given.
    tied = distribution("M", "cpsat", [_run(s, 0.5, 9.0, 2) for s in seeds])
    assert side_by_side("M", {"highs": highs, "cpsat": tied})["lowest_p90_gap"] == "highs"


def test_engines_needs_seeds_and_known_names() -> None:
    runner = CliRunner()
    unknown = runner.invoke(command, ["--size", "S", "--seeds", "2", "--engines", "highs,gurobi"])
    assert unknown.exit_code != 0 and "unknown: gurobi" in unknown.output
    no_seeds = runner.invoke(command, ["--size", "S", "--engines", "highs,cpsat"])
    assert no_seeds.exit_code != 0 and "--engines takes --seeds N" in no_seeds.output
