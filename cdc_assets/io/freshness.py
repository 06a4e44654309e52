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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
from confluent_kafka import KafkaException, Message

from cdc_assets.core.envelope import json_payload
from cdc_assets.io.avro import SchemaRegistryUnavailableError
from cdc_assets.io.kafka import RAW_SCHEMA, Decode, SourceError, TopicProbe

HEARTBEAT_TOPIC_PREFIX = "__debezium-heartbeat."


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


class FreshnessProbe(TopicProbe):
    """A ``TopicProbe`` that tells how fresh tables are: events waiting in their topics, and their
    connectors' heartbeats (each connector's looked up once in the probe's life: its tables share it)."""

    def __init__(self, settings: Mapping[str, object], timeout_s: float = 10.0):
        super().__init__(settings, timeout_s)
        self._heartbeats: dict[str, datetime | None] = {}

    def table_freshness(self, topic: str, applied: Mapping[int, int] | None,
                        decode: Decode | None = None) -> TableFreshness:
        """How far ``topic`` is ahead of the ``applied`` offsets (next offset per partition, as a table's
        latest batch commit records them; None: nothing applied yet, so the whole retained topic waits);
        ``decode``: the connector's record format (``io.avro.record_decoder``), to read the newest source time."""
        try:
            waiting, oldest, newest = 0, None, None
            for partition in self.partitions(topic):
                low, high = self.watermarks(topic, partition)
                start = max(low, (applied or {}).get(partition, low))
                if start >= high:
                    continue
                waiting += high - start
                first = _kafka_time(self.record_at(topic, partition, start))
                last = _source_time(self.record_at(topic, partition, high - 1), decode)
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
                partitions = self.partitions(topic)
            except SourceError:
                return None
            times = []
            for partition in partitions:
                low, high = self.watermarks(topic, partition)
                if high > low:
                    times.append(_kafka_time(self.record_at(topic, partition, high - 1)))
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
