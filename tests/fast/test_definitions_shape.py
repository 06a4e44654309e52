"""The code location's shape without a broker or Spark: each captured table is an asset with checks of
its own, but the ops are a few per connector however many tables it captures (one op per table and
check made the load take minutes with thousands of tables); which checks a merge run evaluates."""

import collections

from dagster import AssetKey, MaterializeResult

from cdc_assets.assets import report_metadata
from cdc_assets.catalog import resolve_tables
from cdc_assets.check_names import UNAVAILABLE_CHECK
from cdc_assets.checks import evaluate_table_checks, merge_run_checks
from cdc_assets.checks.merged import primary_key_result
from cdc_assets.config import parse_config
from cdc_assets.core.fold import BatchSummary
from cdc_assets.definitions import TABLES_PER_OP, build_definitions, op_groups
from cdc_assets.io.delta import KeyReport
from cdc_assets.io.kafka import RAW_SCHEMA, RawBatch
from cdc_assets.merge import BatchReport

POST_MERGE = {"primary_key", "capture_lag", "no_dead_letters", "schema_matches_source"}


def config(root, tables: int) -> str:
    listed = "\n".join(f"      - name: inventory.t{n}" for n in range(tables))
    return f"""\
kafka: {{bootstrap_servers: '127.0.0.1:9'}}
delta: {{root: '{root}'}}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables:
{listed}
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    transaction_metadata: true
    tables:
      - name: dbo.orders
"""


def test_every_table_has_its_asset_and_checks_in_a_few_ops_per_connector(tmp_path):
    defs = build_definitions(parse_config(config(tmp_path, 50)))
    graph = defs.resolve_asset_graph()
    table = AssetKey(["dbserver1", "inventory", "t7"])
    orders = AssetKey(["server1", "dbo", "orders"])
    assert len(list(graph.get_all_asset_keys())) == 2 * 51  # each table and its topic
    assert {k.name for k in graph.get(table).check_keys} == {*POST_MERGE, "freshness", UNAVAILABLE_CHECK}
    assert {k.name for k in graph.get(orders).check_keys} == {
        *POST_MERGE, "freshness", "transactions_reconciled", "consistent_watermark_fresh"}
    node = graph.get(table)
    assert node.group_name == "inventory" and {"spark", "delta", "kafka"} <= set(node.kinds)
    assert node.tags["cdc_assets/status"] == "active" and node.metadata["source_table"] == "inventory.t7"
    assert node.freshness_policy is not None

    merge_op = defs.get_assets_def(table)
    assert merge_op.node_def.name == "inventory_merge" and merge_op.can_subset
    assert merge_op.node_def.pool == "cdc_connector_inventory"
    # By default a merge run evaluates the blocking key checks; the warnings run on the freshness schedule.
    merged = {spec.name for spec in merge_op.check_specs if spec.key.asset_key == table}
    assert merged == {"primary_key", UNAVAILABLE_CHECK}  # PostgreSQL's TOAST may leave values unavailable
    assert all(spec.blocking for spec in merge_op.check_specs)

    # Three ops per connector (merge, freshness, the scheduled table checks), with 50 tables or one; the
    # merge job runs the merges and the checks they evaluate, not the scheduled ones (their own job).
    merge_job = defs.resolve_job_def("cdc_merge_job")
    assert sorted(node.name for node in merge_job.graph.nodes) == ["inventory_merge", "sales_merge"]
    assert "max_records_per_batch" in str(merge_op.node_def.config_schema.config_type.fields)  # type: ignore[union-attr]
    # A run request for some tables names their checks: else Dagster adds every check of theirs, in other ops.
    tables = {key: next(t for t in resolve_tables(parse_config(config(tmp_path, 50))) if t.name == name)
              for key, name in ((table, "inventory.t7"), (orders, "dbo.orders"))}
    assert {(key.asset_key, key.name) for key in merge_run_checks(tables)} == {
        *((key, "primary_key") for key in tables), (table, UNAVAILABLE_CHECK), (orders, "transactions_reconciled")}
    subset = merge_job.get_subset(asset_selection=set(tables), asset_check_selection=set(merge_run_checks(tables)))
    assert sorted(node.name for node in subset.graph.nodes) == ["inventory_merge", "sales_merge"]
    assert merge_job.get_subset(asset_selection={table}).graph.nodes != subset.graph.nodes  # what it avoids

    # The scheduled job runs only checks, in ops without a pool and without the merge.
    scheduled = defs.resolve_job_def("cdc_freshness_job")
    assert sorted(node.name for node in scheduled.graph.nodes) == [
        "inventory_freshness", "inventory_table_checks", "sales_freshness", "sales_table_checks"]
    assert {key.name for key in scheduled.asset_layer.asset_graph.asset_check_keys if key.asset_key == orders} == {
        "freshness", "capture_lag", "no_dead_letters", "schema_matches_source", "consistent_watermark_fresh"}


def test_checks_after_merge_all_keeps_every_table_check_in_the_merge_run(tmp_path):
    text = config(tmp_path, 3).replace("connectors:", "checks_after_merge: all\nconnectors:", 1)
    defs = build_definitions(parse_config(text))
    table = AssetKey(["dbserver1", "inventory", "t1"])
    assert {spec.name for spec in defs.get_assets_def(table).check_specs if spec.key.asset_key == table} == {
        *POST_MERGE, UNAVAILABLE_CHECK}
    scheduled = defs.resolve_job_def("cdc_freshness_job")
    assert sorted(node.name for node in scheduled.graph.nodes) == ["inventory_freshness", "sales_freshness"]
    [resolved] = [t for t in resolve_tables(parse_config(text)) if t.name == "inventory.t1"]
    assert {key.name for key in merge_run_checks({table: resolved})} == {*POST_MERGE, UNAVAILABLE_CHECK}


def test_a_connector_of_many_tables_spreads_over_ops_of_a_bounded_size(tmp_path):
    """An op's results cost Dagster a walk over all its outputs: a connector's tables go to ops of at most
    ``TABLES_PER_OP``, and the transaction-consistent ones stay together in the first."""
    defs = build_definitions(parse_config(config(tmp_path, 2 * TABLES_PER_OP + 5)))
    op_of = {key.path[-1]: defs.get_assets_def(key).node_def.name
             for key in defs.resolve_asset_graph().get_all_asset_keys() if key.path[0] == "dbserver1"}
    sizes = collections.Counter(op_of.values())
    assert sizes == {"inventory_merge": TABLES_PER_OP, "inventory_merge_2": TABLES_PER_OP, "inventory_merge_3": 5}
    assert op_of["t0"] == "inventory_merge" and op_of[f"t{2 * TABLES_PER_OP + 4}"] == "inventory_merge_3"
    assert sorted(node.name for node in defs.resolve_job_def("cdc_freshness_job").graph.nodes) == [
        f"inventory_{kind}{suffix}" for kind in ("freshness", "table_checks") for suffix in ("", "_2", "_3")
    ] + ["sales_freshness", "sales_table_checks"]

    tables = resolve_tables(parse_config(config(tmp_path, 5)))
    consistent = [t for t in tables if t.transactions is not None]  # sales's dbo.orders: the rule alone
    groups = op_groups([*tables[:4], *consistent], size=3)
    assert [(suffix, [t.name for t in group]) for suffix, group in groups] == [
        ("", ["dbo.orders", "inventory.t0", "inventory.t1"]), ("_2", ["inventory.t2", "inventory.t3"])]


def test_the_primary_key_check_fails_on_a_duplicate_or_a_null_key_and_says_which() -> None:
    key = AssetKey("t")
    assert primary_key_result(key, KeyReport(rows=5, duplicate_keys=0, null_keys=0)).passed
    assert primary_key_result(key, None).passed  # no batch applied yet
    nulls = primary_key_result(key, KeyReport(rows=5, duplicate_keys=0, null_keys=2))
    assert not nulls.passed and nulls.description == "2 row(s) have a null key"
    both = primary_key_result(key, KeyReport(rows=5, duplicate_keys=1, null_keys=2))
    assert not both.passed and both.description == "1 key(s) appear more than once; 2 row(s) have a null key"
    metadata = {name: value.value for name, value in both.metadata.items()}
    assert metadata == {"rows": 5, "duplicate_keys": 1, "null_keys": 2}


def test_unavailable_values_stored_as_null_show_in_the_materialization_and_fail_a_blocking_check(tmp_path) -> None:
    """A merge whose batches stored values the source left unavailable as null (no event nor row held them)
    says how many in its materialization, and its blocking check fails on that merge's count."""
    [table] = [t for t in resolve_tables(parse_config(config(tmp_path, 1))) if t.name == "inventory.t0"]
    key = AssetKey("t")
    raw = RawBatch(table.topic, RAW_SCHEMA.empty_table(), {0: 0}, {0: 4}, {0: 4}, 4)

    def merge(*never_seen: int) -> MaterializeResult:
        reports = [BatchReport(table, "delta-rs", raw, 0, BatchSummary(
            2, 1, 0, 1, 0, 0, None, None, None, (), unavailable_never_seen=n), None) for n in never_seen]
        return MaterializeResult(asset_key=key, metadata=report_metadata(reports))

    def check(materialized: MaterializeResult):  # the merge run's evaluation: no instance, Spark nor Delta read
        [result] = evaluate_table_checks(table, key, {UNAVAILABLE_CHECK}, None, None, None, None,  # type: ignore[arg-type]
                                         materialized)
        return result

    lost = merge(2, 0, 1)
    assert lost.metadata is not None and lost.metadata["unavailable_never_seen"] == 3
    failed = check(lost)
    assert not failed.passed and failed.description is not None and "stored 3 value(s)" in failed.description
    kept = merge(0)
    assert kept.metadata is not None and "unavailable_never_seen" not in kept.metadata and check(kept).passed
