"""The rows_match_source check as the code location defines it: its own job and stopped schedule, in no merge or
freshness run; run on a real PostgreSQL (a logical slot its "connector" keeps confirming), a real Kafka topic
and a Delta table merged by the project's writer, it passes on equal tables and names a row deleted from the
Delta table by hand."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DefaultScheduleStatus
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.spark import DELTA_JARS_ENV_VAR, delta_jars
from tests.support.reconcile import SlotAdvancer, World, merged_world, source_row
from tests.support.venvs import venv_of_this_ones_packages

ROOT = Path(__file__).resolve().parents[2]

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


S3_CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "s3://{bucket}/cdc", writer: delta-rs, storage_options: {options}}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: inventory.items, key_columns: [id, region], path: "s3://{bucket}/cdc/items"}}]
    rows_match_source: {{dsn_env: RECONCILE_TEST_DSN, buckets: 16}}
"""
# The shop connector's check run in-process by the python of an installation of its own (argv: the config file).
RUN_CHECK = """
import json, sys
from pathlib import Path
from dagster import DagsterInstance
from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
defs = build_definitions(parse_config(Path(sys.argv[1]).read_text()), topics=[])
with DagsterInstance.ephemeral() as instance:
    result = defs.resolve_job_def("shop_rows_match_source_job").execute_in_process(instance=instance)
[evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "rows_match_source"]
print(json.dumps({"passed": evaluation.passed, "severity": evaluation.severity.value,
                  "description": evaluation.description}))
"""


def test_a_store_whose_connector_is_not_installed_is_a_warning_naming_the_jars_and_the_command(
        postgres: Any, broker: Any, object_store: Any, tmp_path: Path) -> None:
    """Tables on S3 written by delta-rs, in an installation that never fetched Hadoop's S3 connector (a venv of the
    test's own, Delta's jars named by CDC_DELTA_SPARK_JARS): Spark cannot read them, so the check is a warning
    that names the store, the directory without jars and the command that fetches them; never a pass."""
    bucket = object_store.create_bucket(f"rms-{uuid.uuid4().hex[:8]}")
    prefix = f"jars{uuid.uuid4().hex[:8]}"
    world = World(postgres.create_database(f"recon_{prefix}"), tmp_path / "unused", topic=f"{prefix}.inventory.items")
    try:
        world.target = DeltaTarget(f"s3://{bucket}/cdc/items", object_store.storage_options())
        rows = [source_row(i) for i in range(1, 21)]
        world.insert_source(rows)
        world.merge(rows)  # the table is materialized: the check gets as far as opening Spark on it
    finally:
        world.connection.close()
    config = tmp_path / "s3.yaml"
    config.write_text(S3_CONFIG.format(bootstrap=broker.bootstrap_servers, bucket=bucket, prefix=prefix,
                                       options=json.dumps(object_store.storage_options())))
    venv = tmp_path / "venv"
    python = venv_of_this_ones_packages(venv)
    env = {name: value for name, value in os.environ.items() if name not in ("CDC_ASSETS_CONFIG", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(ROOT), RECONCILE_TEST_DSN=world.dsn, **{DELTA_JARS_ENV_VAR: delta_jars()})
    run = subprocess.run([str(python), "-c", RUN_CHECK, str(config)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    evaluation = json.loads(run.stdout.strip().splitlines()[-1])
    missing = venv / "share" / "cdc-assets" / "hadoop-aws-jars"
    assert evaluation == {"passed": False, "severity": "WARN", "description": (
        f"cannot evaluate: delta.root 's3://{bucket}/cdc' is on s3, where Spark opens the Delta tables (delta.writer "
        f"delta-spark, or rows_match_source's reads), and Spark needs Hadoop's connector for it: no jars in "
        f"{missing} (run `CDC_SETUP_EXTRAS=s3 scripts/setup`)")}
