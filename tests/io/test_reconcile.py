"""rows_match_source's comparison (``cdc_assets.io.reconcile``) on a real PostgreSQL and a Delta table the
project's delta-rs writer merged rows into, in the shape Debezium's values land in (``core.types``)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from cdc_assets.io.reconcile import DeltaSide, PostgresSource, Reconciliation, committed_position_reached
from tests.support.reconcile import DELTA_SCHEMA, World, delta_row, source_row


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
