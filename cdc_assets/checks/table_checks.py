"""The checks that look at what a table's merges left, evaluated in its merge run or in the connector's
scheduled check op."""

from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetKey,
    DagsterInstance,
    MaterializeResult,
    MetadataValue,
    multi_asset_check,
)

from cdc_assets import check_names
from cdc_assets.catalog import CapturedTable
from cdc_assets.checks.merged import (
    RunReads,
    capture_lag_result,
    dead_letters_result,
    key_report,
    primary_key_result,
    schema_result,
    unavailable_result,
)
from cdc_assets.checks.results import NOT_MATERIALIZED, not_evaluated
from cdc_assets.checks.specs import scheduled_check_specs, selected_check_names
from cdc_assets.checks.transactions import transactions_result, watermark_result
from cdc_assets.io.delta import DeltaWriter
from cdc_assets.resources import DeltaResource, SparkResource
from cdc_assets.translator import CdcTranslator


def evaluate_table_checks(table: CapturedTable, key: AssetKey, selected: set[str], instance: DagsterInstance,
                          delta: DeltaResource, spark: SparkResource, reads: RunReads,
                          materialized: MaterializeResult | None = None, merged_by: DeltaWriter | None = None
                          ) -> Iterator[AssetCheckResult]:
    """The results of the ``selected`` checks (names) of ``table`` among ``table_check_specs``;
    ``reads``: the op run's shared reads; ``materialized``: the table's materialization in this step, if
    it merged (else its latest is read from ``instance``), and ``merged_by`` the writer that merged it,
    whose loaded table the key check reads (else the writer of ``delta`` loads it)."""
    merged = _plain_metadata(materialized)
    latest = None if materialized is not None else instance.get_latest_materialization_event(key)
    if materialized is None and latest is None:
        # Never merged: every check of what merges left would pass on nothing, so none claims to.
        for name in sorted(selected):
            yield not_evaluated(key, name, NOT_MATERIALIZED.format(name=table.name))
        return
    if check_names.KEY_CHECK in selected:
        writer = merged_by or delta.writer_for_schema_changes(spark)
        yield primary_key_result(key, key_report(table, writer, merged.get("key_columns") or ()))
    last: dict[str, Any] = merged  # the metadata of the table's latest materialization
    if latest is not None and latest.asset_materialization is not None:
        last = {name: value.value for name, value in latest.asset_materialization.metadata.items()}
    if check_names.CAPTURE_LAG_CHECK in selected:
        yield capture_lag_result(table, key, last)
    if check_names.DEAD_LETTERS_CHECK in selected:
        yield dead_letters_result(table, key, reads)
    if check_names.SCHEMA_CHECK in selected:
        yield schema_result(table, key, delta, spark, reads.registry.get((table.connector, table.name)))
    if check_names.TRANSACTIONS_CHECK in selected and table.transactions is not None:
        yield transactions_result(table, key, last)
    if check_names.WATERMARK_CHECK in selected and table.transactions is not None:
        yield watermark_result(table, key)
    if check_names.UNAVAILABLE_CHECK in selected:
        yield unavailable_result(table, key, last)


def _plain_metadata(materialized: MaterializeResult | None) -> dict[str, Any]:
    """A materialization's metadata as plain values (none if ``materialized`` is None)."""
    metadata = (materialized.metadata or {}) if materialized is not None else {}
    return {name: value.value if isinstance(value, MetadataValue) else value for name, value in metadata.items()}


def build_scheduled_table_checks(name: str, tables: Sequence[CapturedTable],
                                 translator: CdcTranslator | None = None) -> AssetChecksDefinition | None:
    """The checks of ``tables`` (one connector's) that their merge runs leave to the freshness schedule
    (``scheduled_check_specs``), in one subsettable check op named ``name`` without the merge op's pool (a
    merge waits for no check); None when the merge runs evaluate every check. Each looks at the table's
    latest materialization, Delta table and the dead-letter table as they are when it runs."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_asset_key(table): table for table in tables}
    specs = [spec for key, table in by_key.items() for spec in scheduled_check_specs(table, key)]
    if not specs:
        return None

    @multi_asset_check(name=name, specs=specs, can_subset=True)
    def table_checks(context: AssetCheckExecutionContext, spark: SparkResource,
                     delta: DeltaResource) -> Iterator[AssetCheckResult]:
        reads = RunReads(delta)
        for key, names in selected_check_names(context.selected_asset_check_keys).items():
            yield from evaluate_table_checks(by_key[key], key, names, context.instance, delta, spark, reads)

    return table_checks
