"""The console over a Kafka log (the real test broker): the same pages, read through the
audit view beside the repo."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gitsched.console import console_app
from tests.support.cluster_repo import gitsched
from tests.support.console import log_url
from tests.support.kafka_broker import bootstrap_from_env, check_broker, delete_topics, unique_topic

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka_demo(demo: Path) -> Iterator[str]:
    bootstrap = bootstrap_from_env()
    check_broker(bootstrap)
    topic = unique_topic("gitsched-console")
    url = f"kafka://{bootstrap}/{topic}"
    gitsched("log", "copy", "--from", log_url(demo), "--to", url, expect=0)
    yield url
    delete_topics(bootstrap, [topic])


def test_the_pages_read_a_kafka_log(demo: Path, kafka_demo: str) -> None:
    app = console_app(demo, kafka_demo, plans=False, interval_s=0.5, first_wait_s=300.0)
    with TestClient(app) as client:
        overview = client.get("/").text
        assert "20 nodes, 85 of 144 GPUs allocated; 8 jobs, 7 running, 1 pending" in overview
        job = client.get("/jobs/vision/video-gen").text
        assert "cohort research shares 56 h100-80g GPUs" in job
        assert "Raise nlp&#39;s H100 borrowing limit to 16" in client.get("/changes").text
    assert (demo / ".gitsched" / "audit.db").exists()  # the view beside the repo, as audit's
