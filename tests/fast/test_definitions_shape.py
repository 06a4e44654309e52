"""The code location's shape without a broker or Spark: each captured table is an asset with checks of
its own, but the ops are a few per connector however many tables it captures (one op per table and
check made the load take minutes with thousands of tables)."""

from dagster import AssetCheckKey, AssetKey

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions

POST_MERGE = {"unique_keys", "no_null_keys", "capture_lag", "no_dead_letters", "schema_matches_source"}


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
    assert len(list(graph.get_all_asset_keys())) == 51
    assert {k.name for k in graph.get(table).check_keys} == {*POST_MERGE, "freshness"}
    assert {k.name for k in graph.get(orders).check_keys} == {
        *POST_MERGE, "freshness", "transactions_reconciled", "consistent_watermark_fresh"}
    node = graph.get(table)
    assert node.group_name == "inventory" and {"spark", "delta", "kafka"} <= set(node.kinds)
    assert node.tags["cdc_assets/status"] == "active" and node.metadata["source_table"] == "inventory.t7"
    assert node.freshness_policy is not None

    merge_op = defs.get_assets_def(table)
    assert merge_op.node_def.name == "inventory_merge" and merge_op.can_subset
    assert merge_op.node_def.pool == "cdc_connector_inventory"
    blocking = {spec.name for spec in merge_op.check_specs if spec.key.asset_key == table and spec.blocking}
    assert blocking == {"unique_keys", "no_null_keys"}

    # Two ops per connector (merge, freshness), with 50 tables or one; the merge job runs the merges
    # and the checks they evaluate, not the live freshness checks (their own job).
    merge_job = defs.resolve_job_def("cdc_merge_job")
    assert sorted(node.name for node in merge_job.graph.nodes) == ["inventory_merge", "sales_merge"]
    assert "max_records_per_batch" in str(merge_op.node_def.config_schema.config_type.fields)  # type: ignore[union-attr]

    # The live freshness job runs only the freshness checks, in their own ops (no pool, no merge).
    freshness_job = defs.resolve_job_def("cdc_freshness_job")
    assert sorted(node.name for node in freshness_job.graph.nodes) == ["inventory_freshness", "sales_freshness"]
    assert AssetCheckKey(table, "freshness") in freshness_job.asset_layer.asset_graph.asset_check_keys
