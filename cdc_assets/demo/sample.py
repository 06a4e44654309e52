"""The demo's sample change events: a PostgreSQL connector (two tables, schemas disabled) and an
SQL Server connector (one table, schemas enabled) with snapshot reads, creates, updates, deletes
with tombstones and an SQL Server primary-key change; and rounds of further changes to watch flow.

``SAMPLE_TOPICS`` has fixed times (November 2023, for tests that need the same events every run);
``publish_sample`` publishes the same events as made a few minutes ago, so the demo's capture lag
is minutes, as a live connector's would be."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_assets.demo.broker import PRODUCER_SETTINGS
from cdc_assets.demo.events import Record, encode_key, envelope, lsn, postgres_source, sqlserver_source
from cdc_assets.io.kafka import LIBRDKAFKA_LOGGER

_T0 = 1_700_000_000_000
# How long before publishing the sample's snapshot is dated; its changes follow within ~2 minutes.
_SAMPLE_AGE_MS = 180_000
_ORDERS_KEY = "server1.dbo.orders.Key"


def _products(t0: int) -> list[Record]:
    rows = {101: ("scooter", 3.14), 102: ("car battery", 8.1), 103: ("12-pack drill bits", 0.8),
            104: ("hammer", 0.75), 105: ("hammer", 0.875), 106: ("hammer", 1.0), 107: ("rocks", 5.3),
            108: ("jacket", 0.1), 109: ("spare tire", 22.2)}
    records: list[Record] = []
    for i, (pid, (name, weight)) in enumerate(rows.items()):
        row = {"id": pid, "name": name, "weight": weight}
        source = postgres_source(34078720, t0 + i, "inventory", "products", snapshot="true")
        records.append((encode_key({"id": pid}), envelope("r", None, row, source, t0 + i)))
    changes = [
        ("u", 106, {"id": 106, "name": "18oz carpenter hammer", "weight": 1.0}),
        ("u", 107, {"id": 107, "name": "rocks", "weight": 5.1}),
        ("c", 110, {"id": 110, "name": "jacket", "weight": 0.2}),
        ("c", 111, {"id": 111, "name": "scooter", "weight": 5.18}),
        ("u", 110, {"id": 110, "name": "new water resistent white wind breaker", "weight": 0.5}),
        ("d", 111, None),
    ]
    for i, (op, pid, after) in enumerate(changes):
        source = postgres_source(34100000 + 1000 * i, t0 + 60_000 + i, "inventory", "products")
        records.append((encode_key({"id": pid}), envelope(op, None, after, source, t0 + 60_000 + i)))
        if op == "d":
            records.append((encode_key({"id": pid}), None))
    return records


def _customers(t0: int) -> list[Record]:
    people = {1001: ("Sally", "Thomas"), 1002: ("George", "Bailey"), 1003: ("Edward", "Walker"),
              1004: ("Anne", "Kretchmar")}
    records: list[Record] = []
    for i, (cid, (first, last)) in enumerate(people.items()):
        row = {"id": cid, "first_name": first, "last_name": last, "email": f"{first.lower()}@example.com"}
        source = postgres_source(35000000, t0 + i, "inventory", "customers", snapshot="true")
        records.append((encode_key({"id": cid}), envelope("r", None, row, source, t0 + i)))
    created = {"id": 1005, "first_name": "john", "last_name": "doe", "email": "john.doe@example.org"}
    updated = {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "noreply@example.org"}
    for i, (op, cid, after) in enumerate([("c", 1005, created), ("u", 1001, updated), ("d", 1004, None)]):
        source = postgres_source(35100000 + 1000 * i, t0 + 90_000 + i, "inventory", "customers")
        records.append((encode_key({"id": cid}), envelope(op, None, after, source, t0 + 90_000 + i)))
    records.append((encode_key({"id": 1004}), None))
    return records


def _orders(t0: int) -> list[Record]:
    name = "server1.dbo.orders.Value"
    records: list[Record] = []

    def add(op: str, key: int, before: dict | None, after: dict | None, source: dict) -> None:
        value = envelope(op, before, after, source, source["ts_ms"] + 5, with_schema=True, row_name=name)
        records.append((encode_key({"id": key}, with_schema=True, name=_ORDERS_KEY), value))

    for i, oid in enumerate((10001, 10002, 10003)):
        row = {"id": oid, "order_date": f"2026-01-0{i + 1}", "purchaser": 1001 + i, "quantity": i + 1}
        add("r", oid, None, row, sqlserver_source(None, None, None, t0 + i, "dbo", "orders", snapshot="true"))
    add("c", 10004, None, {"id": 10004, "order_date": "2026-02-01", "purchaser": 1003, "quantity": 7},
        sqlserver_source(lsn(100), lsn(99), 1, t0 + 120_000, "dbo", "orders"))
    add("u", 10001, None, {"id": 10001, "order_date": "2026-01-01", "purchaser": 1001, "quantity": 9},
        sqlserver_source(lsn(110), lsn(109), 2, t0 + 121_000, "dbo", "orders"))
    # A primary-key change: delete (serial 1) + tombstone and insert (serial 2) sharing both LSNs.
    old = {"id": 10002, "order_date": "2026-01-02", "purchaser": 1002, "quantity": 2}
    new = {**old, "id": 10005}
    add("d", 10002, old, None, sqlserver_source(lsn(120), lsn(119), 1, t0 + 122_000, "dbo", "orders"))
    records.append((encode_key({"id": 10002}, with_schema=True, name=_ORDERS_KEY), None))
    add("c", 10005, None, new, sqlserver_source(lsn(120), lsn(119), 2, t0 + 122_000, "dbo", "orders"))
    return records


def sample_topics(t0_ms: int) -> dict[str, tuple[int, list[Record]]]:
    """The sample per topic: (partitions, records), its snapshot made at ``t0_ms`` (epoch milliseconds)."""
    return {
        "dbserver1.inventory.products": (1, _products(t0_ms)),
        "dbserver1.inventory.customers": (2, _customers(t0_ms)),
        "server1.dbo.orders": (3, _orders(t0_ms)),
    }


SAMPLE_TOPICS = sample_topics(_T0)
# The demo config's signal channel (cdc_assets/demo/pipeline.yaml): made with the sample, empty, as a connector's
# signal.kafka.topic is, so that the preflight finds it and a snapshot signal has somewhere to go.
SIGNAL_TOPIC = "dbserver1.signals"


def _ensure_topics(admin: AdminClient, partitions: dict[str, int]) -> set[str]:
    """Create the topics of ``partitions`` (name: partition count) that do not exist yet; returns those
    it created."""
    futures = admin.create_topics([NewTopic(topic, num_partitions=count, replication_factor=1)
                                   for topic, count in partitions.items()])
    created = set()
    for topic, future in futures.items():
        try:
            future.result()
            created.add(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def _publish(bootstrap_servers: str, records: dict[str, list[Record]]) -> None:
    # A new broker loads its transaction coordinator at the first idempotent producer: its "load in
    # progress: retrying" warnings are expected, so only errors are logged (through Python logging).
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap_servers, "log_level": 3,
                         "logger": LIBRDKAFKA_LOGGER})
    for topic, topic_records in records.items():
        for key, value in topic_records:
            producer.produce(topic, key=key, value=value)
    left = producer.flush(30)
    producer.close()  # now, not when collected: a producer left open reconnects to a broker that stopped
    if left:
        raise RuntimeError(f"{left} sample events were not delivered to {bootstrap_servers} within 30 s")


def publish_sample(bootstrap_servers: str, now_ms: int | None = None) -> dict[str, int]:
    """Put the sample on the broker, dated a few minutes before ``now_ms`` (default: now): creates its
    topics where missing and publishes to those that are empty, so publishing it again changes nothing.
    Returns the events published per topic (0: the topic already held events)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    sample = sample_topics(now_ms - _SAMPLE_AGE_MS)
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    created = _ensure_topics(admin, {SIGNAL_TOPIC: 1,
                                     **{topic: partitions for topic, (partitions, _) in sample.items()}})
    empty = {topic: records for topic, (_, records) in sample.items()
             if topic in created or _events_in(bootstrap_servers, topic) == 0}
    _publish(bootstrap_servers, empty)
    return {topic: len(empty.get(topic, [])) for topic in sample}


def _events_in(bootstrap_servers: str, topic: str) -> int:
    """The records ``topic`` holds (sum of its partitions' high watermarks)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "cdc-assets-demo-sample"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def change_round(number: int, now_ms: int | None = None) -> dict[str, list[Record]]:
    """Round ``number`` (1, 2, ...) of changes after the sample, made at ``now_ms`` (default: now): in
    inventory.products an insert (id 200 + number), an update of 101 and a delete (+ tombstone) of the
    previous round's insert (108 in round 1); in inventory.customers an insert (id 2000 + number) and an
    update of 1001; in dbo.orders an update of 10001 and a primary-key change (10004 + number becomes
    10005 + number). Source positions grow with ``number``, so each round is newer than the last."""
    if number < 1:
        raise ValueError(f"change rounds count from 1, not {number}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    base = 50_000_000 + 10_000 * number  # PostgreSQL LSNs beyond the sample's (35,102,000 at most)

    def pg(table: str, i: int, op: str, row_id: int, after: dict | None) -> list[Record]:
        source = postgres_source(base + i, now_ms + i, "inventory", table, tx_id=1000 + number)
        event = (encode_key({"id": row_id}), envelope(op, None, after, source, now_ms + i))
        return [event, (encode_key({"id": row_id}), None)] if op == "d" else [event]

    gone = 200 + number - 1 if number > 1 else 108
    products = [*pg("products", 0, "c", 200 + number, {"id": 200 + number, "name": f"demo widget {number}",
                                                         "weight": float(number)}),
                *pg("products", 1, "u", 101, {"id": 101, "name": "scooter", "weight": 3.14 + number}),
                *pg("products", 2, "d", gone, None)]
    customers = [*pg("customers", 3, "c", 2000 + number, {"id": 2000 + number, "first_name": "Demo",
                                                           "last_name": f"User {number}",
                                                           "email": f"demo{number}@example.org"}),
                 *pg("customers", 4, "u", 1001, {"id": 1001, "first_name": "Sally", "last_name": "Thomas",
                                                 "email": f"sally+{number}@example.org"})]
    name = "server1.dbo.orders.Value"
    orders: list[Record] = []

    def order(op: str, key: int, before: dict | None, after: dict | None, counter: int, serial: int) -> None:
        source = sqlserver_source(lsn(counter), lsn(counter - 1), serial, now_ms, "dbo", "orders")
        value = envelope(op, before, after, source, now_ms + 5, with_schema=True, row_name=name)
        orders.append((encode_key({"id": key}, with_schema=True, name=_ORDERS_KEY), value))

    counter = 1000 + 10 * number  # SQL Server LSN counters beyond the sample's (120 at most)
    order("u", 10001, None, {"id": 10001, "order_date": "2026-01-01", "purchaser": 1001, "quantity": 9 + number},
          counter, 1)
    # The sample's 10002 became 10005; each round moves that order to the next id.
    moved = 10004 + number
    old = {"id": moved, "order_date": "2026-01-02", "purchaser": 1002, "quantity": 2}
    order("d", moved, old, None, counter + 2, 1)
    orders.append((encode_key({"id": moved}, with_schema=True, name=_ORDERS_KEY), None))
    order("c", moved + 1, None, {**old, "id": moved + 1}, counter + 2, 2)
    return {"dbserver1.inventory.products": products, "dbserver1.inventory.customers": customers,
            "server1.dbo.orders": orders}


def publish_changes(bootstrap_servers: str, number: int, now_ms: int | None = None) -> dict[str, int]:
    """Publish ``change_round(number)`` (the sample must be on the broker); returns events per topic."""
    records = change_round(number, now_ms)
    _publish(bootstrap_servers, records)
    return {topic: len(topic_records) for topic, topic_records in records.items()}
