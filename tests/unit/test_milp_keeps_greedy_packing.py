"""The MILP never does worse than greedy on the same instance (issue #13): a job the model
admits but whose counts do not pack where it counted them is placed by greedy's packing on
what is left, and where both plans run the same jobs, the one that leaves less capacity
unusable to the learned job shapes is kept, and the solve says so."""

from __future__ import annotations

from dataclasses import replace

from gitsched.engine.model import ReplicaPlacement
from gitsched.engine.placement.formulation import BuildOptions, build
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import _less_fragmented
from gitsched.engine.placement.plan import JobOutcome, JobShape, OutcomeStatus
from gitsched.engine.placement.realise import pack_solution
from gitsched.engine.placement.warmstart import warm_values
from tests.support.factories import instance, job, node, queue


def test_a_job_the_model_admits_on_a_full_flavor_is_placed_on_what_is_left() -> None:
    nodes = [node("h", flavor="h100", gpus=8), node("a", flavor="a100", gpus=8)]
    inst = instance(nodes, [queue("q")], [job("y", gpu=8, flavors=("a100",)), job("x", gpu=4)])
    greedy = GreedyPlacer().solve(inst)
    model = build(inst, greedy, BuildOptions(small=True))
    warm = warm_values(model, inst, greedy)
    assert warm is not None
    # The model's counts put "x" on the A100 node too, where "y" already takes every GPU.
    x = model.jobs["q/x"]
    values = list(warm)
    for flavor, col in x.flavor.items():
        values[col] = 1.0 if flavor == "a100" else 0.0
    for cid, col in x.per_class.items():
        values[col] = 1.0 if cid == model.node_class["a"] else 0.0
    packed = pack_solution(inst, model, tuple(values))
    assert packed.status["q/y"] is OutcomeStatus.PLACED
    assert packed.status["q/x"] is OutcomeStatus.PLACED  # not lost for packing reasons
    assert {r.node for r in packed.packing.running["q/x"].replicas} == {"h"}
    assert packed.notes["q/x"] == "placed by repair after the solve"


def _placed(key: str, node_name: str, gpu: int, milli: int) -> JobOutcome:
    return JobOutcome(
        key, OutcomeStatus.PLACED, "h100", (ReplicaPlacement(node_name, (gpu,), milli),)
    )


def test_of_two_plans_that_run_the_same_the_one_leaving_whole_gpus_is_less_fragmented() -> None:
    jobs = [job("s1", gpu=0.5), job("s2", gpu=0.5)]
    inst = instance([node("n", gpus=4)], [queue("q")], jobs)
    # Both shares on one GPU leave three whole GPUs; on two GPUs, two whole and two halves.
    together = (_placed("q/s1", "n", 0, 500), _placed("q/s2", "n", 0, 500))
    apart = (_placed("q/s1", "n", 0, 500), _placed("q/s2", "n", 1, 500))
    assert not _less_fragmented(inst, together, apart)  # no learned shapes: nothing to tell
    whole_gpu_pods = ((JobShape(1000, 1000, 1024), 10),)
    learned = replace(inst, shapes=whole_gpu_pods)
    assert _less_fragmented(learned, together, apart)
    assert not _less_fragmented(learned, apart, together)
    # A plan that runs less is never preferred for its packing.
    assert not _less_fragmented(learned, together[:1], apart)
