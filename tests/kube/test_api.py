"""The API adapter on the real server: its calls reuse the client's connections."""

from __future__ import annotations

import os
from typing import Any

import pytest

from gitsched.cluster.api import KubeApi
from tests.support.kube import ENV_VAR, KubeWorld

pytestmark = pytest.mark.kube


def _opened(api: KubeApi) -> int:
    """Connections the client's pools have opened so far (urllib3 counts them)."""
    pools: Any = api.api_client.rest_client.pool_manager.pools
    keys = pools.keys()  # the container refuses plain iteration
    return sum(pools[key].num_connections for key in keys)


def test_writes_give_their_connection_back_so_one_is_reused(world: KubeWorld) -> None:
    # A client of its own: no informer thread holds one of its connections.
    api = KubeApi.connect(os.environ[ENV_VAR])
    world.add_node("n0")
    world.bootstrap()
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reused", "namespace": world.team, "labels": {"a": "b"}},
        "spec": {
            "schedulerName": "gitsched",
            "schedulingGates": [{"name": "gitsched.io/placement"}],
            "containers": [{"name": "main", "image": "registry.example/x:1"}],
        },
    }
    pod = api.create_pod(world.team, body)
    assert pod is not None
    opened = _opened(api)
    # Sequential writes whose replies we never decode: each used to keep its
    # connection, so every call opened (and TLS-handshook) a new one.
    for _ in range(5):
        api.remove_scheduling_gates(world.team, "reused")
    assert api.bind(world.team, "reused", pod["metadata"]["uid"], world.nodes[0])
    api.ensure_namespace(world.team)
    api.delete_pod(world.team, "reused", pod["metadata"]["uid"], 0)
    assert _opened(api) == opened
