"""The log's topic: created with, and checked for, the settings a log needs.

One partition (a total order), kept forever, never compacted: a topic that is
not so would lose or reorder events silently, so opening a log refuses it.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from gitsched.eventlog.base import EventLogError, LogConfigurationError
from gitsched.eventlog.kafka.errors import _translate

PARTITION = 0
# Topic settings gitsched insists on: the log is the only source of truth.
REQUIRED_TOPIC_CONFIG = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}


def ensure_topic(config: dict[str, Any], topic: str, timeout_s: float, *, create: bool) -> None:
    """Check `topic` (creating it first if it is missing and `create`), through an
    admin client with `config`."""
    try:
        admin = AdminClient(config)
        if not _topic_exists(admin, topic, timeout_s):
            if not create:
                raise LogConfigurationError(
                    f"topic {topic} does not exist (and create_topic is off)"
                )
            _create_topic(admin, topic, timeout_s)
        _check_topic(admin, topic, timeout_s)
    except EventLogError:
        raise
    except Exception as error:
        raise _translate(error, f"checking topic {topic}") from error


def delete_topic(config: dict[str, Any], topic: str, timeout_s: float) -> None:
    try:
        admin = AdminClient(config)
        deleted = admin.delete_topics(
            [topic], operation_timeout=timeout_s, request_timeout=timeout_s
        )
        deleted[topic].result(timeout=timeout_s)
    except Exception as error:
        raise _translate(error, f"deleting topic {topic}") from error


def _metadata(admin: AdminClient, topic: str, timeout_s: float) -> Any:
    return admin.list_topics(topic=topic, timeout=timeout_s)


def _topic_exists(admin: AdminClient, topic: str, timeout_s: float) -> bool:
    described = _metadata(admin, topic, timeout_s).topics.get(topic)
    if described is None or described.error is None:
        return described is not None
    if described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return False
    raise KafkaException(described.error)


def _create_topic(admin: AdminClient, topic: str, timeout_s: float) -> None:
    brokers = len(_metadata(admin, topic, timeout_s).brokers)
    replicas = max(1, min(3, brokers))
    config = dict(REQUIRED_TOPIC_CONFIG)
    config["min.insync.replicas"] = "2" if replicas >= 3 else "1"
    created = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=replicas, config=config)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    try:
        created[topic].result(timeout=timeout_s)
    except KafkaException as error:
        # Another process may create it first; its settings are checked next either way.
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    # Metadata reaches every broker shortly after the create returns.
    deadline = time.monotonic() + timeout_s
    while not _topic_exists(admin, topic, timeout_s) and time.monotonic() < deadline:
        time.sleep(0.05)


def _check_topic(admin: AdminClient, topic: str, timeout_s: float) -> None:
    partitions = len(_metadata(admin, topic, timeout_s).topics[topic].partitions)
    if partitions != 1:
        raise LogConfigurationError(
            f"topic {topic} has {partitions} partitions: a gitsched log needs "
            f"exactly 1 (num.partitions) for a total order"
        )
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=timeout_s)
    configs = described[resource].result(timeout=timeout_s)
    for name, wanted in REQUIRED_TOPIC_CONFIG.items():
        entry = configs.get(name)
        actual = str(entry.value if entry is not None else None)
        if actual != wanted:
            raise LogConfigurationError(
                f"topic {topic} has {name}={actual}: a gitsched log needs "
                f"{name}={wanted} (events are kept forever and never compacted)"
            )
