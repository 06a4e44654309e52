"""drift_repair_sensor end to end on real parts: Debezium 3.6's PostgreSQL connector (embedded engine) captures a
table, the project's merge job merges it, and rows are deleted from and changed in the Delta table behind the
pipeline's back. rows_match_source fails naming them; the sensor, ticked on the same Dagster instance, requests
one incremental snapshot whose additional condition selects exactly the drifted keys in the real database, the
connector reads those rows alone (its incremental-snapshot events say which), and once they are merged the sensor
has the check run again: it passes. The table's history reads check failed, snapshot requested, snapshot done,
check passed; no tick requests anything twice. Then the connector is redeployed with a new slot and
``snapshot.mode: no_data`` after rows changed while it was away: no event shows them, and the check names them."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    RunRequest,
    build_sensor_context,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from sensors.drift_repair import REPAIR_TAG, STEP_TAG
from tests.support import harness as h

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


def test_the_sensor_heals_drifted_keys_with_a_targeted_snapshot_of_real_debezium(broker, postgres, tmp_path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    run_id = uuid.uuid4().hex[:6]
    prefix = f"dr{run_id}"
    dsn = postgres.create_database(f"drift_{run_id}")
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE debezium_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
                           "data varchar(2048)); CREATE TABLE cdc_marker (id int PRIMARY KEY); "
                           "CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10, 2))")
        connection.execute("INSERT INTO items SELECT g, 'row ' || g, g / 4.0 FROM generate_series(1, 300) g")
    properties = h.connector_properties(
        "drift", prefix, h.parse_dsn(dsn), ["public.items", "public.debezium_signal", "public.cdc_marker"], tmp_path,
        **{"snapshot.mode": "initial", "signal.enabled.channels": "source",
           "signal.data.collection": "public.debezium_signal", "incremental.snapshot.chunk.size": "16",
           "signal.poll.interval.ms": "200"})
    runner = h.DebeziumRunner(broker.bootstrap_servers, [properties], tmp_path)
    monkeypatch.setenv(DSN_ENV, dsn)
    path = tmp_path / "delta" / "items"
    defs = build_definitions(parse_config(f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path / 'delta'}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    signal: {{channel: source, table: public.debezium_signal, dsn_env: {DSN_ENV}, debezium_version: "3.6"}}
    tables: [{{name: public.items, path: "{path}"}}]
    rows_match_source: {{buckets: 16, settle_timeout_s: 120}}
"""), topics=[f"{prefix}.public.items"])
    key = AssetKey([prefix, "public", "items"])
    check = AssetCheckKey(key, "rows_match_source")
    sensor = defs.resolve_sensor_def("drift_repair_sensor")
    topic = f"{prefix}.public.items"

    runner.start()
    try:
        with DagsterInstance.ephemeral() as instance, Markers(dsn) as markers:
            def run(job: str, tags: dict[str, str] | None = None, run_config: dict | None = None,
                    checks: list[AssetCheckKey] | None = None) -> Any:
                definition = defs.resolve_job_def(job)
                if checks is not None:  # the subset the daemon launches for a request naming checks alone
                    definition = definition.get_subset(asset_selection=set(), asset_check_selection=set(checks))
                result = definition.execute_in_process(instance=instance, tags=tags, run_config=run_config,
                                                       raise_on_error=False)
                assert result.success, h.failures(result)
                return result

            def evaluation(result: Any) -> Any:
                [found] = [e for e in result.get_asset_check_evaluations() if e.check_name == "rows_match_source"]
                return found

            def tick(cursor: str | None) -> Any:
                return sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor, definitions=defs))

            runner.wait_for_marker(1)
            deadline = time.monotonic() + 180
            while sum(h.end_offsets(broker.bootstrap_servers, topic).values()) < 300:  # the initial snapshot
                assert time.monotonic() < deadline, runner.log_tail()
                time.sleep(0.5)
            run("cdc_merge_job")
            assert len(DeltaTable(str(path)).to_pyarrow_table()) == 300
            passed = evaluation(run("shop_rows_match_source_job"))
            assert passed.passed, passed.description

            table = DeltaTable(str(path))  # behind the pipeline's back
            table.delete("id IN (5, 250)")
            table.update(updates={"v": "'wrong'"}, predicate="id = 17")
            failed = evaluation(run("shop_rows_match_source_job"))
            assert not failed.passed, failed.description
            ranges = failed.metadata["drifted_ranges"].value
            assert len(ranges["keys"]) == 3 and ranges["extra_keys"] == 0

            first = tick(None)
            [request] = first.run_requests
            assert request.job_name == "incremental_snapshot_job" and request.tags[STEP_TAG] == "snapshot"
            [condition] = request.run_config["ops"]["send_execute_snapshot"]["config"]["additional_conditions"]
            assert condition["table"] == "public.items"
            with psycopg.connect(dsn) as connection:  # the WHERE selects exactly the drifted keys
                selected = connection.execute(f"SELECT id FROM public.items WHERE {condition['filter']}").fetchall()
            assert sorted(row[0] for row in selected) == [5, 17, 250]
            assert [o.metadata["drift_repair"].value for o in first.asset_events] == ["snapshot requested"]
            again = tick(first.cursor)
            assert again.run_requests == [] and again.asset_events == []  # idempotent: nothing twice
            assert tick(None).run_requests[0].run_key == request.run_key  # a lost cursor: the same run key

            run(request.job_name, request.tags, request.run_config)
            with psycopg.connect(dsn) as connection:
                [(data,)] = connection.execute("SELECT data FROM debezium_signal WHERE type = 'execute-snapshot'"
                                               ).fetchall()
            assert json.loads(data)["additional-conditions"][0]["filter"] == condition["filter"]

            cursor, recheck = again.cursor, None
            deadline = time.monotonic() + 300
            while recheck is None:
                assert time.monotonic() < deadline, f"no re-check requested: {cursor}\n{runner.log_tail()}"
                run("cdc_merge_job")
                step = tick(cursor)
                cursor = step.cursor
                recheck = next(iter(step.run_requests), None)
                time.sleep(1)
            assert isinstance(recheck, RunRequest) and recheck.asset_check_keys == [check]
            assert recheck.tags[REPAIR_TAG] == request.tags[REPAIR_TAG] and recheck.tags[STEP_TAG] == "recheck"
            [done] = step.asset_events
            assert done.metadata["drift_repair"].value == "snapshot done"
            assert done.metadata["snapshot_reads_merged"].value == done.metadata["source_rows_selected"].value == 3

            healed = evaluation(run(recheck.job_name, recheck.tags, checks=list(recheck.asset_check_keys or [])))
            assert healed.passed, healed.description
            assert tick(cursor).run_requests == []  # a passed evaluation: nothing more

            # The connector read the drifted rows alone.
            reads = {r.key["id"] for r in h.read_topic(broker.bootstrap_servers, topic)
                     if r.value is not None and r.value["source"]["snapshot"] == "incremental"}
            assert reads == {5, 17, 250}
            history = [evaluation.passed for evaluation in _check_history(instance, check)]
            assert history == [True, False, True]
            assert markers.last > 0

            # Drift no event shows: rows changed while the connector was away, which came back with a new slot
            # and snapshot.mode no_data (a redeployment that neither streams nor re-reads them). The merge has
            # nothing to apply; the check names exactly those keys.
            runner.stop()
            h.drop_replication_slots(dsn)
            with psycopg.connect(dsn, autocommit=True) as connection:
                connection.execute("UPDATE items SET v = 'changed while away' WHERE id IN (60, 61)")
                connection.execute("INSERT INTO items VALUES (301, 'inserted while away', 1)")
            (tmp_path / "redeployed").mkdir()
            redeployed = h.DebeziumRunner(broker.bootstrap_servers, [{
                **properties, "snapshot.mode": "no_data",
                "offset.storage.file.filename": str(tmp_path / "redeployed" / "offsets.dat")}], tmp_path / "redeployed")
            redeployed.start()
            try:
                redeployed.wait_for_marker(markers.last + 1)  # streaming again, from the new slot
                run("cdc_merge_job")
                lost = evaluation(run("shop_rows_match_source_job"))
                assert not lost.passed and lost.severity == AssetCheckSeverity.ERROR, lost.description
                ranges = lost.metadata["drifted_ranges"].value
                assert len(ranges["keys"]) == 3 and ranges["extra_keys"] == 0, ranges
                assert "(1 key(s) missing, 0 extra, 2 with different values)" in (lost.description or ""), \
                    lost.description

                # Events deleted before they were merged, as retention deletes them: the partition's earliest
                # retained offset moved past the table's committed one. The merge halts naming where; the check
                # fails at once (no wait for a table that cannot catch up) naming the same offsets, and, nothing
                # of the table being left in its topic, the keys that differ: key 90's lost change among them.
                since = h.end_offsets(broker.bootstrap_servers, topic)
                with psycopg.connect(dsn, autocommit=True) as connection:
                    connection.execute("UPDATE items SET v = 'lost to retention' WHERE id = 90")
                h.wait_for_growth(broker.bootstrap_servers, topic, since)
                ends = h.end_offsets(broker.bootstrap_servers, topic)
                admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
                for deleted in admin.delete_records([TopicPartition(topic, p, end) for p, end in ends.items()]
                                                    ).values():
                    deleted.result()
                [gap] = [f"{topic}[{p}]: committed offset {since[p]} is below the earliest retained offset {end}"
                         for p, end in sorted(ends.items()) if end > since[p]]  # the partition of key 90's event
                halted = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance,
                                                                                   raise_on_error=False)
                assert not halted.success and any(gap in failure for failure in h.failures(halted)), \
                    h.failures(halted)
                retained = evaluation(run("shop_rows_match_source_job"))
                assert not retained.passed and retained.severity == AssetCheckSeverity.ERROR, retained.description
                assert "deleted by retention before they were merged" in (retained.description or "")
                assert [gap in entry for entry in retained.metadata["lost_to_retention"].value] == [True]
                assert retained.metadata["waited_s"].value < 5, retained.metadata["waited_s"]
                named = [key for bucket in retained.metadata["drifted_buckets"].value for key in bucket["sample_keys"]]
                if named:  # the look found the slot confirmed past the source's position: the keys settle at once
                    assert sorted(named) == ["different: 60", "different: 61", "different: 90", "missing: 301"], named
                else:  # the slot had not confirmed it yet (the suite's load): counted, never named wrongly
                    assert "cannot be named" in (retained.description or ""), retained.description
                assert "drifted_ranges" not in retained.metadata  # a snapshot's reads would wait behind the gap
                assert tick(cursor).run_requests == []
            finally:
                redeployed.stop()
    finally:
        runner.stop()
        h.drop_replication_slots(dsn)
        os.environ.pop(DSN_ENV, None)


def _check_history(instance: DagsterInstance, check: AssetCheckKey) -> list[Any]:
    """The check's evaluations, oldest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        check, limit=100, status={AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED})
    return [r.event.dagster_event.event_specific_data for r in reversed(records)
            if r.event is not None and r.event.dagster_event is not None]
