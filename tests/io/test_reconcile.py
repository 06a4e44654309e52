"""rows_match_source's comparison (``cdc_assets.io.reconcile``) on a real PostgreSQL and a Delta table the
project's delta-rs writer merged rows into, in the shape Debezium's values land in (``core.types``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.delta import CommitRequest, DeltaRsWriter, DeltaTarget
from cdc_assets.io.reconcile import DeltaSide, PostgresSource, Reconciliation, committed_position_reached, reconcile

CREATE = """
CREATE TABLE inventory.items (
    id bigint, region text, name text, amount numeric(10, 2), total numeric, price float8, ratio real,
    born date, seen timestamp, at timestamptz, data bytea, doc jsonb, flag boolean, uid uuid, clock time,
    PRIMARY KEY (id, region))
"""
COLUMNS = "id, region, name, amount, total, price, ratio, born, seen, at, data, doc, flag, uid, clock"

# The Delta types Debezium's values of those columns land in (core.types).
DELTA_SCHEMA = pa.schema([
    ("id", pa.int64()), ("region", pa.string()), ("name", pa.string()), ("amount", pa.decimal128(38, 2)),
    ("total", pa.decimal128(38, 18)), ("price", pa.float64()), ("ratio", pa.float64()), ("born", pa.date32()),
    ("seen", pa.timestamp("us")), ("at", pa.timestamp("us", tz="UTC")), ("data", pa.binary()),
    ("doc", pa.string()), ("flag", pa.bool_()), ("uid", pa.string()), ("clock", pa.string()),
    ("_cdc_op", pa.string()), ("_cdc_position", pa.string()), ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
])


def source_row(i: int) -> dict[str, Any]:
    """Row ``i`` of the source table, as the test inserts it."""
    return {
        "id": i, "region": ["eu", "us", "Zürich's"][i % 3], "name": None if i % 7 == 0 else f"item {i}",
        "amount": Decimal(i) / 4, "total": Decimal("1.5") * i, "price": i / 3.0, "ratio": 0.1 * (i % 5),
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

    def __init__(self, dsn: str, path: Path, mode: str = "scd1"):
        import psycopg

        self.dsn, self.mode = dsn, apply_mode(mode)
        self.target = DeltaTarget(str(path))
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.connection.execute("CREATE SCHEMA inventory")
        self.connection.execute(CREATE)
        self.version = 0

    def lsn_position(self) -> str:
        """A Delta position at the source's current WAL position (source part, partition 0, offset 0)."""
        lsn = str(self.connection.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        high, low = lsn.split("/")
        return format((int(high, 16) << 32) + int(low, 16), "x").rjust(16, "0") + "0" * 30

    def insert_source(self, rows: Sequence[dict[str, Any]]) -> None:
        from psycopg.types.json import Jsonb

        with self.connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO inventory.items ({COLUMNS}) VALUES ({', '.join(['%s'] * 15)})",
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
                              CommitRequest("cdc_assets:t", self.version, "t", {0: self.version}), self.mode)

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


@pytest.fixture
def world(postgres: Any, tmp_path: Path) -> Iterator[World]:
    dsn = postgres.create_database(f"reconcile_{uuid.uuid4().hex[:8]}")
    world = World(dsn, tmp_path / "items")
    rows = [source_row(i) for i in range(1, 201)]
    world.insert_source(rows)
    world.merge(rows)
    yield world
    world.connection.close()


def drift(result: Reconciliation) -> dict[str, set[str]]:
    """The drifted keys by kind."""
    found: dict[str, set[str]] = {}
    for bucket in result.drifted:
        for difference in bucket.differences:
            found.setdefault(difference.kind, set()).add(difference.display)
    return found


def test_equal_tables_pass_on_every_type(world: World, spark: SparkSession) -> None:
    result = world.check(spark)
    assert result.left_out == []
    assert result.differing_first == [], result
    assert result.passed and result.source_rows == result.delta_rows == 200
    assert len(result.columns) == 15 and result.first_position


def test_rows_deleted_added_and_changed_in_delta_are_drift_in_their_buckets(world: World,
                                                                           spark: SparkSession) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(world.target.path)
    table.delete("id = 5")  # missing from Delta
    table.update(updates={"amount": "CAST(99.99 AS DECIMAL(38, 2))"}, predicate="id = 17")  # a changed value
    world.merge([{**source_row(900), "region": "eu"}])  # in Delta only: extra
    result = world.check(spark)
    assert drift(result) == {"missing": {"5, Zürich's"}, "different": {"17, Zürich's"}, "extra": {"900, eu"}}, result
    assert not result.passed and result.in_flight_keys == 0
    assert result.source_rows == 200 and result.delta_rows == 200
    assert set(result.differing_first) == {bucket.bucket for bucket in result.drifted}


def test_a_change_in_flight_is_not_drift(world: World, spark: SparkSession) -> None:
    """The source changes before the check looks; the pipeline applies it while the check waits for the table
    to pass the source's position of the first look: no drift, though the first look differed."""
    world.connection.execute("UPDATE inventory.items SET name = 'renamed' WHERE id = 42")
    world.connection.execute("DELETE FROM inventory.items WHERE id = 43")
    delta = DeltaSide(spark, world.target.path, world.mode)
    plain = committed_position_reached(delta, None)  # type: ignore[arg-type]
    asked: list[str] = []

    def reached(position: str) -> bool:
        if not asked:  # the pipeline catches up only after the first look, while the check waits
            threading.Timer(1.0, lambda: world.merge([{**source_row(42), "name": "renamed"}],
                                                     deletes=[(43, "us")])).start()
        asked.append(position)
        return plain(position)

    result = world.check(spark, reached)
    delta.close()
    assert asked and asked[0] == result.first_position
    assert len(asked) > 1, "the check did not wait for the table to pass its first look's position"
    assert result.differing_first and result.passed and result.drifted == [], result


def test_a_table_that_never_catches_up_is_unsettled_not_drift(world: World, spark: SparkSession) -> None:
    world.connection.execute("UPDATE inventory.items SET name = 'late' WHERE id = 8")
    result = world.check(spark, reached=None, settle_timeout_s=1.0)
    assert result.unsettled == result.differing_first and len(result.unsettled) == 1
    assert result.drifted == [] and not result.passed


def test_a_key_changing_between_the_last_looks_is_in_flight(world: World, spark: SparkSession) -> None:
    """A key that differs at the second look but whose source row changed before the third is in flight;
    a key behind the pipeline's back (Delta changed by hand) in the same run is drift."""
    from deltalake import DeltaTable

    DeltaTable(world.target.path).update(updates={"name": "'by hand'"}, predicate="id = 60")
    world.connection.execute("UPDATE inventory.items SET name = 'busy 1' WHERE id = 61")
    calls: list[str] = []

    def reached(position: str) -> bool:
        calls.append(position)
        if len(calls) == 2:  # before the third look: the source changes again, the pipeline is behind
            world.connection.execute("UPDATE inventory.items SET name = 'busy 2' WHERE id = 61")
        return True

    result = world.check(spark, reached)
    assert drift(result) == {"different": {"60, eu"}}, result
    assert result.in_flight_keys == 1


def test_a_quiet_table_is_caught_up_once_the_slot_confirmed_past_the_position(world: World,
                                                                              spark: SparkSession) -> None:
    """The table's newest change is behind the source's position; a logical slot confirmed past it and no
    event waiting in the topic prove the table has applied everything up to it."""
    source = PostgresSource(world.dsn)
    delta = DeltaSide(spark, world.target.path, world.mode)
    waiting = [0]
    reached = committed_position_reached(delta, source, lambda: waiting[0])
    try:
        assert source.confirmed_position() is None  # no slot yet
        world.connection.execute("SELECT pg_create_logical_replication_slot('reconcile_test', 'pgoutput')")
        world.connection.execute("CREATE TABLE inventory.other (id int)")  # the source moves on, not this table
        position, _ = source.look("SELECT 1")
        assert not reached(position)  # the slot has confirmed nothing past its start, before the position
        world.connection.execute("INSERT INTO inventory.other VALUES (1)")
        world.connection.execute("SELECT pg_replication_slot_advance('reconcile_test', pg_current_wal_lsn())")
        confirmed = source.confirmed_position()
        assert confirmed is not None and confirmed >= position and reached(position)
        waiting[0] = 3
        assert not reached(position)  # the connector read past it, the merge is behind
    finally:
        world.connection.execute("SELECT pg_drop_replication_slot('reconcile_test')")
        delta.close()
        source.close()
