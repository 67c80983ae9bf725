"""Learned job shapes (engine.shapes): the log's summary of what jobs look like, and
greedy's node choice over it (engine.placement.fragmentation: workload fragmentation plus
stranded GPU)."""

from __future__ import annotations

import dataclasses

from immutables import Map

from gitsched.engine import events as ev
from gitsched.engine.core import placement_instance
from gitsched.engine.model import Job, Placement, ReplicaPlacement
from gitsched.engine.placement.constraints import NodeFree
from gitsched.engine.placement.fragmentation import NodeScorer
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.objective import workload_fragmentation
from gitsched.engine.placement.plan import PlacementInstance, PlacementPlan
from gitsched.engine.shapes import (
    SHAPE_LIMIT,
    SHAPE_UNIT,
    SHAPE_WINDOW_JOBS,
    JobShape,
    job_shape,
    learned_shapes,
    remember_shape,
    shape_key,
)
from gitsched.engine.state import fold
from tests.support.factories import CLUSTER, instance, job, node, queue


def _with_shapes(inst: PlacementInstance, *shapes: tuple[JobShape, int]) -> PlacementInstance:
    return dataclasses.replace(inst, shapes=tuple(shapes))


def _replica(plan: PlacementPlan, key: str) -> ReplicaPlacement:
    outcome = plan.outcome(key)
    assert outcome is not None and outcome.running, outcome
    return outcome.replicas[0]


def _running(key: str, node_name: str, gpu: int, milli: int) -> Placement:
    return Placement(key, "h100", (ReplicaPlacement(node_name, (gpu,), milli),))


WHOLE = JobShape(1000, 1000, 1024)
SMALL_SHARE = JobShape(160, 1000, 1024)


def test_a_share_fills_the_remainder_an_810_left_instead_of_breaking_a_whole_gpu() -> None:
    """Best fit on free GPU sends a 160 share to the emptier-looking single-GPU node and
    breaks its whole GPU; knowing the workload is mostly whole-GPU jobs, the share goes
    into the 190 milli the 810 share left, and every whole GPU stays whole."""
    big = job("big", gpu=0.81, submitted_at="1")
    small = job("small", gpu=0.16, submitted_at="2")
    nodes = [node("a", gpus=2), node("b", gpus=1)]
    current = {big.key: _running(big.key, "a", 0, 810)}
    inst = instance(nodes, [queue("q")], [big, small], current=current)
    plain = _replica(GreedyPlacer().solve(inst), small.key)
    assert plain.node == "b"  # best fit: 1000 - 160 left on b is less than 1190 - 160 on a
    learned = _with_shapes(inst, (WHOLE, 9 * SHAPE_UNIT), (SMALL_SHARE, SHAPE_UNIT))
    chosen = _replica(GreedyPlacer().solve(learned), small.key)
    assert (chosen.node, chosen.gpus) == ("a", (0,))


def test_a_cpu_hungry_job_goes_where_cpu_is_to_spare_so_no_gpu_is_stranded() -> None:
    """FGD's measure sees only the next job. Best fit puts a CPU-only job on the node with
    the least CPU left; with the workload's 1-GPU jobs asking 16 CPU each, that leaves
    the small node's GPUs without the CPU to feed them. The stranded-GPU term sends the
    job to the node with CPU to spare."""
    cpu_job = job("cpu", gpu=0, cpu=24, submitted_at="1")
    nodes = [node("small", gpus=2, cpu=40), node("large", gpus=2, cpu=128)]
    inst = instance(nodes, [queue("q")], [cpu_job])
    assert _replica(GreedyPlacer().solve(inst), cpu_job.key).node == "small"
    learned = _with_shapes(inst, (JobShape(1000, 16_000, 1024), SHAPE_UNIT))
    assert _replica(GreedyPlacer().solve(learned), cpu_job.key).node == "large"


def test_the_least_growth_is_chosen_across_the_flavors_a_job_may_take() -> None:
    """Flavor order alone would put an any-flavor share on the first flavor's empty node;
    knowing the workload, it fills the a100 GPU an 810 share left."""
    big = dataclasses.replace(job("big", gpu=0.81, submitted_at="1"), gpu_flavors=("a100",))
    small = job("small", gpu=0.16, submitted_at="2")
    nodes = [node("h", gpus=1), node("a", flavor="a100", gpus=1)]
    current = {big.key: Placement(big.key, "a100", (ReplicaPlacement("a", (0,), 810),))}
    inst = instance(nodes, [queue("q")], [big, small], current=current)
    assert _replica(GreedyPlacer().solve(inst), small.key).node == "h"
    learned = _with_shapes(inst, (WHOLE, 9 * SHAPE_UNIT), (SMALL_SHARE, SHAPE_UNIT))
    assert _replica(GreedyPlacer().solve(learned), small.key).node == "a"


def test_growth_is_zero_where_nothing_the_workload_asks_for_is_lost() -> None:
    inst = _with_shapes(instance([node("a", gpus=2)], [queue("q")], []), (WHOLE, SHAPE_UNIT))
    scorer = NodeScorer.of(inst)
    assert scorer is not None
    free = NodeFree.of(inst.nodes[0])
    # A whole GPU taken from two whole ones leaves one whole GPU: nothing unusable.
    assert scorer.growth(free, 1000, 1000, 1024) == (0.0, -1)
    # A share breaks a GPU that whole-GPU jobs could have used: its remainder is lost.
    growth, gpu = scorer.growth(free, 500, 1000, 1024)
    assert growth == 500.0 and gpu == 0
    assert NodeScorer.of(instance([node("a")], [queue("q")], [])) is None


def _submissions(jobs: list[Job]) -> list[ev.Event]:
    return [
        ev.ClusterConfigured(cluster=CLUSTER),
        *(ev.JobSubmitted(job=j) for j in jobs),
    ]


def test_shapes_are_published_once_a_window_is_full_and_older_ones_decay() -> None:
    whole = [job(f"w{i}", gpu=1) for i in range(SHAPE_WINDOW_JOBS)]
    state = fold(_submissions(whole[:-1]))
    assert state.shapes == Map() and state.shapes_window_jobs == SHAPE_WINDOW_JOBS - 1
    assert placement_instance(state, "").shapes == ()
    state = fold([ev.JobSubmitted(job=whole[-1])], state)
    key = shape_key(job_shape(whole[0]))
    assert dict(state.shapes) == {key: SHAPE_WINDOW_JOBS * SHAPE_UNIT}
    assert placement_instance(state, "").shapes == learned_shapes(state.shapes)
    shares = [job(f"s{i}", gpu=0.5) for i in range(SHAPE_WINDOW_JOBS)]
    state = fold((ev.JobSubmitted(job=j) for j in shares), state)
    weights = dict(state.shapes)
    # The older window lost an eighth of its weight; the new one counts in full.
    assert weights[key] == SHAPE_WINDOW_JOBS * SHAPE_UNIT * 7 // 8
    assert weights[shape_key(job_shape(shares[0]))] == SHAPE_WINDOW_JOBS * SHAPE_UNIT
    # CPU-only jobs take no GPU and are not counted.
    cpu_only = fold([ev.JobSubmitted(job=job("c", gpu=0))], state)
    assert cpu_only.shapes_window_jobs == state.shapes_window_jobs


def test_the_summary_is_bounded_and_the_same_on_replay_in_any_map_order() -> None:
    jobs = [
        job(f"j{i}", gpu=(i % (SHAPE_LIMIT + 20) + 1) / 100) for i in range(3 * SHAPE_WINDOW_JOBS)
    ]
    first = fold(_submissions(jobs))
    again = fold(_submissions(jobs))
    assert 0 < len(first.shapes) <= SHAPE_LIMIT
    assert learned_shapes(first.shapes) == learned_shapes(again.shapes)
    # The published weights follow from the counts alone, not the order within a window.
    window = jobs[:SHAPE_WINDOW_JOBS]
    counts = (Map(), Map(), 0)
    for j in reversed(window):
        counts = remember_shape(counts, j)
    forward = fold(_submissions(window))
    assert dict(counts[0]) == dict(forward.shapes)


def test_workload_fragmentation_counts_what_the_shapes_cannot_use() -> None:
    # One shape: a whole GPU, no CPU or memory needs (steps 0). A node with one GPU at 400
    # free and one whole: the 400 are stranded for it.
    shapes = ((1.0, -1, -1, 1, 1000, frozenset({"T4"})),)
    assert workload_fragmentation("T4", (400, 1000), 0, 0, shapes) == 400
    assert workload_fragmentation("V100", (400, 1000), 0, 0, shapes) == 1400
    half = ((1.0, -1, -1, 1, 500, frozenset({"T4"})),)
    assert workload_fragmentation("T4", (400, 1000), 0, 0, half) == 400


def test_stranded_gpu_counts_only_where_the_clusters_cpu_could_feed_its_gpus() -> None:
    """Where the workload asks more CPU per GPU than the cluster has, CPU runs out first
    whatever the choice: stranded GPU is no longer counted, fragmentation alone decides."""
    nodes = [node("small", gpus=2, cpu=40), node("large", gpus=2, cpu=128)]
    inst = instance(nodes, [queue("q")], [])
    fed = NodeScorer.of(_with_shapes(inst, (JobShape(1000, 16_000, 1024), SHAPE_UNIT)))
    starved = NodeScorer.of(_with_shapes(inst, (JobShape(1000, 64_000, 1024), SHAPE_UNIT)))
    assert fed is not None and fed.gpu_bound
    assert starved is not None and not starved.gpu_bound
    assert fed.stranded(2000, 16_000, 1 << 20) == 1000.0
    assert starved.stranded(2000, 16_000, 1 << 20) == 0.0
