"""Quotas and preemption as a Kueue user reads them, the same in every solver, at any spacing
of priority classes (docs/quotas-and-preemption.md tells each scenario in words).

Each scenario is a cluster with one big node per flavor, so only quota and priority decide;
it runs under greedy, HiGHS, CBC and CP-SAT with priority classes 1, 200 and 10,000 apart, and must
give the same documented outcome. A property test then checks the rules themselves on small
random instances: every stop is allowed by a rule, and nobody who could run by a rule waits
for a lower-priority job of its own queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitsched.engine.model import (
    Isolation,
    Job,
    Placement,
    Policy,
    PreemptionScope,
    ReplicaPlacement,
)
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.milp import MilpPlacer, attribution
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan
from gitsched.engine.placement.preemption import start_ledger
from gitsched.engine.placement.solvers import placer
from gitsched.engine.units import GPU_MILLI
from tests.support.factories import instance, job, node, queue

SOLVERS = ["greedy", "highs", "cbc", "cpsat"]
SPACINGS = [1, 200, 10_000]
NOW = "2026-11-22T12:00:00+00:00"
P, K, R, W = (
    OutcomeStatus.PLACED,
    OutcomeStatus.KEPT,
    OutcomeStatus.PREEMPTED,
    OutcomeStatus.PENDING,
)


@dataclass(frozen=True)
class Run:
    """A job running before the decision: `hours` ago, on its flavor's node."""

    job: Job
    flavor: str = "h100"
    hours: float = 1.0


@dataclass(frozen=True)
class Scenario:
    queues: list[tuple[str, str | None, dict[str, tuple[float, float | None, float | None]]]]
    running: list[Run]
    waiting: list[Job]
    # job -> status, or (status, rule, preemptor) for a preempted job
    expect: dict[str, OutcomeStatus | tuple[OutcomeStatus, str, str]]
    gpus: dict[str, int] = field(default_factory=lambda: {"h100": 16})
    policy: Policy = field(default_factory=Policy)
    # queue -> its own spec.preemption.reclaimWithinCohort (else the Policy's)
    reclaim: dict[str, PreemptionScope] = field(default_factory=dict)


def j(name: str, q: str, gpus: float, level: int, **kw: object) -> Job:
    """A job at priority level 0 (low), 1 or 2 (high); spaced out per test."""
    return job(name, queue=q, gpu=gpus, priority=level, flavors=("h100",), **kw)  # type: ignore[arg-type]


SCENARIOS: dict[str, Scenario] = {
    "priority preemption within a queue": Scenario(
        [("q", None, {"h100": (8, None, None)})],
        [Run(j("low", "q", 8, 0))],
        [j("high", "q", 8, 2)],
        {"q/high": P, "q/low": (R, "within-queue", "q/high")},
        gpus={"h100": 8},
    ),
    "minimal victim set, least lost work": Scenario(
        [("q", None, {"h100": (12, None, None)})],
        [
            Run(j("old", "q", 4, 0), hours=10),
            Run(j("fresh", "q", 4, 0), hours=1),
            Run(j("mid", "q", 4, 1), hours=1),
        ],
        [j("high", "q", 4, 2)],
        {"q/high": P, "q/fresh": (R, "within-queue", "q/high"), "q/old": K, "q/mid": K},
        gpus={"h100": 12},
    ),
    "not enough victims: nobody is preempted": Scenario(
        [("q", None, {"h100": (8, None, None)})],
        [Run(j("low", "q", 4, 0)), Run(j("top", "q", 4, 2))],
        [j("mid", "q", 8, 1)],
        {"q/mid": W, "q/low": K, "q/top": K},
        gpus={"h100": 8},
    ),
    "reclaim from a borrower, whatever its priority": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("b1", "b", 8, 2), hours=5), Run(j("b2", "b", 8, 2), hours=1)],
        [j("a1", "a", 8, 0)],
        {"a/a1": P, "b/b1": K, "b/b2": (R, "reclaim", "a/a1")},
    ),
    "reclaim LowerPriority: a lower priority does not reclaim": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("b1", "b", 8, 2), hours=5), Run(j("b2", "b", 8, 2), hours=1)],
        [j("a1", "a", 8, 0)],
        {"a/a1": W, "b/b1": K, "b/b2": K},
        policy=Policy(reclaim_within_cohort=PreemptionScope.LOWER_PRIORITY),
    ),
    "reclaim with a lending limit": Scenario(
        [("a", "c", {"h100": (8, None, 4)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("b1", "b", 8, 1), hours=5), Run(j("b2", "b", 4, 1), hours=1)],
        [j("a1", "a", 8, 0)],
        {"a/a1": P, "b/b1": K, "b/b2": (R, "reclaim", "a/a1")},
    ),
    "reclaim across two flavors: only where the queue borrows": Scenario(
        [
            ("a", "c", {"h100": (4, None, None), "a100": (4, None, None)}),
            ("b", "c", {"h100": (4, None, None), "a100": (4, None, None)}),
        ],
        [
            Run(j("bh1", "b", 4, 1), hours=5),
            Run(j("bh2", "b", 4, 1), hours=1),
            Run(job("ba", queue="b", gpu=4, priority=0), flavor="a100", hours=1),
        ],
        [j("a1", "a", 4, 0)],
        {"a/a1": P, "b/bh1": K, "b/bh2": (R, "reclaim", "a/a1"), "b/ba": K},
        gpus={"h100": 8, "a100": 8},
    ),
    "reclaim plus preemption in the own queue": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [
            Run(j("alow", "a", 4, 0)),
            Run(j("b1", "b", 8, 0), hours=5),
            Run(j("b2", "b", 4, 0), hours=1),
        ],
        [j("ahigh", "a", 8, 2)],
        {
            "a/ahigh": P,
            "a/alow": (R, "within-queue", "a/ahigh"),
            "b/b2": (R, "reclaim", "a/ahigh"),
            "b/b1": K,
        },
    ),
    "nominal before borrowing, over priority across queues": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("a0", "a", 8, 2))],
        [j("a1", "a", 8, 1), j("b1", "b", 8, 0)],
        {"a/a0": K, "a/a1": W, "b/b1": P},
        policy=Policy(reclaim_within_cohort=PreemptionScope.NEVER),
    ),
    "borrowing limit: up to nominal + limit, not one GPU more": Scenario(
        [("a", "c", {"h100": (4, 4, None)}), ("b", "c", {"h100": (12, None, None)})],
        [],
        [j("a1", "a", 8, 1, submitted_at="1"), j("a2", "a", 1, 1, submitted_at="2")],
        {"a/a1": P, "a/a2": W},
    ),
    "lending limit: a queue lends no more than it": Scenario(
        [("a", "c", {"h100": (8, None, 2)}), ("b", "c", {"h100": (0, None, None)})],
        [],
        [j("b1", "b", 2, 1, submitted_at="1"), j("b2", "b", 1, 1, submitted_at="2")],
        {"b/b1": P, "b/b2": W},
    ),
    "never preempt to borrow (own queue)": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("alow", "a", 8, 0)), Run(j("b0", "b", 4, 0))],
        [j("abig", "a", 10, 2)],
        {"a/abig": W, "a/alow": K, "b/b0": K},
    ),
    "never preempt another queue to borrow": Scenario(
        [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
        [Run(j("a0", "a", 8, 0, preemptible=False)), Run(j("b0", "b", 8, 0))],
        [j("a1", "a", 8, 2)],
        {"a/a0": K, "a/a1": W, "b/b0": K},
    ),
}

# Issue 31's reproduction: 32 GPUs, alpha (nominal 8, borrowingLimit 8) runs a high-priority
# 2x8 gang and so borrows 8; beta runs 4 within nominal; gamma (nominal 16) asks for a 2x8
# gang of normal priority. Kueue reclaims the gang (whole workloads) with `Any`.
ISSUE_31 = dict(
    queues=[
        ("alpha", "c", {"h100": (8, 8, None)}),
        ("beta", "c", {"h100": (8, None, None)}),
        ("gamma", "c", {"h100": (16, None, None)}),
    ],
    running=[Run(j("gang", "alpha", 8, 2, replicas=2)), Run(j("small", "beta", 4, 0))],
    waiting=[j("g", "gamma", 8, 1, replicas=2)],
    gpus={"h100": 32},
)
RECLAIMED = {
    "alpha/gang": (R, "reclaim", "gamma/g"),
    "gamma/g": P,
    "beta/small": K,
}
NOT_RECLAIMED = {"alpha/gang": K, "gamma/g": W, "beta/small": K}
SCENARIOS.update(
    {
        "reclaim a high-priority borrowing gang (Any, the default)": Scenario(
            **ISSUE_31,  # type: ignore[arg-type]
            expect=RECLAIMED,
        ),
        "reclaim per queue: the queue's Any beats the Policy's Never": Scenario(
            **ISSUE_31,  # type: ignore[arg-type]
            expect=RECLAIMED,
            policy=Policy(reclaim_within_cohort=PreemptionScope.NEVER),
            reclaim={"gamma": PreemptionScope.ANY},
        ),
        "reclaim per queue: LowerPriority keeps a higher-priority borrower": Scenario(
            **ISSUE_31,  # type: ignore[arg-type]
            expect=NOT_RECLAIMED,
            reclaim={"gamma": PreemptionScope.LOWER_PRIORITY},
        ),
        "reclaim per queue: Never keeps every borrower": Scenario(
            **ISSUE_31,  # type: ignore[arg-type]
            expect=NOT_RECLAIMED,
            reclaim={"gamma": PreemptionScope.NEVER},
        ),
        "reclaim per queue: the borrower's own setting does not protect it": Scenario(
            **ISSUE_31,  # type: ignore[arg-type]
            expect=RECLAIMED,
            reclaim={"alpha": PreemptionScope.NEVER},
        ),
        "reclaim before the own queue: lendable part of a lendingLimit": Scenario(
            [("a", "c", {"h100": (8, None, 4)}), ("b", "c", {"h100": (8, None, None)})],
            [Run(j("alow", "a", 4, 0)), Run(j("b1", "b", 8, 1), hours=5), Run(j("b2", "b", 4, 1))],
            [j("ahigh", "a", 4, 2)],
            {"a/ahigh": P, "a/alow": K, "b/b1": K, "b/b2": (R, "reclaim", "a/ahigh")},
        ),
        "reclaim before the own queue: a lendingLimit, the borrower's job straddles": Scenario(
            [("a", "c", {"h100": (8, None, 4)}), ("b", "c", {"h100": (8, None, None)})],
            [Run(j("alow", "a", 4, 0)), Run(j("b1", "b", 12, 1))],
            [j("ahigh", "a", 4, 2)],
            {"a/ahigh": P, "a/alow": K, "b/b1": (R, "reclaim", "a/ahigh")},
        ),
        "reclaim before the own queue: borrowed capacity on another flavor": Scenario(
            [
                ("a", "c", {"h100": (4, None, None), "a100": (4, None, None)}),
                ("b", "c", {"h100": (4, None, None), "a100": (4, None, None)}),
            ],
            [
                Run(job("alow", queue="a", gpu=4, priority=0, flavors=("h100", "a100"))),
                Run(j("bh", "b", 4, 1)),
                Run(job("ba1", queue="b", gpu=4, priority=1), flavor="a100", hours=5),
                Run(job("ba2", queue="b", gpu=4, priority=1), flavor="a100", hours=1),
            ],
            [job("ahigh", queue="a", gpu=4, priority=2, flavors=("h100", "a100"))],
            {
                "a/ahigh": P,
                "a/alow": K,
                "b/bh": K,
                "b/ba1": K,
                "b/ba2": (R, "reclaim", "a/ahigh"),
            },
            gpus={"h100": 8, "a100": 8},
        ),
    }
)

SCENARIOS.update(
    {
        "a non-preemptible job does not borrow": Scenario(
            [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
            [],
            [j("np", "a", 12, 1, preemptible=False), j("p", "b", 4, 0)],
            {"a/np": W, "b/p": P},
        ),
        "a non-preemptible job within nominal is admitted and kept": Scenario(
            [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
            [Run(j("np", "a", 8, 0, preemptible=False))],
            [j("np2", "a", 4, 0, preemptible=False), j("high", "a", 8, 2)],
            {"a/np": K, "a/np2": W, "a/high": P},
        ),
        "a non-preemptible job on borrowed GPUs is reclaimed (issue 32, item 7)": Scenario(
            [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
            [Run(j("np", "a", 16, 2, preemptible=False))],
            [j("b1", "b", 8, 0)],
            {"a/np": (R, "reclaim", "b/b1"), "b/b1": P},
        ),
        "a non-preemptible job within nominal is never reclaimed": Scenario(
            [("a", "c", {"h100": (8, None, None)}), ("b", "c", {"h100": (8, None, None)})],
            [Run(j("np", "a", 8, 2, preemptible=False), hours=5), Run(j("a2", "a", 8, 2))],
            [j("b1", "b", 8, 0)],
            {"a/np": K, "a/a2": (R, "reclaim", "b/b1"), "b/b1": P},
        ),
    }
)


def build(s: Scenario, spacing: int) -> PlacementInstance:
    def spaced(x: Job) -> Job:
        return replace(x, priority=100 + x.priority * spacing)

    nodes = [node(f"{f}-node", flavor=f, gpus=n) for f, n in s.gpus.items()]
    queues = [
        replace(queue(n, cohort=c, quotas=q), reclaim_within_cohort=s.reclaim.get(n))
        for n, c, q in s.queues
    ]
    used = dict.fromkeys(s.gpus, 0)
    current = {}
    for r in s.running:
        k = r.job.resources.whole_gpus
        replicas = []
        for _ in range(r.job.replicas):
            gpus = tuple(range(used[r.flavor], used[r.flavor] + k))
            used[r.flavor] += k
            replicas.append(ReplicaPlacement(f"{r.flavor}-node", gpus, GPU_MILLI))
        started = f"2026-11-22T{12 - r.hours:02.0f}:00:00+00:00"
        current[r.job.key] = Placement(r.job.key, r.flavor, tuple(replicas), started)
    jobs = [spaced(r.job) for r in s.running] + [spaced(x) for x in s.waiting]
    base = instance(nodes, queues, jobs, current, replace(s.policy, gap_tolerance=0.0))
    return replace(base, now=NOW)


def rules_problems(inst: PlacementInstance, plan: PlacementPlan) -> list[str]:
    """Everything the plan does that the rules do not allow."""
    problems = list(check_plan(inst, plan)) + list(attribution(inst, plan.outcomes).problems)
    for o in plan.outcomes:
        if o.status is OutcomeStatus.PREEMPTED and not o.rule:
            problems.append(f"{o.job}: preempted without a rule")
    return problems


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_scenario_gives_its_documented_outcome(name: str, solver: str, spacing: int) -> None:
    s = SCENARIOS[name]
    inst = build(s, spacing)
    chosen = placer(solver)
    plan = chosen.solve(inst)
    assert rules_problems(inst, plan) == []
    if isinstance(chosen, MilpPlacer):
        assert chosen.last_report is not None and chosen.last_report.problems == ()
    got: dict[str, object] = {}
    for o in plan.outcomes:
        got[o.job] = (o.status, o.rule, o.preempted_by) if o.status is R else o.status
    assert got == s.expect


# -- the rules on random instances ------------------------------------------------------------


@st.composite
def small_instances(draw: st.DrawFn) -> PlacementInstance:
    spacing = draw(st.sampled_from(SPACINGS))
    cohort = draw(st.sampled_from([None, "c"]))
    names = ["a", "b"] if cohort else ["a"]
    queues = [
        queue(
            n,
            cohort=cohort,
            quotas={
                "h100": (
                    draw(st.integers(0, 8)),
                    draw(st.sampled_from([None, 0, 2, 4])),
                    draw(st.sampled_from([None, 0, 2, 4])),
                )
            },
        )
        for n in names
    ]
    policy = Policy(
        gap_tolerance=0.0,
        preempt_within_queue=draw(
            st.sampled_from([PreemptionScope.LOWER_PRIORITY, PreemptionScope.NEVER])
        ),
        reclaim_within_cohort=draw(st.sampled_from(list(PreemptionScope))),
    )
    jobs: list[Job] = []
    current: dict[str, Placement] = {}
    free = list(range(12))
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([1, 2, 4]))
        x = job(
            f"j{i}",
            queue=draw(st.sampled_from(names)),
            gpu=gpus,
            priority=100 + draw(st.integers(0, 2)) * spacing,
            flavors=("h100",),
            submitted_at=str(i),
        )
        jobs.append(x)
        if draw(st.booleans()) and len(free) >= gpus:
            taken, free = tuple(free[:gpus]), free[gpus:]
            hours = draw(st.integers(0, 9))
            current[x.key] = Placement(
                x.key,
                "h100",
                (ReplicaPlacement("h100-node", taken, GPU_MILLI),),
                f"2026-11-22T{12 - hours:02d}:00:00+00:00",
            )
    inst = instance([node("h100-node", gpus=12)], queues, jobs, current, policy)
    # Start from a legal state: what runs fits its quotas.
    if start_ledger(inst).violations():
        inst = replace(inst, current={})
    return replace(inst, now=NOW)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(small_instances(), st.sampled_from([SOLVERS[0], SOLVERS[1], SOLVERS[3]]))
def test_every_solver_keeps_the_rules(inst: PlacementInstance, solver: str) -> None:
    plan = placer(solver).solve(inst)
    assert rules_problems(inst, plan) == []
    outcomes = {o.job: o for o in plan.outcomes}
    jobs = {x.key: x for x in inst.jobs}
    for o in plan.outcomes:
        # A running job that could stay stops only for a preemptor with a rule.
        if o.status is OutcomeStatus.PREEMPTED and o.rule != "place-gone":
            assert o.preempted_by is not None
            assert outcomes[o.preempted_by].running
            assert o.rule in ("within-queue", "reclaim")
            if o.rule == "within-queue":
                assert jobs[o.preempted_by].priority > jobs[o.job].priority
                assert inst.policy.preempt_within_queue is PreemptionScope.LOWER_PRIORITY
            else:
                assert inst.policy.reclaim_within_cohort is not PreemptionScope.NEVER
                assert jobs[o.preempted_by].queue != jobs[o.job].queue


# -- isolation: dedicated is charged for what it holds (issue 32, item 9) ----------------------

DEDICATED = Isolation.DEDICATED


def dedicated_instance(spacing: int, other_nominal: float, cohort: str | None) -> PlacementInstance:
    """Two dedicated 8-GPU nodes in region eu. Team `other` runs a low-priority job of
    2 x 0.25 GPU with isolation: dedicated on one of them (it holds the whole node); team
    `reg` (nominal 16) asks for a high-priority 2 x 8 job with residency eu."""
    nodes = [node(f"ded-{i}", gpus=8, isolation=DEDICATED, region="eu") for i in (1, 2)]
    queues = [
        queue("reg", cohort=cohort, quotas={"h100": (16, None, None)}),
        queue("other", cohort=cohort, quotas={"h100": (other_nominal, None, None)}),
    ]
    tiny = job("tiny", queue="other", replicas=2, gpu=0.25, priority=100, isolation=DEDICATED)
    big = job(
        "big",
        queue="reg",
        replicas=2,
        gpu=8,
        priority=100 + 2 * spacing,
        isolation=DEDICATED,
        residency=("eu",),
    )
    held = Placement(
        tiny.key,
        "h100",
        (
            ReplicaPlacement("ded-1", (0,), 250),
            ReplicaPlacement("ded-1", (1,), 250),
        ),
        "2026-11-22T11:00:00+00:00",
    )
    base = instance(nodes, queues, [tiny, big], {tiny.key: held}, Policy(gap_tolerance=0.0))
    return replace(base, now=NOW)


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("solver", SOLVERS)
def test_a_dedicated_job_is_charged_the_node_and_reclaimed(solver: str, spacing: int) -> None:
    """Charged 8 GPUs (not 0.5), `other` (nominal 4) borrows 4: `reg`, below its nominal
    quota, reclaims the node for its regulated job."""
    inst = dedicated_instance(spacing, 4, "c")
    assert start_ledger(inst).usage[("other", "h100")] == 8 * GPU_MILLI
    plan = placer(solver).solve(inst)
    assert rules_problems(inst, plan) == []
    got = {o.job: (o.status, o.rule, o.preempted_by) for o in plan.outcomes}
    assert got["other/tiny"] == (R, "reclaim", "reg/big")
    assert got["reg/big"][0] is P


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_dedicated_job_needs_quota_for_the_whole_node(solver: str) -> None:
    """A queue without a cohort and 4 GPUs of nominal quota cannot hold an 8-GPU node alone,
    however small the job's share; with 8 it can."""
    inst = dedicated_instance(1, 4, None)
    small = replace(inst, current={}, jobs=tuple(j for j in inst.jobs if j.queue == "other"))
    plan = placer(solver).solve(small)
    assert [o.status for o in plan.outcomes] == [W]
    assert "quota" in plan.outcomes[0].constraint or "quota" in plan.outcomes[0].reason
    enough = replace(small, queues=(queue("other", quotas={"h100": (8, None, None)}),))
    assert [o.status for o in placer(solver).solve(enough).outcomes] == [P]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    ("scope", "why"),
    [
        (PreemptionScope.LOWER_PRIORITY, "reclaimWithinCohort is LowerPriority and priority"),
        (PreemptionScope.NEVER, "reclaimWithinCohort is Never"),
    ],
)
def test_a_job_left_waiting_says_who_borrows_and_why_no_reclaim(
    solver: str, scope: PreemptionScope, why: str
) -> None:
    """Issue 31's pending reason named neither the borrowing nor why reclaim did not happen."""
    s = Scenario(**ISSUE_31, expect=NOT_RECLAIMED, reclaim={"gamma": scope})  # type: ignore[arg-type]
    plan = placer(solver).solve(build(s, 200))
    (waiting,) = [o for o in plan.outcomes if o.job == "gamma/g"]
    assert waiting.status is W
    assert "queue alpha borrows 8 h100 GPUs; not reclaimed: " + why in waiting.reason


RECLAIM_CASES = sorted(n for n in SCENARIOS if n.startswith("reclaim"))


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
@pytest.mark.parametrize("name", RECLAIM_CASES)
def test_an_incremental_solve_reclaims_as_a_full_one(name: str, backend: str, spacing: int) -> None:
    """The reconciler re-solves a new job incrementally: the same reclaims, by the same rule
    (issue 31's "feasible, gap 20.68%" was this path: an LP bound, and no reclaim)."""
    s = SCENARIOS[name]
    inst = build(s, spacing)
    placer_ = MilpPlacer(backend)
    plan = placer_.solve_incremental(inst, [x.key for x in s.waiting])
    assert rules_problems(inst, plan) == []
    got: dict[str, object] = {}
    for o in plan.outcomes:
        got[o.job] = (o.status, o.rule, o.preempted_by) if o.status is R else o.status
    assert got == s.expect
    assert plan.stats.gap is not None and plan.stats.gap <= 0.011


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_scenario_gives_its_documented_outcome_level_by_level(
    name: str, backend: str, spacing: int
) -> None:
    """`solver.levels: sequential` (level 1 solved first, then held): the same outcomes."""
    s = SCENARIOS[name]
    inst = build(s, spacing)
    # The clock only a backstop (a busy CI machine): the node budget is what stops a solve.
    inst = replace(inst, policy=replace(inst.policy, levels="sequential", time_limit_s=120.0))
    chosen = MilpPlacer(backend)
    plan = chosen.solve(inst)
    assert rules_problems(inst, plan) == []
    assert chosen.last_report is not None and chosen.last_report.problems == ()
    got: dict[str, object] = {}
    for o in plan.outcomes:
        got[o.job] = (o.status, o.rule, o.preempted_by) if o.status is R else o.status
    assert got == s.expect
    # As a weighted solve of these few jobs: the whole objective solved, not level 1 alone.
    weighted = MilpPlacer(backend).solve(
        replace(inst, policy=replace(inst.policy, levels="weighted"))
    )
    assert plan.stats.status == weighted.stats.status
    assert plan.stats.objective == pytest.approx(weighted.stats.objective, rel=1e-6)
