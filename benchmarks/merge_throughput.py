"""Throughput of the merge path, end to end on the embedded default.

Produces N Debezium PostgreSQL events (default W1: 1,000,000 events over 100,000 keys, ~80% updates,
~10% creates, ~10% deletes each followed by a tombstone, 3 partitions) into a local broker, then
times the project's micro-batch merge from the first poll to the last committed Delta version,
and checks the table against an oracle (row count and checksum of the reference fold).

Prints events/s, per-stage seconds, Spark start-up, the consume-only ceiling (confluent-kafka with
no parsing) as a reference, and peak RSS of the whole process tree (Python + JVM).

    python benchmarks/merge_throughput.py [--events 1000000] [--keys 100000] [--batch 100000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from benchmarks.measure import PeakRss
from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.demo.broker import LocalBroker
from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget
from cdc_assets.io.kafka_source import KafkaSource
from cdc_assets.io.spark import spark_config
from cdc_assets.pipeline import merge_micro_batch

TOPIC = "bench.public.accounts"


def generate(events: int, keys: int, seed: int = 7) -> tuple[list[tuple[bytes, bytes | None]], dict[int, dict]]:
    """W1 events (with tombstones after deletes) and the reference fold: key -> final row."""
    rng = random.Random(seed)
    state: dict[int, dict] = {}
    records: list[tuple[bytes, bytes | None]] = []
    base_ts = int(time.time() * 1000) - 3_600_000
    for i in range(events):
        key = rng.randrange(keys)
        draw = rng.random()
        op = "u" if draw < 0.8 else ("c" if draw < 0.9 else "d")
        if key not in state:
            op = "c"
        elif op == "c":
            op = "u"
        row = None if op == "d" else {"id": key, "balance": rng.randrange(1_000_000), "owner": f"owner-{key}",
                                      "status": rng.choice(("open", "frozen", "closed")), "seq": i}
        source = {"version": "2.3.4.Final", "connector": "postgresql", "name": "bench", "ts_ms": base_ts + i,
                  "snapshot": "false", "db": "bench", "schema": "public", "table": "accounts",
                  "txId": 1000 + i, "lsn": 100_000_000 + 64 * i, "xmin": None}
        value = {"before": None, "after": row, "source": source, "op": op, "ts_ms": base_ts + i + 5,
                 "transaction": None}
        key_bytes = json.dumps({"id": key}).encode()
        records.append((key_bytes, json.dumps(value).encode()))
        if op == "d":
            records.append((key_bytes, None))
            state.pop(key, None)
        else:
            state[key] = row
    return records, state


def checksum(rows: list[dict]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r["id"]):
        digest.update(f"{row['id']}|{row['balance']}|{row['owner']}|{row['status']}|{row['seq']}\n".encode())
    return digest.hexdigest()[:16]


def produce(bootstrap: str, records: list[tuple[bytes, bytes | None]], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])[TOPIC].result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 1_000_000})
    for i, (key, value) in enumerate(records):
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)


def consume_only(bootstrap: str, partitions: int, total: int) -> float:
    """The broker/client ceiling: read all ``total`` records with confluent-kafka, no parsing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-consume-only",
                         "enable.auto.commit": False, "receive.message.max.bytes": 1_000_000_000})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    started, seen = time.perf_counter(), 0
    while seen < total:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100_000, help="max records per micro-batch")
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()

    records, reference = generate(args.events, args.keys)
    events = sum(1 for _, value in records if value is not None)
    print(f"W1: {events} events + {len(records) - events} tombstones over {args.keys} keys, "
          f"{args.partitions} partitions, batches of {args.batch}")
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work, LocalBroker(Path(work) / "broker") as broker:
        produce(broker.bootstrap_servers, records, args.partitions)
        len_records = len(records)
        del records
        ceiling = consume_only(broker.bootstrap_servers, args.partitions, len_records)
        with PeakRss(exclude_pid=broker.pid) as rss:
            started = time.perf_counter()
            builder = SparkSession.builder
            for key, value in spark_config().items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            spark_start = time.perf_counter() - started

            table = CapturedTable("bench", "postgresql", "bench", "public.accounts", TOPIC,
                                  DeltaTarget(str(Path(work) / "delta" / "accounts")))
            source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "bench"})
            writer = DeltaRsWriter()
            stages: dict[str, float] = defaultdict(float)
            batches = 0
            merge_started = time.perf_counter()
            while True:
                report = merge_micro_batch(spark, source, writer, table, BatchLimits(max_records=args.batch))
                batches += 1
                for stage, seconds in report.timings.items():
                    stages[stage] += seconds
                if report.raw.caught_up:
                    break
            merge_seconds = time.perf_counter() - merge_started
            source.close()
        rows = DeltaTable(table.target.path).to_pyarrow_table(columns=["id", "balance", "owner", "status",
                                                                       "seq"]).to_pylist()
        ok = len(rows) == len(reference) and checksum(rows) == checksum(list(reference.values()))
        spark.stop()

    print(f"oracle: {'OK' if ok else 'MISMATCH'} ({len(rows)} rows, expected {len(reference)})")
    print(f"consume only (ceiling): {ceiling:.1f} s, {events / ceiling:,.0f} events/s")
    print(f"spark session start: {spark_start:.1f} s")
    print(f"project merge job: {merge_seconds:.1f} s for {batches} batches, {events / merge_seconds:,.0f} events/s "
          f"({events / merge_seconds / (events / ceiling):.2f}x of the consume-only ceiling)")
    total = stages.pop("total_s", merge_seconds)
    for stage, seconds in sorted(stages.items(), key=lambda item: -item[1]):
        print(f"  {stage:<24} {seconds:7.1f} s  {100 * seconds / total:5.1f}%")
    print(f"peak RSS (python + JVM): {rss.peak / 2**30:.2f} GiB (python alone: {rss.peak_python / 2**30:.2f} GiB, "
          "which includes this benchmark's generated events)")
    if not ok:
        raise SystemExit("the merged table does not match the oracle")


if __name__ == "__main__":
    main()
