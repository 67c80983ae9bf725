"""Gangs as close together as the network tree allows, under greedy and the MILP.

The tree: one datacenter, three spines, two blocks per spine, two 8-GPU nodes per block
(levels narrowest first: block, spine, datacenter), with some nodes drained.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.engine.model import (
    ClusterSpec,
    FlavorQuota,
    GpuFlavor,
    Job,
    Node,
    NodeState,
    Policy,
    PriorityClass,
    Queue,
    Resources,
    TopologyMode,
    TopologyRequirement,
)
from gitsched.engine.placement import milp
from gitsched.engine.placement.check import check_plan
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.placement.milp import MilpPlacer
from gitsched.engine.placement.objective import instance_tree
from gitsched.engine.placement.plan import (
    JobOutcome,
    OutcomeStatus,
    PlacementInstance,
    PlacementPlan,
    Placer,
)
from gitsched.engine.placement.topology import (
    CLUSTER_LEVEL,
    NODE_LEVEL,
    Tree,
    compact_allocation,
    gang_spans,
    span_of,
    tightest_level,
)

CLUSTER = ClusterSpec(
    "tree",
    ("block", "spine", "datacenter"),
    (GpuFlavor("h100", "H100", 80),),
    (PriorityClass("normal", 500),),
    "normal",
)
QUEUE = Queue("q", "q", quotas=(FlavorQuota("h100", 1_000_000),))
# s0 and s2 keep two Ready nodes each, in one block; s1 keeps three, over both its blocks.
DRAINED = frozenset({"n000", "n001", "n101", "n200", "n201"})


def nodes(drained: frozenset[str] = DRAINED) -> tuple[Node, ...]:
    out = []
    for s in range(3):
        for b in range(2):
            for i in range(2):
                name = f"n{s}{b}{i}"
                out.append(
                    Node(
                        name,
                        "h100",
                        8,
                        128_000,
                        1024 * 1024,
                        {"block": f"b{s}{b}", "spine": f"s{s}", "datacenter": "dc"},
                        state=NodeState.DRAINED if name in drained else NodeState.READY,
                    )
                )
    return tuple(out)


def gang(
    name: str,
    replicas: int = 3,
    level: str | None = None,
    mode: TopologyMode = TopologyMode.REQUIRED,
    gpus: int = 8,
    slice_size: int | None = None,
    slice_level: str | None = None,
) -> Job:
    topology = (
        TopologyRequirement(level, mode, slice_size, slice_level)
        if level is not None or mode is TopologyMode.UNCONSTRAINED
        else None
    )
    return Job(
        name, "q", replicas, Resources(gpus * 1000, 1000, 1024), "normal", 500, topology=topology
    )


def instance(*jobs: Job, drained: frozenset[str] = DRAINED) -> PlacementInstance:
    return PlacementInstance(CLUSTER, nodes(drained), (QUEUE,), jobs, {}, Policy())


@pytest.fixture(params=["greedy", "highs", "cbc", "cpsat", "highs-classes"])
def solver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Greedy, the MILP with each backend, and the MILP's class model of large instances."""
    name: str = request.param
    if name == "highs-classes":
        monkeypatch.setattr(milp, "SMALL_NODES", 0)
    return name


def placer(name: str) -> Placer:
    return GreedyPlacer() if name == "greedy" else MilpPlacer(name.split("-")[0])


def solve(name: str, inst: PlacementInstance) -> PlacementPlan:
    solver = placer(name)
    plan = solver.solve(inst)
    assert check_plan(inst, plan) == []
    if isinstance(solver, MilpPlacer):
        # The MILP's own plan, not greedy's taken as a fallback or for being tighter.
        report = solver.last_report
        assert report is not None and not report.fell_back and not report.greedy_tighter
    return plan


def outcome(plan: PlacementPlan, name: str) -> JobOutcome:
    found = plan.outcome(f"q/{name}")
    assert found is not None
    return found


def spines(o: JobOutcome) -> set[str]:
    return {r.node[:2] for r in o.replicas}


def blocks(o: JobOutcome) -> list[str]:
    return [r.node[:3] for r in o.replicas]


# -- the span, one definition ---------------------------------------------------------------


def test_the_span_is_the_narrowest_common_level_and_the_domains_used_per_level() -> None:
    tree = Tree.of(CLUSTER, nodes())
    assert tree.levels == ("node", "block", "spine", "datacenter")
    span = span_of(tree, ["n110", "n111", "n100"])
    assert span.level == "spine" and span.used == (3, 2, 1, 1)
    assert span.text(tree) == "3 nodes in 2 blocks in 1 spine in 1 datacenter"
    assert span_of(tree, ["n010", "n011"]).level == "block"
    assert span_of(tree, ["n010", "n010"]).level == "node"


def test_equal_labels_under_different_parents_are_different_domains() -> None:
    twins = [
        Node("a", "h100", 8, 1, 1, {"block": "b0", "spine": "s0"}),
        Node("b", "h100", 8, 1, 1, {"block": "b0", "spine": "s1"}),
    ]
    tree = Tree(("block", "spine"), twins)
    assert span_of(tree, ["a", "b"]).level == CLUSTER_LEVEL


def test_the_tightest_level_is_the_narrowest_domain_whose_free_room_holds_the_gang() -> None:
    tree = Tree.of(CLUSTER, nodes())
    free = {n.name: 1 for n in nodes() if n.name not in DRAINED}
    assert tightest_level(tree, free, 1) == "node"
    assert tightest_level(tree, free, 2) == "block"
    assert tightest_level(tree, free, 3) == "spine"
    assert tightest_level(tree, free, 7) == "datacenter"
    assert tightest_level(tree, free, 8) is None
    # Slices of two in one block: only s1 has two blocks, but one of them holds a single node.
    assert tightest_level(tree, free, 4, 2, "block") == "datacenter"


def test_a_compact_allocation_uses_as_few_domains_as_possible_at_every_level() -> None:
    """Seven replicas of one per node over the whole cluster: all of s1 (the largest spine),
    then a spine of two; slices of two keep to blocks of two free nodes."""
    tree = Tree.of(CLUSTER, nodes())
    free = {n.name: 1 for n in nodes() if n.name not in DRAINED}
    allocation = compact_allocation(tree, free, 5, lambda n: (0, 0))
    assert allocation is not None
    assert span_of(tree, [n for n, _ in allocation]).used == (5, 3, 2, 1)
    sliced = compact_allocation(tree, free, 4, lambda n: (0, 0), None, 2, "block")
    assert sliced is not None
    names = [n for n, _ in sliced]
    assert names[0][:3] == names[1][:3] and names[2][:3] == names[3][:3]


# -- the scenarios, under every solver --------------------------------------------------------


def test_required_spine_lands_on_the_one_spine_with_room(solver: str) -> None:
    plan = solve(solver, instance(gang("g", level="spine")))
    assert spines(outcome(plan, "g")) == {"n1"}


def test_preferred_block_climbs_to_one_spine_and_says_so(solver: str) -> None:
    plan = solve(solver, instance(gang("g", level="block", mode=TopologyMode.PREFERRED)))
    o = outcome(plan, "g")
    assert o.status is OutcomeStatus.PLACED and spines(o) == {"n1"}
    assert o.reason.endswith("preferred block: no block could hold it; placed within one spine")


@pytest.mark.parametrize("job", [None, "datacenter"])
def test_inside_a_large_domain_the_gang_still_packs_into_the_tightest(
    solver: str, job: str | None
) -> None:
    """Preferred datacenter (everything is one datacenter) and no topology field at all:
    the gang still takes one spine, and a pair takes one block."""
    mode = TopologyMode.PREFERRED
    plan = solve(solver, instance(gang("g", level=job, mode=mode), gang("p", 2, job, mode)))
    g, p = outcome(plan, "g"), outcome(plan, "p")
    assert spines(g) == {"n1"}
    assert len(set(blocks(p))) == 1
    assert "preferred" not in g.reason


def test_preferred_inside_its_own_domain_packs_below_it(solver: str) -> None:
    """Preferred spine with every node Ready: a pair goes into one block, not two."""
    inst = instance(gang("p", 2, "spine", TopologyMode.PREFERRED), drained=frozenset())
    p = outcome(solve(solver, inst), "p")
    assert len(set(blocks(p))) == 1


def test_slices_sit_each_in_one_block(solver: str) -> None:
    """Four replicas, each two in one block, anywhere in the datacenter: only blocks with two
    free nodes serve, although one spine has three free nodes."""
    drained = frozenset({"n000", "n101", "n200"})
    job = gang("s", 4, "datacenter", slice_size=2, slice_level="block")
    o = outcome(solve(solver, instance(job, drained=drained)), "s")
    assert o.status is OutcomeStatus.PLACED
    b = blocks(o)
    assert b[0] == b[1] and b[2] == b[3] and b[0] != b[2]
    assert {"n00", "n10", "n20"}.isdisjoint(b)


def test_slices_that_no_domain_holds_wait_and_say_why(solver: str) -> None:
    job = gang("s", 4, "spine", slice_size=2, slice_level="block")
    o = outcome(solve(solver, instance(job)), "s")
    assert o.status is OutcomeStatus.PENDING
    assert o.reason == (
        "needs 2 slices of 2 replicas of 8 × h100 GPU, each slice in one block domain within"
        " one spine domain; the largest free spine domain holds 1 of the 2 slices"
    )


def test_a_required_gang_too_large_for_any_domain_waits_with_the_largest(solver: str) -> None:
    o = outcome(solve(solver, instance(gang("g", 4, "spine"))), "g")
    assert o.status is OutcomeStatus.PENDING
    assert "in one spine domain; the largest free spine domain holds 3 of the 4 replicas" in (
        o.reason
    )


def test_a_preferred_gang_too_large_for_any_domain_spreads_as_little_as_it_can(
    solver: str,
) -> None:
    """Seven nodes free in three spines of one datacenter, no datacenter label on one spine:
    no domain holds seven, so the gang spreads over all three spines, and says so."""
    plain = tuple(
        Node(n.name, n.flavor, n.gpus, n.cpu_milli, n.memory_mib, dict(n.topology), state=n.state)
        for n in nodes()
    )
    for n in plain:
        n.topology.pop("datacenter")
    cluster = ClusterSpec(
        "tree", ("block", "spine"), CLUSTER.gpu_flavors, CLUSTER.priority_classes, "normal"
    )
    job = gang("g", 7, "block", TopologyMode.PREFERRED)
    inst = PlacementInstance(cluster, plain, (QUEUE,), (job,), {}, Policy())
    o = outcome(solve(solver, inst), "g")
    assert o.status is OutcomeStatus.PLACED
    assert o.reason.endswith("preferred block: no domain could hold it, spread over 3 spines")


def test_every_gang_sits_at_the_tightest_span_free_when_it_was_placed(solver: str) -> None:
    inst = instance(
        gang("a", 3, "spine"),
        gang("b", 2, "block", TopologyMode.PREFERRED),
        gang("c", 2),
    )
    plan = solve(solver, inst)
    spans = gang_spans(inst, plan.outcomes)
    assert len(spans) == 3
    assert all(s.extra == 0 for s in spans), spans


def test_unconstrained_is_placed_without_a_level(solver: str) -> None:
    o = outcome(solve(solver, instance(gang("u", 3, mode=TopologyMode.UNCONSTRAINED))), "u")
    assert o.status is OutcomeStatus.PLACED and len(o.replicas) == 3


@settings(max_examples=200, deadline=None)
@given(
    rooms=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    count=st.integers(1, 12),
    sliced=st.booleans(),
)
def test_a_compact_allocation_is_the_tightest_and_keeps_every_rule(
    rooms: list[int], count: int, sliced: bool
) -> None:
    """Any room on the 12 nodes: the allocation places exactly `count` replicas within each
    node's room, its span is the tightest level free, and slices stay in one block."""
    tree = Tree.of(CLUSTER, nodes(frozenset()))
    room = {n.name: k for n, k in zip(nodes(frozenset()), rooms, strict=True)}
    size, level = (2, "block") if sliced else (1, "node")
    if count % size:
        count += 1
    allocation = compact_allocation(tree, room, count, lambda n: (room[n], 0), None, size, level)
    tightest = tightest_level(tree, room, count, size, level)
    if allocation is None:
        assert tightest is None
        return
    assert sum(k for _, k in allocation) == count
    assert all(0 < k <= room[n] for n, k in allocation)
    assert len({n for n, _ in allocation}) == len(allocation)
    replicas = [n for n, k in allocation for _ in range(k)]
    assert span_of(tree, replicas).level == tightest
    if sliced:
        for i in range(0, count, 2):
            assert replicas[i][:3] == replicas[i + 1][:3]


def test_an_instance_tree_follows_the_clusters_levels_not_only_its_node_list() -> None:
    """Two instances over the very same node tuple whose clusters name other topology
    levels have other trees (the tree is cached per node tuple across solves)."""
    first = instance()
    flat = replace(first, cluster=replace(CLUSTER, topology_levels=("spine", "datacenter")))
    assert flat.nodes is first.nodes
    assert instance_tree(first).levels == (NODE_LEVEL, "block", "spine", "datacenter")
    assert instance_tree(flat).levels == (NODE_LEVEL, "spine", "datacenter")
    assert instance_tree(first) is instance_tree(replace(first, jobs=(gang("g"),)))
