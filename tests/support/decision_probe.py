"""One placement decision, printed as the events it appends (their type and data, as JSON):
run in subprocesses with different PYTHONHASHSEED values by test_determinism.py."""

from __future__ import annotations

import dataclasses
import json
import sys

from gitsched.engine import events as ev
from gitsched.engine.codec import to_data
from gitsched.engine.core import ApplyPlan, decide, placement_instance
from gitsched.engine.placement.solvers import solve
from gitsched.simulation.synth import folded_state, synth_instance


def main(solver: str) -> None:
    inst = synth_instance("S", 1)
    policy = dataclasses.replace(inst.policy, solver=solver, gap_tolerance=0.0, time_limit_s=120)
    state = folded_state(dataclasses.replace(inst, policy=policy))
    instance = placement_instance(state, inst.now)
    plan = solve(instance)
    events = decide(state, ApplyPlan(plan, "s1", inst.now))
    out = []
    for e in events:
        if isinstance(e, ev.SolveCompleted):
            e = dataclasses.replace(e, seconds=0.0)  # the solve's own wall time
        out.append({"type": e.type, "data": to_data(e)})
    json.dump(out, sys.stdout, sort_keys=True, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1])
