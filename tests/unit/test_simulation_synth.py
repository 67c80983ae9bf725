"""gitsched.simulation.synth.folded_state: the one way a synthetic instance becomes the folded state
that the bench (gitsched bench synth) and the determinism probe decide on (issue #13)."""

from __future__ import annotations

import dataclasses

import pytest

from gitsched.engine.core import placement_instance
from gitsched.engine.model import Policy
from gitsched.simulation.synth import folded_state, synth_instance, with_new_jobs


@pytest.mark.parametrize("seed", [1, 2])
def test_the_state_gives_back_the_instance_it_was_built_from(seed: int) -> None:
    inst = with_new_jobs(synth_instance("S", seed), 5, seed)
    inst = dataclasses.replace(inst, policy=Policy(solver="cbc", time_limit_s=7.0))
    back = placement_instance(folded_state(inst), inst.now)
    assert back.policy == inst.policy and back.cluster == inst.cluster
    assert sorted(back.nodes, key=lambda n: n.name) == sorted(inst.nodes, key=lambda n: n.name)
    assert back.queues == inst.queues
    assert sorted(back.jobs, key=lambda j: j.key) == sorted(inst.jobs, key=lambda j: j.key)
    assert inst.current and dict(back.current) == dict(inst.current)
