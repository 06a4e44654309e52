"""The rows_match_source check as the code location defines it: its own job and stopped schedule, in no merge or
freshness run; run on a real PostgreSQL (a logical slot its "connector" keeps confirming), a real Kafka topic
and a Delta table merged by the project's writer, it passes on equal tables and names a row deleted from the
Delta table by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DefaultScheduleStatus
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.support.reconcile import SlotAdvancer, World, merged_world

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: inventory.items, key_columns: [id, region], path: "{path}"}}]
    rows_match_source: {{dsn_env: RECONCILE_TEST_DSN, buckets: 16, settle_timeout_s: 120, cron: "0 3 * * *"}}
"""


@pytest.fixture
def world(postgres: Any, broker: Any, tmp_path: Path) -> Iterator[World]:
    world = merged_world(postgres, broker, tmp_path, "recon")
    yield world
    world.connection.close()


def test_rows_match_source_runs_in_its_own_job_passes_then_names_drift(world: World, broker: Any, spark: Any,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILE_TEST_DSN", world.dsn)
    prefix = world.prefix  # type: ignore[attr-defined]
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        prefix=prefix, path=world.target.path)), topics=[])
    key = AssetKey([prefix, "inventory", "items"])
    check = AssetCheckKey(key, "rows_match_source")
    job = defs.resolve_job_def("shop_rows_match_source_job")
    schedule = defs.resolve_schedule_def("shop_rows_match_source_schedule")
    assert schedule.job_name == job.name and schedule.default_status == DefaultScheduleStatus.STOPPED
    assert "shop_rows_match_source" in {node.name for node in job.nodes}
    for other in ("cdc_merge_job", "cdc_freshness_job"):  # no merge or freshness run waits for a comparison
        assert "shop_rows_match_source" not in {node.name for node in defs.resolve_job_def(other).nodes}
    assert check in defs.resolve_asset_graph().asset_check_keys  # on demand from the UI

    with SlotAdvancer(world), DagsterInstance.ephemeral() as instance:
        passed = _evaluation(job.execute_in_process(instance=instance))
        assert passed.passed, passed.description
        assert passed.metadata["source_rows"].value == passed.metadata["delta_rows"].value == 200
        assert passed.metadata["compared"].value == "rows" and passed.metadata["source_position"].value

        DeltaTable(world.target.path).delete("id = 5")  # behind the pipeline's back
        failed = _evaluation(job.execute_in_process(instance=instance))
    assert not failed.passed and "1 key(s) missing" in (failed.description or "")
    [bucket] = failed.metadata["drifted_buckets"].value
    assert bucket["missing"] == 1 and bucket["sample_keys"] == ["missing: 5, Zürich's"]
    assert failed.metadata["delta_rows"].value == 199 and failed.metadata["source_s"].value > 0


def _evaluation(result: Any) -> Any:
    assert result.success
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "rows_match_source"]
    return evaluation
