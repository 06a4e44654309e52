"""drift_repair_sensor end to end on real MariaDB, captured as production captures it: Debezium's MariaDB connector
in the session's Kafka Connect worker (JSON), the check settling on the connector's offsets in Connect
(``rows_match_source.kafka_connect_url``, heartbeats every 500 ms). The flow of ``test_drift_repair_real.py``
(``tests/support/drift_repair.py``): rows deleted from and changed in Delta behind the pipeline's back fail the
check naming them; the sensor's incremental snapshot, ``additional-conditions`` in MariaDB's SQL through the
source signal table, reads exactly those rows and the re-check passes. Then the connector is deleted, rows change
while it is away, and one under a new name (new offsets) comes back with ``snapshot.mode: no_data``: no event
shows them, the check names them. Last, a change's event deleted from the topic before it was merged halts the
merge and fails the check at once (``lost_to_retention``)."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from dagster import DagsterInstance, Definitions

from tests.support.connect import ConnectWorker
from tests.support.drift_repair import ROWS, DriftRepair, flow_definitions
from tests.support.mariadb import DBZ_GRANTS, MariaDBServer
from tests.support.mariadb_workloads import CapturedDatabase, PsycopgLike

DSN_ENV = "CDC_MARIADB_DRIFT_REPAIR_DSN"


class MariaSQL:
    """The database through the server's administrator account: the flow's ``SourceSQL``."""

    def __init__(self, mariadb: MariaDBServer, database: str):
        self._mariadb, self._database = mariadb, database

    def execute(self, sql: str) -> None:
        """Run one statement."""
        self._mariadb.execute(sql, self._database)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """A query's rows."""
        return [tuple(row.values()) for row in self._mariadb.query(sql, self._database)]


def test_the_sensor_heals_drifted_keys_of_real_mariadb_captured_in_kafka_connect(
        broker: Any, mariadb: MariaDBServer, connect_worker: ConnectWorker, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = uuid.uuid4().hex[:6]
    database, prefix, user = f"drift_{run_id}", f"mdr{run_id}", f"dr{run_id}"
    mariadb.execute(f"CREATE DATABASE {database}")
    for statement in ("CREATE TABLE debezium_signal (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL, "
                      "data VARCHAR(2048))", "CREATE TABLE cdc_marker (id INT PRIMARY KEY)",
                      "CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(40), n DECIMAL(10, 2))",
                      "INSERT INTO items VALUES " + ", ".join(f"({i}, 'row {i}', {i / 4})"
                                                              for i in range(1, ROWS + 1))):
        mariadb.execute(statement, database)
    # The connector's own account: its binlog connection is told apart from other tests' connectors by it (a
    # deleted connector is away once its account has no connection left). It writes its snapshot windows into
    # the signal table.
    for host in ("127.0.0.1", "localhost"):
        mariadb.execute(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{mariadb.password}'")
        mariadb.execute(f"GRANT {DBZ_GRANTS} ON *.* TO '{user}'@'{host}'")
        mariadb.execute(f"GRANT INSERT, UPDATE, DELETE ON {database}.debezium_signal TO '{user}'@'{host}'")
    monkeypatch.setenv(DSN_ENV, f"mariadb://{mariadb.admin_user}:{mariadb.admin_password}@{mariadb.host}:"
                                f"{mariadb.port}/{database}")

    def connector(name: str, **overrides: str) -> dict[str, str]:
        """The connector's registration: heartbeats carry its offsets past a quiet server's last transaction (the
        server sends the binlog client one every 0.8 x keep-alive interval); ``name``'s own schema history."""
        return mariadb.connector_config(prefix, [database], broker.bootstrap_servers, **{
            "database.user": user, "signal.enabled.channels": "source",
            "signal.data.collection": f"{database}.debezium_signal", "incremental.snapshot.chunk.size": "16",
            "heartbeat.interval.ms": "500", "connect.keep.alive.interval.ms": "2000",
            "schema.history.internal.kafka.topic": f"{name}.schema-history", **overrides})

    def definitions(name: str) -> Definitions:
        """The pipeline, the check asking Connect how far connector ``name`` has read."""
        return flow_definitions(
            broker.bootstrap_servers, tmp_path / "delta", "mariadb", prefix, f"{database}.items",
            f'{{channel: source, table: {database}.debezium_signal, dsn_env: {DSN_ENV}, debezium_version: "3.5"}}',
            f', kafka_connect_url: "{connect_worker.url}", kafka_connect_connector: {name}')

    redeployed = f"{prefix}b"
    connect_worker.register(prefix, connector(prefix))
    markers = CapturedDatabase(mariadb, connect_worker, database, prefix, broker.bootstrap_servers, tmp_path)
    try:
        with DagsterInstance.ephemeral() as instance, contextlib.closing(mariadb.connect(database)) as connection:
            flow = DriftRepair(broker.bootstrap_servers, definitions(prefix), instance, MariaSQL(mariadb, database),
                               f"{database}.items", prefix, tmp_path / "delta" / "items", connect_worker.log_tail)
            connect_worker.wait_running(prefix)
            cursor = flow.heal()

            connect_worker.delete(prefix)
            _wait_disconnected(mariadb, user)
            flow.change_while_away()
            connect_worker.register(redeployed, connector(redeployed, **{"snapshot.mode": "no_data"}))
            connect_worker.wait_running(redeployed)
            markers.wait_for_marker(PsycopgLike(connection))  # streaming again, past the changes made while away
            flow.defs = definitions(redeployed)
            flow.names_changes_made_while_away()
            flow.fails_at_once_on_events_lost_to_retention(cursor)
    finally:
        markers.close()
        connect_worker.delete(prefix)
        connect_worker.delete(redeployed)
        for host in ("127.0.0.1", "localhost"):
            mariadb.execute(f"DROP USER '{user}'@'{host}'")


def _wait_disconnected(mariadb: MariaDBServer, user: str, timeout_s: float = 60) -> None:
    """Wait until ``user`` has no connection to the server: its connector's task has stopped reading the binlog."""
    deadline = time.monotonic() + timeout_s
    while connections := mariadb.query("SELECT id, command FROM information_schema.processlist WHERE user = %s",
                                       args=[user]):
        assert time.monotonic() < deadline, f"the deleted connector's connections stay: {connections}"
        time.sleep(0.2)
