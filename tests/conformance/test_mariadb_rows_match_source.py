"""rows_match_source on a quiet MariaDB table, captured by Debezium's MariaDB connector in the shared Kafka Connect
worker and merged by the project's merge job. The server does not know how far the connector has read, so a bucket
that differs could never settle: with ``rows_match_source.kafka_connect_url`` the connector's offsets committed in
Connect do (their binlog position past the check's first look, and nothing of the table waiting in its topic).
A drift-free copy passes; a row changed in Delta by hand is drift, found well within ``settle_timeout_s``;
without the URL the same check can only give up, unsettled."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from dagster import AssetCheckSeverity, DagsterInstance
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.support import harness as h
from tests.support.connect import ConnectWorker
from tests.support.mariadb import MariaDBServer

DSN_ENV = "CDC_MARIADB_RMS_DSN"
SETTLE_TIMEOUT_S = 120


def _check(config: str) -> Any:
    """One run of the connector's rows_match_source job: the check's evaluation."""
    with DagsterInstance.ephemeral() as instance:
        result = build_definitions(parse_config(config)).resolve_job_def("maria_rows_match_source_job") \
            .execute_in_process(instance=instance, raise_on_error=False)
    assert result.success, h.failures(result)
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_a_quiet_mariadb_table_settles_on_the_connectors_offsets_in_kafka_connect(
        broker: Any, mariadb: MariaDBServer, connect_worker: ConnectWorker, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = uuid.uuid4().hex[:6]
    database, prefix = f"rms_{run_id}", f"rms{run_id}"
    mariadb.execute(f"CREATE DATABASE {database}")
    mariadb.execute("CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10, 2))", database)
    for start in range(1, 201, 50):
        mariadb.execute("INSERT INTO items VALUES " + ", ".join(f"({i}, 'row {i}', {i / 4})"
                                                                for i in range(start, start + 50)), database)
    monkeypatch.setenv(DSN_ENV, f"mariadb://{mariadb.user}:{mariadb.password}@{mariadb.host}:{mariadb.port}/"
                                f"{database}")
    # Heartbeats carry the connector's offset past the last transaction on a quiet server: the server sends the
    # binlog client a heartbeat event every 0.8 x keep-alive interval, and each lets Debezium emit one.
    connect_worker.register(prefix, mariadb.connector_config(
        prefix, [database], broker.bootstrap_servers, **{"heartbeat.interval.ms": "500",
                                                         "connect.keep.alive.interval.ms": "2000"}))
    try:
        connect_worker.wait_running(prefix)
        topic = f"{prefix}.{database}.items"
        deadline = time.monotonic() + 180

        def wait_for_events(count: int) -> None:
            while sum(h.end_offsets(broker.bootstrap_servers, topic).values()) < count:
                assert time.monotonic() < deadline, connect_worker.log_tail()
                time.sleep(0.5)

        # A change streamed after the snapshot, the server's last: the table's newest applied position (where
        # that transaction begins) stays behind the source's at every later look, as a quiet table's does. Made
        # once the snapshot is in the topic: a running connector may not have read its binlog position yet, and
        # an update before it is part of the snapshot, never streamed (the suite's load made that a flake).
        wait_for_events(200)
        mariadb.execute("UPDATE items SET v = 'streamed' WHERE id = 1", database)
        wait_for_events(201)
        base = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path / 'delta'}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: maria
    kind: mariadb
    topic.prefix: {prefix}
    tables: [{{name: {database}.items}}]
"""
        with_connect = base + (
            f"    rows_match_source: {{dsn_env: {DSN_ENV}, buckets: 16, settle_timeout_s: {SETTLE_TIMEOUT_S}, "
            f"kafka_connect_url: \"{connect_worker.url}\", kafka_connect_connector: {prefix}}}\n")
        assert not h.failures(h.run_job(with_connect))

        passed = _check(with_connect)
        assert passed.passed, passed.description
        assert passed.metadata["source_rows"].value == passed.metadata["delta_rows"].value == 200

        path = tmp_path / "delta" / prefix / database / "items"
        DeltaTable(str(path)).update(updates={"v": "'by hand'"}, predicate="id = 17")  # behind the pipeline's back
        start = time.monotonic()
        failed = _check(with_connect)
        took = time.monotonic() - start
        assert not failed.passed and failed.severity == AssetCheckSeverity.ERROR, failed.description
        assert [bucket["sample_keys"] for bucket in failed.metadata["drifted_buckets"].value] == [["different: 17"]]
        waited = failed.metadata["waited_s"].value
        assert waited < SETTLE_TIMEOUT_S / 2 and took < SETTLE_TIMEOUT_S, (waited, took)
        assert failed.metadata["last_source_position"].value >= failed.metadata["source_position"].value

        # Without Connect's offsets the quiet table's differing bucket never settles: a warning, no drift claimed.
        unsettled = _check(base + f"    rows_match_source: {{dsn_env: {DSN_ENV}, buckets: 16, settle_timeout_s: 3}}\n")
        assert not unsettled.passed and unsettled.severity == AssetCheckSeverity.WARN, unsettled.description
        assert unsettled.metadata["unsettled_buckets"].value and "kafka_connect_url" in unsettled.description
    finally:
        connect_worker.delete(prefix)
