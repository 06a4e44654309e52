"""The Kafka source: bounded reads of one topic from given offsets, with confluent-kafka.

The consumer is assigned partitions at given offsets and never auto-commits: the offsets that count
are the ones committed with the data into Delta. A batch ends at the high watermarks seen when it
starts, or earlier at the record/byte bounds, so a run never chases a moving end.

A batch's partitions fetch together, and each partition's part of a batch ends at the high watermark
seen when the batch began: a partition that keeps receiving records cannot keep the others waiting.
librdkafka hands out what it fetched partition by partition, so a batch bounded by records or bytes
shares its bounds out among the partitions with pending records (``_consume``): one busy partition
cannot fill a batch while the others wait.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

T = TypeVar("T")
RAW_SCHEMA = pa.schema(
    [("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary())]
)
# Messages per consume call: the call holds the GIL while it makes them, and a batch read ahead must
# not keep the thread applying the current batch waiting (docs/tuning.md).
_CONSUME_CHUNK = 2_000
# How long a consume call waits for the messages it asks for. Short: a partition whose stop is past a
# transaction marker waits for a message that never comes, and only the call's end shows its position past it.
_CONSUME_WAIT_S = 0.1
# How often a batch whose cut keeps nothing reads its topic's watermarks again while nothing more is there.
_READ_ON_WAIT_S = 0.1
# Errors of a source's first request that mean no broker is there (refused, unresolvable): not retried. A
# timeout is retried: a broker busy starting up answers late.
_UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
# The headers Debezium puts on a primary-key change's delete (and its tombstone) and create: the records
# ``core.key_changes.key_change_cut`` must keep together (``RawBatch.key_change_halves``).
KEY_CHANGE_HEADERS = frozenset({"__debezium.newkey", "__debezium.oldkey"})
# Where the address comes from, for the message that says it is wrong.
_ADDRESS_HINT = ("set the address in the pipeline config's kafka.bootstrap_servers (the demo's config reads it from "
                 "CDC_KAFKA_BOOTSTRAP_SERVERS)")


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
# The offsets that count are committed with the data: the consumer never commits or stores any itself.
_CONSUMER_DEFAULTS = {
    "logger": LIBRDKAFKA_LOGGER,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "partition.assignment.strategy": "range",
    # A fetch at a partition's end waits at most this long: the consumer's next request (the next table's
    # metadata, its first fetch) queues behind it on the connection. Records below the high watermark a
    # batch reads up to are answered at once whatever it is.
    "fetch.wait.max.ms": 10,
}


class SourceError(RuntimeError):
    """The topic cannot be read as asked; the message names broker, topic and partition."""


class UnknownTopicError(SourceError):
    """The topic does not exist on the broker (not retried); the message lists the closest topics there."""


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
    # The (partition, offset) of the records with a key-change header (``KEY_CHANGE_HEADERS``).
    key_change_halves: frozenset[tuple[int, int]] = frozenset()

    @property
    def caught_up(self) -> bool:
        """Whether the batch reached the high watermark of every partition."""
        return all(self.end_offsets[p] >= high for p, high in self.high_watermarks.items())

    def without_records(self) -> RawBatch:
        """The batch's coordinates and counts, its records let go: a run keeps what each of its
        batches read, and must not keep the records of every batch while it drains a backlog."""
        return replace(self, records=self.records.schema.empty_table())


def _continuing(end_offsets: Mapping[int, int], pieces: Sequence[RawBatch | None]) -> RawBatch | None:
    """The records read past a batch that ends at ``end_offsets``, for the next batch to start with: the
    ``pieces`` (records past a cut, records past the bounds) that continue it, each from where the one
    before ends (None: none). The next batch takes what its bounds allow of them and carries the rest on."""
    carried: RawBatch | None = None
    at = dict(end_offsets)
    for piece in pieces:
        if piece is None:
            continue
        if piece.start_offsets != at:
            break
        carried = piece if carried is None else replace(
            carried, records=pa.concat_tables([carried.records, piece.records]), end_offsets=piece.end_offsets,
            records_read=carried.records_read + piece.records_read, bytes_read=carried.bytes_read + piece.bytes_read,
            key_change_halves=carried.key_change_halves | piece.key_change_halves)
        at = dict(piece.end_offsets)
    return carried


# Given a batch read, the end offsets its reader keeps it to (None: all of it): ``KafkaSource.read_batch``.
Cut = Callable[[RawBatch], Mapping[int, int] | None]
# Given a topic and records as read (``RAW_SCHEMA``), the records in the JSON converter's form (``io.avro``).
Decode = Callable[[str, pa.Table], pa.Table]


def _split(batch: RawBatch, ends: Mapping[int, int]) -> tuple[RawBatch, RawBatch]:
    """``batch`` up to ``ends`` (each partition's offset its part stops before), and the records from there."""
    records = batch.records
    before = pc.less(records["partition"], 0)  # none
    for partition, end in ends.items():
        before = pc.or_(before, pc.and_(pc.equal(records["partition"], partition), pc.less(records["offset"], end)))
    past = pc.invert(before)
    # The records before the first one past the cut are all kept: sliced, not copied.
    first = pc.index(past, True).as_py()
    first = records.num_rows if first < 0 else first  # none past it: a cut over offsets no record holds
    kept = pa.concat_tables([records.slice(0, first), records.slice(first).filter(before.slice(first))])
    rest = records.filter(past)
    size = sum(pc.sum(pc.binary_length(kept[name])).as_py() or 0 for name in ("key", "value"))
    halves = frozenset(h for h in batch.key_change_halves if h[0] in ends and h[1] < ends[h[0]])
    return (replace(batch, records=kept, end_offsets=dict(ends), records_read=kept.num_rows, bytes_read=size,
                    key_change_halves=halves),
            replace(batch, records=rest, start_offsets=dict(ends), records_read=rest.num_rows,
                    bytes_read=batch.bytes_read - size, timings={},
                    key_change_halves=batch.key_change_halves - halves))


class _Shares:
    """A batch's record and byte bounds shared out among its partitions, in rounds: each round gives every
    partition still below its end an even part of what the batch may still take, so a partition that
    reaches its end with part of its share unused leaves it to the others in the next round."""

    def __init__(self, partitions: list[int], max_records: int, max_bytes: int):
        self.max_records, self.max_bytes = max_records, max_bytes
        self.count = self.size = 0
        self._records = dict.fromkeys(partitions, 0)
        self._bytes = dict.fromkeys(partitions, 0)
        self._record_share = dict.fromkeys(partitions, 0)
        self._byte_share = dict.fromkeys(partitions, 0)

    @property
    def full(self) -> bool:
        """Whether the batch reached a bound."""
        return self.count >= self.max_records or self.size >= self.max_bytes

    @property
    def records_left(self) -> int:
        return self.max_records - self.count

    def records_allowed(self, partition: int) -> int:
        """Records the partition may still take in this round."""
        return max(0, self._record_share[partition] - self._records[partition])

    def takes(self, partition: int) -> bool:
        """Whether the partition may take its next record (the one that crosses its byte share included)."""
        return (not self.full and self._records[partition] < self._record_share[partition]
                and self._bytes[partition] < self._byte_share[partition])

    def active(self, below: list[int]) -> list[int]:
        """The partitions of ``below`` (not at their ends) that may take records; a new round when none may."""
        taking = [p for p in below if self.takes(p)]
        if taking:
            return taking
        # The records the partitions below may hold in all, levelled: one that holds more than its even part
        # already (records carried from the batch before) takes none, the others split the rest exactly, the
        # lowest partitions taking one more: which gets the odd record does not hang on librdkafka's order.
        levelled = sorted(below)
        total = self.records_left + sum(self._records[p] for p in levelled)
        while any(self._records[p] * len(levelled) > total for p in levelled):
            over = [p for p in levelled if self._records[p] * len(levelled) > total]
            total -= sum(self._records[p] for p in over)
            levelled = [p for p in levelled if p not in over]
        records, odd = divmod(total, len(levelled))
        size = -(-(self.max_bytes - self.size) // len(below))
        for partition in below:
            self._record_share[partition] = self._records[partition]
            self._byte_share[partition] = self._bytes[partition] + size
        for rank, partition in enumerate(levelled):
            self._record_share[partition] = records + (rank < odd)
        return list(below)

    def took(self, partition: int, size: int, records: int = 1) -> None:
        """Count ``records`` of ``size`` bytes in all that the partition took."""
        self.count += records
        self.size += size
        self._records[partition] += records
        self._bytes[partition] += size

    def takes_of(self, partition: int, sizes: Sequence[int]) -> int:
        """How many of the records of ``sizes``, in order, the partition may take (``takes`` for each)."""
        records = min(self.max_records - self.count, self._record_share[partition] - self._records[partition])
        room = min(self.max_bytes - self.size, self._byte_share[partition] - self._bytes[partition])
        if records <= 0 or room <= 0 or not sizes:
            return 0
        # A record is taken while the bytes taken before it stay below the room: the one crossing it too.
        before = itertools.accumulate(sizes[:min(records, len(sizes)) - 1])
        return 1 + bisect.bisect_left(list(before), room)


class _Kept:
    """A partition's records read past its share, in offset order: their offsets and sizes, from ``head``."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.head = 0
        self.size = 0

    def __len__(self) -> int:
        return len(self.offsets) - self.head

    def add(self, offset: int, size: int) -> None:
        self.offsets.append(offset)
        self.sizes.append(size)
        self.size += size

    def take(self, shares: _Shares, partition: int) -> int | None:
        """Give the partition what its share takes of these records, first first; the offset after the last
        one taken (None: none taken)."""
        count = shares.takes_of(partition, self.sizes[self.head:self.head + shares.max_records])
        if not count:
            return None
        size = sum(self.sizes[self.head:self.head + count])
        shares.took(partition, size, count)
        self.size -= size
        self.head += count
        return self.offsets[self.head - 1] + 1


class KafkaSource:
    """Reads bounded batches of topics, one topic at a time (a run's worker reuses it across its tables)."""

    def __init__(self, settings: Mapping[str, object], retries: int = 3, backoff_s: float = 1.0):
        """``retries``: how often a failed metadata or watermark request is tried again, with
        exponential backoff from ``backoff_s``, before the batch fails naming broker and topic."""
        self._settings = {**_CONSUMER_DEFAULTS, **settings}
        self._consumer: Consumer | None = None
        self._topic: str | None = None  # what the fetching consumer last read
        # Watermarks (and metadata asked outside a read) go through a client of their own: a broker serves
        # one request of a connection at a time, so each would wait behind the fetching consumer's fetch.
        self._lookup: Consumer | None = None
        self._retries, self._backoff_s = retries, backoff_s
        self._reached = False  # whether a request of this source was ever answered
        # The partitions assigned (fetching), each with the offset it was assigned at.
        self._assigned_at: dict[int, int] = {}
        self._reader: ThreadPoolExecutor | None = None
        # The batch being read ahead: what was asked for (topic, start offsets, limits) and its read.
        self._ahead: tuple[tuple, Future[tuple[RawBatch, RawBatch | None]]] | None = None
        # The records the last batch read past its end, not read ahead: (topic, bounds, decode) and the records,
        # which a read that starts where they do (the same table's next batch) takes instead of fetching them.
        self._past: tuple[tuple, RawBatch] | None = None

    def _retrying(self, action: Callable[[], T], what: str) -> T:
        """Run ``action``, retrying Kafka errors and timeouts; then a clear ``SourceError``. Not retried: an
        unknown topic, and a broker that never answered this source (a wrong address, or none running)."""
        attempts = self._retries + 1
        for attempt in range(attempts):
            try:
                result = action()
                self._reached = True
                return result
            except UnknownTopicError:
                self._reached = True
                raise
            except (KafkaException, SourceError) as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if not self._reached and error is not None and error.code() in _UNREACHABLE:
                    raise SourceError(f"cannot reach Kafka at {self.bootstrap_servers} ({what}: {error.str()}): is "
                                      f"a broker running there? If not this address, {_ADDRESS_HINT}") from exc
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

    def _client_for(self, topic: str) -> Consumer:
        """The fetching consumer for a batch of ``topic``, nothing of another topic assigned. One consumer
        serves every topic a source reads: a new one per topic waited ~50 ms for its connection to the
        partitions' leader before its first fetch (more with TLS and SASL), in every table of a run."""
        if self._consumer is not None and self._topic not in (None, topic):
            self._unassign_all(self._consumer)
        self._topic = topic
        return self._client()

    def _metadata(self) -> Consumer:
        """The client for metadata and watermark requests (it never fetches)."""
        if self._lookup is None:
            self._lookup = Consumer(dict(self._settings))
        return self._lookup

    def topics(self, timeout_s: float = 10.0) -> list[str]:
        """Names of the broker's topics."""
        self._settle()
        try:
            return sorted(self._metadata().list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            raise SourceError(f"cannot list topics on Kafka at {self.bootstrap_servers}: {exc}") from exc

    def partitions(self, topic: str, timeout_s: float = 5.0) -> list[int]:
        """The topic's partition ids; a clear error when the topic does not exist."""
        self._settle()
        return self._partitions(topic, timeout_s)

    def _partitions(self, topic: str, timeout_s: float = 5.0, client: Consumer | None = None) -> list[int]:
        def fetch() -> list[int]:
            metadata = (client or self._metadata()).list_topics(topic, timeout=timeout_s)
            topic_metadata = metadata.topics.get(topic)
            if topic_metadata is None or (topic_metadata.error is not None
                                          and topic_metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise UnknownTopicError(self._unknown_topic(topic, client or self._metadata(), timeout_s))
            if topic_metadata.error is not None or not topic_metadata.partitions:
                raise SourceError(f"topic '{topic}' has no readable partitions on {self.bootstrap_servers} "
                                  f"({topic_metadata.error})")
            return sorted(topic_metadata.partitions)

        return self._retrying(fetch, f"reading metadata of topic '{topic}'")

    def _unknown_topic(self, topic: str, client: Consumer, timeout_s: float) -> str:
        """The message for a topic that does not exist: the closest topics of its prefix (its first dotted
        part: a Debezium connector's topic.prefix), else of the whole broker."""
        prefix = topic.split(".")[0]
        try:
            names = [name for name in client.list_topics(timeout=timeout_s).topics if not name.startswith("_")]
        except KafkaException:
            names = []
        mine = [name for name in names if name.split(".")[0] == prefix]
        closest = difflib.get_close_matches(topic, mine or names, n=3, cutoff=0.5)
        where = f"of prefix '{prefix}'" if mine else "on the broker"
        found = f"the closest topics {where}: {', '.join(closest)}" if closest else \
            f"no topic {where} is close to it ({len(mine or names)} topic(s) {where})"
        return f"topic '{topic}' does not exist on {self.bootstrap_servers}; {found}"

    def read_batch(
        self,
        topic: str,
        start_offsets: Mapping[int, int] | None,
        max_records: int,
        max_bytes: int,
        poll_timeout_s: float = 30.0,
        read_ahead: bool = False,
        until: Mapping[int, int] | None = None,
        cut: Cut | None = None,
        decode: Decode | None = None,
    ) -> RawBatch:
        """Read ``topic`` from ``start_offsets`` (absent partitions: earliest) to the high watermarks.

        Stops early at ``max_records`` records or ``max_bytes`` of keys and values, shared out evenly
        among the partitions with pending records (a partition with fewer leaves its part to the
        others); each partition's records are a contiguous run from its start offset. Records read past a
        partition's share are kept: the next call that reads the topic from this batch's end offsets (with
        the same ``until`` and ``decode``) starts with them instead of fetching them again.

        ``until``: per partition, an offset its part of the batch stops before (a batch that must
        leave a partition's later records out); the batch is then not caught up there.

        ``cut``: where the caller can end the batch read, per partition (None: where it ends). The
        batch returned ends there, and counts only the records it keeps; the records past the cut
        start the next batch, read ahead from the cut without fetching them again. A cut at the
        batch's start offsets keeps nothing: the batch is read on, its bounds doubled each time,
        until the cut keeps something or nothing more can be read for ``poll_timeout_s`` (then it is
        returned whole).

        ``read_ahead``: when the batch stops short of the high watermarks, the next one (from its end
        offsets, same bounds) is read in the background while the caller applies this one, and the
        next call that asks for exactly it takes it. Any other use of the source waits for it first
        (the consumer has one user at a time) and reads anew.

        ``decode``: the connector's record format (``io.avro``), applied to the records as they are read,
        before ``cut`` sees them (None: the JSON converter's records, as they are).
        """
        bounds = dict(until) if until else None
        request = (topic, dict(start_offsets) if start_offsets else None, max_records, max_bytes, bounds, decode)
        taken = self._take_ahead(request)
        if taken is None:
            taken = self._read(topic, start_offsets, max_records, max_bytes, poll_timeout_s, bounds,
                               self._carried((topic, bounds, decode), start_offsets), decode)
        batch, past = taken  # past: records read past the batch, which the next one starts with
        if cut is not None:
            batch, past = self._cut(batch, past, cut, max_records, max_bytes, poll_timeout_s, bounds, decode)
        if read_ahead and not batch.caught_up:
            following = (topic, dict(batch.end_offsets), max_records, max_bytes, bounds, decode)
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-read-ahead")
            self._ahead = (following, self._reader.submit(self._read, topic, batch.end_offsets, max_records,
                                                          max_bytes, poll_timeout_s, bounds, past, decode))
        elif past is not None:
            self._past = ((topic, bounds, decode), past)
        return batch

    def _carried(self, read: tuple, start_offsets: Mapping[int, int] | None) -> RawBatch | None:
        """The records the last batch read past its end, if a read of ``read`` (topic, bounds, decode) from
        ``start_offsets`` starts with them; let go either way."""
        held, self._past = self._past, None
        if held is None or held[0] != read or held[1].start_offsets != dict(start_offsets or {}):
            return None
        return held[1]

    def _cut(self, batch: RawBatch, past: RawBatch | None, cut: Cut, max_records: int, max_bytes: int,
             poll_timeout_s: float, until: Mapping[int, int] | None, decode: Decode | None = None
             ) -> tuple[RawBatch, RawBatch | None]:
        """``batch`` ended where ``cut`` says (``read_batch``), and the records read past it (None: none);
        ``past``: those read past ``batch`` already."""
        idle_since: float | None = None  # since when reading on has found nothing more
        while True:
            asked = cut(batch)
            ends = {p: (asked or {}).get(p, end) for p, end in batch.end_offsets.items()}
            if ends == batch.end_offsets:
                return batch, past
            if ends != batch.start_offsets:
                kept, rest = _split(batch, ends)
                return kept, _continuing(ends, (rest, past))
            if idle_since is None:
                max_records, max_bytes = 2 * max_records, 2 * max_bytes
            further, past = self._read(batch.topic, batch.start_offsets, max_records, max_bytes, poll_timeout_s,
                                       until, _continuing(batch.start_offsets, (batch, past)), decode)
            if further.end_offsets != batch.end_offsets:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= poll_timeout_s:
                return batch, past  # nothing more to read: whole
            else:
                # What the cut waits for may be a moment behind what was read (a key change's other event,
                # produced to another partition): the watermarks are read again until the poll timeout.
                time.sleep(_READ_ON_WAIT_S)
            batch = replace(further, timings={k: batch.timings.get(k, 0.0) + further.timings.get(k, 0.0)
                                              for k in {*batch.timings, *further.timings}})

    def _take_ahead(self, request: tuple) -> tuple[RawBatch, RawBatch | None] | None:
        """The batch read ahead (and the records read past it), if it is the one asked for. Its timings:
        what the caller waited (``consume_s``) and what the read took in the background (``read_ahead_s``)."""
        started = time.perf_counter()
        asked, read = self._settle()
        if read is None or asked != request:
            return None
        batch, past = read
        waited = time.perf_counter() - started
        return replace(batch, timings={"consume_s": waited, "read_ahead_s": sum(batch.timings.values())}), past

    def _settle(self) -> tuple[tuple | None, tuple[RawBatch, RawBatch | None] | None]:
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
              poll_timeout_s: float, until: Mapping[int, int] | None = None, carried: RawBatch | None = None,
              decode: Decode | None = None) -> tuple[RawBatch, RawBatch | None]:
        """The batch from ``start_offsets``, and the records read past its bounds (None: none), which the
        next batch starts with; ``carried``: records already read from those offsets (the consumer
        positioned at their end offsets), which the batch takes first, within its bounds, and does not fetch
        again (nor decode again: ``decode`` applies to the records fetched here)."""
        started = time.perf_counter()
        consumer = self._client_for(topic)
        # Asked by the fetching consumer itself: it learns the partitions' leaders from the answer. Left to
        # find them on its own, it started fetching a newly assigned topic about a second later.
        partitions = self._partitions(topic, client=consumer)
        start: dict[int, int] = {}
        high: dict[int, int] = {}
        for partition in partitions:
            def watermarks(p: int = partition) -> tuple[int, int]:
                return self._metadata().get_watermark_offsets(TopicPartition(topic, p), timeout=poll_timeout_s)

            low, high[partition] = self._retrying(watermarks, f"reading watermarks of {topic}[{partition}]")
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
        stop = {p: min(high[p], max(start[p], (until or {}).get(p, high[p]))) for p in partitions}
        end = dict(start)
        read_to = {**start, **(carried.end_offsets if carried is not None else {})}
        pending = [p for p in partitions if end[p] < stop[p]]
        chunks: list[pa.RecordBatch] = carried.records.to_batches() if carried is not None else []
        carried_chunks = len(chunks)
        halves = set(carried.key_change_halves) if carried is not None else set()
        size = 0
        if pending:
            self._position_at(consumer, topic, read_to, pending)
            try:
                size = self._consume(consumer, topic, pending, end, read_to, stop, chunks, halves, max_records,
                                     max_bytes, poll_timeout_s, carried)
            except BaseException:
                self._unassign_all(consumer)
                raise
        consumed = time.perf_counter()
        timings = {"consume_s": consumed - started}
        if decode is not None and len(chunks) > carried_chunks:
            fetched = decode(topic, pa.Table.from_batches(chunks[carried_chunks:], schema=RAW_SCHEMA))
            chunks = chunks[:carried_chunks] + fetched.to_batches()
            timings["decode_s"] = time.perf_counter() - consumed
            consumed = time.perf_counter()
        records = pa.Table.from_batches(chunks, schema=RAW_SCHEMA)
        batch = RawBatch(
            topic=topic,
            records=records,
            start_offsets=start,
            end_offsets=read_to,
            high_watermarks=high,
            records_read=records.num_rows,
            bytes_read=size,
            timings={**timings, "to_arrow_s": time.perf_counter() - consumed},
            key_change_halves=frozenset(halves),
        )
        past = None
        if read_to != end:  # records read past a partition's share: the next batch's first
            batch, past = _split(batch, end)
        if pending and batch.caught_up:
            # Nothing more to fetch for this batch, and a consumer left polling the partitions' ends would
            # make the next batch's requests (another topic's, most often) queue behind it.
            self._unassign_all(consumer)
        return batch, past

    def _position_at(self, consumer: Consumer, topic: str, start: Mapping[int, int], pending: list[int]) -> None:
        """Make the consumer hand out the ``pending`` partitions' records from ``start`` (where the batch
        goes on reading: its start offsets, or the end of the records it carries).

        What is assigned is kept between batches when it continues exactly where this batch starts:
        the records librdkafka fetched ahead are used instead of fetched again. Otherwise nothing stays
        assigned. Pending partitions not assigned yet are assigned at their start offsets.
        """
        assigned = consumer.assignment()
        if assigned:
            # No record handed out yet since the assignment: the position is unknown (negative).
            continues = all(tp.topic == topic and tp.partition in start
                            and (tp.offset if tp.offset >= 0 else self._assigned_at.get(tp.partition))
                            == start[tp.partition] for tp in consumer.position(assigned))
            if not continues:
                self._unassign_all(consumer)
        new = [p for p in pending if p not in self._assigned_at]
        if new:
            consumer.incremental_assign([TopicPartition(topic, p, start[p]) for p in new])
            self._assigned_at.update({p: start[p] for p in new})

    def _unassign_all(self, consumer: Consumer) -> None:
        """Stop fetching (what librdkafka fetched ahead is dropped, to be fetched again)."""
        assigned = consumer.assignment()
        if assigned:
            consumer.incremental_unassign(assigned)
        self._assigned_at.clear()

    def _consume(self, consumer: Consumer, topic: str, pending: list[int], end: dict[int, int],
                 fetched: dict[int, int], stop: Mapping[int, int], chunks: list[pa.RecordBatch],
                 halves: set[tuple[int, int]], max_records: int, max_bytes: int, poll_timeout_s: float,
                 carried: RawBatch | None = None) -> int:
        """Read the ``pending`` partitions up to ``stop`` until the bounds, the ``carried`` records (the first
        of ``chunks``) taken first; the records as Arrow chunks of one consume call each. ``end``: where the
        batch ends in each partition; ``fetched``: where the records in ``chunks`` end, past ``end`` in a
        partition read past its share; ``halves`` gets the records with a key-change header. Returns the
        bytes of the records in ``chunks``.

        The bounds are shared out in rounds (``_Shares``): a partition that reached its share keeps the
        records it is handed out while the others take theirs, and what a partition could not use (it
        reached ``stop``) is shared out again, kept records first. Kept records left over start the next
        batch (``_read``): librdkafka's fetched-ahead records are dropped by a pause or a seek, so only a
        partition that kept a whole share is paused, and only records past ``stop`` are sought back. A
        batch holds a contiguous run of each partition from its start offset, and the consumer's
        positions are where the records handed out end.
        """
        shares = _Shares(pending, max_records, max_bytes)
        kept = {p: _Kept() for p in pending}
        keeping: set[int] = set()  # the partitions with kept records (asked for each record handed out)
        share = (max(1, max_records // len(pending)), max(1, max_bytes // len(pending)))
        if carried is not None:
            records = carried.records
            sizes = pc.add(pc.fill_null(pc.binary_length(records["key"]), 0),
                           pc.fill_null(pc.binary_length(records["value"]), 0))
            for partition in pc.unique(records["partition"]).to_pylist():
                mine = pc.equal(records["partition"], partition)
                run = kept[partition]
                run.offsets = pc.filter(records["offset"], mine).to_pylist()
                run.sizes = pc.filter(sizes, mine).to_pylist()
                run.size = sum(run.sizes)
                keeping.add(partition)
        below = list(pending)  # partitions whose batch does not reach their stop offsets yet
        paused: set[int] = set()
        last_progress = time.monotonic()
        try:
            while below and not shares.full:
                for partition in shares.active(below):
                    run = kept[partition]
                    taken_to = run.take(shares, partition)
                    if taken_to is not None:
                        end[partition] = taken_to
                    if not run:
                        keeping.discard(partition)
                        end[partition] = fetched[partition]
                below = [p for p in below if end[p] < stop[p]]
                fetching = [p for p in below if fetched[p] < stop[p] and len(kept[p]) < share[0]
                            and kept[p].size < share[1]]
                self._pause_all_but(consumer, topic, fetching, paused)
                if shares.full or not fetching:
                    continue  # full, or every partition left holds a share kept: the next round takes it
                # Never ask for more than a fetching partition may take and keep, nor than they hold up to their
                # stops: consume returns once it has as many messages as asked, or waits out its timeout.
                wanted = min(_CONSUME_CHUNK, min(shares.records_allowed(p) + share[0] - len(kept[p]) for p in fetching),
                             sum(stop[p] - fetched[p] for p in fetching))
                partitions: list[int] = []
                offsets: list[int] = []
                keys: list[bytes | None] = []
                values: list[bytes | None] = []
                passed: set[int] = set()  # partitions handed out records past their stops
                for message in consumer.consume(wanted, timeout=_CONSUME_WAIT_S):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise SourceError(f"{topic}[{message.partition()}]: error while consuming from "
                                          f"{self.bootstrap_servers}: {error}")
                    read_from, offset = message.partition(), message.offset()
                    if read_from is None or offset is None or read_from not in fetched or message.topic() != topic \
                            or offset < fetched[read_from]:
                        continue
                    if offset >= stop[read_from]:
                        passed.add(read_from)  # past the partition's stop: read again from there
                        continue
                    key, value, headers = message.key(), message.value(), message.headers()
                    if headers and not KEY_CHANGE_HEADERS.isdisjoint(dict(headers)):
                        halves.add((read_from, offset))
                    size = (len(key) if key else 0) + (len(value) if value else 0)
                    partitions.append(read_from)
                    offsets.append(offset)
                    keys.append(key)
                    values.append(value)
                    fetched[read_from] = offset + 1
                    if read_from in keeping or not shares.takes(read_from):
                        kept[read_from].add(offset, size)
                        keeping.add(read_from)
                    else:
                        shares.took(read_from, size)
                        end[read_from] = offset + 1
                if offsets:
                    last_progress = time.monotonic()
                    chunks.append(pa.record_batch([pa.array(partitions, pa.int32()), pa.array(offsets, pa.int64()),
                                                   pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                                                  schema=RAW_SCHEMA))
                for partition in passed:
                    # A record past the stop means no record is left below it (a transaction marker's offset,
                    # which no message shows): the partition is read to its stop, and read again from there.
                    fetched[partition] = stop[partition]
                    if partition not in keeping:
                        end[partition] = stop[partition]
                    consumer.seek(TopicPartition(topic, partition, stop[partition]))
                    self._assigned_at[partition] = stop[partition]  # unknown until it hands one out
                # Transaction markers and compacted-away records occupy offsets no message shows: when
                # every record handed out of a partition was taken, a position at its stop means none is left.
                checked = [TopicPartition(topic, p) for p in below if p not in passed and p not in keeping]
                for position in consumer.position(checked) if checked else []:
                    if position.offset >= stop[position.partition]:
                        reached = max(end[position.partition], stop[position.partition])
                        end[position.partition] = fetched[position.partition] = reached
                below = [p for p in below if end[p] < stop[p]]
                if below and time.monotonic() - last_progress > poll_timeout_s:
                    partition = below[0]
                    raise SourceError(
                        f"topic '{topic}' on {self.bootstrap_servers}: no records for {poll_timeout_s:.0f}s while "
                        f"partition {partition} (next offset {fetched[partition]}) is below its high watermark "
                        f"{stop[partition]}")
        finally:
            # Fetching again for the next batch (an assignment kept goes on where this batch's records end).
            if paused:
                consumer.resume([TopicPartition(topic, p) for p in paused])
        return shares.size + sum(run.size for run in kept.values())  # taken, and kept past the batch's end

    def _pause_all_but(self, consumer: Consumer, topic: str, active: list[int], paused: set[int]) -> None:
        """Pause the assigned partitions not in ``active`` (what they fetched is dropped: their records
        are handed out from their positions once resumed), resume the paused ones in it."""
        pause = [p for p in self._assigned_at if p not in active and p not in paused]
        resume = [p for p in active if p in paused]
        if pause:
            consumer.pause([TopicPartition(topic, p) for p in pause])
            paused.update(pause)
        if resume:
            consumer.resume([TopicPartition(topic, p) for p in resume])
            paused.difference_update(resume)

    def commit_group_offsets(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Record applied offsets in the consumer group too, so Kafka tools show the lag.

        Informational only: the offsets that count live in the Delta commit, so once per run is enough.
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
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None
