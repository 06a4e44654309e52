"""The backfill sensor: tables with a missing or empty Delta target get a snapshot and a merge run."""

import json

import pyarrow as pa
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable, write_deltalake

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.jobs.test_snapshots import CONFIG


def test_missing_target_requests_snapshot_and_merge_once_then_again_when_empty(broker, tmp_path):
    text = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, signal_topic="s")
    defs = build_definitions(parse_config(text))
    sensor = defs.resolve_sensor_def("snapshot_backfill_sensor")
    with DagsterInstance.ephemeral() as instance:
        first = sensor.evaluate_tick(build_sensor_context(instance=instance))
        assert [(r.job_name, r.run_key) for r in first.run_requests] == [
            ("incremental_snapshot_job", "snapshot-backfill:dbserver1.inventory.customers"),
            ("cdc_merge_job", "snapshot-backfill:dbserver1.inventory.customers:merge")]
        assert first.run_requests[0].run_config["ops"]["send_execute_snapshot"]["config"]["tables"] == [
            "inventory.customers"]
        assert [k.path for k in first.run_requests[1].asset_selection] == [["dbserver1", "inventory", "customers"]]

        # Re-evaluated with the advanced cursor: nothing new is requested.
        again = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=first.cursor))
        assert again.run_requests == [] and json.loads(again.cursor) == ["dbserver1.inventory.customers"]

        # Once the table has rows it leaves the cursor; emptied again, it is requested again.
        path = str(tmp_path / "dbserver1" / "inventory" / "customers")
        write_deltalake(path, pa.table({"id": [1]}))
        filled = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=again.cursor))
        assert filled.run_requests == [] and json.loads(filled.cursor) == []
        DeltaTable(path).delete()
        emptied = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=filled.cursor))
        assert len(emptied.run_requests) == 2
