"""A source table in a real PostgreSQL and its Delta table, merged through the project's delta-rs writer in the
shape Debezium's values land in (``core.types``): what rows_match_source's tests compare."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.delta import CommitRequest, DeltaRsWriter, DeltaTarget
from cdc_assets.io.reconcile import DeltaSide, PostgresSource, Reconciliation, reconcile

CREATE = """
CREATE TABLE inventory.items (
    id bigint, region text, name text, amount numeric(10, 2), units numeric(12, 0), total numeric, price float8,
    ratio real, born date, seen timestamp, at timestamptz, data bytea, doc jsonb, flag boolean, uid uuid, clock time,
    PRIMARY KEY (id, region))
"""
COLUMNS = "id, region, name, amount, units, total, price, ratio, born, seen, at, data, doc, flag, uid, clock"

# The Delta types Debezium's values of those columns land in (core.types).
DELTA_SCHEMA = pa.schema([
    ("id", pa.int64()), ("region", pa.string()), ("name", pa.string()), ("amount", pa.decimal128(38, 2)),
    ("units", pa.decimal128(38, 0)),
    ("total", pa.decimal128(38, 18)), ("price", pa.float64()), ("ratio", pa.float64()), ("born", pa.date32()),
    ("seen", pa.timestamp("us")), ("at", pa.timestamp("us", tz="UTC")), ("data", pa.binary()),
    ("doc", pa.string()), ("flag", pa.bool_()), ("uid", pa.string()), ("clock", pa.string()),
    ("_cdc_op", pa.string()), ("_cdc_position", pa.string()), ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
])


# Doubles whose canonical texts tests compare across engines: the random workload's kind that Java's %.14e and
# C's round apart, zeros, subnormals, the extremes, the special values, short and long shortest texts, a null.
EDGE_DOUBLES = [
    3129881278.388425, -522495456.7057565, 317084838.0897875,
    0.0, -0.0, 5e-324, 1e-320, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
    float("nan"), float("inf"), float("-inf"), 1.0, -2.5, 0.1, 1e23, 2.82879384806159e17, None]


def source_row(i: int) -> dict[str, Any]:
    """Row ``i`` of the source table, as the test inserts it."""
    return {
        "id": i, "region": ["eu", "us", "Zürich's"][i % 3], "name": None if i % 7 == 0 else f"item {i}",
        "amount": Decimal(i) / 4, "units": Decimal(i * 100), "total": Decimal("1.5") * i, "price": i / 3.0,
        "ratio": 0.1 * (i % 5),
        "born": date(2000, 1, 1 + i % 28), "seen": datetime(2024, 2, 29, 12, 0, i % 60, 1000 * i),
        "at": datetime(2024, 3, 1, 8, i % 60, 5, 250000, tzinfo=timezone.utc), "data": bytes([i % 256, 0, 255]),
        "doc": {"n": i, "tags": ["a", "b"]}, "flag": i % 2 == 0, "uid": uuid.UUID(int=i),
        "clock": f"{i % 24:02d}:30:15.5",
    }


def delta_row(values: dict[str, Any], doc_text: str, position: str) -> dict[str, Any]:
    """The Delta row Debezium's event of a source row becomes (values as core.types converts them)."""
    ratio = float(f"{values['ratio']:.7g}")  # a real: the shortest text of its 32-bit value
    return {**values, "total": Decimal(values["total"]), "ratio": ratio, "doc": doc_text, "uid": str(values["uid"]),
            "clock": values["clock"].ljust(15, "0"), "_cdc_op": "r", "_cdc_position": position,
            "_cdc_source_ts": datetime.now(timezone.utc)}


def NOTHING_IN_FLIGHT(position: str) -> bool:
    """The pipeline has applied every change: a test that changes the Delta table by hand says so."""
    return True


class World:
    """A source table in PostgreSQL and its Delta table, merged through the project's delta-rs writer."""

    def __init__(self, dsn: str, path: Path, mode: str = "scd1", topic: str = "t"):
        import psycopg

        self.dsn, self.mode, self.topic = dsn, apply_mode(mode), topic
        self.target = DeltaTarget(str(path))
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.connection.execute("CREATE SCHEMA inventory")
        self.connection.execute(CREATE)
        self.version = 0

    def lsn_position(self) -> str:
        """A Delta position at the source's current WAL position (source part, partition 0, offset 0)."""
        lsn = str(self.connection.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        high, low = lsn.split("/")
        return format((int(high, 16) << 32) + int(low, 16), "x").rjust(16, "0") + "0" * 30

    def insert_source(self, rows: Sequence[dict[str, Any]]) -> None:
        from psycopg.types.json import Jsonb

        with self.connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO inventory.items ({COLUMNS}) VALUES ({', '.join(['%s'] * 16)})",
                               [tuple(Jsonb(v) if k == "doc" else v for k, v in row.items()) for row in rows])

    def merge(self, rows: Sequence[dict[str, Any]], deletes: Sequence[tuple[int, str]] = ()) -> None:
        """Merge ``rows`` (source values) and deletes of ``(id, region)`` into the Delta table at the source's
        current position, as a batch of the pipeline would."""
        position = self.lsn_position()
        texts = {row["id"]: self.doc_text(row["id"]) for row in rows}
        batch = [delta_row(row, texts[row["id"]], position) for row in rows]
        batch += [{**{name: None for name in DELTA_SCHEMA.names}, "id": i, "region": region, "_cdc_op": "d",
                   "_cdc_position": position} for i, region in deletes]
        table = pa.Table.from_pylist(batch, schema=DELTA_SCHEMA)
        if self.mode.name == "soft_delete":
            table = table.append_column("_cdc_deleted", pa.array([row["_cdc_op"] == "d" for row in batch]))
        self.version += 1
        DeltaRsWriter().merge(self.target, table, ["id", "region"],
                              CommitRequest(f"cdc_assets:{self.topic}", self.version, self.topic,
                                                            {0: self.version}), self.mode)

    def doc_text(self, i: int) -> str:
        row = self.connection.execute("SELECT doc::text FROM inventory.items WHERE id = %s", (i,)).fetchone()
        return str(row[0]) if row is not None else "{}"

    def check(self, spark: SparkSession, reached: Callable[[str], bool] | None = NOTHING_IN_FLIGHT, buckets: int = 16,
              settle_timeout_s: float = 30.0) -> Reconciliation:
        source = PostgresSource(self.dsn)
        delta = DeltaSide(spark, self.target.path, self.mode)
        try:
            return reconcile(source, delta, "inventory.items", ["id", "region"], buckets=buckets,
                             reached=reached, settle_timeout_s=settle_timeout_s, poll_s=0.2)
        finally:
            delta.close()
            source.close()


class SlotAdvancer:
    """The connector's side of a quiet table: a logical slot confirmed up to the current WAL position, again
    and again, as a running connector (with heartbeats) confirms what it has written to Kafka."""

    def __init__(self, world: World):
        self._world, self._stop = world, threading.Event()
        world.connection.execute("SELECT pg_create_logical_replication_slot('rows_match_source', 'pgoutput')")
        self._thread = threading.Thread(target=self._advance, daemon=True)

    def _advance(self) -> None:
        import psycopg

        with psycopg.connect(self._world.dsn, autocommit=True) as connection:
            while not self._stop.wait(0.3):
                connection.execute("SELECT pg_replication_slot_advance('rows_match_source', pg_current_wal_lsn())")

    def __enter__(self) -> SlotAdvancer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._world.connection.execute("SELECT pg_drop_replication_slot('rows_match_source')")


def merged_world(postgres: Any, broker: Any, tmp_path: Path, name: str, *setup: str) -> World:
    """A source table of 200 rows in a fresh database of ``postgres`` (``setup`` statements run first), merged
    into its Delta table, and a topic of the table's name under a fresh prefix (``world.prefix``) whose one event
    the merge applied: nothing waits."""
    from tests.support.topics import new_topic_named, produce

    prefix = f"{name}{uuid.uuid4().hex[:8]}"
    topic = new_topic_named(broker, f"{prefix}.inventory.items")
    produce(broker, topic, [(b"k", b"v")])
    world = World(postgres.create_database(f"{name}_{prefix}"), tmp_path / "items", topic=topic)
    for statement in setup:
        world.connection.execute(statement)
    rows = [source_row(i) for i in range(1, 201)]
    world.insert_source(rows)
    world.merge(rows)
    world.prefix = prefix  # type: ignore[attr-defined]
    return world
