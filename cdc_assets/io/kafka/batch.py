"""What a read of a topic asks for and what it gives: a batch of raw records with their Kafka coordinates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa

RAW_SCHEMA = pa.schema(
    [("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary())]
)
# The headers Debezium puts on a primary-key change's delete (and its tombstone) and create: the records
# ``core.key_changes.key_change_cut`` must keep together (``RawBatch.key_change_halves``).
KEY_CHANGE_HEADERS = frozenset({"__debezium.newkey", "__debezium.oldkey"})


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


# Given a batch read, the end offsets its reader keeps it to (None: all of it): ``KafkaSource.read_batch``.
Cut = Callable[[RawBatch], Mapping[int, int] | None]
# Given a topic and records as read (``RAW_SCHEMA``), the records in the JSON converter's form (``io.avro``).
Decode = Callable[[str, pa.Table], pa.Table]


@dataclass(frozen=True)
class ReadRequest:
    """One batch asked of a source (``KafkaSource.read_batch``): a batch read ahead is taken when the request
    for it is equal to the one it was read for (the poll timeout aside)."""

    topic: str
    start_offsets: dict[int, int] | None  # None: every partition from its earliest retained offset
    max_records: int
    max_bytes: int
    until: dict[int, int] | None = None  # per partition, an offset the batch stops before
    decode: Decode | None = None
    poll_timeout_s: float = field(default=30.0, compare=False)

    @property
    def records_of(self) -> tuple[str, dict[int, int] | None, Decode | None]:
        """What records read for this request are, whatever its start and bounds: records read past one
        batch serve the next batch of the same records (``carry.Carry``)."""
        return self.topic, self.until, self.decode

    def from_(self, start_offsets: Mapping[int, int]) -> ReadRequest:
        """The same request from ``start_offsets`` (the batch that follows one ending there)."""
        return replace(self, start_offsets=dict(start_offsets))

    def doubled(self) -> ReadRequest:
        """The same request with its record and byte bounds doubled."""
        return replace(self, max_records=2 * self.max_records, max_bytes=2 * self.max_bytes)
