"""docs/operations.md's downstream asset, run as written: under ``eager() & all_deps_blocking_checks_passed()`` a
merge of its table whose blocking check failed requests no run of it (where plain ``eager()`` would), one whose
blocking checks passed does."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AutomationCondition,
    DagsterInstance,
    Definitions,
    asset,
    evaluate_automation_conditions,
)

from tests.support.docs import doc_blocks

ROOT = Path(__file__).resolve().parents[2]
TABLE = AssetKey(["dbserver1", "inventory", "customers"])

# The table the block's asset depends on; no broker is contacted to load it (its tables are listed).
PIPELINE = """\
kafka: {{bootstrap_servers: "127.0.0.1:9"}}
delta: {{root: "{root}", writer: delta-rs}}
connectors:
  - name: inventory
    kind: mysql
    topic.prefix: dbserver1
    tables:
      - name: inventory.customers
"""


def documented_definitions() -> Definitions:
    """The ``defs`` of docs/operations.md's block that uses ``all_deps_blocking_checks_passed``."""
    blocks = [code for lang, code in doc_blocks(ROOT / "docs" / "operations.md")
              if lang == "python" and "all_deps_blocking_checks_passed" in code]
    assert len(blocks) == 1
    namespace: dict = {"__name__": "downstream_example"}
    exec(compile(blocks[0], "docs/operations.md", "exec"), namespace)
    return namespace["defs"]


def merged(instance: DagsterInstance, checks_passed: dict[str, bool]) -> None:
    """A merge of the table as a run records it: its materialization, then its blocking checks' evaluations."""
    instance.report_runless_asset_event(AssetMaterialization(TABLE))
    for name, passed in checks_passed.items():
        instance.report_runless_asset_event(AssetCheckEvaluation(asset_key=TABLE, check_name=name, passed=passed,
                                                                 severity=AssetCheckSeverity.ERROR))


def test_a_downstream_asset_waits_for_its_tables_blocking_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE.format(root=tmp_path / "lake"))
    monkeypatch.setenv("CDC_ASSETS_CONFIG", str(pipeline))
    documented = documented_definitions()

    # The control: the same dependency under plain eager() runs whatever the checks say.
    @asset(deps=[TABLE], automation_condition=AutomationCondition.eager())
    def eager_report() -> None:
        """Rebuilt after each merge."""

    defs = Definitions.merge(documented, Definitions(assets=[eager_report]))
    graph = defs.resolve_asset_graph()
    blocking = {key.name for key in graph.get_check_keys_for_assets({TABLE}) if graph.get_check_spec(key).blocking}
    assert blocking == {"primary_key"}
    report, control = AssetKey("customer_report"), eager_report.key
    with DagsterInstance.ephemeral() as instance:
        def tick(cursor=None):
            result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            requested = {key for key in (report, control) if result.get_num_requested(key)}
            if requested:  # the requested run materializes them, and the next tick sees that
                for key in requested:
                    instance.report_runless_asset_event(AssetMaterialization(key))
                seen = evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
                assert seen.total_requested == 0
                return requested, seen.cursor
            return requested, result.cursor

        requested, cursor = tick()
        assert requested == set()
        merged(instance, {"primary_key": False})
        requested, cursor = tick(cursor)
        assert requested == {control}  # a duplicate key: the report waits
        merged(instance, dict.fromkeys(blocking, True))
        requested, cursor = tick(cursor)
        assert requested == {report, control}
