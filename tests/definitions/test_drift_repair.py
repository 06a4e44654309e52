"""drift_repair_sensor as the code location defines it, on a real PostgreSQL (source table, signal table and a
logical slot its "connector" keeps confirming), a real Kafka topic and a real Dagster instance, without Debezium
(tests/conformance/test_drift_repair_real.py runs it with one): stopped by default and defined only where a
connector has a signal channel; a key in Delta only asks for no snapshot; a snapshot no connector acts on is taken
as done after repair_timeout_s, and the re-check that still fails is not repaired again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DefaultSensorStatus, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from sensors.drift_repair import REPAIR_TAG, STEP_TAG
from tests.support.reconcile import SlotAdvancer, World, merged_world, source_row

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    {signal}
    tables: [{{name: inventory.items, key_columns: [id, region], path: "{path}"}}]
    rows_match_source: {{dsn_env: DRIFT_REPAIR_TEST_DSN, buckets: 16, settle_timeout_s: 120, repair_timeout_s: 2}}
"""
SIGNAL = "signal: {channel: source, table: inventory.debezium_signal, dsn_env: DRIFT_REPAIR_TEST_DSN}"


@pytest.fixture
def world(postgres: Any, broker: Any, tmp_path: Path) -> Iterator[World]:
    world = merged_world(postgres, broker, tmp_path, "repair",
                         "CREATE TABLE inventory.debezium_signal (id varchar(64) PRIMARY KEY, "
                         "type varchar(32) NOT NULL, data varchar(2048))")
    yield world
    world.connection.close()


def test_the_sensor_is_stopped_by_default_and_needs_a_signal_channel(world: World, broker: Any,
                                                                     tmp_path: Path) -> None:
    prefix = world.prefix  # type: ignore[attr-defined]
    settings = {"bootstrap": broker.bootstrap_servers, "root": tmp_path, "prefix": prefix, "path": world.target.path}
    defs = build_definitions(parse_config(CONFIG.format(signal=SIGNAL, **settings)), topics=[])
    sensor = defs.resolve_sensor_def("drift_repair_sensor")
    assert sensor.default_status == DefaultSensorStatus.STOPPED
    assert {"incremental_snapshot_job", "shop_rows_match_source_job"} <= {job.name for job in sensor.jobs}
    unsignalled = build_definitions(parse_config(CONFIG.format(signal="", **settings)), topics=[])
    assert "drift_repair_sensor" not in {s.name for s in unsignalled.sensors or []}


def test_a_repair_that_did_not_heal_is_not_repaired_again(world: World, broker: Any, spark: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRIFT_REPAIR_TEST_DSN", world.dsn)
    prefix = world.prefix  # type: ignore[attr-defined]
    defs = build_definitions(parse_config(CONFIG.format(
        bootstrap=broker.bootstrap_servers, root=tmp_path, prefix=prefix, path=world.target.path, signal=SIGNAL)),
        topics=[])
    check = AssetCheckKey(AssetKey([prefix, "inventory", "items"]), "rows_match_source")
    sensor = defs.resolve_sensor_def("drift_repair_sensor")

    with SlotAdvancer(world), DagsterInstance.ephemeral() as instance:
        def run(job: str, tags: dict[str, str] | None = None, run_config: dict | None = None,
                checks: list[AssetCheckKey] | None = None) -> Any:
            definition = defs.resolve_job_def(job)
            if checks is not None:  # the subset the daemon launches for a request naming checks alone
                definition = definition.get_subset(asset_selection=set(), asset_check_selection=set(checks))
            result = definition.execute_in_process(instance=instance, tags=tags, run_config=run_config)
            assert result.success
            return result

        def failed_check(tags: dict[str, str] | None = None, checks: list[AssetCheckKey] | None = None) -> Any:
            [found] = [e for e in run("shop_rows_match_source_job", tags, checks=checks).get_asset_check_evaluations()]
            assert not found.passed, found.description
            return found

        def tick(cursor: str | None) -> Any:
            return sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor, definitions=defs))

        world.merge([{**source_row(900), "region": "eu"}])  # in Delta only: no snapshot heals it
        assert failed_check().metadata["drifted_ranges"].value["extra_keys"] == 1
        extra_only = tick(None)
        assert extra_only.run_requests == [] and extra_only.asset_events == []

        DeltaTable(world.target.path).delete("id = 5")
        failed_check()
        requested = tick(extra_only.cursor)
        [snapshot] = requested.run_requests
        [condition] = snapshot.run_config["ops"]["send_execute_snapshot"]["config"]["additional_conditions"]
        rows = world.connection.execute(f"SELECT id, region FROM inventory.items WHERE {condition['filter']}")
        assert rows.fetchall() == [(5, "Zürich's")]  # not the extra key, which the source does not have
        run(snapshot.job_name, snapshot.tags, snapshot.run_config)  # sent: no connector reads it

        waiting = tick(requested.cursor)
        assert waiting.run_requests == []  # 1 source row selected, no read merged
        time.sleep(2.5)  # repair_timeout_s
        done = tick(waiting.cursor)
        [recheck] = done.run_requests
        assert recheck.tags[STEP_TAG] == "recheck" and recheck.tags[REPAIR_TAG] == snapshot.tags[REPAIR_TAG]
        assert recheck.asset_check_keys == [check]
        [observation] = done.asset_events
        assert observation.metadata["timed_out"].value is True
        assert observation.metadata["source_rows_selected"].value == 1
        assert observation.metadata["snapshot_reads_merged"].value == 0
        failed_check(recheck.tags, list(recheck.asset_check_keys or []))

        after = tick(done.cursor)
        assert after.run_requests == [] and after.asset_events == []  # not repaired again
        assert '"repairs": {}' in (after.cursor or "")
