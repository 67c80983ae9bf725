"""Inference services on a real API server (kwok nodes): each replica is a pod on the node
gitsched decided, spread keeps replicas apart and holds when a node goes NotReady, and a
rolling update replaces pods a few at a time without ever running fewer than min."""

from __future__ import annotations

from typing import Any

import pytest

from gitsched.cluster.api import Obj
from gitsched.engine import events as ev
from tests.support.cluster_repo import H
from tests.support.kube import KubeWorld, run_until

pytestmark = pytest.mark.kube


def service_yaml(
    *, low: int, high: int, image: str = "registry.example/serve:1", extra: str = ""
) -> str:
    return (
        H
        + f"""kind: InferenceService
metadata:
  name: chat
spec:
  replicas: {{min: {low}, max: {high}}}
  resources: {{gpu: 2, cpu: 4, memoryGiB: 16}}
  spread: [{{topology: node, maxPerDomain: 1}}]
{extra}  template:
    metadata:
      labels: {{app: chat}}
    spec:
      containers:
        - name: serve
          image: {image}
"""
    )


def commit_service(world: KubeWorld, text: str, message: str) -> None:
    world.repo.write(f"teams/{world.team}/services/chat.yaml", text)
    world.repo.commit(message)


def serving(world: KubeWorld) -> dict[str, Obj]:
    """The service's pods that run and are not being deleted, by name."""
    return {
        name: pod
        for name, pod in world.pods().items()
        if pod["metadata"]["labels"]["gitsched.io/job"].startswith(f"{world.team}.chat.")
        and pod["status"].get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    }


def nodes_of(pods: dict[str, Obj]) -> list[str]:
    return sorted(p["spec"]["nodeName"] for p in pods.values())


def images(pods: dict[str, Obj]) -> set[Any]:
    return {p["spec"]["containers"][0]["image"] for p in pods.values()}


def test_a_service_is_spread_over_nodes_and_survives_a_node_going_not_ready(
    world: KubeWorld,
) -> None:
    nodes = [world.add_node(f"n{i}") for i in range(3)]
    world.bootstrap(nominal=24)
    commit_service(world, service_yaml(low=2, high=2), "serve chat from 2 replicas")
    controller = world.controller()
    run_until(controller, "2 replicas Running", lambda r: len(serving(world)) == 2)
    before = nodes_of(serving(world))
    # 2 GPUs a replica: both would fit one node; the spread puts them on two
    assert len(set(before)) == 2 and set(before) <= set(nodes)

    lost = before[0]
    world.fail_node(lost)
    least = [len(serving(world))]

    def moved(_: object) -> bool:
        now = serving(world)
        least.append(len(now))
        return len(now) == 2 and lost not in nodes_of(now) and len(set(nodes_of(now))) == 2

    run_until(controller, "the lost replica Running on the third node", moved)
    assert min(least) >= 1  # one node lost took one replica, never both
    after = nodes_of(serving(world))
    assert before[1] in after and lost not in after
    steps = [e for e in world.events() if isinstance(e, ev.ServiceReplicasChanged)]
    assert steps[0].added and steps[0].service == f"{world.team}/chat"


def test_a_rolling_update_replaces_pods_without_going_below_min(world: KubeWorld) -> None:
    for i in range(3):
        world.add_node(f"n{i}")
    world.bootstrap(nominal=24)
    rolling = "  rollingUpdate: {maxSurge: 1, maxUnavailable: 0}\n"
    commit_service(world, service_yaml(low=2, high=2, extra=rolling), "serve chat")
    controller = world.controller()
    run_until(controller, "2 replicas Running", lambda r: len(serving(world)) == 2)
    run_until(
        controller,
        "both replicas started",
        lambda r: (
            len(r.state.services[f"{world.team}/chat"].replicas) == 2
            and all(
                k in r.state.started for k in r.state.jobs if k.startswith(f"{world.team}/chat.")
            )
        ),
    )

    commit_service(
        world,
        service_yaml(low=2, high=2, extra=rolling, image="registry.example/serve:2"),
        "chat: serve:2",
    )
    counts: list[int] = []

    def rolled(_: object) -> bool:
        now = serving(world)
        counts.append(len(now))
        return len(now) == 2 and images(now) == {"registry.example/serve:2"}

    run_until(controller, "every replica on serve:2", rolled, timeout_s=90)
    assert min(counts) >= 2, counts  # never below min
    assert max(counts) <= 3, counts  # at most maxSurge above
    steps = [e for e in world.events() if isinstance(e, ev.ServiceReplicasChanged)]
    rollout = [s for s in steps if "rolling update" in s.reason]
    assert len(rollout) >= 2  # a few at a time, each step an event
    assert all(len(s.added) <= 1 for s in rollout)
