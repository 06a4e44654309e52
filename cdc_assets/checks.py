"""Asset checks of every CDC table: the keys are unique and never null (blocking: they guard
correctness for anything downstream), the table is fresh now (no event waits in its topic longer
than its bound, the connector's heartbeats are recent), the capture lag of the last merge is under
its bound, no event of the table sits in the dead-letter table, and the Delta schema holds every
column the source last announced."""

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow.dataset as pds
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    asset_check,
    multi_asset_check,
)
from deltalake import DeltaTable

from cdc_assets.catalog import CapturedTable
from cdc_assets.io.delta import DeltaRsWriter, KeyReport
from cdc_assets.io.freshness import TableFreshness, freshness_verdict, last_heartbeat, table_freshness
from cdc_assets.io.registry import read_registry
from cdc_assets.io.transactions import latest_watermark
from cdc_assets.resources import DeltaResource, KafkaResource, SparkResource
from cdc_assets.translator import CdcTranslator, dagster_name


def _key_report(table: CapturedTable, delta: DeltaResource, spark: SparkResource) -> KeyReport | None:
    """Key statistics of the table; its key columns are the configured ones, else those its last
    batch commit recorded (taken from the record keys)."""
    writer = delta.writer_for_schema_changes(spark)
    progress = writer.read_progress(table.target, table.app_id)
    keys = table.key_columns or (progress.key_columns if progress else ())
    return writer.key_report(table.target, keys) if keys else None


FRESHNESS_CHECK = "freshness"


def live_freshness(table: CapturedTable, kafka_settings: dict[str, Any]) -> tuple[TableFreshness, datetime | None]:
    """The table's topic against the offsets its Delta table committed, and the connector's newest
    heartbeat (looked up only for a connector that sends them)."""
    progress = DeltaRsWriter().read_progress(table.target, table.app_id)  # the Delta log alone: no Spark
    state = table_freshness(kafka_settings, table.topic, progress.offsets if progress else None)
    heartbeat = last_heartbeat(kafka_settings, table.topic_prefix) if table.max_heartbeat_age_s else None
    return state, heartbeat


def freshness_metadata(state: TableFreshness, heartbeat: datetime | None) -> dict[str, Any]:
    """What the freshness check and the events-waiting observations show."""
    metadata: dict[str, Any] = {"events_waiting": state.events_waiting, "behind_s": round(state.behind_s, 3)}
    if state.waiting_since is not None:
        metadata["waiting_since"] = state.waiting_since.isoformat()
    if state.newest_source_time is not None:
        metadata["newest_waiting_source_time"] = state.newest_source_time.isoformat()
    if heartbeat is not None:
        metadata["last_heartbeat_at"] = heartbeat.isoformat()
        metadata["heartbeat_age_s"] = round((state.checked_at - heartbeat).total_seconds(), 3)
    return metadata


def build_table_checks(table: CapturedTable, translator: CdcTranslator | None = None) -> list[AssetChecksDefinition]:
    """The checks of one captured table (the two key checks share one scan), on the asset the
    translator (default ``CdcTranslator()``) names."""
    key = (translator or CdcTranslator()).get_asset_key(table)
    name = table.name

    @multi_asset_check(
        name=f"{dagster_name('_'.join(key.path))}_key_checks",
        specs=[
            AssetCheckSpec("unique_keys", asset=key, blocking=True,
                           description=f"Each key of {name} appears once (current versions for scd2)."),
            AssetCheckSpec("no_null_keys", asset=key, blocking=True, description=f"No row of {name} has a null key."),
        ],
        can_subset=True,
    )
    def key_checks(context: AssetCheckExecutionContext, delta: DeltaResource,
                   spark: SparkResource) -> Iterator[AssetCheckResult]:
        # One scan of the keys serves both checks.
        report = _key_report(table, delta, spark)
        selected = {check.name for check in context.selected_asset_check_keys}
        if "unique_keys" in selected:
            yield AssetCheckResult(
                check_name="unique_keys", passed=report is None or report.duplicate_keys == 0,
                metadata={"rows": 0, "note": "no batch applied yet"} if report is None else
                {"rows": report.rows, "duplicate_keys": report.duplicate_keys})
        if "no_null_keys" in selected:
            yield AssetCheckResult(
                check_name="no_null_keys", passed=report is None or report.null_keys == 0,
                metadata={"rows": 0, "note": "no batch applied yet"} if report is None else
                {"null_keys": report.null_keys})

    heartbeat_rule = (f"; the connector's newest heartbeat is at most {table.max_heartbeat_age_s:.0f}s old"
                      if table.max_heartbeat_age_s else "")

    @asset_check(asset=key, name=FRESHNESS_CHECK, description=(
        f"Live, on its own schedule: no event of {name} has waited in its topic longer than "
        f"{table.max_capture_lag_s:.0f}s{heartbeat_rule}."))
    def freshness(context: AssetCheckExecutionContext, kafka: KafkaResource) -> AssetCheckResult:
        state, heartbeat = live_freshness(table, kafka.client_settings())
        verdict = freshness_verdict(state, table.max_capture_lag_s, heartbeat, table.max_heartbeat_age_s)
        return AssetCheckResult(passed=verdict.passed, description=verdict.reason,
                                metadata={**freshness_metadata(state, heartbeat), "bound_s": table.max_capture_lag_s})

    @asset_check(asset=key, name="capture_lag", description=(
        f"The newest change applied by the last merge of {name} is at most {table.max_capture_lag_s:.0f}s old."))
    def capture_lag(context: AssetCheckExecutionContext) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(key)
        materialization = event.asset_materialization if event else None
        lag = materialization.metadata.get("capture_lag_s") if materialization else None
        if lag is None:
            return AssetCheckResult(passed=True, metadata={"note": "the last merge applied no change"})
        return AssetCheckResult(passed=lag.value <= table.max_capture_lag_s, severity=AssetCheckSeverity.WARN,
                                metadata={"capture_lag_s": lag.value, "bound_s": table.max_capture_lag_s})

    @asset_check(asset=key, name="no_dead_letters", description=f"No event of {name} is in the dead-letter table.")
    def no_dead_letters(context: AssetCheckExecutionContext) -> AssetCheckResult:
        target = table.dead_letter
        count = 0
        if target is not None and DeltaTable.is_deltatable(target.path, storage_options=dict(target.storage_options)):
            dataset = DeltaTable(target.path, storage_options=dict(target.storage_options)).to_pyarrow_dataset()
            count = dataset.count_rows(filter=pds.field("topic") == table.topic)
        return AssetCheckResult(passed=count == 0, severity=AssetCheckSeverity.WARN,
                                metadata={"dead_lettered_events": count})

    @asset_check(asset=key, name="schema_matches_source",
                 description=f"The Delta table of {name} has every column the source last announced.")
    def schema_matches_source(context: AssetCheckExecutionContext, delta: DeltaResource,
                              spark: SparkResource) -> AssetCheckResult:
        entry = read_registry(delta.registry_path, delta.storage_options).get((table.connector, name))
        if entry is None:
            return AssetCheckResult(passed=True, metadata={"note": "no schema-change event announced this table"})
        schema = delta.writer_for_schema_changes(spark).table_schema(table.target)
        present = set(schema.fieldNames()) if schema is not None else set()
        missing = [column for column in entry.columns.fieldNames() if column not in present]
        return AssetCheckResult(passed=not missing, severity=AssetCheckSeverity.WARN,
                                metadata={"missing_columns": missing, "announced": entry.columns.fieldNames()})

    checks = [key_checks, freshness, capture_lag, no_dead_letters, schema_matches_source]
    if table.transaction_log is not None:
        checks += _transaction_checks(table, key)
    return checks


def _transaction_checks(table: CapturedTable, key: AssetKey) -> list[AssetChecksDefinition]:
    @asset_check(asset=key, name="transactions_reconciled", description=(
        f"Every transaction's END count of events for {table.name} is matched by the events in its topic."))
    def transactions_reconciled(context: AssetCheckExecutionContext) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(key)
        recorded = event.asset_materialization.metadata.get("transactions_incomplete") if event else None
        incomplete = dict(recorded.value) if recorded is not None else {}
        description = "; ".join(f"transaction {tx}: END announces {n['expected']} events for {table.name}, the "
                                f"topic holds {n['seen']}" for tx, n in incomplete.items())
        return AssetCheckResult(passed=not incomplete, description=description or None,
                                metadata={"incomplete_transactions": sorted(incomplete)})

    @asset_check(asset=key, name="consistent_watermark_fresh", description=(
        f"The connector's consistent watermark is at most {table.max_watermark_lag_s:.0f}s old."))
    def consistent_watermark_fresh(context: AssetCheckExecutionContext) -> AssetCheckResult:
        assert table.watermarks is not None
        latest = latest_watermark(table.watermarks, table.connector)
        if latest is None or latest["transaction_ts"] is None:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"note": "no consistent watermark recorded yet"})
        age = (datetime.now(timezone.utc) - latest["transaction_ts"]).total_seconds()
        return AssetCheckResult(passed=age <= table.max_watermark_lag_s, severity=AssetCheckSeverity.WARN,
                                metadata={"transaction_id": latest["transaction_id"], "age_s": round(age, 3),
                                          "versions": json.loads(latest["versions"])})

    return [transactions_reconciled, consistent_watermark_fresh]
