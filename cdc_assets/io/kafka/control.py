"""Control topics: a connector's schema-change topic and transaction topic, read as a sequence of events
per partition from a cursor of offsets (the schema-change and transaction sensors, the transaction log's
ingest). A malformed event stops its partition there, the cursor kept before it; the others read on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from cdc_assets.io.kafka.batch import Decode, RawBatch
from cdc_assets.io.kafka.errors import UnknownTopicError
from cdc_assets.io.kafka.source import KafkaSource

E = TypeVar("E")


@dataclass(frozen=True)
class ControlRecord:
    """One record of a control topic, as read (its value decoded from the connector's record format)."""

    partition: int
    offset: int
    value: bytes | None
    where: str  # "<topic> partition <p> offset <o>", for the messages that name it


@dataclass
class ControlRead:
    """What one read of a control topic found. ``next_offsets``: where the next read starts in each partition
    (the batch's end, or a malformed event); ``problems``: the malformed events, each with its coordinates."""

    batch: RawBatch
    next_offsets: dict[int, int]
    problems: list[str] = field(default_factory=list)

    def records(self) -> list[ControlRecord]:
        """The records in (partition, offset) order: each partition's events in the order they happened."""
        ordered = self.batch.records.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
        return [ControlRecord(r["partition"], r["offset"], r["value"],
                              f"{self.batch.topic} partition {r['partition']} offset {r['offset']}") for r in ordered]

    def events(self, parse: Callable[[bytes | None], E], malformed: type[Exception],
               fail_as: Callable[[str], Exception] | None = None) -> Iterator[tuple[ControlRecord, E]]:
        """Each record with its event as ``parse`` reads it, in (partition, offset) order. A record ``parse``
        raises ``malformed`` for is noted in ``problems`` and stops its partition: ``next_offsets`` is kept
        before it, and the partition's later records are left for a later read. With ``fail_as``, it raises
        that error, naming the record, instead (a reader that must not read past it in any partition)."""
        stopped: set[int] = set()
        for record in self.records():
            if record.partition in stopped:
                continue
            try:
                event = parse(record.value)
            except malformed as exc:
                if fail_as is not None:
                    raise fail_as(f"{record.where}: {exc}") from exc
                self.problems.append(f"{record.where}: {exc}")
                self.next_offsets[record.partition] = record.offset
                stopped.add(record.partition)
                continue
            yield record, event


def read_control(source: KafkaSource, topic: str, offsets: Mapping[int, int] | None, max_events: int,
                 max_bytes: int = 64 * 1024 * 1024, decode: Decode | None = None) -> ControlRead:
    """The control topic's records from ``offsets`` (absent partitions: earliest), at most ``max_events`` of
    them and ``max_bytes``, read within 10 s; its ``SourceError`` when it cannot be read."""
    batch = source.read_batch(topic, offsets, max_events, max_bytes, 10, decode=decode)
    return ControlRead(batch, dict(batch.end_offsets))


def read_control_if_exists(source: KafkaSource, topic: str, offsets: Mapping[int, int] | None, max_events: int,
                           decode: Decode | None = None) -> ControlRead | None:
    """``read_control``, None when the topic does not exist (a connector that has captured nothing of the
    kind yet)."""
    try:
        return read_control(source, topic, offsets, max_events, decode=decode)
    except UnknownTopicError:
        return None
