"""rows_match_source's comparison (``cdc_assets.io.reconcile``) on a real PostgreSQL and a Delta table the
project's delta-rs writer merged rows into, in the shape Debezium's values land in (``core.types``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdc_assets.io.reconcile import DeltaSide, PostgresSource, Reconciliation, committed_position_reached
from tests.support.reconcile import World, source_row


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
