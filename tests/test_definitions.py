"""The code location: assets, groups, kinds and the merge job, run for real through Dagster."""

import subprocess
import sys

from dagster import AssetKey, materialize
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.sample import publish_sample

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
  writer: delta-rs
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables:
      - name: inventory.products
      - name: inventory.customers
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    tables:
      - name: dbo.orders
"""

KEYS = [AssetKey(["dbserver1", "inventory", "products"]), AssetKey(["dbserver1", "inventory", "customers"]),
        AssetKey(["server1", "dbo", "orders"])]


def test_merge_job_applies_the_sample_and_reports_metadata(spark, broker, tmp_path):
    publish_sample(broker.bootstrap_servers)
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path)))

    graph = defs.resolve_asset_graph()
    assert set(graph.get_all_asset_keys()) == set(KEYS)
    products = graph.get(KEYS[0])
    assert products.group_name == "inventory" and graph.get(KEYS[2]).group_name == "sales"
    assert {"spark", "delta", "kafka"} <= set(products.kinds)

    job = defs.resolve_job_def("cdc_merge_job")
    result = job.execute_in_process()
    assert result.success
    materializations = {m.asset_key: m.metadata for m in result.get_asset_materialization_events()
                        for m in [m.event_specific_data.materialization]}
    assert set(materializations) == set(KEYS)
    products_md = materializations[KEYS[0]]
    assert products_md["rows_inserted"].value == 10 and products_md["tombstones_skipped"].value == 1
    assert products_md["events_read"].value == 16 and products_md["delta_version"].value == 1
    assert products_md["capture_lag_s"].value > 0
    assert products_md["offsets"].value == {"0": {"from": 0, "to": 16, "high_watermark": 16}}
    orders = DeltaTable(str(tmp_path / "server1" / "dbo" / "orders")).to_pyarrow_table().to_pylist()
    assert sorted(row["id"] for row in orders) == [10001, 10003, 10004, 10005]  # 10002 became 10005
    assert next(row for row in orders if row["id"] == 10001)["quantity"] == 9

    # A second run finds nothing new: no events read, nothing changes.
    again = materialize([defs.get_assets_def(KEYS[1])], resources=defs.resources)
    metadata = again.asset_materializations_for_node(again.get_asset_materialization_events()[0].node_name)[0].metadata
    assert metadata["events_read"].value == 0
    assert DeltaTable(str(tmp_path / "dbserver1" / "inventory" / "customers")).version() == 1


def test_a_broken_config_is_a_readable_error_at_load(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.format(bootstrap="x:1", root=tmp_path).replace("kind: sqlserver", "kind: sybase"))
    load = subprocess.run([sys.executable, "-c", "import cdc_assets.definitions"], capture_output=True, text=True,
                          env={"CDC_ASSETS_CONFIG": str(bad), "PATH": ""})
    assert load.returncode != 0
    assert f"{bad}:line 14: connectors.1.kind" in load.stderr
