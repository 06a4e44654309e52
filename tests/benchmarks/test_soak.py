"""The soak's producer knows each record's offset and production time without a delivery callback: on a
real broker, every partition holds what it noted, in that order, with those timestamps."""

from __future__ import annotations

import math
import random

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.many_tables import TableEvents
from benchmarks.soak import RateProducer, high_watermarks
from cdc_assets.demo.broker import ApacheKafkaBroker


def test_the_noted_offsets_and_times_are_the_brokers(broker: ApacheKafkaBroker) -> None:
    tables = [TableEvents(900 + i, 400, 10_000, random.Random(i)) for i in range(2)]
    producer = RateProducer(broker.bootstrap_servers, rate=200, seconds=1.5, tables=tables, partitions=3)
    topics = list(producer.produced_at)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1) for t in topics]).values():
        future.result()
    producer.run()  # in this thread: produces for 1.5 s and flushes

    highs = high_watermarks(admin, topics, 3)
    producer.check_offsets(highs)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "soak-offsets",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(3)])
        seen = 0
        while seen < sum(sum(partitions.values()) for partitions in highs.values()):
            for message in consumer.consume(500, timeout=5.0):
                assert message.error() is None
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                noted = producer.produced_at[topic][partition][offset]
                if message.value() is None:
                    assert math.isnan(noted)  # a tombstone
                else:
                    assert noted == message.timestamp()[1] / 1000
                seen += 1
    finally:
        consumer.close()
    assert seen == producer.count + sum(math.isnan(t) for p in producer.produced_at.values() for a in p.values()
                                        for t in a)

    highs[topics[0]][0] += 1  # one record more on the broker than noted: the check must refuse it
    with pytest.raises(SystemExit, match="not the produced order"):
        producer.check_offsets(highs)
