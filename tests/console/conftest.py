"""The console's tests run against the demo cluster repo (`gitsched demo`), built once per
session and copied for each test that changes it (a commit, a reconcile)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_repo import gitsched


@pytest.fixture(scope="session")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo repo after `gitsched demo`: copy it, never change it."""
    path = tmp_path_factory.mktemp("console-demo") / "demo"
    gitsched("demo", path, expect=0)
    yield path


@pytest.fixture
def demo(demo_template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "demo"
    shutil.copytree(demo_template, copy, symlinks=True)
    # The audit view is a cache beside the log: each test builds its own.
    (copy / ".gitsched" / "audit.db").unlink(missing_ok=True)
    return copy
