"""What the UI launches, asked of Dagster's GraphQL API on a code server of its own (as dagster-webserver does):
the launchpad's starting config, and the asset and check selection of the UI's Materialize button."""

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance
from dagster._core.workspace.context import WorkspaceRequestContext
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql, infer_job_selector

from cdc_assets.catalog import resolve_tables
from cdc_assets.checks import merge_run_checks
from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.translator import CdcTranslator

# Two connectors (two merge ops); batch limits of the pipeline's own, for the launchpad to show.
CONFIG = """\
kafka: {{bootstrap_servers: '127.0.0.1:9'}}
delta: {{root: '{root}'}}
batch: {{max_records: 5000, max_batches_per_run: 3}}
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
    transaction_metadata: true
    tables:
      - name: dbo.orders
"""

# The fields of LaunchAssetExecutionButton's asset query that decide the run it launches.
ASSET_NODES = """
query {
  assetNodes {
    assetKey { path }
    jobNames
    assetChecksOrError { ... on AssetChecks { checks { name jobNames } } }
  }
}
"""

LAUNCHPAD = """
query($selector: PipelineSelector!) {
  runConfigSchemaOrError(selector: $selector) {
    __typename
    ... on RunConfigSchema { rootDefaultYaml }
  }
}
"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkspaceRequestContext, str]]:
    """A GraphQL context on a code server loading the code location of ``CONFIG``, and the config's text."""
    work = tmp_path_factory.mktemp("ui")
    config = CONFIG.format(root=work / "delta")
    location = work / "location.py"
    location.write_text(textwrap.dedent(f"""\
        from cdc_assets.config import parse_config
        from cdc_assets.definitions import build_definitions

        defs = build_definitions(parse_config({config!r}))
        """))
    with DagsterInstance.local_temp(str(work)) as instance, \
            define_out_of_process_context(str(location), "defs", instance) as context:
        yield context, config


def materialize_selection(context: WorkspaceRequestContext, keys: list[AssetKey]) -> tuple[str, set[AssetCheckKey]]:
    """The job and checks the UI's Materialize launches for ``keys`` (dagster-webserver's
    LaunchAssetExecutionButton: the first job, by name, that holds every asset, and those of the assets'
    checks that job holds)."""
    nodes = {AssetKey(node["assetKey"]["path"]): node
             for node in execute_dagster_graphql(context, ASSET_NODES).data["assetNodes"]}
    chosen = [nodes[key] for key in keys]
    job = next(name for name in chosen[0]["jobNames"] if all(name in node["jobNames"] for node in chosen))
    checks = {AssetCheckKey(key, check["name"]) for key, node in zip(keys, chosen, strict=True)
              for check in node["assetChecksOrError"]["checks"] if job in check["jobNames"]}
    return job, checks


def test_materialize_from_the_ui_evaluates_the_checks_of_a_merge_run(ui):
    context, config = ui
    pipeline = parse_config(config)
    captured = {CdcTranslator().get_asset_key(table): table for table in resolve_tables(pipeline)}
    # "Materialize all", and one table's "Materialize".
    customers = AssetKey(["dbserver1", "inventory", "customers"])
    for keys, ops in ((list(captured), {"inventory_merge", "sales_merge"}), ([customers], {"inventory_merge"})):
        job, checks = materialize_selection(context, keys)
        assert checks == set(merge_run_checks({key: captured[key] for key in keys})), job
        # The run's plan: the merge ops alone (not the ops of the scheduled checks, freshness and table checks).
        subset = build_definitions(pipeline).resolve_job_def(job).get_subset(
            asset_selection=set(keys), asset_check_selection=checks)
        assert {node.name for node in subset.graph.nodes} == ops


def test_the_launchpad_opens_with_the_merge_config_and_no_machine_facts(ui):
    context, _ = ui
    job, _ = materialize_selection(context, [AssetKey(["dbserver1", "inventory", "products"])])
    for name in ("cdc_merge_job", job):
        schema = execute_dagster_graphql(context, LAUNCHPAD, {"selector": infer_job_selector(context, name)})
        text = schema.data["runConfigSchemaOrError"]["rootDefaultYaml"]
        launchpad = yaml.safe_load(text)
        # The op config a user changes, first, with the values a run of this pipeline uses.
        assert next(iter(launchpad)) == "ops", text
        limits = {"max_records_per_batch": 5000, "max_batches_per_run": 3, "concurrent_tables": 2}
        assert launchpad["ops"] == {op: {"config": limits} for op in ("inventory_merge", "sales_merge")}, text
        # No fact of this machine: Delta's jars, JVM flags, the venv.
        assert "jar" not in text and "-XX" not in text and str(Path(".venv")) not in text, text
