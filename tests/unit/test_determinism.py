"""The same log and commit give the same events in any process: a decision run in
subprocesses with different PYTHONHASHSEED values appends the same events, byte for byte.

Regression: the state's maps (HAMTs) iterate in an order that follows their keys' hashes,
and the running jobs reached the MILP's columns in that order, so the solver's choice among
equal-cost plans changed from one process to the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def decide_in_a_process(seed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.decision_probe", "highs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=True,
    )
    return done.stdout


def test_a_decision_appends_the_same_events_whatever_the_hash_seed() -> None:
    first = decide_in_a_process("0")
    assert b'"JobPreempted"' in first and b'"PlacementDecided"' in first
    for seed in ("1", "4242"):
        assert decide_in_a_process(seed) == first, f"PYTHONHASHSEED={seed} decided otherwise"
