"""Real git repositories and the real `gitsched` command, for acceptance tests.

Every test builds its cluster repo with `git init` and commits made under fixed
authors and dates, then drives `python -m gitsched` in a subprocess, the way an
operator or a CI job would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_repo import (
    ANA,
    ClusterRepo,
    gitsched,
    job_yaml,
)


@pytest.fixture
def repo(tmp_path: Path) -> ClusterRepo:
    return ClusterRepo(tmp_path / "cluster")


@pytest.fixture
def bootstrapped(repo: ClusterRepo) -> ClusterRepo:
    repo.bootstrap()
    return repo


@pytest.fixture(scope="module")
def reconciled_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRepo]:
    """A cluster with two good commits and a placed job, reconciled once: copy, never modify."""
    base = ClusterRepo(tmp_path_factory.mktemp("template") / "cluster")
    base.bootstrap()
    base.write("teams/ml/jobs/train.yaml", job_yaml("train", replicas=2, topology="nvlink"))
    base.commit("ml: a 2x8 training gang", author=ANA)
    gitsched("reconcile", "--once", base.path, expect=0)
    yield base


@pytest.fixture
def reconciled(reconciled_template: ClusterRepo, tmp_path: Path) -> ClusterRepo:
    return reconciled_template.copy_to(tmp_path / "cluster")
