"""A real Kubernetes API server (etcd + kube-apiserver + kwok, started by scripts/kube), for cluster tests.

The kubeconfig comes from GITSCHED_TEST_KUBECONFIG, which scripts/test sets.
Without it, or when the server does not answer, a test fails saying how to
start one; it is never skipped. Each test has its own fake nodes (labelled with
the test's id, which the inventory selects on) and its own team namespace, so
tests share one server without seeing each other.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitsched.cluster.api import KubeApi
from tests.support.kube import (
    ENV_VAR,
    HOW_TO_START,
    KubeWorld,
)


@pytest.fixture(scope="session")
def kube_api() -> KubeApi:
    path = os.environ.get(ENV_VAR, "").strip()
    if not path:
        pytest.fail(
            f"{ENV_VAR} is not set: this test needs a real Kubernetes API server; {HOW_TO_START}"
        )
    if not Path(path).is_file():
        pytest.fail(f"{ENV_VAR}={path}: no such kubeconfig; {HOW_TO_START}")
    api = KubeApi.connect(path)
    try:
        api.core.list_namespace(_preload_content=False, _request_timeout=10)
    except Exception as e:
        pytest.fail(f"the API server in {path} does not answer ({e}); {HOW_TO_START}")
    return api


@pytest.fixture
def world(kube_api: KubeApi, tmp_path: Path) -> Iterator[KubeWorld]:
    w = KubeWorld(kube_api, tmp_path)
    try:
        yield w
    finally:
        w.close()
