"""The MILP placer's parts: the linear backends, the model against the scoring objective,
incremental solves, soft terms, explanations, and the seeded generator."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from gitsched.engine.model import (
    Isolation,
    Placement,
    Policy,
    PreemptionScope,
    ReplicaPlacement,
    TopologyMode,
)
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.formulation import BuildOptions, Formulation, build
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.linear import LinearModel, SolveLimits, solve
from gitsched.engine.placement.milp import (
    MilpPlacer,
    _short_of_nominal,
    incremental_start,
    realise,
    reclaims,
)
from gitsched.engine.placement.objective import fair_targets, objective_terms, plan_objective
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.preemption import Rights
from gitsched.engine.placement.solvers import placer
from gitsched.engine.placement.warmstart import warm_values
from gitsched.simulation.synth import SIZES, synth_instance, with_new_jobs
from tests.support.factories import instance, job, node, queue

HIGHS = MilpPlacer("highs")


def knapsack() -> LinearModel:
    lp = LinearModel()
    cols = [lp.var(f"take__{i}", 0, 1, cost=v) for i, v in enumerate((10, 13, 7, 8, 9))]
    lp.row("capacity__bag", zip(cols, (5.0, 6.0, 3.0, 4.0, 4.0), strict=True), upper=10)
    return lp


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_backends_solve_a_knapsack_and_its_relaxation(backend: str) -> None:
    lp = knapsack()
    exact = solve(lp, backend, SolveLimits(60, 0.0), warm=[1, 0, 0, 0, 0])
    assert exact.status == "optimal" and exact.objective == pytest.approx(22.0)
    assert exact.bound == pytest.approx(22.0)
    relaxed = solve(lp, backend, SolveLimits(60, 0.0, relax=True))
    assert relaxed.objective == pytest.approx(22.5)
    assert lp.violations(list(exact.values or ())) == []


@pytest.mark.parametrize(("threads", "flag"), [(1, None), (2, "2")])
def test_cbc_on_one_thread_searches_in_its_main_thread(
    monkeypatch: pytest.MonkeyPatch, threads: int, flag: str | None
) -> None:
    """CBC's `-threads 1` adds a worker thread, and PuLP's CBC 2.10.3 sometimes deadlocks
    handing it the root: the CI run of 2026-11-28 waited out a 10 s limit on a 16-column
    model (1 run in ~150). One thread is CBC's serial search, with no `-threads` at all."""
    import subprocess

    seen: list[list[str]] = []
    popen = subprocess.Popen

    def spy(args: list[str], *a: object, **k: object) -> object:
        seen.append(list(args))
        return popen(args, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", spy)
    got = solve(knapsack(), "cbc", SolveLimits(60, 0.0, threads=threads), warm=[1, 0, 0, 0, 0])
    assert got.status == "optimal" and got.objective == pytest.approx(22.0)
    (args,) = [a for a in seen if "-solve" in a]
    assert (args[args.index("-threads") + 1] if "-threads" in args else None) == flag


def test_the_model_counts_a_node_a_dedicated_job_holds_as_touched() -> None:
    """A dedicated job holds its node whole, however little of it it uses. The model's
    fragmentation term counted touched nodes as used GPUs / GPUs per node, so two quarter-
    GPU dedicated jobs on two 4-GPU nodes read as one touched node: the model's plan scored
    0.1 more than the same plan realised, and below greedy's (hypothesis found it)."""
    held = Isolation.DEDICATED
    nodes = [
        node("n0", gpus=4, nvlink="d0", isolation=held),
        node("n1", gpus=8, nvlink="d0", isolation=held),
        node("n2", gpus=1, nvlink="d1"),
        node("n3", gpus=4, nvlink="d1", isolation=held),
    ]
    jobs = [
        job(name, gpu=gpu, priority=100, preemptible=False, isolation=Isolation.DEDICATED)
        for name, gpu in (("j0", 0.25), ("j1", 4), ("j2", 0.25))
    ]
    inst = instance(nodes, [queue("q")], jobs)
    plan = HIGHS.solve(inst)
    report = HIGHS.last_report
    assert report is not None and not report.fell_back and report.problems == ()
    assert report.model_objective == pytest.approx(report.milp_objective, abs=1e-6)
    assert plan.stats.objective >= report.greedy_objective - 1e-6
    big = plan.outcome("q/j1")
    assert big is not None and big.running
    assert {n.name: n.gpus for n in nodes}[big.replicas[0].node] == 4  # not half the 8


def test_a_solve_stops_at_its_objective_target_with_the_plan_it_found() -> None:
    """Two knapsack rows over 60 items: asked for 90% of the optimum, HiGHS stops early and
    the stop reads as a feasible plan with its bound, not as an error."""
    rng = random.Random(5)
    lp = LinearModel()
    cols = [lp.var(f"take__{i}", 0, 1, cost=rng.randint(10, 60)) for i in range(60)]
    for name in ("one", "two"):
        weights = [float(rng.randint(10, 60)) for _ in cols]
        lp.row(f"capacity__{name}", zip(cols, weights, strict=True), upper=sum(weights) // 3)
    best = solve(lp, "highs", SolveLimits(60, 0.0))
    assert best.status == "optimal" and best.objective is not None
    target = 0.9 * best.objective
    early = solve(lp, "highs", SolveLimits(60, 0.0, extra=(("objective_target", target),)))
    assert early.status in ("feasible", "optimal") and early.values is not None
    assert early.objective is not None and target <= early.objective <= best.objective + 1e-6
    assert early.bound is not None and early.bound >= best.objective - 1e-6
    assert lp.violations(list(early.values)) == []


def test_an_empty_model_is_its_constant() -> None:
    lp = LinearModel(offset=3.5)
    result = solve(lp, "highs", SolveLimits(1, 0.0))
    assert result.status == "optimal" and result.objective == 3.5 and result.values == ()


def test_violations_name_the_row() -> None:
    lp = knapsack()
    assert lp.violations([1, 1, 0, 0, 0]) == ["capacity__bag: 11.0 outside [-inf, 10]"]


def scenario(policy: Policy | None = None) -> PlacementInstance:
    nodes = [node(f"n{i}", nvlink=f"d{i // 2}") for i in range(4)] + [
        node(f"a{i}", flavor="a100", gpus=4, rack="r2") for i in range(2)
    ]
    queues = [
        queue("a", cohort="c", quotas={"h100": (16, 8, None), "a100": (4, None, None)}),
        queue("b", cohort="c", quotas={"h100": (16, None, 8), "a100": (4, None, None)}),
    ]
    jobs = [
        job("g1", queue="a", replicas=2, gpu=8, topology="nvlink", priority=900, submitted_at="1"),
        job("g2", queue="b", replicas=2, gpu=4, topology="rack", submitted_at="2"),
        job("s1", queue="a", gpu=2, submitted_at="3"),
        job("s2", queue="b", gpu=0.5, submitted_at="4"),
        job("s3", queue="b", gpu=1, flavors=("a100",), submitted_at="5"),
        job("e1", queue="a", replicas=4, min_replicas=2, gpu=4, submitted_at="6"),
        job("p1", queue="b", replicas=2, gpu=8, topology="nvlink", mode=TopologyMode.PREFERRED),
    ]
    return instance(nodes, queues, jobs, policy=policy or Policy(gap_tolerance=0.0))


def test_the_warm_start_scores_in_the_model_what_greedy_scores() -> None:
    """Every term of the model agrees with objective.py on the greedy plan (no fragmentation:
    the model's version of it is a lower estimate, by design)."""
    inst = scenario(Policy(fragmentation_weight=0.0))
    greedy = GreedyPlacer().solve(inst)
    for small in (True, False):
        model = build(inst, greedy, BuildOptions(small=small))
        warm = warm_values(model, inst, greedy)
        assert warm is not None and model.lp.violations(warm) == []
        assert model.lp.objective(warm) == pytest.approx(greedy.stats.objective)


def test_the_per_node_model_scores_compactness_as_the_plan_does() -> None:
    """Every node its own class: the compactness model counts each domain a gang uses at
    every level, so its warm start scores greedy's plan less exactly what its spans cost."""
    inst = scenario(Policy(fragmentation_weight=0.0))
    greedy = GreedyPlacer().solve(inst)
    spans = objective_terms(inst, greedy.outcomes).compactness
    assert spans > 0
    model = build(inst, greedy, BuildOptions(small=True, per_node=True, compactness=True))
    warm = warm_values(model, inst, greedy)
    assert warm is not None and model.lp.violations(warm) == []
    assert model.lp.objective(warm) == pytest.approx(greedy.stats.objective - spans)


def test_the_bound_bounds_every_legal_plan() -> None:
    inst = scenario()
    plan = HIGHS.solve(inst)
    report = HIGHS.last_report
    assert report is not None and report.model_bound is not None
    assert report.model_bound >= plan.stats.objective - 1e-6
    assert report.model_bound >= GreedyPlacer().solve(inst).stats.objective - 1e-6
    assert plan.stats.gap is not None and plan.stats.gap >= 0


def test_names_follow_rule_job_where() -> None:
    inst = scenario()
    model = build(inst, GreedyPlacer().solve(inst), BuildOptions(small=True))
    pattern = re.compile(r"^[a-z_]+__[^_].*")
    assert all(pattern.match(n) for n in model.lp.col_names + model.lp.row_names)
    assert "gang__a/e1" in model.lp.row_names
    assert any(n.startswith("quota__a__h100") for n in model.lp.row_names)
    assert any(n.startswith("cohort__c__h100") for n in model.lp.row_names)


def test_a_pruned_model_keeps_its_bound_through_escape_columns() -> None:
    inst = scenario()
    greedy = GreedyPlacer().solve(inst)
    model = build(inst, greedy, BuildOptions(small=False, domain_candidates=1))
    assert model.pruned and model.escapes
    relaxed = solve(model.lp, "highs", SolveLimits(10, 0.0, relax=True))
    assert relaxed.objective is not None
    assert relaxed.objective >= HIGHS.solve(inst).stats.objective - 1e-6


def test_solve_stats_say_how_good_and_how_big() -> None:
    plan = HIGHS.solve(scenario())
    stats = plan.stats
    assert stats.solver == "highs" and stats.status in ("optimal", "feasible")
    assert stats.variables > 0 and stats.constraints > 0 and stats.bound is not None
    assert check_plan(scenario(), plan) == []


def test_a_spread_preferred_gang_is_a_broken_soft_constraint() -> None:
    nodes = [node("n1", nvlink="d1"), node("n2", nvlink="d2")]
    gang = job("g", replicas=2, gpu=8, topology="nvlink", mode=TopologyMode.PREFERRED)
    plan = HIGHS.solve(instance(nodes, [queue("q")], [gang]))
    assert plan.outcome("q/g") is not None
    assert plan.broken_soft == ("topology__q/g__nvlink",)


def test_fairness_shares_the_cluster_between_queues() -> None:
    """Greedy serves priority first; with a fairness weight and every priority class weighing
    the same, the MILP gives each queue its share."""
    nodes = [node(f"n{i}") for i in range(2)]
    queues = [queue("a"), queue("b")]
    jobs = [job(f"a{i}", queue="a", gpu=8, priority=900, submitted_at=str(i)) for i in range(2)]
    jobs += [job(f"b{i}", queue="b", gpu=8, priority=100, submitted_at=str(i)) for i in range(2)]
    fair = Policy(fairness_weight=2.0, priority_weight=0.0, gap_tolerance=0.0)
    inst = instance(nodes, queues, jobs, policy=fair)
    targets = fair_targets(inst.queues, inst.jobs, {"gpu": 16000, "cpu": 256000, "memory": 2**21})
    assert targets["a"].share == pytest.approx(0.5) and targets["b"].share == pytest.approx(0.5)
    plan = HIGHS.solve(inst)
    running = {o.job.split("/")[0] for o in plan.outcomes if o.running}
    assert running == {"a", "b"}
    greedy = GreedyPlacer().solve(inst)
    assert {o.job.split("/")[0] for o in greedy.outcomes if o.running} == {"a"}
    assert "fairness__b" in greedy.broken_soft and plan.broken_soft == ()


def test_fairness_never_outranks_a_priority_class() -> None:
    """Fairness is a small term: with priorities weighed, the higher class runs first and
    the unfair share is reported as a broken soft constraint."""
    nodes = [node(f"n{i}") for i in range(2)]
    queues = [queue("a"), queue("b")]
    jobs = [job(f"a{i}", queue="a", gpu=8, priority=900, submitted_at=str(i)) for i in range(2)]
    jobs += [job(f"b{i}", queue="b", gpu=8, priority=100, submitted_at=str(i)) for i in range(2)]
    plan = HIGHS.solve(instance(nodes, queues, jobs, policy=Policy(fairness_weight=2.0)))
    assert {o.job for o in plan.outcomes if o.running} == {"a/a0", "a/a1"}
    assert plan.broken_soft == ("fairness__b",)


def test_pending_and_preempted_jobs_say_why_and_name_a_constraint() -> None:
    inst = scenario()
    plan = HIGHS.solve(inst)
    current = {
        k: replace(p, started_at="2026-11-22T11:00:00+00:00") for k, p in plan.placements().items()
    }
    urgent = job("urgent", queue="a", replicas=4, gpu=8, priority=1000)
    again = HIGHS.solve(replace(inst, jobs=(*inst.jobs, urgent), current=current))
    for o in again.outcomes:
        if o.status in (OutcomeStatus.PENDING, OutcomeStatus.PREEMPTED):
            assert o.reason and o.constraint, o


def test_an_incremental_solve_moves_nothing_and_places_the_new_job() -> None:
    inst = scenario()
    first = HIGHS.solve(inst)
    current = first.placements()
    late = job("late", queue="z", gpu=1, flavors=("a100",), submitted_at="9")
    later = replace(
        inst,
        nodes=(*inst.nodes, node("a9", flavor="a100", gpus=4, rack="r3")),
        queues=(*inst.queues, queue("z", quotas={"a100": (4, None, None)})),
        jobs=(*inst.jobs, late),
        current=current,
    )
    plan = HIGHS.solve_incremental(later, ["z/late"])
    assert check_plan(later, plan) == []
    assert all(
        plan.outcome(k) is not None and plan.outcome(k).status is OutcomeStatus.KEPT  # type: ignore[union-attr]
        for k in current
    )
    assert plan.outcome("z/late").status is OutcomeStatus.PLACED  # type: ignore[union-attr]
    waiting = [o for o in plan.outcomes if o.constraint.startswith("incremental__")]
    assert {o.job for o in waiting} == {
        o.job for o in first.outcomes if o.status is OutcomeStatus.PENDING
    }


@pytest.mark.parametrize(("seed", "later"), [(1, 3), (3, 3), (4, 3)])
def test_an_incremental_solve_of_new_jobs_moves_no_running_job(seed: int, later: int) -> None:
    """The class model may stop a running job whose room the new jobs turn out not to
    need; the packing then keeps it where it is, and never moves a job the model could
    only keep or stop (these instances moved 1 to 4 running jobs through repair)."""
    base = synth_instance("S", seed)
    inst = replace(base, current=GreedyPlacer().solve(base).placements())
    after = with_new_jobs(inst, 6, later)
    new = [j.key for j in after.jobs[len(inst.jobs) :]]
    plan = HIGHS.solve_incremental(after, new)
    assert check_plan(after, plan) == []
    assert [o.job for o in plan.outcomes if o.status is OutcomeStatus.MOVED] == []
    decided = tuple(j for j in after.jobs if j.key in inst.current or j.key in new)
    sub = replace(after, jobs=decided, basis=after)
    start, _ = incremental_start(sub, set(new))
    if reclaims(GreedyPlacer().solve(sub)):
        # Reclaim is the rules' (issue 31): the start is greedy's plan that does it.
        start = GreedyPlacer().solve(sub)
        assert plan.stats.objective >= plan_objective(after, start.outcomes) - 1e-6
    else:
        assert plan.stats.objective >= start.stats.objective - 1e-6


def test_an_incremental_solve_keeps_a_job_no_admitted_job_may_preempt() -> None:
    """The model ties a stop to the rules per queue, not per preemptor: here it stops
    team01/job00169 though no job it admits may preempt it (team01 does not borrow).
    That job stays where it is, the MILP's plan passes audit's attribution, and the
    solve does not fall back to its greedy start (which it did, admitting none of the 50)."""
    base = synth_instance("S", 2)
    plan = GreedyPlacer().solve(base)
    running = {k: replace(p, started_at=base.now) for k, p in plan.placements().items()}
    after = with_new_jobs(replace(base, current=running), 50, 1)
    new = [j.key for j in after.jobs[len(base.jobs) :]]
    again = HIGHS.solve_incremental(after, new)
    report = HIGHS.last_report
    assert report is not None and report.problems == () and not report.fell_back
    assert check_plan(after, again) == []
    assert again.outcome("team01/job00169").status is OutcomeStatus.KEPT  # type: ignore[union-attr]
    assert not any(o.status is OutcomeStatus.MOVED for o in again.outcomes)


def test_a_running_job_on_a_failed_node_moves_at_its_cost() -> None:
    from gitsched.engine.model import NodeState

    nodes = [node("n1"), node("n2")]
    x = job("x", gpu=8)
    current = {"q/x": Placement("q/x", "h100", (ReplicaPlacement("n1", tuple(range(8)), 1000),))}
    failed = [replace(nodes[0], state=NodeState.FAILED), nodes[1]]
    inst = instance(failed, [queue("q")], [x], current)
    plan = HIGHS.solve(inst)
    moved = plan.outcome("q/x")
    assert moved is not None and moved.status is OutcomeStatus.MOVED
    assert moved.replicas[0].node == "n2" and "Failed" in moved.reason


def test_the_registry_knows_every_solver() -> None:
    assert placer("greedy").name == "greedy"
    assert placer("highs").name == "highs" and placer("cbc").name == "cbc"


def test_the_generator_is_seeded_and_sized() -> None:
    a, b = synth_instance("S", 3), synth_instance("S", 3)
    assert a == b and a != synth_instance("S", 4)
    assert len(a.nodes) == SIZES["S"].nodes and len(a.jobs) == SIZES["S"].jobs
    assert sum(n.gpus for n in a.nodes) == 512 and {n.flavor for n in a.nodes} == {"h100", "gb200"}
    empty = replace(a, current={})
    assert check_plan(empty, GreedyPlacer().solve(empty)) == []
    more = with_new_jobs(a, 5, 1)
    assert len(more.jobs) == len(a.jobs) + 5


def _gang_beside_small_jobs() -> tuple[Formulation, tuple[float, ...]]:
    """A quota of 12 GPUs, a 2x8 gang at priority 900 and three 4-GPU jobs at 100: the
    LP runs three quarters of the gang and none of the small jobs. The model and the LP's
    values."""
    jobs = [job("big", replicas=2, gpu=8, priority=900, submitted_at="0")]
    jobs += [job(f"s{i}", gpu=4, priority=100, submitted_at=str(i + 1)) for i in range(3)]
    inst = instance(
        [node("n0"), node("n1")],
        [queue("q", quotas={"h100": (12, None, None)})],
        jobs,
        policy=Policy(gap_tolerance=0.0),
    )
    model = build(inst, GreedyPlacer().solve(inst), BuildOptions(small=False))
    relaxed = solve(model.lp, "highs", SolveLimits(60, 0.0, relax=True))
    assert relaxed.values is not None
    return model, relaxed.values


def test_the_fill_neighbourhood_frees_the_single_replicas_the_lp_leaves_out() -> None:
    """The quota holds three quarters of a gang: the LP runs that, and none of the small
    jobs. RENS fixes the small jobs where the LP left them and finds only the empty plan;
    the fill neighbourhood frees them too and fills the quota with them."""
    model, lp_values = _gang_beside_small_jobs()
    assert 0 < lp_values[model.jobs["q/big"].place] < 1
    placer = MilpPlacer("highs")
    placer._start()
    found: dict[str, set[str]] = {}
    for mode in ("rens", "fill"):
        sub = placer._fix_and_solve(model, model.lp, lp_values, None, mode, lambda: 60.0, 0.0, 1.0)
        assert sub.values is not None and sub.objective is not None
        assert model.lp.violations(sub.values) == []
        found[mode] = {k for k, jv in model.jobs.items() if sub.values[jv.place] > 0.5}
    assert found["rens"] == set()
    assert found["fill"] == {"q/s0", "q/s1", "q/s2"}


def test_the_quota_neighbourhood_frees_the_class_that_falls_short_of_nominal_quota() -> None:
    """Level 1 of the objective is where an integral plan loses most: from RENS's empty
    plan, the class that falls furthest short of the LP's nominal fill comes first (the
    gang, which cannot fit), then the next; the other jobs may only stop, and freeing the
    small jobs of the lower class fills the quota with them."""
    model, lp_values = _gang_beside_small_jobs()
    placer = MilpPlacer("highs")
    placer._start()
    best = placer._fix_and_solve(model, model.lp, lp_values, None, "rens", lambda: 60.0, 0, 1)
    assert best.values is not None
    tried: list[int] = []
    classes = []
    while (short := _short_of_nominal(model, lp_values, best.values, tried)) is not None:
        tried.append(short[0])
        classes.append(short)
        sub = placer._fix_and_solve(
            model,
            model.lp,
            lp_values,
            best.values,
            "quota",
            lambda: 60.0,
            0,
            1,
            None,
            short[1],
        )
        assert sub.values is not None and model.lp.violations(sub.values) == []
        best = sub
    assert classes[:2] == [(900, {"q/big"}), (100, {"q/s0", "q/s1", "q/s2"})]
    assert {k for k, jv in model.jobs.items() if best.values[jv.place] > 0.5} == {
        "q/s0",
        "q/s1",
        "q/s2",
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_small_synthetic_instances_are_solved_to_optimality(seed: int) -> None:
    """Gap 0 against the class model's MIP bound: what the class rows count packs onto the
    nodes (seed 3 needs the per-node model to pack it)."""
    inst = synth_instance("S", seed)
    inst = replace(inst, policy=replace(inst.policy, gap_tolerance=0.0, time_limit_s=60))
    plan = HIGHS.solve(inst)
    assert check_plan(inst, plan) == []
    assert plan.stats.status == "optimal" and plan.stats.gap == pytest.approx(0.0, abs=1e-9)
    assert plan.stats.objective > GreedyPlacer().solve(inst).stats.objective
    assert plan.stats.objective == pytest.approx(plan_objective(inst, plan.outcomes))


def test_share_slots_make_one_node_exact() -> None:
    """Two GPUs a quarter free and one whole: a whole-GPU job and a half share would pass
    the GPU and milli-GPU rows, but no GPU is left for the share; the rows that count
    slots of each share size see it, so the model's optimum packs and the gap is 0."""
    full = node("n1", gpus=3)
    held = {
        f"q/held{g}": Placement(f"q/held{g}", "h100", (ReplicaPlacement("n1", (g,), 750),))
        for g in (0, 1)
    }
    jobs = [job(f"held{g}", gpu=0.75, preemptible=False, submitted_at="0") for g in (0, 1)]
    jobs += [
        job("whole", gpu=1, submitted_at="1"),
        job("half", gpu=0.5, submitted_at="2"),
        job("quarter1", gpu=0.25, submitted_at="3"),
        job("quarter2", gpu=0.25, submitted_at="4"),
    ]
    inst = instance([full], [queue("q")], jobs, held, Policy(gap_tolerance=0.0))
    plan = HIGHS.solve(inst)
    assert check_plan(inst, plan) == []
    running = {o.job for o in plan.outcomes if o.running}
    assert running == {"q/held0", "q/held1", "q/whole", "q/quarter1", "q/quarter2"}
    assert plan.stats.status == "optimal" and plan.stats.gap == pytest.approx(0.0, abs=1e-9)


def test_the_per_node_model_counts_what_its_plan_scores() -> None:
    """Every node its own class: the model's optimum, packed where it says, scores the same."""
    inst = synth_instance("S", 3)
    greedy = GreedyPlacer().solve(inst)
    model = build(inst, greedy, BuildOptions(small=True, per_node=True))
    assert all(len(c.nodes) == 1 for c in model.classes)
    fixed = list(model.lp.col_upper)
    for jv in model.jobs.values():  # a small problem: only the running jobs are decided
        if jv.job.key not in inst.current:
            fixed[jv.place] = 0.0
    lp = model.lp.with_bounds(model.lp.col_lower, fixed)
    solution = solve(lp, "highs", SolveLimits(60, 0.0))
    assert solution.values is not None and solution.objective is not None
    plan = realise(inst, model, solution.values, 1, follow=True)
    assert plan_objective(inst, plan) >= solution.objective - 1e-6
    assert check_plan(inst, PlacementPlan(plan, greedy.stats)) == []


def test_fixed_columns_leave_the_model_before_the_solver() -> None:
    """HiGHS gets only the free columns (their fixed neighbours move into the row bounds);
    CBC gets everything: both agree."""
    lp = knapsack()
    lower = [1.0, 0.0, 0.0, 0.0, 0.0]
    upper = [1.0, 0.0, 1.0, 1.0, 1.0]
    fixed = lp.with_bounds(lower, upper)
    for backend in ("highs", "cbc"):
        result = solve(fixed, backend, SolveLimits(60, 0.0))
        assert result.objective == pytest.approx(19.0)  # item 0, then 3 and ... 4 do not fit
        assert result.values is not None and result.values[:2] == (1.0, 0.0)
    everything = solve(
        lp.with_bounds([1.0, 0, 0, 1, 0], [1.0, 0, 0, 1, 0]), "highs", SolveLimits(9, 0)
    )
    assert everything.status == "optimal" and everything.objective == pytest.approx(18.0)
    too_much = lp.with_bounds([1.0, 1, 0, 0, 0], [1.0, 1, 0, 0, 0])
    assert solve(too_much, "highs", SolveLimits(9, 0)).status == "infeasible"


def test_claimable_asks_may_once_per_queue_and_priority() -> None:
    queues = [queue(n, cohort="c") for n in ("a", "b", "c")] + [queue("solo")]
    jobs = [
        job(f"{q}{p}", queue=q, priority=p, preemptible=p != 900)
        for q in ("a", "b", "c", "solo")
        for p in (100, 500, 900)
    ]
    for scope in PreemptionScope:
        inst = instance([node("n1")], queues, jobs, policy=Policy(reclaim_within_cohort=scope))
        rights = Rights(inst)
        for claimants in (jobs[:1], jobs[3:5], jobs[::2], jobs):
            brute = {v.key for v in jobs if any(rights.may(c, v) for c in claimants)}
            assert rights.claimable(claimants, jobs) == brute


def test_an_incremental_start_keeps_every_running_job_and_preempts_nobody() -> None:
    inst = scenario()
    current = HIGHS.solve(inst).placements()
    late = job("late", queue="a", gpu=8, priority=1000, submitted_at="9")
    later = replace(inst, jobs=(*inst.jobs, late), current=current)
    start, _ = incremental_start(later, {"a/late"})
    assert check_plan(later, start) == []
    assert {o.job for o in start.outcomes if o.status is OutcomeStatus.KEPT} == set(current)
    assert not any(o.status is OutcomeStatus.PREEMPTED for o in start.outcomes)
    plan = HIGHS.solve_incremental(later, ["a/late"])
    assert check_plan(later, plan) == [] and plan.stats.objective >= start.stats.objective - 1e-6


@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
def test_a_re_solve_never_stops_a_running_job_for_one_of_equal_priority(backend: str) -> None:
    # Found by hypothesis (tests/contract/test_solvers.py). The model ties stops to the
    # rules per queue: qa/j4 (priority 100) may be stopped by some job of qa, so once the
    # non-preemptible j0 is gone the model stopped j4 to admit j3, also priority 100. The
    # realisation now undoes any stop no rule allows, for every running job.
    jobs = [
        job("j0", queue="qa", gpu=0.25, priority=500, preemptible=False, submitted_at="0"),
        job("j1", queue="qa", gpu=0, priority=100, preemptible=False, submitted_at="1"),
        job("j2", queue="qa", gpu=0, priority=500, preemptible=False, submitted_at="2"),
        job("j3", queue="qa", gpu=8, priority=100, preemptible=False, submitted_at="3"),
        job("j4", queue="qa", gpu=0.25, priority=100, submitted_at="4"),
    ]
    queues = [
        queue("qa", quotas={"h100": (8, None, None), "a100": (0, None, None)}),
        queue("qb", quotas={"h100": (0, None, None), "a100": (0, None, None)}),
    ]
    policy = Policy(solver=backend, preempt_within_queue=PreemptionScope.LOWER_PRIORITY)
    first_inst = instance([node("n0", gpus=8)], queues, jobs, policy=policy)
    milp = MilpPlacer(backend)
    first = milp.solve(first_inst)
    running = {k: p for k, p in first.placements().items() if k != "qa/j0"}
    assert "qa/j4" in running and "qa/j3" not in running

    second_inst = replace(first_inst, jobs=tuple(jobs[1:]), current=running)
    second = milp.solve(second_inst)
    report = milp.last_report
    assert report is not None and report.problems == () and not report.fell_back
    status = {o.job: o.status for o in second.outcomes}
    assert status["qa/j4"] is OutcomeStatus.KEPT
    assert status["qa/j3"] is OutcomeStatus.PENDING
    assert check_plan(second_inst, second) == []
