"""rows_match_source's comparison (``cdc_assets.io.reconcile``) on a real PostgreSQL and a Delta table the
project's delta-rs writer merged rows into, in the shape Debezium's values land in (``core.types``)."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_assets.core.reconcile import ComparedColumn, Dialect, canonical_of, value_text
from cdc_assets.io.reconcile import DeltaSide, PostgresSource, Reconciliation, committed_position_reached
from tests.support.reconcile import DELTA_SCHEMA, EDGE_DOUBLES, World, delta_row, source_row
from tests.support.workloads import _random_text


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
    assert len(result.columns) == 16 and result.first_position


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


def test_each_look_runs_both_sides_at_once(world: World, spark: SparkSession) -> None:
    """Every look (the checksums, then both looks again at the drifted bucket) runs the source's query while
    Spark reads the Delta table: their spans overlap, the Delta table's version pinned first; each side's
    seconds are its own spans', and the wall time covers them all."""
    from deltalake import DeltaTable

    DeltaTable(world.target.path).delete("id = 9")
    result = world.check(spark)
    assert drift(result) == {"missing": {"9, eu"}}, result
    assert len(result.looks) == 3, result.looks
    for look in result.looks:
        # The version pinned, the source's query began before Spark had read the table (one after the other,
        # the source would begin only once Spark was done).
        assert look.delta[0] <= look.source[0] < look.delta[1], look
    assert result.side_by_side_s == pytest.approx(sum(look.overlap_s for look in result.looks))
    assert result.source_s == pytest.approx(sum(look.source[1] - look.source[0] for look in result.looks))
    assert result.delta_s == pytest.approx(sum(look.delta[1] - look.delta[0] for look in result.looks))
    assert result.wall_s >= max(result.looks[-1].delta[1], result.looks[-1].source[1])


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
        # One read-only repeatable-read snapshot per look: its statements all see the source at its position.
        assert source.look("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
                           )[1] == [("repeatable read", "on")]
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


@pytest.fixture
def soft_world(postgres: Any, tmp_path: Path) -> Iterator[World]:
    world = World(postgres.create_database(f"reconcile_{uuid.uuid4().hex[:8]}"), tmp_path / "soft", "soft_delete")
    rows = [source_row(i) for i in range(1, 41)]
    world.insert_source(rows)
    world.merge(rows)
    world.connection.execute("DELETE FROM inventory.items WHERE id IN (3, 4)")
    world.merge([], deletes=[(3, "eu"), (4, "us")])  # kept as rows marked deleted
    yield world
    world.connection.close()


def test_soft_delete_compares_live_rows_and_a_wrong_mark_is_drift(soft_world: World, spark: SparkSession) -> None:
    from deltalake import DeltaTable

    result = soft_world.check(spark)
    assert (result.source_rows, result.delta_rows, drift(result), result.unsettled) == (38, 38, {}, [])
    assert result.passed
    table = DeltaTable(soft_world.target.path)
    table.update(updates={"_cdc_deleted": "true"}, predicate="id = 9")  # live at the source, marked deleted
    table.update(updates={"_cdc_deleted": "false"}, predicate="id = 3")  # deleted at the source, live again
    assert drift(soft_world.check(spark)) == {"missing": {"9, eu"}, "extra": {"3, eu"}}


def test_scd2_compares_current_versions(postgres: Any, spark: SparkSession, tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    world = World(postgres.create_database(f"reconcile_{uuid.uuid4().hex[:8]}"), tmp_path / "scd2", "scd2")
    rows = [source_row(i) for i in range(1, 31)]
    world.insert_source(rows)
    position = world.lsn_position()
    current = pa.Table.from_pylist([delta_row(row, world.doc_text(row["id"]), position) for row in rows],
                                   schema=DELTA_SCHEMA)
    older = pa.Table.from_pylist([delta_row({**row, "name": "before"}, world.doc_text(row["id"]), "0" * 46)
                                  for row in rows[:10]], schema=DELTA_SCHEMA)

    def versions(table: pa.Table, is_current: bool, valid_to: str | None) -> pa.Table:
        return (table.drop_columns(["_cdc_position", "_cdc_source_ts"])
                .append_column("_cdc_valid_from", table["_cdc_position"])
                .append_column("_cdc_valid_from_ts", table["_cdc_source_ts"])
                .append_column("_cdc_valid_to", pa.array([valid_to] * table.num_rows, pa.string()))
                .append_column("_cdc_valid_to_ts", pa.nulls(table.num_rows, pa.timestamp("us", tz="UTC")))
                .append_column("_cdc_current", pa.array([is_current] * table.num_rows)))

    write_deltalake(world.target.path, pa.concat_tables([versions(older, False, position),
                                                         versions(current, True, None)]))
    try:
        result = world.check(spark)
        assert result.passed and result.source_rows == result.delta_rows == 30, result
        # Key 4's old version made current by hand: two current versions, one of them stale.
        DeltaTable(world.target.path).update(updates={"_cdc_current": "true"}, predicate="id = 4 AND name = 'before'")
        result = world.check(spark)
        assert drift(result) == {"extra": {"4, us"}}, result
        assert not result.passed and result.delta_rows == 31
    finally:
        world.connection.close()


def test_drifted_ranges_select_exactly_the_drifted_keys_at_the_source(world: World, spark: SparkSession) -> None:
    """The drift's machine-readable ranges (the check's ``drifted_ranges`` metadata) give the WHERE a repair's
    snapshot reads: by keys, exactly the keys missing or different (a composite key, a quote in a text part);
    by buckets, every row of their buckets; a key in Delta only is in neither (no source row heals it)."""
    from deltalake import DeltaTable

    from cdc_assets.core.reconcile import DriftedRanges, bucket_of

    table = DeltaTable(world.target.path)
    table.delete("id IN (5, 6)")
    table.update(updates={"name": "'by hand'"}, predicate="id = 60")
    world.merge([{**source_row(900), "region": "eu"}])  # in Delta only
    ranges = DriftedRanges.from_metadata(json.loads(json.dumps(world.check(spark).drifted_ranges().to_metadata())))
    assert ranges.extra_keys == 1 and ranges.keys is not None and len(ranges.keys) == 3

    def selected(condition: str | None) -> set[tuple[int, str]]:
        assert condition is not None
        rows = world.connection.execute(f"SELECT id, region FROM inventory.items WHERE {condition}").fetchall()
        return {(int(i), str(region)) for i, region in rows}

    assert selected(ranges.condition("postgresql")) == {(5, "Zürich's"), (6, "eu"), (60, "eu")}
    by_buckets = ranges.condition("postgresql", fits=lambda condition: "IN ((" not in condition)
    bucket = bucket_of(ranges.key_columns, ranges.buckets, "postgresql")
    in_buckets = world.connection.execute(
        f"SELECT id, region FROM inventory.items WHERE {bucket} IN "
        f"({', '.join(str(b) for b in ranges.drifted_buckets)})").fetchall()
    assert selected(by_buckets) == {(int(i), str(r)) for i, r in in_buckets} > {(5, "Zürich's"), (6, "eu")}
    assert ranges.condition("postgresql", fits=lambda _: False) is None


# Each column of the table below: its PostgreSQL type and the Delta type Debezium's value of it lands in.
TRICKY_COLUMNS: dict[str, tuple[str, T.DataType]] = {
    "grp": ("integer", T.LongType()), "flag": ("boolean", T.BooleanType()), "name": ("text", T.StringType()),
    "amount": ("numeric(12,4)", T.DecimalType(12, 4)), "total": ("numeric(38,18)", T.DecimalType(38, 18)),
    "score": ("double precision", T.DoubleType()), "ratio": ("real", T.DoubleType()), "born": ("date", T.DateType()),
    "seen": ("timestamp", T.TimestampNTZType()), "at": ("timestamp with time zone", T.TimestampType()),
    "data": ("bytea", T.BinaryType()), "clock": ("time", T.StringType()),
}


def _tricky_rows() -> list[tuple[Any, ...]]:
    """The random workload's kinds of values (``workloads.rnd_changes``: doubles of +-1e9 and twice them, amounts
    of scale 4, instants of 2020) and edge values of every type, one row per id."""
    rng = random.Random(59)
    rows: list[tuple[Any, ...]] = []
    for i in range(300):
        rows.append((i, rng.randint(0, 9), rng.random() < 0.5, None if i % 10 == 0 else _random_text(rng, i % 30),
                     Decimal(rng.randint(-10**12, 10**12)).scaleb(-4),
                     Decimal(rng.randint(-10**20, 10**20)).scaleb(-18),
                     rng.uniform(-1e9, 1e9) * rng.choice([1, 2, 4]), rng.uniform(-1e6, 1e6),
                     dt.date(1969, 12, 31) + dt.timedelta(days=rng.randint(-40000, 40000)),
                     dt.datetime(1969, 7, 20) + dt.timedelta(microseconds=rng.getrandbits(50)),
                     dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=rng.getrandbits(45)),
                     rng.randbytes(i % 5), dt.time(i % 24, i % 60, i % 60, rng.randint(0, 999999))))
    edges: list[tuple[Any, ...]] = [
        (None, None, "", Decimal("0.0001"), Decimal("0E-18"), 1e-7, dt.date(1, 1, 1),
         dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(1969, 12, 31, 23, 59, 59, 999999, dt.timezone.utc),
         b"", dt.time(0, 0)),
        (-1, False, 'line1\nline2 "q" \\ tab\t ☃ 𝄞 \'|:~', Decimal("-99999999.9999"), Decimal("0.000000000000000001"),
         -3.4028235e38, dt.date(9999, 12, 31), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
         dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), b"\x00\xff|", dt.time(23, 59, 59, 999999)),
    ]
    for j, score in enumerate(EDGE_DOUBLES):
        edge = edges[j % len(edges)]
        rows.append((1000 + j, *edge[:5], score, *edge[5:]))
    return rows


def test_each_canonical_text_reads_alike_in_postgresql_and_spark(postgres: Any, spark: SparkSession) -> None:
    """The same values in a PostgreSQL table and in a Spark frame of the Delta types Debezium's values land in
    read as the same canonical text, value by value: else rows_match_source reports drift that is not there."""
    import psycopg

    dsn = postgres.create_database(f"canonical_{uuid.uuid4().hex[:8]}")
    names = list(TRICKY_COLUMNS)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE tricky (id int PRIMARY KEY, "
                           f"{', '.join(f'{n} {t}' for n, (t, _) in TRICKY_COLUMNS.items())})")
        with connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO tricky VALUES ({', '.join(['%s'] * (len(names) + 1))})", _tricky_rows())
        source_types: dict[str, str] = dict(connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'tricky'").fetchall())
        # The values as the source holds them are what Debezium sends (a real: its shortest text's double).
        stored = connection.execute(f"SELECT id, {', '.join(names)} FROM tricky").fetchall()
        columns = [ComparedColumn(n, canonical, source_types[n]) for n, (_, delta_type) in TRICKY_COLUMNS.items()
                   if (canonical := canonical_of(delta_type, source_types[n], "postgresql")) is not None]
        assert [c.name for c in columns] == names

        def texts(dialect: Dialect) -> str:
            return ", ".join(value_text(column, dialect) for column in columns)

        in_postgresql = {row[0]: row[1:] for row in connection.execute(f"SELECT id, {texts('postgresql')} FROM tricky")}
    frame = spark.createDataFrame(
        [(i, *values[:-1], None if values[-1] is None else values[-1].isoformat(timespec="microseconds"))
         for i, *values in stored],
        T.StructType([T.StructField("id", T.LongType()),
                      *(T.StructField(n, delta_type) for n, (_, delta_type) in TRICKY_COLUMNS.items())]))
    view = f"tricky_{uuid.uuid4().hex[:8]}"
    frame.createOrReplaceTempView(view)
    try:
        in_spark = {row[0]: tuple(row[1:]) for row in spark.sql(f"SELECT id, {texts('spark')} FROM {view}").collect()}
    finally:
        spark.catalog.dropTempView(view)
    assert in_spark.keys() == in_postgresql.keys() and len(in_spark) == 300 + len(EDGE_DOUBLES)
    differing = [(name, i, in_postgresql[i][k], in_spark[i][k]) for i in sorted(in_spark)
                 for k, name in enumerate(names) if in_postgresql[i][k] != in_spark[i][k]]
    assert differing == [], f"{len(differing)} differ (column, id, PostgreSQL's text, Spark's): {differing[:10]}"
    assert in_spark[1000][names.index("score")] == "0x1.751c657cc6dfap31"  # the exact binary value, no rounding
