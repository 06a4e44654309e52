"""The Kafka source: bounded reads of one topic from given offsets, with confluent-kafka.

The consumer is used with ``assign`` + ``seek`` and never auto-commits: the offsets that count
are the ones committed with the data into Delta. A batch ends at the high watermarks seen when it
starts, or earlier at the record/byte bounds, so a run never chases a moving end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

T = TypeVar("T")
RAW_SCHEMA = pa.schema(
    [("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary())]
)
# Messages per consume call: the call holds the GIL while it makes them, and a batch read ahead must
# not keep the thread applying the current batch waiting (W1: 10,000 took 15% longer end to end).
_CONSUME_CHUNK = 2_000
# The local broker may answer with a whole backlog at once: accept large responses, bound batches here.
_CONSUMER_DEFAULTS = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "receive.message.max.bytes": 1_000_000_000,
    "fetch.max.bytes": 52_428_800,
    "partition.assignment.strategy": "range",
}


class SourceError(RuntimeError):
    """The topic cannot be read as asked; the message names broker, topic and partition."""


@dataclass(frozen=True)
class RawBatch:
    """Records of one topic, as read: Kafka coordinates and raw bytes (tombstones included)."""

    topic: str
    records: pa.Table
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    high_watermarks: dict[int, int]
    bytes_read: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def caught_up(self) -> bool:
        """Whether the batch reached the high watermark of every partition."""
        return all(self.end_offsets[p] >= high for p, high in self.high_watermarks.items())


class KafkaSource:
    """Reads bounded batches of topics with one consumer (reused across tables of a run)."""

    def __init__(self, settings: Mapping[str, object], retries: int = 3, backoff_s: float = 1.0):
        """``retries``: how often a failed metadata or watermark request is tried again, with
        exponential backoff from ``backoff_s``, before the batch fails naming broker and topic."""
        self._settings = {**_CONSUMER_DEFAULTS, **settings}
        self._consumer: Consumer | None = None
        self._retries, self._backoff_s = retries, backoff_s
        self._assigned_at: dict[int, int] = {}
        self._reader: ThreadPoolExecutor | None = None
        # The batch being read ahead: what was asked for (topic, start offsets, limits) and its read.
        self._ahead: tuple[tuple, Future[RawBatch]] | None = None

    def _retrying(self, action: Callable[[], T], what: str) -> T:
        """Run ``action``, retrying Kafka errors and timeouts; then a clear ``SourceError``."""
        attempts = self._retries + 1
        for attempt in range(attempts):
            try:
                return action()
            except (KafkaException, SourceError) as exc:
                if attempt + 1 == attempts:
                    raise SourceError(f"{what} on Kafka at {self.bootstrap_servers} failed after {attempts} "
                                      f"attempt(s): {exc}") from exc
                time.sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    @property
    def bootstrap_servers(self) -> str:
        return str(self._settings.get("bootstrap.servers", "?"))

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(dict(self._settings))
        return self._consumer

    def topics(self, timeout_s: float = 10.0) -> list[str]:
        """Names of the broker's topics."""
        self._settle()
        try:
            return sorted(self._client().list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            raise SourceError(f"cannot list topics on Kafka at {self.bootstrap_servers}: {exc}") from exc

    def partitions(self, topic: str, timeout_s: float = 5.0) -> list[int]:
        """The topic's partition ids; a clear error when the topic does not exist."""
        self._settle()
        return self._partitions(topic, timeout_s)

    def _partitions(self, topic: str, timeout_s: float = 5.0) -> list[int]:
        def fetch() -> list[int]:
            metadata = self._client().list_topics(topic, timeout=timeout_s)
            topic_metadata = metadata.topics.get(topic)
            if topic_metadata is None or topic_metadata.error is not None or not topic_metadata.partitions:
                reason = topic_metadata.error if topic_metadata is not None else "not in metadata"
                raise SourceError(f"topic '{topic}' does not exist on {self.bootstrap_servers} ({reason})")
            return sorted(topic_metadata.partitions)

        return self._retrying(fetch, f"reading metadata of topic '{topic}'")

    def read_batch(
        self,
        topic: str,
        start_offsets: Mapping[int, int] | None,
        max_records: int,
        max_bytes: int,
        poll_timeout_s: float = 30.0,
        read_ahead: bool = False,
    ) -> RawBatch:
        """Read ``topic`` from ``start_offsets`` (absent partitions: earliest) to the high watermarks.

        Stops early at ``max_records`` records or ``max_bytes`` of keys and values; each partition's
        records are a contiguous run from its start offset.

        ``read_ahead``: when the batch stops short of the high watermarks, the next one (from its end
        offsets, same bounds) is read in the background while the caller applies this one, and the
        next call that asks for exactly it takes it. Any other use of the source waits for it first
        (the consumer has one user at a time) and reads anew.
        """
        request = (topic, dict(start_offsets) if start_offsets else None, max_records, max_bytes)
        batch = self._take_ahead(request)
        if batch is None:
            batch = self._read(topic, start_offsets, max_records, max_bytes, poll_timeout_s)
        if read_ahead and not batch.caught_up:
            following = (topic, dict(batch.end_offsets), max_records, max_bytes)
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-read-ahead")
            self._ahead = (following, self._reader.submit(self._read, topic, batch.end_offsets, max_records,
                                                          max_bytes, poll_timeout_s))
        return batch

    def _take_ahead(self, request: tuple) -> RawBatch | None:
        """The batch read ahead, if it is the one asked for. Its timings: what the caller waited
        (``consume_s``) and what the read took in the background (``read_ahead_s``)."""
        started = time.perf_counter()
        asked, batch = self._settle()
        if batch is None or asked != request:
            return None
        waited = time.perf_counter() - started
        return replace(batch, timings={"consume_s": waited, "read_ahead_s": sum(batch.timings.values())})

    def _settle(self) -> tuple[tuple | None, RawBatch | None]:
        """Wait for a read ahead and drop it, the caller using the consumer next: what it was asked
        for and what it read (None when there was none, or it failed: read again in the foreground,
        which raises the error to the caller)."""
        if self._ahead is None:
            return None, None
        (asked, read), self._ahead = self._ahead, None
        try:
            return asked, read.result()
        except Exception:
            return asked, None

    def _read(self, topic: str, start_offsets: Mapping[int, int] | None, max_records: int, max_bytes: int,
              poll_timeout_s: float) -> RawBatch:
        started = time.perf_counter()
        consumer = self._client()
        partitions = self._partitions(topic)
        start: dict[int, int] = {}
        high: dict[int, int] = {}
        for partition in partitions:
            low, high[partition] = self._retrying(
                lambda p=partition: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=poll_timeout_s),
                f"reading watermarks of {topic}[{partition}]")
            committed = (start_offsets or {}).get(partition)
            if committed is not None and committed < low:
                raise SourceError(
                    f"{topic}[{partition}]: committed offset {committed} is below the earliest retained "
                    f"offset {low}: events were deleted by retention before they were applied")
            if committed is not None and committed > high[partition]:
                raise SourceError(
                    f"{topic}[{partition}]: committed offset {committed} is beyond the high watermark "
                    f"{high[partition]}: the topic was recreated or truncated; resetting the table is an "
                    "operator's decision")
            start[partition] = committed if committed is not None else low
        pending = {p for p in partitions if start[p] < high[p]}
        end = dict(start)
        columns: dict[str, list] = {"partition": [], "offset": [], "key": [], "value": []}
        size = 0
        if pending:
            self._position_at(consumer, topic, partitions, start)
            try:
                size = self._consume(consumer, topic, pending, end, high, columns, max_records, max_bytes,
                                     poll_timeout_s)
            except BaseException:
                consumer.unassign()
                raise
            # A fetch at the end of a partition is a long poll the broker serves over and over while the
            # batch is applied (the local broker spends a core on it): stop fetching caught-up partitions
            # until the next batch. At most records past this batch's end are dropped, to be fetched again.
            consumer.pause([TopicPartition(topic, p) for p in partitions if end[p] >= high[p]])
        consumed = time.perf_counter()
        records = pa.table(
            {
                "partition": pa.array(columns["partition"], pa.int32()),
                "offset": pa.array(columns["offset"], pa.int64()),
                "key": pa.array(columns["key"], pa.binary()),
                "value": pa.array(columns["value"], pa.binary()),
            },
            schema=RAW_SCHEMA,
        )
        return RawBatch(
            topic=topic,
            records=records,
            start_offsets=start,
            end_offsets=end,
            high_watermarks=high,
            bytes_read=size,
            timings={"consume_s": consumed - started, "to_arrow_s": time.perf_counter() - consumed},
        )

    def _position_at(self, consumer: Consumer, topic: str, partitions: list[int], start: Mapping[int, int]) -> None:
        """Make the consumer hand out each partition's records from ``start``.

        The assignment is kept between batches: when the previous batch of this topic ended exactly
        where this one starts, the records librdkafka already fetched are used instead of fetched
        again (a broker may answer one fetch with the whole backlog). Otherwise: assign anew.
        """
        continues = False
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        if assigned == {(topic, p) for p in partitions}:
            positions = consumer.position([TopicPartition(topic, p) for p in partitions])
            # No record handed out yet since the assignment: the position is unknown (negative).
            continues = all((tp.offset if tp.offset >= 0 else self._assigned_at.get(tp.partition))
                            == start[tp.partition] for tp in positions)
        if not continues:
            consumer.assign([TopicPartition(topic, p, start[p]) for p in partitions])
            self._assigned_at = dict(start)
        consumer.resume([TopicPartition(topic, p) for p in partitions])  # the last batch paused caught-up ones

    def _consume(self, consumer: Consumer, topic: str, pending: set[int], end: dict[int, int],
                 high: dict[int, int], columns: dict[str, list], max_records: int, max_bytes: int,
                 poll_timeout_s: float) -> int:
        partitions, offsets, keys, values = (columns["partition"], columns["offset"], columns["key"],
                                             columns["value"])
        size = 0
        last_progress = time.monotonic()
        while pending and len(offsets) < max_records and size < max_bytes:
            # Never ask for more than the partitions still hold up to their high watermarks: consume
            # returns once it has as many messages as asked, or waits out its whole timeout.
            remaining = sum(high[p] - end[p] for p in pending)
            messages = consumer.consume(min(_CONSUME_CHUNK, max_records - len(offsets), remaining), timeout=1.0)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SourceError(f"{topic}[{message.partition()}]: error while consuming from "
                                      f"{self.bootstrap_servers}: {error}")
                partition, offset = message.partition(), message.offset()
                if partition not in pending or offset >= high[partition]:
                    continue
                key, value = message.key(), message.value()
                partitions.append(partition)
                offsets.append(offset)
                keys.append(key)
                values.append(value)
                end[partition] = offset + 1
                size += (len(key) if key else 0) + (len(value) if value else 0)
                if end[partition] >= high[partition]:
                    pending.discard(partition)
                if len(offsets) >= max_records or size >= max_bytes:
                    break
            if messages:
                last_progress = time.monotonic()
            # Transaction markers and compacted-away records occupy offsets no message shows.
            for position in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
                if position.offset >= high[position.partition]:
                    end[position.partition] = high[position.partition]
                    pending.discard(position.partition)
            if pending and time.monotonic() - last_progress > poll_timeout_s:
                stuck = {p: end[p] for p in sorted(pending)}
                raise SourceError(
                    f"topic '{topic}' on {self.bootstrap_servers}: no records for {poll_timeout_s:.0f}s while "
                    f"partitions {stuck} (next offset) are below their high watermarks "
                    f"{ {p: high[p] for p in sorted(pending)} }")
        return size

    def commit_group_offsets(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Record applied offsets in the consumer group too, so Kafka tools show the lag.

        Informational only: the offsets that count live in the Delta commit. Called once per run, not
        per batch: an offset commit is a write the broker persists (the local one spends seconds of
        CPU on each).
        """
        self._settle()
        if offsets:
            self._client().commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                                  asynchronous=False)

    def close(self) -> None:
        """Close the consumer (leaves no group membership behind)."""
        self._settle()
        if self._reader is not None:
            self._reader.shutdown()
            self._reader = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
