"""rows_match_source without a database: which columns each side compares and how, what counts as a differing
bucket or key, and the code location's check, job and schedule for a connector that names a source DSN."""

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DefaultScheduleStatus, build_schedule_context
from pyspark.sql import types as T

from cdc_assets.config import ConfigError, parse_config
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.reconcile import (
    KeyRow,
    TableQueries,
    compared_columns,
    differing_buckets,
    key_differences,
    key_rows,
    live_rows,
)
from cdc_assets.definitions import build_definitions


def test_columns_compared_by_delta_type_and_source_type_hidden_and_untyped_ones_left_out():
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("wide", T.StringType()),
                           T.StructField("at", T.StringType()), T.StructField("price", T.DoubleType()),
                           T.StructField("tags", T.ArrayType(T.StringType())), T.StructField("gone", T.StringType()),
                           T.StructField("_cdc_position", T.StringType())])
    types = {"id": "bigint", "wide": "numeric", "at": "time", "price": "float", "tags": "json"}
    compared, left_out = compared_columns(schema, types, "mysql")
    assert [(c.name, c.canonical) for c in compared] == [("id", "integer"), ("wide", "decimal"), ("at", "time")]
    assert left_out == ["price", "tags", "gone"]  # no rule for MariaDB's FLOAT, no struct rule, not at the source
    compared, _ = compared_columns(schema, {**types, "price": "double"}, "mysql")
    assert ("price", "double") in [(c.name, c.canonical) for c in compared]
    compared, _ = compared_columns(schema, {**types, "price": "double precision"}, "postgresql")
    assert ("price", "double") in [(c.name, c.canonical) for c in compared]


def test_each_apply_mode_compares_the_rows_that_stand_for_the_source():
    assert live_rows(apply_mode("scd1")) is None
    assert live_rows(apply_mode("soft_delete")) == "NOT coalesce(`_cdc_deleted`, false)"
    assert live_rows(apply_mode("scd2")) == "`_cdc_current`"
    compared, _ = compared_columns(T.StructType([T.StructField("id", T.LongType())]), {"id": "int"}, "spark")
    queries = TableQueries("t", tuple(compared), tuple(compared), 8, "spark", live_rows(apply_mode("scd2")))
    assert "WHERE `_cdc_current` GROUP BY" not in queries.checksums()  # the filter is inside the bucket query
    assert "FROM t WHERE `_cdc_current`" in queries.checksums()
    assert "WHERE `_cdc_current` AND MOD(" in queries.rows_in([3, 1])


def test_differing_buckets_and_keys_say_missing_extra_and_different():
    assert differing_buckets({0: (2, 10), 1: (1, 5), 2: (1, 7)}, {0: (2, 10), 1: (1, 6), 3: (1, 1)}) == [1, 2, 3]
    source = {"k1": KeyRow("1", "a", 0), "k2": KeyRow("2", "b", 1), "k3": KeyRow("3", "c", 1)}
    delta = {"k1": KeyRow("1", "a", 0), "k2": KeyRow("2", "x", 1), "k4": KeyRow("4", "d", 2)}
    found = key_differences(source, delta)
    assert {key: (d.kind, d.bucket) for key, d in found.items()} == {
        "k2": ("different", 1), "k3": ("missing", 1), "k4": ("extra", 2)}
    twice = key_rows([("k1", "1", "a", 0), ("k1", "1", "a", 0)])  # two current versions of one key
    assert twice["k1"].copies == 2 and key_differences({"k1": KeyRow("1", "a", 0)}, twice)["k1"].kind == "extra"


def test_a_connector_with_a_source_dsn_gets_the_check_its_own_job_and_a_stopped_schedule(tmp_path):
    defs = build_definitions(parse_config(f"""\
kafka: {{bootstrap_servers: '127.0.0.1:9'}}
delta: {{root: '{tmp_path}'}}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables: [{{name: inventory.items}}, {{name: inventory.orders, apply_mode: scd2}}]
    rows_match_source: {{dsn_env: INVENTORY_DSN, cron: "0 3 * * *"}}
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    tables: [{{name: dbo.orders}}]
"""))
    graph = defs.resolve_asset_graph()
    items, orders = AssetKey(["dbserver1", "inventory", "items"]), AssetKey(["dbserver1", "inventory", "orders"])
    assert "rows_match_source" in {k.name for k in graph.get(items).check_keys}
    assert "current versions" in graph.get_check_spec(
        next(k for k in graph.get(orders).check_keys if k.name == "rows_match_source")).description
    assert "rows_match_source" not in {k.name for k in graph.get(AssetKey(["server1", "dbo", "orders"])).check_keys}
    job = defs.resolve_job_def("inventory_rows_match_source_job")
    assert {node.name for node in job.nodes} == {"inventory_rows_match_source"}
    for other in ("cdc_merge_job", "cdc_freshness_job"):
        assert "inventory_rows_match_source" not in {node.name for node in defs.resolve_job_def(other).nodes}
    schedule = defs.resolve_schedule_def("inventory_rows_match_source_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.default_status == DefaultScheduleStatus.STOPPED


def test_a_table_with_a_cron_of_its_own_leaves_its_connectors_schedule(tmp_path):
    defs = build_definitions(parse_config(f"""\
kafka: {{bootstrap_servers: '127.0.0.1:9'}}
delta: {{root: '{tmp_path}'}}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables:
      - {{name: inventory.items}}
      - {{name: inventory.orders, rows_match_source: {{cron: "*/30 * * * *", running: true}}}}
    rows_match_source: {{dsn_env: INVENTORY_DSN, cron: "0 3 * * *"}}
"""))
    items, orders = (AssetCheckKey(AssetKey(["dbserver1", "inventory", name]), "rows_match_source")
                     for name in ("items", "orders"))
    job = defs.resolve_job_def("inventory_rows_match_source_job")
    for name, cron, status, key in (
            ("inventory_rows_match_source_schedule", "0 3 * * *", DefaultScheduleStatus.STOPPED, items),
            ("inventory_inventory_orders_rows_match_source_schedule", "*/30 * * * *", DefaultScheduleStatus.RUNNING,
             orders)):
        schedule = defs.resolve_schedule_def(name)
        assert (schedule.cron_schedule, schedule.default_status, schedule.job_name) == (cron, status, job.name)
        with DagsterInstance.ephemeral() as instance:
            [request] = schedule.evaluate_tick(build_schedule_context(instance)).run_requests or []
        assert request.asset_check_keys == [key]
        # The run the scheduler makes of the request (the job's subset) holds that check alone.
        subset = job.get_subset(asset_check_selection=set(request.asset_check_keys))
        assert subset.asset_layer.asset_graph.asset_check_keys == {key}


def test_a_table_schedule_needs_a_connector_that_reads_its_source():
    with pytest.raises(ConfigError, match=r"table 'dbo\.orders': a rows_match_source schedule needs"):
        parse_config("""\
kafka: {bootstrap_servers: '127.0.0.1:9'}
delta: {root: '/tmp/x'}
connectors:
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    tables: [{name: dbo.orders, rows_match_source: {cron: "0 * * * *"}}]
""")


def test_a_binlog_offset_of_kafka_connect_as_a_position_none_while_its_snapshot_runs():
    from cdc_assets.io.reconcile import _binlog_position

    streaming = {"file": "mariadb-bin.000002", "pos": 4711, "row": 1, "event": 2, "gtids": "0-1-40", "ts_sec": 1}
    later_file = {"file": "mariadb-bin.000010", "pos": 4, "ts_sec": 1}
    assert _binlog_position(streaming, "mariadb") == _binlog_position({**streaming, "row": 0}, "mariadb")
    assert _binlog_position(later_file, "mariadb") > _binlog_position(streaming, "mariadb")  # type: ignore[operator]
    assert _binlog_position({**streaming, "snapshot": "true"}, "mariadb") is None  # its rows are not all sent
    assert _binlog_position({**streaming, "snapshot": True, "snapshot_completed": True}, "mariadb") is not None
    assert _binlog_position({"ts_sec": 1}, "mariadb") is None


def test_the_source_table_is_the_one_the_topic_names_else_the_tables_name(tmp_path):
    from cdc_assets.catalog import resolve_tables

    tables = {table.name: table for table in resolve_tables(parse_config(f"""\
kafka: {{bootstrap_servers: '127.0.0.1:9'}}
delta: {{root: '{tmp_path}'}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: db1.eu
    tables:
      - {{name: public.items}}
      - {{name: public.items_history, topic: db1.eu.public.items, apply_mode: scd2}}
      - {{name: public.routed, topic: all_shop_changes}}
"""), list_topics=lambda: [])}
    # A second Delta table of one topic reads its topic's source table; a routed topic's table is its name.
    assert [tables[name].source_table for name in ("public.items", "public.items_history", "public.routed")] == [
        "public.items", "public.items", "public.routed"]
