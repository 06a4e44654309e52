"""The Kafka source: bounded reads of one topic from given offsets, with confluent-kafka.

The consumer is assigned partitions at given offsets and never auto-commits: the offsets that count
are the ones committed with the data into Delta. A batch ends at the high watermarks seen when it
starts, or earlier at the record/byte bounds, so a run never chases a moving end.

A batch's partitions fetch together, and each partition's part of a batch ends at the high watermark
seen when the batch began: a partition that keeps receiving records cannot keep the others waiting.
librdkafka hands out what it fetched partition by partition, so a batch bounded by records or bytes
shares its bounds out among the partitions with pending records (``fetch.Fetch``): one busy partition
cannot fill a batch while the others wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc_assets.io.kafka.batch import RAW_SCHEMA, Cut, Decode, RawBatch, ReadRequest
from cdc_assets.io.kafka.carry import Carry, cut_batch, split
from cdc_assets.io.kafka.clients import CONSUMER_DEFAULTS, look_up, watermarks
from cdc_assets.io.kafka.errors import (
    DEFAULT_ADDRESS_SOURCE,
    Retrying,
    SourceError,
    UnknownTopicError,
    lost_to_retention,
)
from cdc_assets.io.kafka.fetch import Fetch
from cdc_assets.io.kafka.names import unknown_topic_message


class KafkaSource:
    """Reads bounded batches of topics, one topic at a time (a run's worker reuses it across its tables)."""

    def __init__(self, settings: Mapping[str, object], retries: int = 3, backoff_s: float = 1.0,
                 address_source: str = DEFAULT_ADDRESS_SOURCE):
        """``retries``: how often a failed metadata or watermark request is tried again, with
        exponential backoff from ``backoff_s``, before the batch fails naming broker and topic;
        ``address_source``: where the broker's address is set, for the message when none answers there."""
        self._settings = {**CONSUMER_DEFAULTS, **settings}
        self._consumer: Consumer | None = None
        self._topic: str | None = None  # what the fetching consumer last read
        # Watermarks (and metadata asked outside a read) go through a client of their own: a broker serves
        # one request of a connection at a time, so each would wait behind the fetching consumer's fetch.
        self._lookup: Consumer | None = None
        self._retrying = Retrying(self.bootstrap_servers, retries, backoff_s, address_source)
        # The partitions assigned (fetching), each with the offset it was assigned at.
        self._assigned_at: dict[int, int] = {}
        self._reader: ThreadPoolExecutor | None = None
        # The batch being read ahead: what was asked for and its read.
        self._ahead: tuple[ReadRequest, Future[RawBatch]] | None = None
        self._carry = Carry()  # the records the last batch read past its end

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
            found = look_up(client or self._metadata(), topic, timeout_s)
            if found.unknown:
                raise UnknownTopicError(unknown_topic_message(topic, client or self._metadata(), timeout_s,
                                                              self.bootstrap_servers))
            if not found.readable:
                raise SourceError(f"topic '{topic}' has no readable partitions on {self.bootstrap_servers} "
                                  f"({found.error})")
            return found.partitions

        return self._retrying(fetch, f"reading metadata of topic '{topic}'")

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
        request = ReadRequest(topic, dict(start_offsets) if start_offsets else None, max_records, max_bytes,
                              dict(until) if until else None, decode, poll_timeout_s)
        batch = self._take_ahead(request)
        if batch is None:
            batch = self._read(request)
        if cut is not None:
            batch = cut_batch(batch, request, cut, self._read, self._carry)
        if read_ahead and not batch.caught_up:
            following = request.from_(batch.end_offsets)
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-read-ahead")
            self._ahead = (following, self._reader.submit(self._read, following))
        return batch

    def _take_ahead(self, request: ReadRequest) -> RawBatch | None:
        """The batch read ahead (the records read past it carried), if it is the one asked for. Its timings:
        what the caller waited (``consume_s``) and what the read took in the background (``read_ahead_s``)."""
        started = time.perf_counter()
        batch = self._settle(taking=request)
        if batch is None:
            return None
        waited = time.perf_counter() - started
        return replace(batch, timings={"consume_s": waited, "read_ahead_s": sum(batch.timings.values())})

    def _settle(self, taking: ReadRequest | None = None) -> RawBatch | None:
        """Wait for a read ahead and drop it, the caller using the consumer next. Its batch when it was read
        for ``taking`` (the records it read past that batch stay carried); else None, and nothing carried
        (there was none, it was read for another request, or it failed: read again in the foreground, which
        raises the error to the caller)."""
        if self._ahead is None:
            return None
        (asked, read), self._ahead = self._ahead, None
        try:
            batch = read.result()
        except Exception:
            return None
        if asked != taking:
            self._carry.clear()
            return None
        return batch

    def _read(self, request: ReadRequest) -> RawBatch:
        """The batch ``request`` asks for, the records carried from the batch before taken first, within its
        bounds (not fetched again, nor decoded again: ``decode`` applies to the records fetched here); the
        records read past its bounds are carried to the next batch."""
        started = time.perf_counter()
        carried = self._carry.take(request)  # the consumer is positioned at their end offsets
        topic, decode = request.topic, request.decode
        consumer = self._client_for(topic)
        start, high = self._starts(request, consumer)
        stop = {p: min(high[p], max(start[p], (request.until or {}).get(p, high[p]))) for p in start}
        read_to = {**start, **(carried.end_offsets if carried is not None else {})}
        fetch = Fetch(consumer, topic, self.bootstrap_servers, self._assigned_at, stop, dict(start), read_to,
                      carried.records.to_batches() if carried is not None else [],
                      set(carried.key_change_halves) if carried is not None else set())
        carried_chunks = len(fetch.chunks)
        pending = [p for p in start if fetch.end[p] < stop[p]]
        size = 0
        if pending:
            self._position_at(consumer, topic, read_to, pending)
            try:
                size = fetch.run(pending, request.max_records, request.max_bytes, request.poll_timeout_s, carried)
            except BaseException:
                self._unassign_all(consumer)
                raise
        consumed = time.perf_counter()
        timings = {"consume_s": consumed - started}
        chunks = fetch.chunks
        if decode is not None and len(chunks) > carried_chunks:
            fetched = decode(topic, pa.Table.from_batches(chunks[carried_chunks:], schema=RAW_SCHEMA))
            chunks = chunks[:carried_chunks] + fetched.to_batches()
            timings["decode_s"] = time.perf_counter() - consumed
            consumed = time.perf_counter()
        records = pa.Table.from_batches(chunks, schema=RAW_SCHEMA)
        batch = RawBatch(topic=topic, records=records, start_offsets=start, end_offsets=read_to, high_watermarks=high,
                         records_read=records.num_rows, bytes_read=size,
                         timings={**timings, "to_arrow_s": time.perf_counter() - consumed},
                         key_change_halves=frozenset(fetch.halves))
        past = None
        if read_to != fetch.end:  # records read past a partition's share: the next batch's first
            batch, past = split(batch, fetch.end)
        self._carry.keep(request, past)
        if pending and batch.caught_up:
            # Nothing more to fetch for this batch, and a consumer left polling the partitions' ends would
            # make the next batch's requests (another topic's, most often) queue behind it.
            self._unassign_all(consumer)
        return batch

    def _starts(self, request: ReadRequest, consumer: Consumer) -> tuple[dict[int, int], dict[int, int]]:
        """Where the batch starts in each partition of its topic, and the high watermarks it reads up to; a
        ``SourceError`` when the offsets committed are no longer in the topic."""
        topic = request.topic
        # Asked by the fetching consumer itself: it learns the partitions' leaders from the answer. Left to
        # find them on its own, it started fetching a newly assigned topic about a second later.
        start: dict[int, int] = {}
        high: dict[int, int] = {}
        for partition in self._partitions(topic, client=consumer):
            def read(p: int = partition) -> tuple[int, int]:
                return watermarks(self._metadata(), topic, p, request.poll_timeout_s)

            low, high[partition] = self._retrying(read, f"reading watermarks of {topic}[{partition}]")
            committed = (request.start_offsets or {}).get(partition)
            lost = lost_to_retention(topic, partition, committed, low)
            if lost is not None:
                raise lost
            if committed is not None and committed > high[partition]:
                raise SourceError(
                    f"{topic}[{partition}]: committed offset {committed} is beyond the high watermark "
                    f"{high[partition]}: the topic was recreated or truncated; resetting the table is an "
                    "operator's decision")
            start[partition] = committed if committed is not None else low
        return start, high

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
