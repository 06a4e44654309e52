"""Kafka topics for the tests: created under a unique or a given name, produced to and read back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker
from cdc_assets.demo.events import Record


def new_topic_named(broker: ApacheKafkaBroker, topic: str, partitions: int = 1) -> str:
    """Create ``topic`` under exactly that name (a connector's derived topics) and return it."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result()
    # Created is not yet readable: until the broker's metadata gives each partition a leader, a client asking for
    # watermarks gets "Local: Unknown partition".
    deadline = time.monotonic() + 30
    while True:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions and all(
                partition.leader >= 0 for partition in found.partitions.values()):
            return topic
        assert time.monotonic() < deadline, f"topic {topic} has no leader for each partition after 30 s: {found}"
        time.sleep(0.1)


def new_topic(broker: ApacheKafkaBroker, name: str, partitions: int = 1) -> str:
    """Create a uniquely named topic and return its name."""
    return new_topic_named(broker, f"{name}.{uuid.uuid4().hex[:8]}", partitions)


def produce(broker: ApacheKafkaBroker, topic: str, records: Sequence[Record], partition: int | None = None) -> None:
    """Produce (key, value) records, keyed as Debezium keys them (same key, same partition)."""
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    for key, value in records:
        if partition is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def read_topic(broker: ApacheKafkaBroker, topic: str) -> list[tuple[str, object]]:
    """Every record of partition 0 of ``topic`` up to its end, as (key text, parsed JSON value)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "signal-tests",
                         "enable.auto.commit": False})
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    while len(messages) < high:
        messages += [m for m in consumer.consume(100, timeout=2) if m.error() is None]
    consumer.close()
    return [(m.key().decode(), json.loads(m.value())) for m in messages]
