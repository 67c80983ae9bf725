"""Kafka client errors, as the log's own: what a caller can act on.

A caller of the log retries an unavailable cluster, stops on a fenced writer and
reports anything else; which Kafka error codes mean which is decided here alone,
so the reader, the writer and the topic checks all answer the same way.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, Message

from gitsched.eventlog.base import EventLogError, LogUnavailable, WriterFenced

# Errors that mean another producer with our transactional.id took over.
_FENCING_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
    }
)
# Errors that mean "the cluster cannot be reached or did not answer in time".
_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError._STATE,
    }
)


class _AppendTimeout(Exception):
    """An append ran out of its time budget at some step (named in the message)."""


def _raise_error(message: Message) -> None:
    """Raise the log's error for a message that carries a client error."""
    error = message.error()
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        raise _translate(KafkaException(error), "reading")


def _s_left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def _translate(error: BaseException, doing: str) -> EventLogError:
    """One of the log's errors for a Kafka client (or socket) error."""
    if isinstance(error, EventLogError):
        return error
    underlying = error.__cause__ or error.__context__
    if isinstance(error, SystemError) and underlying is not None:
        # confluent-kafka can leave a client error pending while it calls back into
        # Python (a delivery report after the producer was fenced): the next C call
        # there fails with a SystemError chained to it (confluent-kafka-python#865).
        return _translate(underlying, doing)
    if isinstance(error, _AppendTimeout):
        return LogUnavailable(f"{doing}: no answer from Kafka in time ({error})")
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        kafka_error: KafkaError = error.args[0]
        if kafka_error.code() in _FENCING_CODES:
            return WriterFenced(f"{doing}: another writer took over: {kafka_error.str()}")
        if (
            kafka_error.code() in _UNAVAILABLE_CODES
            or kafka_error.retriable()
            or kafka_error.txn_requires_abort()
        ):
            return LogUnavailable(f"{doing}: Kafka is unavailable: {kafka_error.str()}")
        return EventLogError(f"{doing}: {kafka_error.name()}: {kafka_error.str()}")
    if isinstance(error, OSError):
        return LogUnavailable(f"{doing}: Kafka is unavailable: {error}")
    return EventLogError(f"{doing}: {type(error).__name__}: {error}")
