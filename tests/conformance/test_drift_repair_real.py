"""drift_repair_sensor end to end on real parts: Debezium 3.6's PostgreSQL connector (embedded engine) captures a
table, the project's merge job merges it, and rows are deleted from and changed in the Delta table behind the
pipeline's back. rows_match_source fails naming them; the sensor, ticked on the same Dagster instance, requests
one incremental snapshot whose additional condition selects exactly the drifted keys in the real database, the
connector reads those rows alone (its incremental-snapshot events say which), and once they are merged the sensor
has the check run again: it passes. The table's history reads check failed, snapshot requested, snapshot done,
check passed; no tick requests anything twice. Then the connector is redeployed with a new slot and
``snapshot.mode: no_data`` after rows changed while it was away: no event shows them, and the check names them;
last, a change's event deleted from the topic before it was merged halts the merge and fails the check at once.
The flow is ``tests/support/drift_repair.py``'s, shared with MariaDB's test."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

import psycopg
import pytest
from dagster import DagsterInstance

from tests.support import harness as h
from tests.support.drift_repair import ROWS, DriftRepair, flow_definitions

DSN_ENV = "CDC_DRIFT_REPAIR_DSN"


class Markers:
    """Marker rows inserted again and again: the connector keeps confirming its slot past the check's looks, as a
    connector of a busy database (or with heartbeats) does, so a quiet table's check can settle."""

    def __init__(self, dsn: str):
        self._dsn, self._stop = dsn, threading.Event()
        self._thread = threading.Thread(target=self._insert, daemon=True)
        self.last = 0

    def _insert(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as connection:
            while not self._stop.wait(0.3):
                self.last += 1
                connection.execute("INSERT INTO cdc_marker VALUES (%s)", [self.last])

    def __enter__(self) -> Markers:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


class Psql:
    """The database through psycopg (autocommit): the flow's ``SourceSQL``."""

    def __init__(self, dsn: str):
        self._dsn = dsn

    def execute(self, sql: str) -> None:
        """Run one statement."""
        with psycopg.connect(self._dsn, autocommit=True) as connection:
            connection.execute(sql)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """A query's rows."""
        with psycopg.connect(self._dsn) as connection:
            return connection.execute(sql).fetchall()


def test_the_sensor_heals_drifted_keys_with_a_targeted_snapshot_of_real_debezium(broker, postgres, tmp_path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    run_id = uuid.uuid4().hex[:6]
    prefix = f"dr{run_id}"
    dsn = postgres.create_database(f"drift_{run_id}")
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE debezium_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
                           "data varchar(2048)); CREATE TABLE cdc_marker (id int PRIMARY KEY); "
                           "CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10, 2))")
        connection.execute("INSERT INTO items SELECT g, 'row ' || g, g / 4.0 FROM generate_series(1, %s) g", [ROWS])
    properties = h.connector_properties(
        "drift", prefix, h.parse_dsn(dsn), ["public.items", "public.debezium_signal", "public.cdc_marker"], tmp_path,
        **{"snapshot.mode": "initial", "signal.enabled.channels": "source",
           "signal.data.collection": "public.debezium_signal", "incremental.snapshot.chunk.size": "16",
           "signal.poll.interval.ms": "200"})
    runner = h.DebeziumRunner(broker.bootstrap_servers, [properties], tmp_path)
    monkeypatch.setenv(DSN_ENV, dsn)
    path = tmp_path / "delta" / "items"
    defs = flow_definitions(broker.bootstrap_servers, tmp_path / "delta", "postgresql", prefix, "public.items",
                            f'{{channel: source, table: public.debezium_signal, dsn_env: {DSN_ENV}, '
                            'debezium_version: "3.6"}')
    runner.start()
    try:
        with DagsterInstance.ephemeral() as instance, Markers(dsn) as markers:
            flow = DriftRepair(broker.bootstrap_servers, defs, instance, Psql(dsn), "public.items", prefix, path,
                               runner.log_tail)
            runner.wait_for_marker(1)
            cursor = flow.heal()
            assert markers.last > 0

            # Drift no event shows: rows changed while the connector was away, which came back with a new slot
            # and snapshot.mode no_data (a redeployment that neither streams nor re-reads them).
            runner.stop()
            h.drop_replication_slots(dsn)
            flow.change_while_away()
            (tmp_path / "redeployed").mkdir()
            redeployed = h.DebeziumRunner(broker.bootstrap_servers, [{
                **properties, "snapshot.mode": "no_data",
                "offset.storage.file.filename": str(tmp_path / "redeployed" / "offsets.dat")}], tmp_path / "redeployed")
            redeployed.start()
            flow.log_tail = redeployed.log_tail
            try:
                redeployed.wait_for_marker(markers.last + 1)  # streaming again, from the new slot
                flow.names_changes_made_while_away()
                flow.fails_at_once_on_events_lost_to_retention(cursor)
            finally:
                redeployed.stop()
    finally:
        runner.stop()
        h.drop_replication_slots(dsn)
        os.environ.pop(DSN_ENV, None)

