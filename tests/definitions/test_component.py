"""cdc_assets.CdcComponent: the example dg project (examples/dg_project) loads, lists and validates under
the real `dg` CLI, and the component builds what CDC_ASSETS_CONFIG's file builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from cdc_assets.component import CdcComponent
from cdc_assets.config import ConfigError, load_config
from cdc_assets.definitions import build_definitions
from tests.support.component import DG, EXAMPLE, EXAMPLE_GROUP, EXAMPLE_TABLES, ROOT, copy_of_example, dg_dev

DEFS_YAML = Path("src/cdc_example/defs/cdc/defs.yaml")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example project."""
    return copy_of_example(tmp_path)


def dg(project: Path, *args: str, delta_root: Path, bootstrap: str = "127.0.0.1:9", timeout: float = 300,
       **more_env: str) -> subprocess.CompletedProcess:
    """Run the `dg` CLI of this venv in ``project`` as a user of the example would (its package on the path, with
    this checkout's cdc_assets); ``bootstrap``: the broker its defs.yaml names (by default none listens there)."""
    env = {**os.environ, "PYTHONPATH": f"{project / 'src'}:{ROOT}", "CDC_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
           "CDC_DELTA_ROOT": str(delta_root), **more_env}
    env.pop("CDC_ASSETS_CONFIG", None)
    return subprocess.run([str(DG), *args], cwd=project, env=env, capture_output=True, text=True, timeout=timeout)


def test_dg_lists_the_component_and_validates_the_example_project(project, tmp_path):
    components = dg(project, "list", "components", "--json", delta_root=tmp_path / "delta")
    assert components.returncode == 0, components.stderr[-3000:]
    assert "cdc_assets.CdcComponent" in {entry["key"] for entry in json.loads(components.stdout)["items"]}
    checked = dg(project, "check", "defs", delta_root=tmp_path / "delta")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr


def test_dg_list_defs_shows_the_translation_and_post_processing(project, tmp_path):
    listed = dg(project, "list", "defs", "--json", delta_root=tmp_path / "delta")
    assert listed.returncode == 0, listed.stderr[-3000:]
    defs = json.loads(listed.stdout)
    assets = {asset["asset_key"]: asset for asset in defs["assets"]}
    tables = EXAMPLE_TABLES
    assert set(assets) == tables | {f"kafka/{table}" for table in tables}  # each table's topic, upstream of it
    for table in tables:
        assert assets[table]["dependency_keys"] == [f"kafka/{table}"]
        assert assets[f"kafka/{table}"]["group_name"] == EXAMPLE_GROUP
        assert "automation_condition" not in assets[f"kafka/{table}"]  # post_processing targets kind:delta
    for asset in (assets[table] for table in tables):
        assert asset["group_name"] == EXAMPLE_GROUP  # translation, with the table in its template scope
        assert asset["automation_condition"]["label"].startswith("on_cron(*/5 * * * *")  # post_processing
        assert str(tmp_path / "delta") in asset["description"]  # {{ env.CDC_DELTA_ROOT }}
    assert {"cdc_merge_job", "cdc_freshness_job"} <= {job["name"] for job in defs["jobs"]}
    assert {check["key"].split(":")[0] for check in defs["asset_checks"]} >= EXAMPLE_TABLES


def test_the_topics_include_patterns_match_are_the_components_state(project, tmp_path, broker):
    """With include patterns, the broker's topics are the component's state: `dg utils refresh-defs-state`
    lists them once, and a load from that state builds the matching tables with no broker to ask."""
    from tests.support.topics import new_topic_named

    suffix = uuid.uuid4().hex[:6]
    new_topic_named(broker, f"dbserver1.inventory.orders_{suffix}")
    defs_yaml = project / DEFS_YAML
    text = defs_yaml.read_text().replace(
        "        - name: inventory.products\n          key_columns: [id]\n",
        "        - name: inventory.products\n          key_columns: [id]\n"
        f"      include: ['inventory\\.orders_{suffix}']\n")
    text = text.replace("  translation:", "  defs_state: {management_type: LOCAL_FILESYSTEM, refresh_if_dev: false}\n"
                                          "  translation:")
    assert f"orders_{suffix}" in text and "defs_state" in text
    defs_yaml.write_text(text)

    refreshed = dg(project, "utils", "refresh-defs-state", delta_root=tmp_path / "delta",
                   bootstrap=broker.bootstrap_servers)
    assert refreshed.returncode == 0, refreshed.stdout[-3000:] + refreshed.stderr[-3000:]
    listed = dg(project, "list", "defs", "--json", delta_root=tmp_path / "delta")  # no broker at 127.0.0.1:9
    assert listed.returncode == 0, listed.stderr[-3000:]
    keys = {asset["asset_key"] for asset in json.loads(listed.stdout)["assets"]}
    assert f"dbserver1/inventory/orders_{suffix}" in keys


def test_a_wrong_field_is_named_with_the_defs_yaml_line(project, tmp_path):
    path = project / DEFS_YAML
    lines = path.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "kind: postgresql" in line)
    path.write_text(path.read_text().replace("kind: postgresql", "kind: postgres"))
    checked = dg(project, "check", "defs", delta_root=tmp_path / "delta")
    assert checked.returncode != 0
    assert f"defs.yaml:line {number}: attributes.connectors.0.kind" in checked.stdout + checked.stderr


def test_the_component_builds_what_the_pipeline_config_file_builds(tmp_path, monkeypatch):
    """The same config as a component's attributes and as CDC_ASSETS_CONFIG's file: the same assets,
    checks, jobs, schedules and sensors."""
    demo = yaml.safe_load((ROOT / "cdc_assets" / "demo" / "pipeline.yaml").read_text())
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(demo))
    from_file = build_definitions(load_config(config_file))
    component = CdcComponent(**{name: value for name, value in demo.items()})
    from_component = build_definitions(component.pipeline_config())

    def shape(defs):
        repository = defs.get_repository_def()
        return (sorted(key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()),
                sorted(str(key) for key in repository.asset_graph.asset_check_keys),
                sorted(job.name for job in repository.get_all_jobs()),
                sorted(s.name for s in repository.schedule_defs), sorted(s.name for s in repository.sensor_defs))

    assert shape(from_component) == shape(from_file)
    assert shape(from_file)[0]  # not two empty shapes


def test_the_component_refuses_bad_attributes_naming_the_field():
    component = CdcComponent(kafka={"bootstrap_servers": "x:1"}, delta={"root": "/tmp/x"},
                             connectors=[{"name": "a", "kind": "postgresql", "topic.prefix": "a",
                                          "tables": [{"name": "s.t", "apply_mode": "scd9"}]}])
    with pytest.raises(ConfigError, match=r"connectors\.0\.tables\.0\.apply_mode"):
        component.pipeline_config()


def test_the_docs_show_the_example_defs_yaml_as_it_is():
    doc = (ROOT / "docs" / "component.md").read_text()
    shown = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert shown == (EXAMPLE / DEFS_YAML).read_text()


def test_the_docs_command_runs_as_written(project, tmp_path):
    doc = (ROOT / "docs" / "component.md").read_text()
    command = doc.split("```sh\n", 1)[1].split("```", 1)[0].split("#")[0].strip()
    # Run from a copy's parent laid out as the checkout is, its .venv this one; the example's package is uninstalled
    # after.
    (tmp_path / "examples").mkdir()
    (tmp_path / ".venv").symlink_to(sys.prefix)
    shutil.move(str(project), tmp_path / "examples" / "dg_project")
    env = {k: v for k, v in os.environ.items() if k not in ("CDC_ASSETS_CONFIG", "CDC_DELTA_ROOT")}
    try:
        run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "cdc-example"], capture_output=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "dbserver1/inventory/customers" in run.stdout


def test_dg_dev_serves_the_components_assets(project, tmp_path):
    """`dg dev` on the example: the UI's GraphQL lists the component's assets, in the translated group."""
    with dg_dev(project, tmp_path) as (_, nodes):
        assert {("/".join(node["assetKey"]["path"]), node["groupName"]) for node in nodes} == {
            (key, EXAMPLE_GROUP) for key in EXAMPLE_TABLES | {f"kafka/{table}" for table in EXAMPLE_TABLES}}


def test_the_component_takes_every_field_of_the_pipeline_config():
    """Its attributes are PipelineConfig's fields, declared once there: a field added to one is added to both."""
    from cdc_assets.config import PipelineConfig

    assert set(CdcComponent.model_fields) - {"translation", "defs_state"} == set(PipelineConfig.model_fields)


def test_the_examples_topics_are_the_demos(project, tmp_path, broker):
    """The example's tables read topics the demo publishes (`scripts/demo`'s sample), so its assets can be
    materialized on the demo's broker: every topic `dg list defs` shows upstream of a table exists there."""
    from confluent_kafka.admin import AdminClient

    from cdc_assets.demo.sample import publish_sample, sample_topics

    publish_sample(broker.bootstrap_servers)
    listed = dg(project, "list", "defs", "--json", delta_root=tmp_path / "delta", bootstrap=broker.bootstrap_servers)
    assert listed.returncode == 0, listed.stderr[-3000:]
    topics = {".".join(asset["asset_key"].split("/")[1:]) for asset in json.loads(listed.stdout)["assets"]
              if asset["asset_key"].startswith("kafka/")}
    assert topics == {table.replace("/", ".") for table in EXAMPLE_TABLES}
    assert topics <= set(sample_topics(0))
    on_broker = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10).topics
    assert topics <= set(on_broker)


def test_dg_launch_materializes_the_examples_assets_from_the_demos_topics(project, tmp_path, broker, spark):
    """`dg launch` on the demo's sample: with the component's state frozen first (`dg utils refresh-defs-state`;
    under the default state management `dg launch`, which runs no code server, finds none), the example's tables
    are merged into Delta tables of its own. The run takes the session's local Spark server (the example sets no
    Spark settings: the embedded default's), as runs on one machine share it; a server of its own started cold
    cost the test 20-30 s and a JVM's start."""
    from deltalake import DeltaTable

    from cdc_assets.demo.sample import publish_sample

    publish_sample(broker.bootstrap_servers)
    defs_yaml = project / DEFS_YAML
    defs_yaml.write_text(defs_yaml.read_text().replace(
        "  translation:", "  defs_state: {management_type: LOCAL_FILESYSTEM}\n  translation:"))
    (tmp_path / "home").mkdir()
    for command in (["utils", "refresh-defs-state"], ["launch", "--assets", "*"]):
        # The merge of two tables: minutes on a loaded machine.
        run = dg(project, *command, delta_root=tmp_path / "delta", bootstrap=broker.bootstrap_servers,
                 timeout=1200, DAGSTER_HOME=str(tmp_path / "home"))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "RUN_SUCCESS" in run.stdout + run.stderr
    products = DeltaTable(str(tmp_path / "delta" / "dbserver1" / "inventory" / "products")).to_pyarrow_table()
    assert products.num_rows == 10 and "scooter" in products.column("name").to_pylist()


def test_the_component_takes_the_column_choices_and_refuses_bad_ones_naming_the_field():
    from cdc_assets.catalog import resolve_tables
    from cdc_assets.core.columns import ColumnChoices

    table = {"name": "s.t", "key_columns": ["id"], "exclude_columns": ["ssn"], "ignore_null_updates": True}
    component = CdcComponent(kafka={"bootstrap_servers": "x:1"}, delta={"root": "/tmp/x"},
                             connectors=[{"name": "a", "kind": "postgresql", "topic.prefix": "a", "tables": [table]}])
    [captured] = resolve_tables(component.pipeline_config())
    assert captured.merge.column_choices == ColumnChoices(exclude=("ssn",), ignore_null_updates=True)
    bad = CdcComponent(kafka={"bootstrap_servers": "x:1"}, delta={"root": "/tmp/x"},
                       connectors=[{"name": "a", "kind": "postgresql", "topic.prefix": "a",
                                    "tables": [{**table, "exclude_columns": ["id"]}]}])
    with pytest.raises(ConfigError, match=r"connectors\.0\.tables\.0: .*key column"):
        bad.pipeline_config()
