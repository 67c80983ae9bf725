"""The decomposed solve on small instances: the cut, the quota split, the merged plan."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gitsched.engine.model import Job, Node, NodeState, Placement, Policy, Queue
from gitsched.engine.placement import decompose, preemption, solvers
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.decompose import (
    DecomposedPlacer,
    _split,
    fluid_bound,
    partition,
    quota_violations,
)
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.objective import plan_objective, weights
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    SolveStats,
)
from gitsched.simulation.synth import CLUSTER, NOW, synth_jobs, synth_nodes, synth_queues
from tests.support.factories import instance as factory_instance
from tests.support.factories import job, node, queue


def tiny(nodes: int = 36, jobs: int = 90, seed: int = 1, gap: float = 0.0) -> PlacementInstance:
    """A synth-shaped instance small enough to solve exactly; the first third runs."""
    rng = random.Random(f"tiny-{seed}")
    ns = synth_nodes(nodes, rng)
    qs = synth_queues(8, ns, rng)
    js = synth_jobs(jobs, qs, rng)
    policy = Policy(solver="highs", gap_tolerance=gap, time_limit_s=30.0)
    early = PlacementInstance(
        CLUSTER, tuple(ns), tuple(qs), tuple(js[: jobs // 3]), {}, policy, NOW
    )
    current = GreedyPlacer().solve(early).placements()
    return PlacementInstance(CLUSTER, tuple(ns), tuple(qs), tuple(js), current, policy, NOW)


def test_split_adds_up_and_gives_needs_first() -> None:
    assert _split(100, [30, 10, 0], [1.0, 1.0, 2.0]) == [45, 25, 30]
    assert sum(_split(7, [0, 0, 0], [1.0, 1.0, 1.0])) == 7
    # Short of the needs: by need.
    assert _split(10, [15, 5], [1.0, 1.0]) == [8, 2]  # 7.5 and 2.5: the tie to the lower index


def test_partition_covers_everything_once_and_quotas_add_up() -> None:
    instance = tiny()
    cut = partition(instance, 3)
    names = [n.name for p in cut.parts for n in p.nodes]
    assert sorted(names) == sorted(n.name for n in instance.nodes)
    # Every part gets an even share of each flavor's GPUs (to one domain of the cut).
    for flavor in ("h100", "gb200"):
        gpus = [sum(n.gpus for n in p.nodes if n.flavor == flavor) for p in cut.parts]
        assert max(gpus) - min(gpus) <= 72, (flavor, gpus)
    assert all(p.nodes and p.jobs for p in cut.parts)
    keys = [j.key for p in cut.parts for j in p.jobs]
    assert sorted(keys) == sorted(j.key for j in instance.jobs)
    for k, part in enumerate(cut.parts):
        mine = {n.name for n in part.nodes}
        for key, placement in part.current.items():
            assert {r.node for r in placement.replicas} <= mine, key
            assert cut.job_part[key] == k
    for q in instance.queues:
        for fq in q.quotas:
            pieces = []
            for part in cut.parts:
                queue = part.queue(q.name)
                piece = queue.quota(fq.flavor) if queue else None
                assert piece is not None
                pieces.append(piece)
            assert sum(x.nominal for x in pieces) == fq.nominal
            assert sum(x.guaranteed for x in pieces) == fq.guaranteed
            if fq.borrowing_limit is not None:
                assert sum(x.borrowing_limit or 0 for x in pieces) == fq.borrowing_limit
            else:
                assert all(x.borrowing_limit is None for x in pieces)
            if fq.lending_limit is not None:
                assert sum(x.lending_limit or 0 for x in pieces) == fq.lending_limit


def test_partition_is_a_function_of_the_instance() -> None:
    a, b = partition(tiny(), 3), partition(tiny(), 3)
    assert a.node_part == b.node_part and a.job_part == b.job_part
    assert [p.queues for p in a.parts] == [p.queues for p in b.parts]
    other = partition(tiny(seed=2), 3)
    assert other.job_part != a.job_part


def test_running_jobs_keep_their_quota_in_their_part() -> None:
    """Each part's quotas take what its running jobs use, so no part must preempt to fit."""
    instance = tiny()
    assert instance.current
    for part in partition(instance, 3).parts:
        kept = [
            JobOutcome(k, OutcomeStatus.KEPT, p.flavor, p.replicas) for k, p in part.current.items()
        ]
        assert not quota_violations(part, kept)


def test_decomposed_plan_is_legal_and_its_bound_holds() -> None:
    instance = tiny()
    decompose_parts = 3
    placer = DecomposedPlacer("highs", workers=1, parts=decompose_parts)
    plan = placer.solve(instance)
    assert check_plan(instance, plan) == []
    assert plan.stats.solver == "highs/decomposed"
    assert placer.last_report is not None and placer.last_report.parts == decompose_parts
    assert not placer.last_report.fell_back
    best = MilpPlacer("highs").solve(instance)
    assert plan.stats.bound is not None
    # The fluid bound bounds every plan: the whole problem's optimum and the merged plan.
    assert plan.stats.bound >= best.stats.objective - 1e-6 * abs(best.stats.objective)
    assert plan.stats.bound >= plan.stats.objective
    assert plan.stats.gap is not None and plan.stats.gap >= 0


@pytest.mark.parametrize("seed", [1, 3])
def test_fluid_bound_bounds_the_optimum(seed: int) -> None:
    instance = tiny(nodes=27, jobs=60, seed=seed)
    best = MilpPlacer("highs").solve(instance)
    assert best.stats.gap is not None and best.stats.gap <= 1e-6  # solved to optimality
    bound = fluid_bound(instance)
    assert bound is not None
    assert bound >= best.stats.objective - 1e-6 * abs(best.stats.objective)


def test_incremental_touches_only_the_parts_that_take_new_jobs() -> None:
    instance = tiny(jobs=60)
    solved = MilpPlacer("highs").solve(instance)
    running = {k: replace(p, started_at=NOW) for k, p in solved.placements().items()}
    rng = random.Random("tiny-new")
    fresh = [
        replace(j, name=f"new{i}") for i, j in enumerate(synth_jobs(5, list(instance.queues), rng))
    ]
    later = replace(instance, jobs=(*instance.jobs, *fresh), current=running)
    placer = DecomposedPlacer("highs", workers=1, parts=3)
    plan = placer.solve_incremental(later, [j.key for j in fresh])
    assert check_plan(later, plan) == []
    assert placer.last_report is not None and placer.last_report.solved_parts == 1
    for o in plan.outcomes:
        if o.job in running and o.status is not OutcomeStatus.PREEMPTED:
            assert o.status is OutcomeStatus.KEPT and o.replicas == running[o.job].replicas
        if o.job not in running and not o.job.split("/")[-1].startswith("new"):
            assert o.status is OutcomeStatus.PENDING


def test_solvers_decompose_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    instance = tiny(jobs=45)
    monkeypatch.setattr(decompose, "DECOMPOSE_NODES", 10)
    monkeypatch.setattr(decompose, "PART_NODES", 16)
    plan = solvers.solve(instance, "highs")
    assert plan.stats.solver == "highs/decomposed"
    assert check_plan(instance, plan) == []
    monkeypatch.setattr(decompose, "DECOMPOSE_NODES", 10_000)
    assert solvers.solve(instance, "highs").stats.solver == "highs"


def test_an_edited_running_job_is_decided_in_its_own_part() -> None:
    instance = tiny()
    plain = partition(instance, 3, active_count=1, assign=[])
    elsewhere = [k for k in sorted(instance.current) if plain.job_part[k] not in plain.active]
    assert elsewhere
    cut = partition(instance, 3, active_count=1, assign=[], changed=[elsewhere[0]])
    assert set(cut.active) == {*plain.active, plain.job_part[elsewhere[0]]}


def test_the_cut_of_a_kept_node_list_is_the_cut_made_afresh() -> None:
    instance = tiny()
    decompose._DOMAINS.clear()
    cold = partition(instance, 3, active_count=1, assign={instance.jobs[-1].key})
    warm = partition(instance, 3, active_count=1, assign={instance.jobs[-1].key})
    assert warm == cold and decompose._DOMAINS[3].nodes is instance.nodes
    # Another node list (one node drained, running jobs there lost): summed afresh.
    lost = instance.nodes[0]
    drained = replace(
        instance,
        nodes=(replace(lost, state=NodeState.DRAINED), *instance.nodes[1:]),
    )
    kept = partition(drained, 3)
    decompose._DOMAINS.clear()
    assert kept == partition(drained, 3)
    free = sum(u.schedulable_milli for u in decompose._DOMAINS[3].units.values())
    assert free == sum(n.gpus * 1000 for n in instance.nodes[1:])


def _held(nodes: list[Node], queues: list[Queue], held: Job) -> dict[str, Placement]:
    """`held` running where greedy puts it alone on the nodes."""
    alone = GreedyPlacer().solve(factory_instance(nodes, queues, [held])).outcomes[0]
    return {held.key: Placement(held.key, alone.flavor, alone.replicas)}


def test_the_fluid_bound_keeps_a_non_preemptible_job_running() -> None:
    """A non-preemptible running job on schedulable nodes runs in every plan (check.py), so
    the bound keeps it: it cannot hand its GPUs to a higher-priority job that waits."""
    nodes, queues = [node("n1")], [queue("q")]
    low = job("low", gpu=8, priority=100, preemptible=False)
    high = job("high", gpu=8, priority=900)
    held = factory_instance(nodes, queues, [low, high], _held(nodes, queues, low))
    best = MilpPlacer("highs").solve(held)
    assert best.outcome(low.key).status is OutcomeStatus.KEPT  # type: ignore[union-attr]
    bound = fluid_bound(held)
    assert bound is not None
    # The kept job's value, all a plan can have (it is exempt from quota: no bonus).
    assert bound == pytest.approx(weights(held).value(low, 1))
    assert bound >= best.stats.objective - 1e-9
    # Were it preemptible, the bound would run the high-priority job in nominal quota.
    loose = fluid_bound(replace(held, jobs=(replace(low, preemptible=True), high)))
    assert loose is not None and loose > 10 * bound


def test_the_fluid_bound_frees_a_non_preemptible_job_whose_node_is_gone() -> None:
    nodes, queues = [node("n1"), node("n2")], [queue("q")]
    low = job("low", gpu=8, priority=100, preemptible=False)
    high = job("high", gpu=8, priority=900)
    held = _held(nodes[:1], queues, low)
    drained = [replace(nodes[0], state=NodeState.DRAINED), nodes[1]]
    gone = factory_instance(drained, queues, [low, high], held)
    best = MilpPlacer("highs").solve(gone)
    assert best.outcome(high.key).running  # type: ignore[union-attr]
    bound = fluid_bound(gone)
    assert bound is not None and bound >= best.stats.objective - 1e-6 * abs(bound)
    assert bound > weights(gone).value(high, 1)  # the high job's value and its bonus


def test_high_priority_work_follows_the_nominal_its_queue_holds_with_running_jobs() -> None:
    """Queue q's nominal quota is all held by its running low-priority jobs, in one part:
    its waiting high-priority jobs go there, where they may take that quota back (within
    the queue), not to a part where q has no quota at all. So the parts' fluid bounds add
    up to the whole's: the cut strands nothing."""
    nodes = [node(f"n{i}", rack=f"r{i}") for i in range(8)]
    queues = [
        queue("q", quotas={"h100": (32.0, None, None)}),
        queue("o", quotas={"h100": (32.0, None, None)}),
    ]
    low = [job(f"low{i}", queue="q", gpu=8, priority=100) for i in range(4)]
    high = [job(f"high{i}", queue="q", gpu=8, priority=900) for i in range(4)]
    other = [job(f"other{i}", queue="o", gpu=8, priority=500) for i in range(4)]
    jobs = [*low, *high, *other]
    bare = factory_instance(nodes, queues, jobs)
    homes = partition(bare, 2).node_part
    mine = sorted(n.name for n in nodes if homes[n.name] == homes[nodes[0].name])
    current = {}
    for j, name in zip(low, mine, strict=True):
        alone = GreedyPlacer().solve(
            factory_instance([n for n in nodes if n.name == name], queues, [j])
        )
        current[j.key] = Placement(j.key, "h100", alone.outcomes[0].replicas)
    held = replace(bare, current=current)
    cut = partition(held, 2)
    assert cut.node_part == homes
    part_of_q = homes[nodes[0].name]
    assert {cut.job_part[j.key] for j in high} == {part_of_q}
    whole = fluid_bound(held)
    parts = [fluid_bound(replace(p, basis=held)) for p in cut.parts]
    assert whole is not None and all(b is not None for b in parts)
    assert sum(b for b in parts if b is not None) == pytest.approx(whole, rel=1e-9)


def _synth_m(seed: int) -> PlacementInstance:
    """synth M as `bench synth` builds it: non-preemptible jobs running, a move cap."""
    from gitsched.engine.core import placement_instance
    from gitsched.policies.policy import default_policy
    from gitsched.reconciler.specs import policy_of
    from gitsched.simulation.synth import folded_state, synth_instance

    policy = replace(policy_of(default_policy()), time_limit_s=5.0)
    return placement_instance(folded_state(synth_instance("M", seed, policy)), NOW)


@pytest.mark.parametrize(("seed", "parts"), [(1, 4), (2, 8), (3, 8)])
def test_a_part_reads_the_quota_facts_of_its_running_jobs_as_the_whole_does(
    seed: int, parts: int
) -> None:
    """A queue's running jobs, non-preemptible ones too, find in their part the nominal
    quota they hold in the whole: a part that reads a cut quota where the whole reads none
    moves them (a move no rule of the whole allows), and lets its queue's other parts admit
    non-preemptible work past the nominal quota (seen on XL: 218 of 217 GPUs)."""
    instance = _synth_m(seed)
    whole = preemption.start_ledger(instance)
    jobs = {j.key: j for j in instance.jobs}
    assert any(not jobs[k].preemptible for k in instance.current)
    _, cut = DecomposedPlacer("highs", parts=parts).cut(instance)
    for part in cut.parts:
        ledger = preemption.start_ledger(part)
        for key, run in part.current.items():
            queue = jobs[key].queue
            if not preemption.over_limits(whole, queue, run.flavor):
                assert not preemption.over_limits(ledger, queue, run.flavor), (key, run.flavor)


def test_greedy_in_the_parts_keeps_every_rule_of_the_whole() -> None:
    """The cut bench synth's greedy baseline and DecomposedPlacer both solve: the merged
    plan is checked against the whole instance (moves and their cap included)."""
    instance = _synth_m(1)
    _, cut = DecomposedPlacer("greedy", parts=4).cut(instance)
    assert sum(p.policy.max_moves_per_solve or 0 for p in cut.parts) == (
        instance.policy.max_moves_per_solve
    )
    outcomes = tuple(o for part in cut.parts for o in GreedyPlacer().solve(part).outcomes)
    assert any(o.status is OutcomeStatus.MOVED for o in outcomes)
    stats = SolveStats("greedy/parts", "heuristic", plan_objective(instance, outcomes))
    assert check_plan(instance, PlacementPlan(outcomes, stats)) == []
