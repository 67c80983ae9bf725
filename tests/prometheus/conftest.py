"""A real Prometheus (started by scripts/prometheus) and an exporter each test controls,
for the autoscaling tests. The URL comes from GITSCHED_TEST_PROMETHEUS, which
scripts/test sets; without it, or when the server does not answer, a test fails saying
how to start one; it is never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.prometheus import Exporter, prometheus_from_env, scraped_exporter


@pytest.fixture(scope="session")
def prometheus() -> tuple[str, Path]:
    """(URL, file_sd folder) of the test server."""
    return prometheus_from_env()


@pytest.fixture
def exporter(prometheus: tuple[str, Path]) -> Iterator[tuple[Exporter, str]]:
    """An exporter the server scrapes, and the `test` label value its series carry."""
    with scraped_exporter(prometheus[1]) as scraped:
        yield scraped
