"""One batch's fetch: its pending partitions read up to their stops, the bounds shared out among them
(``shares.Shares``), the records as Arrow chunks of one consume call each.

A partition that reached its share keeps the records it is handed out while the others take theirs, and
what a partition could not use (it reached its stop) is shared out again, kept records first. Kept records
left over start the next batch (``carry``): librdkafka's fetched-ahead records are dropped by a pause or a
seek, so only a partition that kept a whole share is paused, and only records past a stop are sought back.
A batch holds a contiguous run of each partition from its start offset, and the consumer's positions are
where the records handed out end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from cdc_assets.io.kafka.batch import KEY_CHANGE_HEADERS, RAW_SCHEMA, RawBatch
from cdc_assets.io.kafka.errors import SourceError
from cdc_assets.io.kafka.shares import Kept, Shares

# Messages per consume call: the call holds the GIL while it makes them, and a batch read ahead must
# not keep the thread applying the current batch waiting (docs/tuning.md).
_CONSUME_CHUNK = 2_000
# How long a consume call waits for the messages it asks for. Short: a partition whose stop is past a
# transaction marker waits for a message that never comes, and only the call's end shows its position past it.
_CONSUME_WAIT_S = 0.1


class Fetch:
    """The fetching of one batch by ``consumer``. ``end``: where the batch ends in each partition;
    ``fetched``: where the records in ``chunks`` end, past ``end`` in a partition read past its share (both
    updated as records come); ``halves`` gets the records with a key-change header; ``assigned_at``: the
    source's assigned partitions, each with the offset it was assigned at (a seek moves it)."""

    def __init__(self, consumer: Consumer, topic: str, bootstrap_servers: str, assigned_at: dict[int, int],
                 stop: Mapping[int, int], end: dict[int, int], fetched: dict[int, int],
                 chunks: list[pa.RecordBatch], halves: set[tuple[int, int]]):
        self._consumer, self._topic, self._servers = consumer, topic, bootstrap_servers
        self._assigned_at, self._stop = assigned_at, stop
        self.end, self.fetched, self.chunks, self.halves = end, fetched, chunks, halves
        self._paused: set[int] = set()

    def run(self, pending: list[int], max_records: int, max_bytes: int, poll_timeout_s: float,
            carried: RawBatch | None) -> int:
        """Read the ``pending`` partitions up to their stops until the bounds, the ``carried`` records (the
        first of ``chunks``) taken first. Returns the bytes of the records in ``chunks``."""
        shares = Shares(pending, max_records, max_bytes)
        kept = {p: Kept() for p in pending}
        keeping = self._keep(carried, kept)  # the partitions with kept records (asked for each record handed out)
        share = (max(1, max_records // len(pending)), max(1, max_bytes // len(pending)))
        below = list(pending)  # partitions whose batch does not reach their stop offsets yet
        last_progress = time.monotonic()
        try:
            while below and not shares.full:
                for partition in shares.active(below):
                    run = kept[partition]
                    taken_to = run.take(shares, partition)
                    if taken_to is not None:
                        self.end[partition] = taken_to
                    if not run:
                        keeping.discard(partition)
                        self.end[partition] = self.fetched[partition]
                below = [p for p in below if self.end[p] < self._stop[p]]
                fetching = [p for p in below if self.fetched[p] < self._stop[p] and len(kept[p]) < share[0]
                            and kept[p].size < share[1]]
                self._pause_all_but(fetching)
                if shares.full or not fetching:
                    continue  # full, or every partition left holds a share kept: the next round takes it
                # Never ask for more than a fetching partition may take and keep, nor than they hold up to their
                # stops: consume returns once it has as many messages as asked, or waits out its timeout.
                wanted = min(_CONSUME_CHUNK, min(shares.records_allowed(p) + share[0] - len(kept[p]) for p in fetching),
                             sum(self._stop[p] - self.fetched[p] for p in fetching))
                chunks = len(self.chunks)
                passed = self._hand_out(self._consumer.consume(wanted, timeout=_CONSUME_WAIT_S), shares, kept,
                                        keeping)
                if len(self.chunks) > chunks:
                    last_progress = time.monotonic()
                self._at_stops(below, passed, keeping)
                below = [p for p in below if self.end[p] < self._stop[p]]
                if below and time.monotonic() - last_progress > poll_timeout_s:
                    partition = below[0]
                    raise SourceError(
                        f"topic '{self._topic}' on {self._servers}: no records for {poll_timeout_s:.0f}s while "
                        f"partition {partition} (next offset {self.fetched[partition]}) is below its high watermark "
                        f"{self._stop[partition]}")
        finally:
            # Fetching again for the next batch (an assignment kept goes on where this batch's records end).
            if self._paused:
                self._consumer.resume([TopicPartition(self._topic, p) for p in self._paused])
        return shares.size + sum(run.size for run in kept.values())  # taken, and kept past the batch's end

    @staticmethod
    def _keep(carried: RawBatch | None, kept: dict[int, Kept]) -> set[int]:
        """Keep the ``carried`` records, to be taken before any fetched; the partitions they are of."""
        if carried is None:
            return set()
        records = carried.records
        sizes = pc.add(pc.fill_null(pc.binary_length(records["key"]), 0),
                       pc.fill_null(pc.binary_length(records["value"]), 0))
        keeping = set()
        for partition in pc.unique(records["partition"]).to_pylist():
            mine = pc.equal(records["partition"], partition)
            run = kept[partition]
            run.offsets = pc.filter(records["offset"], mine).to_pylist()
            run.sizes = pc.filter(sizes, mine).to_pylist()
            run.size = sum(run.sizes)
            keeping.add(partition)
        return keeping

    def _hand_out(self, messages: list[Message], shares: Shares, kept: dict[int, Kept],
                  keeping: set[int]) -> set[int]:
        """Take or keep the records of one consume call, as one chunk (none when no record came); the
        partitions handed out records past their stops."""
        partitions: list[int] = []
        offsets: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        passed: set[int] = set()  # partitions handed out records past their stops
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise SourceError(f"{self._topic}[{message.partition()}]: error while consuming from "
                                  f"{self._servers}: {error}")
            read_from, offset = message.partition(), message.offset()
            if read_from is None or offset is None or read_from not in self.fetched \
                    or message.topic() != self._topic or offset < self.fetched[read_from]:
                continue
            if offset >= self._stop[read_from]:
                passed.add(read_from)  # past the partition's stop: read again from there
                continue
            key, value, headers = message.key(), message.value(), message.headers()
            if headers and not KEY_CHANGE_HEADERS.isdisjoint(dict(headers)):
                self.halves.add((read_from, offset))
            size = (len(key) if key else 0) + (len(value) if value else 0)
            partitions.append(read_from)
            offsets.append(offset)
            keys.append(key)
            values.append(value)
            self.fetched[read_from] = offset + 1
            if read_from in keeping or not shares.takes(read_from):
                kept[read_from].add(offset, size)
                keeping.add(read_from)
            else:
                shares.took(read_from, size)
                self.end[read_from] = offset + 1
        if offsets:
            self.chunks.append(pa.record_batch([pa.array(partitions, pa.int32()), pa.array(offsets, pa.int64()),
                                                pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                                               schema=RAW_SCHEMA))
        return passed

    def _at_stops(self, below: list[int], passed: set[int], keeping: set[int]) -> None:
        """Move the partitions that have no record left below their stops there."""
        for partition in passed:
            # A record past the stop means no record is left below it (a transaction marker's offset,
            # which no message shows): the partition is read to its stop, and read again from there.
            self.fetched[partition] = self._stop[partition]
            if partition not in keeping:
                self.end[partition] = self._stop[partition]
            self._consumer.seek(TopicPartition(self._topic, partition, self._stop[partition]))
            self._assigned_at[partition] = self._stop[partition]  # unknown until it hands one out
        # Transaction markers and compacted-away records occupy offsets no message shows: when
        # every record handed out of a partition was taken, a position at its stop means none is left.
        checked = [TopicPartition(self._topic, p) for p in below if p not in passed and p not in keeping]
        for position in self._consumer.position(checked) if checked else []:
            if position.offset >= self._stop[position.partition]:
                reached = max(self.end[position.partition], self._stop[position.partition])
                self.end[position.partition] = self.fetched[position.partition] = reached

    def _pause_all_but(self, active: list[int]) -> None:
        """Pause the assigned partitions not in ``active`` (what they fetched is dropped: their records
        are handed out from their positions once resumed), resume the paused ones in it."""
        pause = [p for p in self._assigned_at if p not in active and p not in self._paused]
        resume = [p for p in active if p in self._paused]
        if pause:
            self._consumer.pause([TopicPartition(self._topic, p) for p in pause])
            self._paused.update(pause)
        if resume:
            self._consumer.resume([TopicPartition(self._topic, p) for p in resume])
            self._paused.difference_update(resume)
