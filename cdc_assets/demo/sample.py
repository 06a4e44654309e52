"""The demo's sample change events: a PostgreSQL connector (two tables, schemas disabled) and an
SQL Server connector (one table, schemas enabled) with snapshot reads, creates, updates, deletes
with tombstones and an SQL Server primary-key change."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_assets.demo.broker import PRODUCER_SETTINGS
from cdc_assets.demo.events import Record, encode_key, envelope, lsn, postgres_source, sqlserver_source

_T0 = 1_700_000_000_000


def _products() -> list[Record]:
    rows = {101: ("scooter", 3.14), 102: ("car battery", 8.1), 103: ("12-pack drill bits", 0.8),
            104: ("hammer", 0.75), 105: ("hammer", 0.875), 106: ("hammer", 1.0), 107: ("rocks", 5.3),
            108: ("jacket", 0.1), 109: ("spare tire", 22.2)}
    records: list[Record] = []
    for i, (pid, (name, weight)) in enumerate(rows.items()):
        row = {"id": pid, "name": name, "weight": weight}
        source = postgres_source(34078720, _T0 + i, "inventory", "products", snapshot="true")
        records.append((encode_key({"id": pid}), envelope("r", None, row, source, _T0 + i)))
    changes = [
        ("u", 106, {"id": 106, "name": "18oz carpenter hammer", "weight": 1.0}),
        ("u", 107, {"id": 107, "name": "rocks", "weight": 5.1}),
        ("c", 110, {"id": 110, "name": "jacket", "weight": 0.2}),
        ("c", 111, {"id": 111, "name": "scooter", "weight": 5.18}),
        ("u", 110, {"id": 110, "name": "new water resistent white wind breaker", "weight": 0.5}),
        ("d", 111, None),
    ]
    for i, (op, pid, after) in enumerate(changes):
        source = postgres_source(34100000 + 1000 * i, _T0 + 60_000 + i, "inventory", "products")
        records.append((encode_key({"id": pid}), envelope(op, None, after, source, _T0 + 60_000 + i)))
        if op == "d":
            records.append((encode_key({"id": pid}), None))
    return records


def _customers() -> list[Record]:
    people = {1001: ("Sally", "Thomas"), 1002: ("George", "Bailey"), 1003: ("Edward", "Walker"),
              1004: ("Anne", "Kretchmar")}
    records: list[Record] = []
    for i, (cid, (first, last)) in enumerate(people.items()):
        row = {"id": cid, "first_name": first, "last_name": last, "email": f"{first.lower()}@example.com"}
        source = postgres_source(35000000, _T0 + i, "inventory", "customers", snapshot="true")
        records.append((encode_key({"id": cid}), envelope("r", None, row, source, _T0 + i)))
    created = {"id": 1005, "first_name": "john", "last_name": "doe", "email": "john.doe@example.org"}
    updated = {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "noreply@example.org"}
    for i, (op, cid, after) in enumerate([("c", 1005, created), ("u", 1001, updated), ("d", 1004, None)]):
        source = postgres_source(35100000 + 1000 * i, _T0 + 90_000 + i, "inventory", "customers")
        records.append((encode_key({"id": cid}), envelope(op, None, after, source, _T0 + 90_000 + i)))
    records.append((encode_key({"id": 1004}), None))
    return records


def _orders() -> list[Record]:
    name = "server1.dbo.orders.Value"
    records: list[Record] = []

    def add(op: str, key: int, before: dict | None, after: dict | None, source: dict) -> None:
        value = envelope(op, before, after, source, source["ts_ms"] + 5, with_schema=True, row_name=name)
        records.append((encode_key({"id": key}, with_schema=True, name="server1.dbo.orders.Key"), value))

    for i, oid in enumerate((10001, 10002, 10003)):
        row = {"id": oid, "order_date": f"2026-01-0{i + 1}", "purchaser": 1001 + i, "quantity": i + 1}
        add("r", oid, None, row, sqlserver_source(None, None, None, _T0 + i, "dbo", "orders", snapshot="true"))
    add("c", 10004, None, {"id": 10004, "order_date": "2026-02-01", "purchaser": 1003, "quantity": 7},
        sqlserver_source(lsn(100), lsn(99), 1, _T0 + 120_000, "dbo", "orders"))
    add("u", 10001, None, {"id": 10001, "order_date": "2026-01-01", "purchaser": 1001, "quantity": 9},
        sqlserver_source(lsn(110), lsn(109), 2, _T0 + 121_000, "dbo", "orders"))
    # A primary-key change: delete (serial 1) + tombstone and insert (serial 2) sharing both LSNs.
    old = {"id": 10002, "order_date": "2026-01-02", "purchaser": 1002, "quantity": 2}
    new = {**old, "id": 10005}
    add("d", 10002, old, None, sqlserver_source(lsn(120), lsn(119), 1, _T0 + 122_000, "dbo", "orders"))
    records.append((encode_key({"id": 10002}, with_schema=True, name="server1.dbo.orders.Key"), None))
    add("c", 10005, None, new, sqlserver_source(lsn(120), lsn(119), 2, _T0 + 122_000, "dbo", "orders"))
    return records


SAMPLE_TOPICS: dict[str, tuple[int, list[Record]]] = {
    "dbserver1.inventory.products": (1, _products()),
    "dbserver1.inventory.customers": (2, _customers()),
    "server1.dbo.orders": (3, _orders()),
}


def publish_sample(bootstrap_servers: str) -> dict[str, int]:
    """Create the sample topics and produce the sample events; returns events per topic."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)
                                   for topic, (partitions, _) in SAMPLE_TOPICS.items()])
    for future in futures.values():
        future.result()
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap_servers})
    for topic, (_, records) in SAMPLE_TOPICS.items():
        for key, value in records:
            producer.produce(topic, key=key, value=value)
    producer.flush(30)
    return {topic: len(records) for topic, (_, records) in SAMPLE_TOPICS.items()}
