"""gitsched against a real API server: commits become pods on the decided nodes, and the
cluster's events (finished, failed, node lost, pod deleted) come back into the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from gitsched.cluster.api import KubeApi, Obj
from gitsched.engine import events as ev
from gitsched.engine.model import NodeState
from gitsched.eventlog.envelope import StoredEvent
from gitsched.eventlog.sqlite import SQLiteEventLog
from tests.support.cluster_repo import gitsched
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic
from tests.support.kube import KubeWorld, run_until

pytestmark = pytest.mark.kube


def _stored(world: KubeWorld) -> list[StoredEvent]:
    with SQLiteEventLog(world.log_path) as event_log:
        return list(event_log.read(0))


def _placed_nodes(world: KubeWorld, job: str) -> list[str]:
    for e in reversed(world.events()):
        if isinstance(e, ev.PlacementDecided) and e.job == world.job_key(job):
            return [r.node for r in e.replicas]
    raise AssertionError(f"no PlacementDecided for {job}")


def _job_pods(world: KubeWorld, job: str) -> dict[str, Obj]:
    return {
        name: pod
        for name, pod in world.pods().items()
        if pod["metadata"]["labels"]["gitsched.io/job"] == f"{world.team}.{job}"
    }


def _running(world: KubeWorld, job: str, replicas: int) -> bool:
    pods = _job_pods(world, job)
    return len(pods) == replicas and all(
        p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        for p in pods.values()
    )


class CrashAfterCreates(KubeApi):
    """Our adapter, dying (like a SIGKILLed daemon) after `creates` pods were made."""

    def __init__(self, api: KubeApi, creates: int) -> None:
        super().__init__(api.api_client)
        self.left = creates

    def create_pod(self, namespace: str, body: Obj) -> Obj | None:
        if self.left == 0:
            raise SystemExit("killed mid-actuation")
        self.left -= 1
        return super().create_pod(namespace, body)


def test_a_commit_runs_its_gang_on_the_decided_nodes(world: KubeWorld) -> None:
    for i in range(3):
        world.add_node(f"n{i}", clique=f"nvl-{i}")
    world.bootstrap(nominal=24)
    world.submit("train", replicas=2)
    controller = world.controller()
    run_until(controller, "train's pods Running", lambda r: _running(world, "train", 2))

    decided = _placed_nodes(world, "train")
    pods = _job_pods(world, "train")
    placement = next(iter(pods.values()))["metadata"]["labels"]["gitsched.io/placement"]
    assert sorted(pods) == [f"{world.team}.train-{placement[:6]}-{i}" for i in range(2)]
    for i, name in enumerate(sorted(pods)):
        pod = pods[name]
        assert pod["spec"]["nodeName"] == decided[i]
        assert not pod["spec"].get("schedulingGates")
        labels = pod["metadata"]["labels"]
        assert labels["gitsched.io/queue"] == world.team
        assert labels["gitsched.io/gang"] == f"{world.team}.train"
        assert labels["gitsched.io/replica"] == str(i)
        assert labels["app"] == "train"  # the template's own labels stay
        container = pod["spec"]["containers"][0]
        assert container["image"] == "registry.example/train:1"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {"name": "EPOCHS", "value": "3"} in container["env"]

    # The nodes came from the API, GPU Feature Discovery labels and all.
    state = run_until(
        controller, "JobStarted", lambda r: world.job_key("train") in r.state.started
    ).state
    node = state.nodes[decided[0]]
    assert (node.flavor, node.gpus, node.state) == ("h100-80g", 8, NodeState.READY)
    assert node.topology["nvlink"].startswith("nvl-")
    assert node.labels["nvidia.com/gpu.memory"] == "81559"
    started = [e for e in world.events() if isinstance(e, ev.JobStarted)]
    assert [e.job for e in started] == [world.job_key("train")]


def test_a_single_pod_job_is_made_on_its_node_in_one_call(world: KubeWorld) -> None:
    world.add_node("n0")
    world.bootstrap()
    world.submit("solo")
    controller = world.controller()
    report = run_until(controller, "solo's pod", lambda r: r.actuation.created > 0)
    # No other replica to wait for: created with nodeName, never gated, counted as bound.
    assert (report.actuation.created, report.actuation.bound) == (1, 1)
    assert world.job_key("solo") in report.actuation.bound_at
    (pod,) = _job_pods(world, "solo").values()
    assert pod["spec"]["nodeName"] == _placed_nodes(world, "solo")[0] == world.nodes[0]
    assert not pod["spec"].get("schedulingGates")
    run_until(controller, "solo Running", lambda r: _running(world, "solo", 1))
    again = controller.step()
    assert (again.actuation.created, again.actuation.bound) == (0, 0)


class CountingApi(KubeApi):
    """Our adapter, counting the pod calls the actuator makes."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api.api_client)
        self.calls: list[tuple[str, str]] = []

    def create_pod(self, namespace: str, body: Obj) -> Obj | None:
        gated = "gated" if body["spec"].get("schedulingGates") else "on-node"
        self.calls.append((f"create {gated}", body["metadata"]["labels"]["gitsched.io/replica"]))
        return super().create_pod(namespace, body)

    def remove_scheduling_gates(self, namespace: str, name: str) -> None:
        self.calls.append(("ungate", name.rsplit("-", 1)[1]))
        super().remove_scheduling_gates(namespace, name)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        self.calls.append(("bind", name.rsplit("-", 1)[1]))
        return super().bind(namespace, name, uid, node)


def test_a_gangs_last_pod_is_made_on_its_node_once_the_others_exist(world: KubeWorld) -> None:
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    world.submit("gang", replicas=3)
    api = CountingApi(world.api)
    controller = world.controller(api)
    report = run_until(controller, "the gang's pods", lambda r: r.actuation.created > 0)
    assert (report.actuation.created, report.actuation.bound) == (3, 3)
    # Two gated, then the last on its node (every replica's pod exists by then), then
    # the two ungated and bound: 7 calls, not 9.
    assert api.calls == [
        ("create gated", "0"),
        ("create gated", "1"),
        ("create on-node", "2"),
        ("ungate", "0"),
        ("bind", "0"),
        ("ungate", "1"),
        ("bind", "1"),
    ]
    run_until(controller, "the gang Running", lambda r: _running(world, "gang", 3))
    pods = _job_pods(world, "gang")
    assert [pods[n]["spec"]["nodeName"] for n in sorted(pods)] == _placed_nodes(world, "gang")


def test_a_gang_is_never_partly_bound_and_a_restart_makes_no_duplicates(
    world: KubeWorld,
) -> None:
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    world.submit("gang", replicas=3)
    crashing = world.controller(CrashAfterCreates(world.api, creates=2))
    with pytest.raises(SystemExit):
        run_until(crashing, "a crash", lambda r: False)
    crashing.stop()

    # Two of three pods exist, gated and bound nowhere: the gang has not started in part.
    pods = _job_pods(world, "gang")
    assert len(pods) == 2
    for pod in pods.values():
        assert pod["spec"]["schedulingGates"] == [{"name": "gitsched.io/placement"}]
        assert not pod["spec"].get("nodeName")
        assert pod["status"]["phase"] == "Pending"

    # A new daemon (same log, same cluster) finishes the job: three pods, not five.
    restarted = world.controller()
    run_until(restarted, "the gang Running", lambda r: _running(world, "gang", 3))
    pods = _job_pods(world, "gang")
    assert sorted(p["metadata"]["labels"]["gitsched.io/replica"] for p in pods.values()) == [
        "0",
        "1",
        "2",
    ]
    assert [pods[n]["spec"]["nodeName"] for n in sorted(pods)] == _placed_nodes(world, "gang")
    # Idempotent: more passes change nothing.
    again = restarted.step()
    assert (again.actuation.created, again.actuation.bound, again.actuation.deleted) == (0, 0, 0)


def test_a_finished_job_frees_its_quota_for_a_waiting_one(world: KubeWorld) -> None:
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("first", replicas=2)
    world.submit("second", replicas=1)
    controller = world.controller()
    run_until(controller, "first Running", lambda r: _running(world, "first", 2))
    report = controller.step()
    assert world.job_key("second") in report.state.pending  # the quota is full
    assert not _job_pods(world, "second")

    world.end_pods("first", "succeeded")
    run_until(controller, "second Running", lambda r: _running(world, "second", 1))
    events = world.events()
    finished = [e for e in events if isinstance(e, ev.JobFinished)]
    assert [e.job for e in finished] == [world.job_key("first")]
    assert world.job_key("first") not in controller.step().state.jobs
    # The finished job's pods stay, Succeeded, for their logs.
    assert {p["status"]["phase"] for p in _job_pods(world, "first").values()} == {"Succeeded"}
    # audit's history has the times the cluster gave: started when its pods ran, not
    # when the solver decided; ended when they succeeded.
    stored = {e.type: e for e in _stored(world) if e.data.get("job") == world.job_key("first")}
    run = gitsched(
        "audit",
        "history",
        "--log",
        f"sqlite:///{world.log_path}",
        "--job",
        world.job_key("first"),
        "--format",
        "json",
    )
    assert run.returncode == 0, str(run)
    (row,) = [r for r in run.json() if r["job"] == world.job_key("first")]
    assert (row["start"], row["end"], row["state"]) == (
        stored["JobStarted"].time,
        stored["JobFinished"].time,
        "COMPLETED",
    )
    assert stored["JobStarted"].time > stored["PlacementDecided"].time
    # Its file is still in the repo, and a later commit does not run it again.
    world.submit("third", replicas=1)
    state = run_until(
        controller, "third decided", lambda r: world.job_key("third") in r.state.jobs
    ).state
    assert world.job_key("first") not in state.jobs


def test_a_failed_pod_fails_its_job_with_reason_and_exit_code(world: KubeWorld) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("flaky", replicas=2)
    controller = world.controller()
    run_until(controller, "flaky Running", lambda r: _running(world, "flaky", 2))
    (second,) = [
        n
        for n, p in _job_pods(world, "flaky").items()
        if p["metadata"]["labels"]["gitsched.io/replica"] == "1"
    ]
    world.annotate_pod(second, "failed", exit_code=3)
    run_until(
        controller,
        "JobFailed",
        lambda r: any(isinstance(e, ev.JobFailed) for e in r.observed),
    )
    failed = [e for e in world.events() if isinstance(e, ev.JobFailed)]
    assert len(failed) == 1
    assert (failed[0].job, failed[0].exit_code, failed[0].replica) == (world.job_key("flaky"), 3, 1)
    assert failed[0].reason == "Error"
    # The rest of the gang is stopped; the failed pod stays for its exit code.
    run_until(
        controller,
        "the other replica deleted",
        lambda r: list(_job_pods(world, "flaky")) == [second],
    )


def test_a_higher_priority_commit_preempts_and_deletes_the_victims_pods(
    world: KubeWorld,
) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("batch", replicas=2, priority="low")
    controller = world.controller()
    run_until(controller, "batch Running", lambda r: _running(world, "batch", 2))
    world.submit("urgent", replicas=2, priority="high")
    run_until(
        controller,
        "urgent Running and batch's pods gone",
        lambda r: _running(world, "urgent", 2) and not _job_pods(world, "batch"),
    )
    preempted = [e for e in world.events() if isinstance(e, ev.JobPreempted)]
    assert [e.job for e in preempted] == [world.job_key("batch")]


def test_a_node_going_not_ready_places_its_gang_again_elsewhere(world: KubeWorld) -> None:
    nodes = [world.add_node(f"n{i}") for i in range(3)]
    world.bootstrap(nominal=24)
    world.submit("web", replicas=1)
    controller = world.controller()
    run_until(controller, "web Running", lambda r: _running(world, "web", 1))
    first = _placed_nodes(world, "web")[0]
    assert first in nodes

    world.fail_node(first)
    run_until(
        controller,
        "web Running on another node",
        lambda r: (
            _running(world, "web", 1)
            and next(iter(_job_pods(world, "web").values()))["spec"]["nodeName"] != first
        ),
    )
    changed = [e for e in world.events() if isinstance(e, ev.NodeStateChanged)]
    assert [(e.node, e.state) for e in changed] == [(first, NodeState.FAILED)]
    assert "not Ready" in changed[0].reason
    assert _placed_nodes(world, "web")[0] != first


def test_a_pod_deleted_behind_gitscheds_back_is_logged_and_the_gang_placed_again(
    world: KubeWorld,
) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("svc", replicas=2)
    controller = world.controller()
    run_until(controller, "svc started", lambda r: world.job_key("svc") in r.state.started)
    (victim,) = [
        p
        for p in _job_pods(world, "svc").values()
        if p["metadata"]["labels"]["gitsched.io/replica"] == "0"
    ]
    world.api.delete_pod(world.team, victim["metadata"]["name"], victim["metadata"]["uid"], 0)
    run_until(
        controller,
        "svc started again",
        lambda r: (
            any(isinstance(e, ev.JobInterrupted) for e in world.events())
            and world.job_key("svc") in r.state.started
        ),
    )
    interrupted = [e for e in world.events() if isinstance(e, ev.JobInterrupted)]
    assert len(interrupted) == 1
    assert victim["metadata"]["name"] in interrupted[0].reason
    assert _running(world, "svc", 2)


@pytest.mark.kafka
def test_the_cluster_events_go_to_a_kafka_log_as_well(world: KubeWorld) -> None:
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    topic = unique_topic("gitsched-kube")
    world.log_url = f"kafka://{bootstrap}/{topic}"
    try:
        for i in range(2):
            world.add_node(f"n{i}")
        world.bootstrap(nominal=8)
        world.submit("first", replicas=1)
        world.submit("second", replicas=1)
        controller = world.controller()
        run_until(controller, "first Running", lambda r: _running(world, "first", 1))
        world.end_pods("first", "succeeded")
        run_until(
            controller, "second started", lambda r: world.job_key("second") in r.state.started
        )
        events = world.events()
        kinds = [type(e).__name__ for e in events]
        assert kinds.count("JobStarted") == 2 and kinds.count("JobFinished") == 1
        # Registered as seen first, then again once cluster.yaml names their GPU flavor.
        nodes = {e.node.name: e.node for e in events if isinstance(e, ev.NodeRegistered)}
        assert {n.flavor for n in nodes.values()} == {"h100-80g"} and len(nodes) == 2
    finally:
        for controller in world.controllers:
            controller.stop()
        for event_log in world.logs:
            event_log.close()
        world.controllers.clear()
        world.logs.clear()
        delete_topics(bootstrap, [topic])


def test_a_deleted_node_places_its_gang_again_without_waiting_for_its_stuck_pods(
    world: KubeWorld,
) -> None:
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    world.submit("batch", replicas=1)
    controller = world.controller(grace_period_s=30)
    run_until(controller, "batch Running", lambda r: _running(world, "batch", 1))
    gone = _placed_nodes(world, "batch")[0]
    world.api.core.delete_node(gone, _preload_content=False)
    # Nothing finalizes a pod on a node that no longer exists (no kubelet, no pod GC
    # here): the old pod stays Terminating, and the new one must not wait for its name.
    run_until(
        controller,
        "batch Running on another node",
        lambda r: any(
            p["spec"].get("nodeName") not in (None, gone) and p["status"].get("phase") == "Running"
            for p in _job_pods(world, "batch").values()
        ),
    )
    removed = [e.node for e in world.events() if isinstance(e, ev.NodeRemoved)]
    assert removed == [gone]


def test_a_second_gitsched_on_the_cluster_leaves_the_first_ones_pods_alone(
    world: KubeWorld, kube_api: KubeApi, tmp_path: Path
) -> None:
    for i in range(2):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=16)
    world.submit("train", replicas=2)
    mine = world.controller()
    run_until(mine, "train's pods Running", lambda r: _running(world, "train", 2))
    before = {name: pod["metadata"]["uid"] for name, pod in _job_pods(world, "train").items()}

    # Another repo, another log, another team, on the same API server: its pods' cache
    # holds the first one's pods too, and none of them is in its state.
    other = KubeWorld(kube_api, tmp_path / "other")
    try:
        other.add_node("m0")
        other.bootstrap(nominal=8)
        other.submit("solo", replicas=1)
        theirs = other.controller()
        run_until(theirs, "solo's pod Running", lambda r: _running(other, "solo", 1))
        for _ in range(3):
            assert theirs.step().actuation.deleted == 0
        assert mine.step().actuation.deleted == 0
    finally:
        other.close()
    after = _job_pods(world, "train")
    assert {name: pod["metadata"]["uid"] for name, pod in after.items()} == before
    assert not any(p["metadata"].get("deletionTimestamp") for p in after.values())
