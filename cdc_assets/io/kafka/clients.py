"""What every Kafka client of the project shares: librdkafka's log lines through Python logging, the
consumer settings, and the metadata and watermark look-ups (the source's and the probe's)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition


class _Repeats(logging.Filter):
    """Lets each librdkafka log line through once per ``window_s``: a client that cannot reach its broker
    logs the same failure every few tens of milliseconds (what varies is the client's name and timings)."""

    _VARYING = re.compile(r"rdkafka#\w+-\d+|\d+ms|\d+ identical error\(s\) suppressed")

    def __init__(self, window_s: float = 300.0, remembered: int = 1000):
        super().__init__()
        self._window_s, self._remembered = window_s, remembered
        self._last: dict[tuple[int, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, self._VARYING.sub("", record.getMessage()))
        now = time.monotonic()
        if now - self._last.get(key, -self._window_s) < self._window_s:
            return False
        if len(self._last) >= self._remembered:
            self._last.clear()
        self._last[key] = now
        return True


# librdkafka's log lines go through Python logging (each distinct line once per window), never raw to stderr.
LIBRDKAFKA_LOGGER = logging.getLogger("cdc_assets.kafka.librdkafka")
LIBRDKAFKA_LOGGER.addFilter(_Repeats())
# Every consumer's defaults, which its settings may override.
CLIENT_DEFAULTS = {
    "logger": LIBRDKAFKA_LOGGER,
    # A fetch at a partition's end waits at most this long: the consumer's next request (the next table's
    # metadata, its first fetch) queues behind it on the connection. Records below the high watermark a
    # batch reads up to are answered at once whatever it is.
    "fetch.wait.max.ms": 10,
}
# The source's consumers: the offsets that count are committed with the data, so they never commit or
# store any themselves.
CONSUMER_DEFAULTS = {
    **CLIENT_DEFAULTS,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "partition.assignment.strategy": "range",
}


@dataclass(frozen=True)
class TopicLookup:
    """What the metadata says of one topic: its partitions (sorted; none when it cannot be read) and why not."""

    topic: str
    partitions: list[int]
    listed: bool  # whether the metadata names the topic at all
    error: KafkaError | None  # the metadata's error for the topic

    @property
    def unknown(self) -> bool:
        """Whether the broker does not know the topic."""
        return not self.listed or (self.error is not None and self.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)

    @property
    def readable(self) -> bool:
        return self.listed and self.error is None and bool(self.partitions)

    @property
    def reason(self) -> object:
        """Why the topic cannot be read, for a message."""
        return self.error if self.listed else "not in metadata"


def look_up(client: Consumer, topic: str, timeout_s: float) -> TopicLookup:
    """The metadata of ``topic``, from one request to ``client`` (its KafkaException raised)."""
    found = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None:
        return TopicLookup(topic, [], listed=False, error=None)
    return TopicLookup(topic, sorted(found.partitions), listed=True, error=found.error)


def watermarks(client: Consumer, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """The partition's earliest retained offset and high watermark (its KafkaException raised)."""
    low, high = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
    return low, high
