"""The soak's producer knows each record's offset and production time without a delivery callback: on a
real broker, every partition holds what it noted, in that order, with those timestamps. Its capture lag
ends at the Delta commit that holds each event."""

from __future__ import annotations

import math
import random
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import write_deltalake

from benchmarks.many_tables import TableEvents
from benchmarks.soak import RateProducer, batch_commits, high_watermarks
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.io.delta import CommitRequest, DeltaRsWriter, DeltaTarget


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


def test_each_commit_gives_its_own_time_and_offsets(tmp_path) -> None:
    # The soak's capture lag ends at the commit that holds an event: every batch commit after the last
    # one seen, oldest first, with the time it was made.
    target = DeltaTarget(str(tmp_path / "t"))
    write_deltalake(target.path, pa.table({"id": pa.array([], pa.int64())}))
    writer = DeltaRsWriter()
    before = time.time()
    for version, offsets in enumerate(({0: 3, 1: 2}, {0: 5, 1: 2}, {0: 9, 1: 4}), start=1):
        writer.commit_progress(target, CommitRequest("app", version, "p.s.t", offsets))
        time.sleep(0.05)
    commits = batch_commits(target, "app", -1)
    assert [(v, o) for v, _, o in commits] == [(1, {0: 3, 1: 2}), (2, {0: 5, 1: 2}), (3, {0: 9, 1: 4})]
    times = [t for _, t, _ in commits]
    assert before - 1 <= times[0] < times[1] < times[2] <= time.time() + 1
    assert [v for v, _, _ in batch_commits(target, "app", 2)] == [3]
    assert batch_commits(target, "other", -1) == []
    assert batch_commits(DeltaTarget(str(tmp_path / "none")), "app", -1) == []
