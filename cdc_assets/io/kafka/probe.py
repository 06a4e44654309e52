"""A look at many topics as they are now: partitions, watermarks, retained offsets, single records."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from typing_extensions import Self

from cdc_assets.io.kafka.clients import CLIENT_DEFAULTS, look_up, watermarks
from cdc_assets.io.kafka.errors import SourceError

_LATEST = -1  # ListOffsets' timestamp for a partition's end (its high watermark)


class TopicProbe:
    """One Kafka consumer that looks at many topics as they are now (watermarks, single records), for
    the freshness checks, the merge schedule, the topic observations and the backfill sensor. One client
    serves every table of a check run or sensor tick: a new one per table cost a connection and a metadata
    round trip (38-55 ms a caught-up table against 2 ms), and each record it read waited behind its previous
    fetch (2 s a table with events waiting, against 48 ms). Close it (or use it as a context manager)."""

    def __init__(self, settings: Mapping[str, object], timeout_s: float = 10.0):
        self._settings = settings
        self._timeout_s = timeout_s

    @functools.cached_property
    def _consumer(self) -> Consumer:
        """Made at the first look: a backfill tick with no empty table looks at no topic."""
        return Consumer({**CLIENT_DEFAULTS, **self._settings, "enable.auto.commit": False,
                         "enable.partition.eof": False})

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the consumer, if one was made."""
        if "_consumer" in self.__dict__:
            self._consumer.close()

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; a ``SourceError`` when it does not exist (its KafkaException raised)."""
        found = look_up(self._consumer, topic, self._timeout_s)
        if not found.readable:
            raise SourceError(f"topic '{topic}' does not exist ({found.reason})")
        return found.partitions

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's earliest retained offset and high watermark (its KafkaException raised)."""
        return watermarks(self._consumer, topic, partition, self._timeout_s)

    def record_at(self, topic: str, partition: int, offset: int) -> Message | None:
        """The record at ``offset`` of the partition (None: none came in three polls)."""
        self._consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            for _ in range(3):  # an empty answer may come before the fetch does
                message = self._consumer.poll(self._timeout_s)
                if message is not None and message.error() is None:
                    return message
            return None
        finally:
            self._consumer.unassign()  # no fetch left waiting at the partition's end ahead of the next request

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
            return {partition: self.watermarks(topic, partition) for partition in self.partitions(topic)}
        except KafkaException as exc:
            raise SourceError(f"cannot read the watermarks of '{topic}': {exc}") from exc
