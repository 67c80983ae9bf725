"""The production event log on Kafka, split by what each part does.

`log` is the EventLog interface; `reader` and `writer` the consumer and producer
sides it composes; `topic` the topic's settings; `errors` what Kafka's errors mean
to a caller; `clients` the settings every client shares. Callers import from here.
"""

from gitsched.eventlog.kafka.errors import _translate
from gitsched.eventlog.kafka.log import KafkaEventLog, delete_log_topic
from gitsched.eventlog.kafka.reader import KafkaReader
from gitsched.eventlog.kafka.writer import KafkaWriter

__all__ = ["KafkaEventLog", "KafkaReader", "KafkaWriter", "_translate", "delete_log_topic"]
