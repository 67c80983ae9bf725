"""Kafka client errors become the log's own errors, whatever wraps them."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from gitsched.eventlog.base import EventLogError, LogUnavailable, WriterFenced
from gitsched.eventlog.kafka import _translate


def _system_error_over(cause: BaseException) -> SystemError:
    """What confluent-kafka's binding leaves when a Python callback runs with a client
    error still pending: a SystemError chained to that error."""
    try:
        try:
            raise cause
        except BaseException:
            raise SystemError("<method 'append' of 'list' objects> returned a result") from None
    except SystemError as wrapped:
        wrapped.__cause__ = cause
        return wrapped


def test_a_fenced_producer_reads_as_fenced_even_behind_a_system_error() -> None:
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer"))
    assert isinstance(_translate(fenced, "appending"), WriterFenced)
    translated = _translate(_system_error_over(fenced), "appending to t")
    assert isinstance(translated, WriterFenced)
    assert "another writer took over" in str(translated)


def test_other_errors_keep_their_kind_and_words() -> None:
    down = KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert isinstance(_translate(_system_error_over(down), "reading t"), LogUnavailable)
    alone = _translate(SystemError("no cause"), "reading t")
    assert type(alone) is EventLogError and "SystemError: no cause" in str(alone)
