"""Freshness as it is now, not as the last run saw it: how many events of a table wait in its topic
beyond the offsets committed in Delta, since when, and whether the connector still sends heartbeats.

- A table whose topic has events waiting for longer than its bound is stale: the pipeline stalled
  (no run, or runs that fail), whatever the last materialization recorded.
- A table with nothing waiting is in step with its topic. Whether the topic is in step with the
  source is the connector's heartbeat topic's to tell (``__debezium-heartbeat.<topic.prefix>``, when
  the connector has ``heartbeat.interval.ms`` > 0): a recent heartbeat means the source is quiet, an
  old one that the connector stopped.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from cdc_assets.core.envelope import json_payload
from cdc_assets.io.avro import SchemaRegistryUnavailableError
from cdc_assets.io.kafka_source import LIBRDKAFKA_LOGGER, RAW_SCHEMA, Decode, SourceError

HEARTBEAT_TOPIC_PREFIX = "__debezium-heartbeat."
_LATEST = -1  # ListOffsets' timestamp for a partition's end (its high watermark)


@dataclass(frozen=True)
class TableFreshness:
    """A table's topic against the offsets its Delta table has applied, at ``checked_at``."""

    topic: str
    events_waiting: int
    waiting_since: datetime | None  # Kafka time of the oldest record not yet applied
    newest_source_time: datetime | None  # ``source.ts_ms`` of the newest record not yet applied
    checked_at: datetime

    @property
    def behind_s(self) -> float:
        """How long the oldest waiting event has waited (0 when nothing waits)."""
        if self.waiting_since is None:
            return 0.0
        return max(0.0, (self.checked_at - self.waiting_since).total_seconds())


def _record_at(consumer: Consumer, topic: str, partition: int, offset: int, timeout_s: float) -> Message | None:
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        for _ in range(3):  # an empty answer may come before the fetch does
            message = consumer.poll(timeout_s)
            if message is not None and message.error() is None:
                return message
        return None
    finally:
        consumer.unassign()  # no fetch left waiting at the partition's end ahead of the next request


def _kafka_time(message: Message | None) -> datetime | None:
    if message is None:
        return None
    _, millis = message.timestamp()
    return datetime.fromtimestamp(millis / 1000, timezone.utc) if millis and millis > 0 else None


def _source_time(message: Message | None, decode: Decode | None) -> datetime | None:
    """``source.ts_ms`` of a change event (wrapped or not; read through the connector's record format's
    ``decode``); None for a tombstone or an unreadable value."""
    value = message.value() if message is not None else None
    if message is None or value is None:
        return None
    if decode is not None:
        record = pa.table([[message.partition()], [message.offset()], [message.key()], [value]], schema=RAW_SCHEMA)
        try:
            value = decode(str(message.topic()), record)["value"][0].as_py()
        except SchemaRegistryUnavailableError:
            return None  # the source time is a detail of the check; the batch reports the registry
    try:
        payload = json_payload(value)
        millis = payload["source"]["ts_ms"] if isinstance(payload, dict) else None
        return datetime.fromtimestamp(int(millis) / 1000, timezone.utc) if millis is not None else None
    except (ValueError, TypeError, KeyError):
        return None


class TopicProbe:
    """One Kafka consumer that looks at many topics as they are now (watermarks, single records), for
    the freshness checks, the events-waiting sensor and the backfill sensor. One client serves every
    table of a check run or sensor tick: a new one per table cost a connection and a metadata round
    trip (38-55 ms a caught-up table against 2 ms), and each record it read waited behind its previous
    fetch (2 s a table with events waiting, against 48 ms). Close it (or use it as a context manager)."""

    def __init__(self, settings: Mapping[str, object], timeout_s: float = 10.0):
        self._settings = settings
        self._timeout_s = timeout_s
        self._heartbeats: dict[str, datetime | None] = {}

    @functools.cached_property
    def _consumer(self) -> Consumer:
        """Made at the first look: a backfill tick with no empty table looks at no topic."""
        # A fetch at a partition's end waits at most 10 ms: the next table's requests queue behind it.
        return Consumer({"fetch.wait.max.ms": 10, "logger": LIBRDKAFKA_LOGGER, **self._settings,
                         "enable.auto.commit": False,
                         "enable.partition.eof": False})

    def __enter__(self) -> TopicProbe:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the consumer, if one was made."""
        if "_consumer" in self.__dict__:
            self._consumer.close()

    def _partitions(self, topic: str) -> list[int]:
        metadata = self._consumer.list_topics(topic, timeout=self._timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            reason = metadata.error if metadata is not None else "not in metadata"
            raise SourceError(f"topic '{topic}' does not exist ({reason})")
        return sorted(metadata.partitions)

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self._timeout_s)
        return low, high

    def end_offsets(self, topics: Iterable[str]) -> dict[str, dict[int, int]]:
        """Each of ``topics``' high watermarks per partition, from one metadata request and one offsets request
        per broker for them all (a request per partition cost a round trip each: seconds at thousands of
        tables). A topic that does not exist is left out."""
        wanted = set(topics)
        try:
            metadata = self._consumer.list_topics(timeout=self._timeout_s).topics
            partitions = [TopicPartition(topic, partition, _LATEST) for topic in sorted(wanted)
                          if (found := metadata.get(topic)) is not None and found.error is None
                          for partition in sorted(found.partitions)]
            answered = self._consumer.offsets_for_times(partitions, timeout=self._timeout_s) if partitions else []
        except KafkaException as exc:
            raise SourceError(f"cannot read the end offsets of {len(wanted)} topics: {exc}") from exc
        ends: dict[str, dict[int, int]] = {}
        for answer in answered:
            if answer.error is not None:
                raise SourceError(f"cannot read the end offset of '{answer.topic}' partition {answer.partition}: "
                                  f"{answer.error}")
            ends.setdefault(answer.topic, {})[answer.partition] = answer.offset
        return ends

    def retained_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition of ``topic``: its earliest retained offset (above 0 once retention or a records
        deletion removed its start) and its high watermark. A ``SourceError`` when the topic does not exist."""
        try:
            return {partition: self._watermarks(topic, partition) for partition in self._partitions(topic)}
        except KafkaException as exc:
            raise SourceError(f"cannot read the watermarks of '{topic}': {exc}") from exc

    def table_freshness(self, topic: str, applied: Mapping[int, int] | None,
                        decode: Decode | None = None) -> TableFreshness:
        """How far ``topic`` is ahead of the ``applied`` offsets (next offset per partition, as a table's
        latest batch commit records them; None: nothing applied yet, so the whole retained topic waits);
        ``decode``: the connector's record format (``io.avro.record_decoder``), to read the newest source time."""
        try:
            waiting, oldest, newest = 0, None, None
            for partition in self._partitions(topic):
                low, high = self._watermarks(topic, partition)
                start = max(low, (applied or {}).get(partition, low))
                if start >= high:
                    continue
                waiting += high - start
                first = _kafka_time(_record_at(self._consumer, topic, partition, start, self._timeout_s))
                last = _source_time(_record_at(self._consumer, topic, partition, high - 1, self._timeout_s), decode)
                oldest = first if oldest is None or (first is not None and first < oldest) else oldest
                newest = last if newest is None or (last is not None and last > newest) else newest
            return TableFreshness(topic, waiting, oldest, newest, datetime.now(timezone.utc))
        except KafkaException as exc:
            raise SourceError(f"cannot read the watermarks of '{topic}': {exc}") from exc

    def last_heartbeat(self, topic_prefix: str) -> datetime | None:
        """When the connector's newest heartbeat reached Kafka (None: it has sent none); looked up once
        per connector in the probe's life (its tables share it)."""
        if topic_prefix not in self._heartbeats:
            self._heartbeats[topic_prefix] = self._newest_heartbeat(HEARTBEAT_TOPIC_PREFIX + topic_prefix)
        return self._heartbeats[topic_prefix]

    def _newest_heartbeat(self, topic: str) -> datetime | None:
        try:
            try:
                partitions = self._partitions(topic)
            except SourceError:
                return None
            times = []
            for partition in partitions:
                low, high = self._watermarks(topic, partition)
                if high > low:
                    times.append(_kafka_time(_record_at(self._consumer, topic, partition, high - 1, self._timeout_s)))
            return max((t for t in times if t is not None), default=None)
        except KafkaException as exc:
            raise SourceError(f"cannot read the heartbeat topic '{topic}': {exc}") from exc


@dataclass(frozen=True)
class FreshnessVerdict:
    """Whether a table is fresh now, and why not."""

    passed: bool
    reason: str


def freshness_verdict(freshness: TableFreshness, max_behind_s: float, heartbeat_at: datetime | None = None,
                      max_heartbeat_age_s: float | None = None) -> FreshnessVerdict:
    """Stale when an event has waited in the topic longer than ``max_behind_s`` (the pipeline is
    stalled); else, for a connector that sends heartbeats (``max_heartbeat_age_s``), stale when its
    newest heartbeat is older than that (the connector stopped); else fresh (a quiet source)."""
    if freshness.behind_s > max_behind_s:
        return FreshnessVerdict(False, f"{freshness.events_waiting} events of {freshness.topic} wait to be applied, "
                                       f"the oldest for {freshness.behind_s:.0f}s (bound {max_behind_s:.0f}s): "
                                       "the pipeline is stalled")
    if max_heartbeat_age_s is not None:
        if heartbeat_at is None:
            return FreshnessVerdict(False, "the connector has sent no heartbeat: is it running, with "
                                           "heartbeat.interval.ms > 0?")
        age = (freshness.checked_at - heartbeat_at).total_seconds()
        if age > max_heartbeat_age_s:
            return FreshnessVerdict(False, f"the connector's newest heartbeat is {age:.0f}s old (bound "
                                           f"{max_heartbeat_age_s:.0f}s): the connector has stopped")
    if freshness.events_waiting:
        return FreshnessVerdict(True, f"{freshness.events_waiting} events wait, the oldest for "
                                      f"{freshness.behind_s:.0f}s")
    quiet = "the connector is alive, the source is quiet" if max_heartbeat_age_s is not None else "caught up"
    return FreshnessVerdict(True, f"nothing waits: {quiet}")
