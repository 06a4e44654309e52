"""The Kafka source: bounded reads of one topic from given offsets, with confluent-kafka.

The consumer is assigned partitions at given offsets and never auto-commits: the offsets that count
are the ones committed with the data into Delta. A batch ends at the high watermarks seen when it
starts, or earlier at the record/byte bounds, so a run never chases a moving end.

Partitions are read in turn: only the partition whose turn it is is assigned and fetches (with the
next one, near the turn's end). What the client holds fetched is then one partition's share, even
from a broker that answers a fetch with each partition's whole backlog (the local broker ignores
fetch size limits). A turn ends when its partition reaches the high watermark seen when the turn
began, so a partition that keeps receiving records cannot keep the others waiting.
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
    records_read: int  # tombstones included; kept when the records are let go (``without_records``)
    bytes_read: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def caught_up(self) -> bool:
        """Whether the batch reached the high watermark of every partition."""
        return all(self.end_offsets[p] >= high for p, high in self.high_watermarks.items())

    def without_records(self) -> RawBatch:
        """The batch's coordinates and counts, its records let go: a run keeps what each of its
        batches read, and must not keep the records of every batch while it drains a backlog."""
        return replace(self, records=self.records.schema.empty_table())


class KafkaSource:
    """Reads bounded batches of topics with one consumer (reused across tables of a run)."""

    def __init__(self, settings: Mapping[str, object], retries: int = 3, backoff_s: float = 1.0):
        """``retries``: how often a failed metadata or watermark request is tried again, with
        exponential backoff from ``backoff_s``, before the batch fails naming broker and topic."""
        self._settings = {**_CONSUMER_DEFAULTS, **settings}
        self._consumer: Consumer | None = None
        self._retries, self._backoff_s = retries, backoff_s
        # The partitions assigned (fetching), each with the offset it was assigned at.
        self._assigned_at: dict[int, int] = {}
        # The partition being read in turn: (topic, partition, offset its turn ends at; -1: over).
        self._turn: tuple[str, int, int] | None = None
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
        pending = [p for p in partitions if start[p] < high[p]]
        end = dict(start)
        chunks: list[pa.RecordBatch] = []
        size = 0
        if pending:
            self._position_at(consumer, topic, start)
            try:
                size = self._consume(consumer, topic, self._turn_order(topic, pending, start), end, high, chunks,
                                     max_records, max_bytes, poll_timeout_s)
            except BaseException:
                self._unassign(consumer, topic, list(self._assigned_at))
                raise
        consumed = time.perf_counter()
        records = pa.Table.from_batches(chunks, schema=RAW_SCHEMA)
        return RawBatch(
            topic=topic,
            records=records,
            start_offsets=start,
            end_offsets=end,
            high_watermarks=high,
            records_read=records.num_rows,
            bytes_read=size,
            timings={"consume_s": consumed - started, "to_arrow_s": time.perf_counter() - consumed},
        )

    def _position_at(self, consumer: Consumer, topic: str, start: Mapping[int, int]) -> None:
        """Make the consumer hand out each partition's records from ``start``; a partition is assigned,
        and fetches, only from its turn (``_fetch_only``).

        What is assigned is kept between batches when it continues exactly where this batch starts:
        the records librdkafka already fetched are used instead of fetched again (a broker may answer
        one fetch with the whole backlog). Otherwise nothing stays assigned.
        """
        assigned = consumer.assignment()
        if not assigned:
            return
        # No record handed out yet since the assignment: the position is unknown (negative).
        continues = all(tp.topic == topic and tp.partition in start
                        and (tp.offset if tp.offset >= 0 else self._assigned_at.get(tp.partition))
                        == start[tp.partition] for tp in consumer.position(assigned))
        if not continues:
            consumer.incremental_unassign(assigned)
            self._assigned_at.clear()

    def _unassign(self, consumer: Consumer, topic: str, partitions: list[int]) -> None:
        """Stop fetching ``partitions`` (what librdkafka fetched of them is dropped, to be fetched again)."""
        if partitions:
            consumer.incremental_unassign([TopicPartition(topic, p) for p in partitions])
            for partition in partitions:
                del self._assigned_at[partition]

    def _turn_end(self, topic: str, partition: int, high: Mapping[int, int]) -> int:
        """Where ``partition``'s turn ends (a turn begins here unless this partition's goes on)."""
        if self._turn is None or self._turn[:2] != (topic, partition) or self._turn[2] < 0:
            self._turn = (topic, partition, high[partition])
        return min(high[partition], self._turn[2])

    def _fetch_only(self, consumer: Consumer, topic: str, partitions: list[int], end: Mapping[int, int]) -> None:
        """Let ``partitions`` fetch, those not assigned yet from ``end``; no other partition is assigned.

        Assigned only at its turn, not assigned and paused: librdkafka fetches a partition as soon as
        it is assigned, and a pause comes too late for the fetch already sent. From a broker that
        answers with whole backlogs, a first batch then waited for every partition's (W1: 1.7-2.5 s
        against 0.8 s for its first 100,000 records).
        """
        self._unassign(consumer, topic, [p for p in self._assigned_at if p not in partitions])
        new = [p for p in partitions if p not in self._assigned_at]
        if new:
            consumer.incremental_assign([TopicPartition(topic, p, end[p]) for p in new])
            self._assigned_at.update({p: end[p] for p in new})

    def _turn_order(self, topic: str, pending: list[int], start: Mapping[int, int]) -> list[int]:
        """The pending partitions in the order this batch reads them: the one whose turn goes on
        first (what librdkafka fetched of it is kept), then the next ones round the partitions."""
        if self._turn is None or self._turn[0] != topic:
            return pending
        _, partition, until = self._turn
        first = partition if start.get(partition, until) < until else partition + 1
        index = next((i for i, p in enumerate(pending) if p >= first), 0)
        return pending[index:] + pending[:index]

    def _consume(self, consumer: Consumer, topic: str, order: list[int], end: dict[int, int],
                 high: Mapping[int, int], chunks: list[pa.RecordBatch], max_records: int, max_bytes: int,
                 poll_timeout_s: float) -> int:
        """Read the partitions of ``order`` in turn, each up to ``high`` (or its turn's end), until the
        bounds; the records as Arrow chunks of one consume call each. Returns the bytes read.

        The next partition in turn fetches while this batch reads the end of the current one; its
        records may come in before its turn and are taken as they come, in order, as far as the room
        the current turn leaves in the batch. Past that room it is closed for this batch: a partition
        never has a gap in its run, and never crowds out the partition in turn.
        """
        size = count = 0
        until = dict(high)  # where each partition's part of this batch ends
        room: dict[int, int] = {}  # how many records the next partition may take before its turn
        closed: set[int] = set()  # partitions with records handed out but not taken: read no further
        for index, partition in enumerate(order):
            if count >= max_records or size >= max_bytes or partition in closed:
                break
            until[partition] = self._turn_end(topic, partition, high)
            room.pop(partition, None)
            left = until[partition] - end[partition]
            if left < max_records - count and index + 1 < len(order):
                room[order[index + 1]] = max_records - count - left
                self._fetch_only(consumer, topic, order[index:index + 2], end)
            else:
                self._fetch_only(consumer, topic, [partition], end)
            last_progress = time.monotonic()
            while end[partition] < until[partition] and count < max_records and size < max_bytes:
                # Never ask for more than the partitions still hold up to their ends: consume returns
                # once it has as many messages as asked, or waits out its whole timeout.
                wanted = min(_CONSUME_CHUNK, max_records - count, sum(until[p] - end[p] for p in order[index:]))
                partitions: list[int] = []
                offsets: list[int] = []
                keys: list[bytes | None] = []
                values: list[bytes | None] = []
                took_all = True
                for message in consumer.consume(wanted, timeout=1.0):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise SourceError(f"{topic}[{message.partition()}]: error while consuming from "
                                          f"{self.bootstrap_servers}: {error}")
                    read_from, offset = message.partition(), message.offset()
                    if read_from not in end or not end[read_from] <= offset < until[read_from]:
                        continue  # past this batch's end: the next batch finds the position moved and seeks
                    if room.get(read_from, 1) <= 0:
                        until[read_from] = end[read_from]  # no room left: closed for this batch
                        closed.add(read_from)
                        continue
                    if read_from in room:
                        room[read_from] -= 1
                    key, value = message.key(), message.value()
                    partitions.append(read_from)
                    offsets.append(offset)
                    keys.append(key)
                    values.append(value)
                    end[read_from] = offset + 1
                    size += (len(key) if key else 0) + (len(value) if value else 0)
                    if count + len(offsets) >= max_records or size >= max_bytes:
                        took_all = False  # the rest of these messages is dropped, the position past them
                        break
                if offsets:
                    last_progress = time.monotonic()
                    count += len(offsets)
                    chunks.append(pa.record_batch([pa.array(partitions, pa.int32()), pa.array(offsets, pa.int64()),
                                                   pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                                                  schema=RAW_SCHEMA))
                # Transaction markers and compacted-away records occupy offsets no message shows: when
                # every record handed out was taken, a position at the turn's end means none is left.
                (position,) = consumer.position([TopicPartition(topic, partition)])
                if took_all and position.offset >= until[partition]:
                    end[partition] = max(end[partition], until[partition])
                if end[partition] < until[partition] and time.monotonic() - last_progress > poll_timeout_s:
                    raise SourceError(
                        f"topic '{topic}' on {self.bootstrap_servers}: no records for {poll_timeout_s:.0f}s while "
                        f"partition {partition} (next offset {end[partition]}) is below {until[partition]} (high "
                        f"watermark {high[partition]})")
            if end[partition] >= until[partition]:
                # The turn is over. A fetch at the end of a partition is a long poll the broker serves
                # over and over while the batch is applied (the local broker spends a core on it).
                self._unassign(consumer, topic, [partition])
                self._turn = (topic, partition, -1)
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
