"""The cluster's events in the pure core: a finished job frees its quota and stays finished;
Node objects become nodes; pod phases become job events."""

from __future__ import annotations

from typing import Any

from gitsched.cluster.inventory import InventoryConfig, node_events, quantity, to_node
from gitsched.cluster.observer import job_events
from gitsched.cluster.pods import PLACEMENT_LABEL, desired_pods
from gitsched.engine import events as ev
from gitsched.engine.codec import from_data, to_data
from gitsched.engine.core import ApplyCommit, ApplyPlan, decide, placement_instance
from gitsched.engine.model import Isolation, NodeState
from gitsched.engine.placement.greedy import GreedyPlacer
from gitsched.engine.state import ClusterState, fold
from gitsched.eventlog.codec import decode
from gitsched.eventlog.envelope import StoredEvent
from tests.support.factories import CLUSTER, commit, desired, job, queue

NOW = "2026-11-20T10:00:00+00:00"


def _placed(jobs: list[Any], quota_gpus: float) -> ClusterState:
    """Jobs committed and placed on two 8-GPU nodes, the queue's quota `quota_gpus`."""
    from tests.support.factories import node

    d = desired(
        jobs,
        nodes=[node("n1"), node("n2")],
        queues=[queue("q", quotas={"h100": (quota_gpus, None, None)})],
    )
    state = fold(decide(ClusterState(), ApplyCommit(commit(1), d)))
    plan = GreedyPlacer().solve(placement_instance(state, NOW))
    return fold(decide(state, ApplyPlan(plan, "s1", NOW)), state)


def test_a_finished_job_frees_its_quota_and_is_not_submitted_again() -> None:
    jobs = [job("a", gpu=8), job("b", gpu=8, submitted_at="later")]
    state = _placed(jobs, quota_gpus=8)
    assert set(state.placements) == {"q/a"} and "q/b" in state.pending

    state = fold(
        [ev.JobStarted("q/a", state.placements["q/a"].started_at), ev.JobFinished("q/a")], state
    )
    assert state.needs_placement and "q/a" not in state.jobs and state.ended["q/a"] == "finished"
    assert "q/a" not in state.started
    plan = GreedyPlacer().solve(placement_instance(state, NOW))
    state = fold(decide(state, ApplyPlan(plan, "s2", NOW)), state)
    assert set(state.placements) == {"q/b"}

    # The next commit still holds a.yaml: it is a record now, not a resubmission.
    events = decide(state, ApplyCommit(commit(2), desired(jobs, queues=[queue("q")])))
    assert not [e for e in events if isinstance(e, ev.JobSubmitted)]
    # Removing the file clears the record; adding it again would run it again.
    events = decide(state, ApplyCommit(commit(3), desired([jobs[1]], queues=[queue("q")])))
    assert [e.job for e in events if isinstance(e, ev.JobWithdrawn)] == ["q/a"]
    assert "q/a" not in fold(events, state).ended


def test_a_failed_job_ends_and_an_interrupted_one_is_placed_again() -> None:
    state = _placed([job("a", gpu=8), job("b", gpu=8)], quota_gpus=16)
    failed = fold([ev.JobFailed("q/a", "Error", 3, 1)], state)
    assert failed.ended["q/a"] == "failed" and "q/a" not in failed.placements
    interrupted = fold([ev.JobInterrupted("q/b", "pod deleted")], state)
    assert "q/b" in interrupted.jobs and "q/b" not in interrupted.placements
    assert interrupted.needs_placement


def test_the_new_events_round_trip_and_decode_from_stored_payloads() -> None:
    for event in (
        ev.JobStarted("q/a", NOW),
        ev.JobFailed("q/a", "OOMKilled", 137, 0),
        ev.JobFailed("q/a", "Evicted", None, None),
        ev.JobInterrupted("q/a", "pod q.a-0 deleted outside gitsched"),
    ):
        assert from_data(type(event), to_data(event)) == event
    stored = StoredEvent(
        seq=1,
        id="kubernetes/0/0",
        type="JobFailed",
        schema_version=1,
        data={"job": "q/a", "reason": "Error", "exit_code": 2, "replica": 1},
        time=NOW,
        actor="kubernetes",
        cause="kubernetes",
        prev_hash="0" * 64,
        hash="0" * 64,
    )
    assert decode(stored) == ev.JobFailed("q/a", "Error", 2, 1)


def test_a_job_stored_before_templates_existed_decodes_without_one() -> None:
    job_data = to_data(job("old"))
    del job_data["template"]
    stored = StoredEvent(
        seq=1,
        id="c/0",
        type="JobSubmitted",
        schema_version=1,
        data={"job": job_data},
        time=NOW,
        actor="a",
        cause="c",
        prev_hash="0" * 64,
        hash="0" * 64,
    )
    decoded = decode(stored)
    assert isinstance(decoded, ev.JobSubmitted) and decoded.job.template is None
    assert decoded.job == job("old")


def test_a_commit_without_inventory_leaves_the_live_nodes_alone() -> None:
    from tests.support.factories import node

    state = fold([ev.NodeRegistered(node("k8s-1"))])
    events = decide(state, ApplyCommit(commit(1), desired([], nodes=[])))
    assert not [e for e in events if isinstance(e, ev.NodeRemoved)]


def _node_obj(name: str, **over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "labels": {
                "nvidia.com/gpu.product": "H100",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.clique": "nvl72-a.3",
                "topology.kubernetes.io/zone": "eu-1a",
                "topology.kubernetes.io/region": "eu",
                "topology.gitsched.io/rack": "r7",
                "kubernetes.io/hostname": name,
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "191500m", "memory": "2Ti"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for path, value in over.items():
        target = obj
        *parents, last = path.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[last] = value
    return obj


def test_a_node_object_becomes_a_node_with_its_gfd_labels_and_state() -> None:
    n = to_node(_node_obj("gpu-1"), CLUSTER, InventoryConfig())
    assert (n.name, n.flavor, n.gpus, n.cpu_milli, n.memory_mib) == (
        "gpu-1",
        "h100",
        8,
        191500,
        2 * 1024**2,
    )
    assert n.topology == {"nvlink": "nvl72-a.3", "rack": "r7"}
    assert (n.region, n.isolation, n.state) == ("eu", Isolation.SHARED, NodeState.READY)
    assert n.labels["nvidia.com/gpu.memory"] == "81559" and "kubernetes.io/hostname" not in n.labels

    cordoned = to_node(
        _node_obj("gpu-1", **{"spec.unschedulable": True}), CLUSTER, InventoryConfig()
    )
    assert cordoned.state is NodeState.DRAINED
    down = _node_obj(
        "gpu-1",
        **{
            "status.conditions": [
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
            ]
        },
    )
    assert to_node(down, CLUSTER, InventoryConfig()).state is NodeState.FAILED
    tainted = _node_obj(
        "gpu-1",
        **{"spec.taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
    )
    assert to_node(tainted, CLUSTER, InventoryConfig()).state is NodeState.FAILED
    assert quantity("500m") == 0.5 and quantity("64Gi") == 64 * 1024**3 and quantity(None) == 0


def test_node_events_register_change_state_and_remove() -> None:
    cfg = InventoryConfig()
    state = ClusterState(cluster=CLUSTER)
    first = node_events(state, [_node_obj("a"), _node_obj("b")], cfg)
    assert [type(e).__name__ for e in first] == ["NodeRegistered", "NodeRegistered"]
    state = fold(first, state)
    assert node_events(state, [_node_obj("a"), _node_obj("b")], cfg) == []
    down = _node_obj(
        "a",
        **{"status.conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]},
    )
    events = node_events(state, [down], cfg)
    assert events == [
        ev.NodeStateChanged("a", NodeState.FAILED, "Kubernetes: node not Ready (KubeletDown)"),
        ev.NodeRemoved("b"),
    ]
    only_a = InventoryConfig(node_selector="kubernetes.io/hostname=a")
    registered = node_events(
        ClusterState(cluster=CLUSTER), [_node_obj("a"), _node_obj("b")], only_a
    )
    assert registered == [ev.NodeRegistered(to_node(_node_obj("a"), CLUSTER, only_a))]


def test_nodes_wait_for_the_cluster_and_are_registered_once_with_their_flavor() -> None:
    # Before the log holds a cluster.yaml a node's GPU product is no flavor: nothing yet
    # (it was registered under the raw product, then again under the flavor: 64 for 32).
    assert node_events(ClusterState(), [_node_obj("a"), _node_obj("b")], InventoryConfig()) == []
    (first,) = node_events(ClusterState(cluster=CLUSTER), [_node_obj("a")], InventoryConfig())
    assert isinstance(first, ev.NodeRegistered)
    assert first.node.flavor in {f.name for f in CLUSTER.gpu_flavors}


def _pods_for(state: ClusterState, phase: str, **status: Any) -> dict[tuple[str, str], Any]:
    pods = {}
    for key, want in desired_pods(state).items():
        body = want.body
        pods[key] = {
            "metadata": {**body["metadata"], "uid": "u"},
            "spec": {**body["spec"], "nodeName": want.node, "schedulingGates": None},
            "status": {"phase": phase, **status},
        }
    return pods


def test_pod_phases_become_job_events_once() -> None:
    state = _placed([job("a", gpu=8, replicas=2)], quota_gpus=16)
    assert job_events(state, {}) == []  # pods not made yet: nothing to say
    running = _pods_for(state, "Running")
    started = job_events(state, running)
    assert started == [ev.JobStarted("q/a", state.placements["q/a"].started_at)]
    state = fold(started, state)
    assert job_events(state, running) == []
    assert job_events(state, _pods_for(state, "Succeeded")) == [ev.JobFinished("q/a")]
    failed = _pods_for(state, "Running")
    key = sorted(failed)[1]
    failed[key]["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
    }
    assert job_events(state, failed) == [ev.JobFailed("q/a", "OOMKilled", 137, 1)]
    # A pod of the running placement gone: someone deleted it behind gitsched's back.
    del running[sorted(running)[0]]
    assert [type(e).__name__ for e in job_events(state, running)] == ["JobInterrupted"]
    # A pod of an older placement (same name) is not this placement's.
    stale = _pods_for(state, "Running")
    for pod in stale.values():
        pod["metadata"]["labels"][PLACEMENT_LABEL] = "older"
    assert [type(e).__name__ for e in job_events(state, stale)] == ["JobInterrupted"]
