"""The real Kafka broker the tests talk to: where it is, whether it answers, and
how to stop and start it (through scripts/kafka, the same script CI uses).

A test that needs Kafka and cannot reach it fails with instructions; it is
never skipped.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

ENV_VAR = "GITSCHED_TEST_KAFKA"
REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "kafka"
HOW_TO_START = (
    f"start the test broker with `scripts/kafka start` and run the tests with "
    f"{ENV_VAR}=127.0.0.1:39092 (the address it prints)"
)


def bootstrap_from_env() -> str:
    """The broker's bootstrap address from the environment, or a failed test saying how to get one."""
    address = os.environ.get(ENV_VAR, "").strip()
    if not address:
        pytest.fail(f"{ENV_VAR} is not set: this test needs a real Kafka broker; {HOW_TO_START}")
    return address


def check_broker(bootstrap: str, *, timeout_s: float = 10) -> None:
    """Fail (never skip) unless a Kafka broker answers at `bootstrap`."""
    from kafka import KafkaAdminClient  # type: ignore[import-untyped,unused-ignore]

    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap.split(","),
            client_id="gitsched-tests",
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
        )
        try:
            admin.list_topics()
        finally:
            admin.close()
    except Exception as error:
        pytest.fail(
            f"no Kafka broker answers at {bootstrap} ({ENV_VAR}): "
            f"{type(error).__name__}: {error}; {HOW_TO_START}"
        )


def unique_topic(prefix: str = "gitsched-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def admin_client(bootstrap: str) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=bootstrap.split(","),
        client_id="gitsched-tests",
        request_timeout_ms=15000,
        bootstrap_timeout_ms=15000,
    )


def create_topic(
    bootstrap: str, topic: str, *, partitions: int = 1, configs: dict[str, str] | None = None
) -> None:
    """Create a topic behind gitsched's back (to see what it makes of odd settings)."""
    admin = admin_client(bootstrap)
    try:
        admin.create_topics(
            {
                topic: {
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "configs": dict(configs or {}),
                }
            },
            wait_for_metadata=True,
        )
    finally:
        admin.close()


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Best effort: a test's topics are litter once it is done."""
    if not topics:
        return
    try:
        admin = admin_client(bootstrap)
        try:
            admin.delete_topics(topics, raise_errors=False)
        finally:
            admin.close()
    except Exception:
        pass  # the broker may be down in a failing fault test; the topics do no harm


def _script_env(bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        pytest.fail(
            f"{ENV_VAR}={bootstrap} is not a broker that scripts/kafka runs on this machine, "
            f"and this test has to stop and start it; {HOW_TO_START}"
        )
    env["GITSCHED_KAFKA_PORT"] = port
    return env


def run_script(bootstrap: str, *args: str, timeout_s: float = 150) -> str:
    """Run scripts/kafka against the broker at `bootstrap`; fail the test on error."""
    result = subprocess.run(
        [str(SCRIPT), *args],
        env=_script_env(bootstrap),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"scripts/kafka {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def broker_is_managed(bootstrap: str) -> bool:
    """Is the broker at `bootstrap` the one scripts/kafka started (so a test may restart it)?"""
    result = subprocess.run(
        [str(SCRIPT), "status"],
        env=_script_env(bootstrap),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0
