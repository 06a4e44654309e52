"""Schema-change sensor and apply job end to end: seed 004's Db2 CREATE, then ALTER and DROP."""

import json
import uuid

import pytest
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.core.position import source_position_of
from cdc_assets.core.schema_change import SchemaChangeError
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import db2_source, encode_key, envelope
from cdc_assets.io.registry import read_registry
from cdc_assets.resources import registry_path
from tests.support.schema_changes import COLUMNS, schema_change
from tests.support.topics import produce, read_topic

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
connectors:
  - name: db2
    kind: db2
    topic.prefix: {prefix}
    include: ['DB2INST1\\.CUST.*']
    signal: {{channel: kafka, topic: {prefix}.signals}}
"""


def load(broker, tmp_path, prefix):
    """Build the code location as a reload would (reads the registry again)."""
    return build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        prefix=prefix)))


def tick(defs, instance, name, cursor=None):
    return defs.resolve_sensor_def(name).evaluate_tick(build_sensor_context(instance=instance, cursor=cursor,
                                                                            definitions=defs))


def run_requested(defs, request, instance):
    job = defs.resolve_job_def(request.job_name or "apply_schema_change_job")
    result = job.execute_in_process(run_config=request.run_config, instance=instance)
    assert result.success
    return result


def test_create_alter_drop_reach_delta_and_the_asset_graph(spark, broker, tmp_path):
    prefix = f"testdb_{uuid.uuid4().hex[:8]}"  # no dot: Kafka refuses names that differ only in '.' and '_'
    key = encode_key({"databaseName": "TESTDB"})
    produce(broker, new_topic_named(broker, prefix), [(key, schema_change("CREATE", COLUMNS)),
                                                      (key, schema_change("CREATE", COLUMNS, table="ORDERS"))])
    with DagsterInstance.ephemeral() as instance:
        defs = load(broker, tmp_path, prefix)
        assert not any(k.path[-1] == "CUSTOMERS" for k in defs.resolve_all_asset_keys())
        first = tick(defs, instance, "schema_change_sensor")
        # ORDERS is not matched by the include pattern: only CUSTOMERS is acted on.
        assert [r.run_key for r in first.run_requests] == [f"schema-change:{prefix}:0:0:0"]
        assert json.loads(first.cursor) == {prefix: {"0": 2}}
        assert tick(defs, instance, "schema_change_sensor", first.cursor).run_requests == []
        result = run_requested(defs, first.run_requests[0], instance)
        path = str(tmp_path / prefix / "DB2INST1" / "CUSTOMERS")
        schema = {f.name: f.type for f in DeltaTable(path).schema().fields}
        assert [n for n in schema if not n.startswith("_cdc_")] == ["ID", "FIRST_NAME", "LAST_NAME", "EMAIL"]
        assert str(schema["ID"]) == "PrimitiveType(\"long\")"
        materialization = result.asset_materializations_for_node("apply_schema_change")[0]
        assert materialization.metadata["change"].value == "CREATE"
        assert materialization.metadata["source_position"].value == source_position_of(
            {"commit_lsn": "00000025:00000d98:00a2"}, "db2")

        # Reload: the new table is an asset; the backfill sensor asks for a snapshot and a merge.
        defs = load(broker, tmp_path, prefix)
        asset_key = [prefix, "DB2INST1", "CUSTOMERS"]
        assert asset_key in [k.path for k in defs.resolve_all_asset_keys()]
        backfill = tick(defs, instance, "snapshot_backfill_sensor")
        assert [r.job_name for r in backfill.run_requests] == ["incremental_snapshot_job", "cdc_merge_job"]
        run_requested(defs, backfill.run_requests[0], instance)
        assert read_topic(broker, f"{prefix}.signals")[0][1]["data"]["data-collections"] == ["DB2INST1.CUSTOMERS"]

        # The connector's snapshot reads arrive; the backfill merge applies them.
        data_topic = new_topic_named(broker, f"{prefix}.DB2INST1.CUSTOMERS")
        row = {"ID": 1, "FIRST_NAME": "Ann", "LAST_NAME": "Lee", "EMAIL": "a@x"}
        source = db2_source(None, "00000026:00000001:0001", 1, "DB2INST1", "CUSTOMERS", snapshot="incremental")
        produce(broker, data_topic, [(encode_key({"ID": 1}), envelope("r", None, row, source, 1))])
        merge = defs.resolve_job_def("cdc_merge_job").execute_in_process(
            instance=instance, asset_selection=[k for k in defs.resolve_all_asset_keys() if k.path == asset_key])
        assert merge.success
        assert DeltaTable(path).to_pyarrow_table(columns=["ID", "EMAIL"]).to_pylist() == [{"ID": 1, "EMAIL": "a@x"}]

        # ALTER adds PHONE and widens ID to BIGINT: old rows read null, new rows carry values.
        altered = [{**COLUMNS[0], "jdbcType": -5, "typeName": "bigint"}, *COLUMNS[1:],
                   {"name": "PHONE", "jdbcType": 12, "typeName": "varchar", "length": 20, "position": 5,
                    "optional": True}]
        produce(broker, prefix, [(key, schema_change("ALTER", altered, commit_lsn="00000027:00000001:0001",
                                                     snapshot="false"))])
        second = tick(defs, instance, "schema_change_sensor", first.cursor)
        [alter_request] = [r for r in second.run_requests if "ALTER" in r.tags["cdc_assets/schema_change"]]
        result = run_requested(defs, alter_request, instance)
        metadata = result.asset_materializations_for_node("apply_schema_change")[0].metadata
        assert metadata["added_columns"].value == ["PHONE"] and metadata["widened_columns"].value == ["ID"]
        new_row = {**row, "ID": 2, "PHONE": "555"}
        produce(broker, data_topic, [(encode_key({"ID": 2}), envelope(
            "c", None, new_row, db2_source("00000027:00000002:0001", "00000027:00000002:0001", 2, "DB2INST1",
                                           "CUSTOMERS"), 2))])
        defs.resolve_job_def("cdc_merge_job").execute_in_process(
            instance=instance, asset_selection=[k for k in defs.resolve_all_asset_keys() if k.path == asset_key])
        rows = sorted(DeltaTable(path).to_pyarrow_table(columns=["ID", "PHONE"]).to_pylist(), key=lambda r: r["ID"])
        assert rows == [{"ID": 1, "PHONE": None}, {"ID": 2, "PHONE": "555"}]

        # A row inserted just before the DROP, not merged yet: the DROP's run merges it first.
        last_row = {**row, "ID": 3, "PHONE": "556"}
        produce(broker, data_topic, [(encode_key({"ID": 3}), envelope(
            "c", None, last_row, db2_source("00000027:00000003:0001", "00000027:00000003:0001", 3, "DB2INST1",
                                            "CUSTOMERS"), 3))])
        # DROP retires the asset: kept, marked, no longer in cdc_merge_job; data kept as of the DROP.
        produce(broker, prefix, [(key, schema_change("DROP", [], commit_lsn="00000028:00000001:0001",
                                                     snapshot="false"))])
        third = tick(defs, instance, "schema_change_sensor", second.cursor)
        [drop_request] = [r for r in third.run_requests if "DROP" in r.tags["cdc_assets/schema_change"]]
        dropped = run_requested(defs, drop_request, instance)
        drop_metadata = dropped.asset_materializations_for_node("apply_schema_change")[0].metadata
        assert drop_metadata["events_merged_before_drop"].value == 1
        defs = load(broker, tmp_path, prefix)
        spec = next(s for s in defs.resolve_all_asset_specs() if s.key.path == asset_key)
        assert spec.tags["cdc_assets/status"] == "retired" and spec.metadata["retired"] is True
        merge_keys = defs.resolve_job_def("cdc_merge_job").asset_layer.executable_asset_keys
        assert all(k.path != asset_key for k in merge_keys)
        scheduled = defs.resolve_job_def("cdc_freshness_job").asset_layer.asset_graph.asset_check_keys
        assert all(k.asset_key.path != asset_key for k in scheduled)  # nor in the scheduled checks
        assert DeltaTable(path).count() == 3
        assert DeltaTable(path).metadata().configuration["cdc_assets.retired"] == "true"


def test_schema_changes_applied_in_any_order_give_the_same_table(broker, tmp_path):
    """The snapshot's DROP TABLE IF EXISTS + CREATE, then ADD PHONE and DROP EMAIL: their runs finishing
    in source order and in reverse leave the same Delta table, live, with EMAIL listed as dropped."""
    key = encode_key({"databaseName": "TESTDB"})
    with_phone = [*COLUMNS, {"name": "PHONE", "jdbcType": 12, "typeName": "varchar", "length": 20, "position": 5}]
    without_email = [c for c in with_phone if c["name"] != "EMAIL"]
    events = [(key, schema_change("DROP", [], commit_lsn="00000025:00000d98:00a2")),
              (key, schema_change("CREATE", COLUMNS, commit_lsn="00000025:00000d98:00a2")),
              (key, schema_change("ALTER", with_phone, commit_lsn="00000027:00000001:0001", snapshot="false")),
              (key, schema_change("ALTER", without_email, commit_lsn="00000029:00000001:0001", snapshot="false")),
              # replayed after a connector restart: changes nothing
              (key, schema_change("ALTER", without_email, commit_lsn="00000029:00000001:0001", snapshot="false"))]
    tables = {}
    for order in ("source", "reverse"):
        prefix = f"orderdb_{order}_{uuid.uuid4().hex[:6]}"
        produce(broker, new_topic_named(broker, prefix), events)
        with DagsterInstance.ephemeral() as instance:
            defs = load(broker, tmp_path, prefix)
            requests = tick(defs, instance, "schema_change_sensor").run_requests
            # the snapshot's DROP is not acted on
            assert [r.run_key.rsplit(":", 2)[1] for r in requests] == ["1", "2", "3", "4"]
            for request in requests if order == "source" else reversed(requests):
                run_requested(defs, request, instance)
            path = str(tmp_path / prefix / "DB2INST1" / "CUSTOMERS")
            table = DeltaTable(path)
            tables[order] = ({f.name for f in table.schema().fields},
                             table.metadata().configuration.get("cdc_assets.dropped_columns"),
                             table.metadata().configuration.get("cdc_assets.retired", "false"))
            spec = next(s for s in load(broker, tmp_path, prefix).resolve_all_asset_specs()
                        if s.key.path[-1] == "CUSTOMERS" and s.key.path[0] != "kafka")  # not its topic
            assert spec.tags["cdc_assets/status"] == "active"
    assert tables["source"] == tables["reverse"]
    columns, dropped, retired = tables["source"]
    assert {"ID", "FIRST_NAME", "LAST_NAME", "EMAIL", "PHONE"} <= columns
    assert (dropped, retired) == ("EMAIL", "false")


def test_a_failed_schema_change_run_leaves_the_registry_as_it_was(broker, tmp_path):
    """An ALTER the wide-type policy refuses fails its run before the table changes: the registry keeps the
    CREATE as the table's latest change (the asset loads as before), so a retry does the whole change."""
    key = encode_key({"databaseName": "TESTDB"})
    amount = {"name": "AMOUNT", "jdbcType": 3, "typeName": "decimal", "length": 10, "scale": 2, "position": 5}
    produce(broker, new_topic_named(broker, prefix := f"faildb_{uuid.uuid4().hex[:8]}"), [
        (key, schema_change("CREATE", [*COLUMNS, amount])),
        (key, schema_change("ALTER", [*COLUMNS, {**amount, "scale": 4}], commit_lsn="00000027:00000001:0001",
                            snapshot="false"))])
    with DagsterInstance.ephemeral() as instance:
        defs = load(broker, tmp_path, prefix)
        create, alter = tick(defs, instance, "schema_change_sensor").run_requests
        run_requested(defs, create, instance)
        failed = defs.resolve_job_def("apply_schema_change_job").execute_in_process(
            run_config=alter.run_config, instance=instance, raise_on_error=False)
        assert not failed.success
        assert "the wide-type policy cannot absorb" in str(failed.get_step_failure_events()[0].event_specific_data)
        config = parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, prefix=prefix))
        entry = read_registry(registry_path(config), {})[("db2", "DB2INST1.CUSTOMERS")]
        assert entry.change == "CREATE"


def test_a_malformed_schema_change_event_stops_the_cursor_before_it(broker, tmp_path):
    prefix = f"baddb_{uuid.uuid4().hex[:8]}"  # no dot: Kafka refuses names that differ only in '.' and '_'
    key = encode_key({"databaseName": "TESTDB"})
    produce(broker, new_topic_named(broker, prefix), [(key, schema_change("CREATE", COLUMNS)),
                                                      (key, b'{"payload": {"ddl": "x"}}'),
                                                      (key, schema_change("CREATE", COLUMNS, table="CUSTX"))])
    with DagsterInstance.ephemeral() as instance:
        defs = load(broker, tmp_path, prefix)
        first = tick(defs, instance, "schema_change_sensor")
        assert [r.run_key for r in first.run_requests] == [f"schema-change:{prefix}:0:0:0"]
        assert json.loads(first.cursor) == {prefix: {"0": 1}}  # not past the bad event at offset 1
        with pytest.raises(Exception, match=rf"{prefix} partition 0 offset 1: value has no 'tableChanges'"):
            tick(defs, instance, "schema_change_sensor", first.cursor)


def test_unabsorbable_type_change_fails_clearly(broker, tmp_path):
    from cdc_assets.core.schema_change import diff_schema, parse_schema_change

    before = parse_schema_change(schema_change("CREATE", [{"name": "P", "jdbcType": 3, "scale": 2}]), "db2")
    after = parse_schema_change(schema_change("ALTER", [{"name": "P", "jdbcType": 3, "scale": 4}]), "db2")
    diff = diff_schema(before.changes[0].columns, after.changes[0].columns)
    assert diff.refused == ("P: decimal(38,2) -> decimal(38,4)",)
    with pytest.raises(SchemaChangeError, match="lists no columns"):
        parse_schema_change(schema_change("ALTER", []), "db2")


def new_topic_named(broker, topic):
    """Create a topic with exactly this name (schema-change topics are named by the prefix)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result()
    return topic
