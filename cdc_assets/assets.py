"""One software-defined asset per captured table: materializing it merges one micro-batch."""

import json
import re
from collections.abc import Mapping

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget
from cdc_assets.io.transactions import update_watermark
from cdc_assets.pipeline import BatchReport, merge_micro_batch
from cdc_assets.resources import DeltaResource, KafkaResource

CDC_KINDS = {"spark", "delta", "kafka"}
STATUS_TAG = "cdc_assets/status"  # "retired" once the source table was dropped


class MergeConfig(Config):
    """Run config of a CDC table merge (launchpad)."""

    max_records_per_batch: int | None = Field(default=None, gt=0,
                                              description="override the pipeline's max records per micro-batch")


def dagster_name(text: str) -> str:
    """``text`` with the characters Dagster names do not allow replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def report_metadata(report: BatchReport) -> dict[str, object]:
    """Materialization metadata for one batch: numbers as numbers, so the UI plots them."""
    summary, outcome = report.summary, report.outcome
    metadata: dict[str, object] = {
        "events_read": report.events_read,
        "tombstones_skipped": report.tombstones,
        "dead_lettered_events": report.dead_lettered,
        "offsets": MetadataValue.json(json.loads(report.offsets_json())),
        "caught_up": report.raw.caught_up,
        "writer": report.writer,
        "delta_path": MetadataValue.path(report.table.target.path),
        "stage_seconds": MetadataValue.json({k: round(v, 3) for k, v in report.timings.items()}),
    }
    if summary is not None:
        metadata.update(
            events_create=summary.creates,
            events_update=summary.updates,
            events_delete=summary.deletes,
            events_snapshot_read=summary.snapshot_reads,
            incremental_snapshot_reads=summary.incremental_snapshot_reads,
        )
        if summary.last_incremental_snapshot_read_ts is not None:
            metadata["last_incremental_snapshot_read_at"] = summary.last_incremental_snapshot_read_ts.isoformat()
    if report.capture_lag_s is not None:
        metadata["capture_lag_s"] = round(report.capture_lag_s, 3)
    if report.capture_lag_p50_s is not None:
        metadata["capture_lag_p50_s"] = round(report.capture_lag_p50_s, 3)
    if report.transactions is not None:
        metadata["transactions_applied"] = int(report.transactions["applied"])  # type: ignore[call-overload]
        metadata["transactions_waiting"] = MetadataValue.json(report.transactions["waiting"])
        metadata["transactions_incomplete"] = MetadataValue.json(report.transactions["incomplete"])
    if "total_s" in report.timings:
        metadata["batch_seconds"] = round(report.timings["total_s"], 3)
    if outcome is not None:
        metadata.update(
            rows_inserted=outcome.inserted,
            rows_updated=outcome.updated,
            rows_deleted=outcome.deleted,
            delta_version=outcome.delta_version,
            already_applied=outcome.already_applied,
        )
    return metadata


def column_schema(schema: StructType | None) -> TableSchema | None:
    """A Delta schema as Dagster column metadata."""
    if schema is None:
        return None
    return TableSchema(columns=[TableColumn(field.name, field.dataType.simpleString(),
                                            description="hidden CDC column" if field.name.startswith("_cdc_")
                                            else None)
                                for field in schema.fields])


def _current_schema(table: CapturedTable) -> StructType | None:
    """The Delta table's schema, read from its log (no Spark), or None if there is no table yet."""
    try:
        return DeltaRsWriter().table_schema(table.target)
    except Exception:  # unreachable storage must not keep the code location from loading
        return None


def build_cdc_asset(table: CapturedTable, limits: BatchLimits,
                    peers: Mapping[str, DeltaTarget] | None = None) -> AssetsDefinition:
    """The asset of one captured table: its materialization is one micro-batch MERGE into Delta.

    ``peers``: the transaction-consistent tables of the same connector (for the watermark)."""
    keys = ", ".join(table.key_columns) if table.key_columns else "from the record key"
    static_metadata: dict[str, object] = {
        "topic": table.topic, "delta_path": MetadataValue.path(table.target.path), "connector": table.connector,
        "connector_kind": table.kind, "source_table": table.name, "apply_mode": table.apply_mode,
        "retired": table.retired}
    schema = column_schema(_current_schema(table))
    if schema is not None:
        static_metadata["dagster/column_schema"] = schema

    @asset(
        key=AssetKey([dagster_name(part) for part in table.asset_key_path]),
        group_name=dagster_name(table.connector),
        kinds=CDC_KINDS,
        description=(f"`{table.name}` captured by {table.kind} connector `{table.connector}`: topic "
                     f"`{table.topic}` merged into Delta at `{table.target.path}` (keys: {keys}; apply mode "
                     f"{table.apply_mode}; bad events: {table.on_bad_event})."),
        metadata=static_metadata,
        # One pool per table: with a pool limit of 1 (see README), two runs never merge one table at once.
        pool=f"cdc_table_{dagster_name(table.topic)}",
        owners=list(table.owners) or None,
        tags={**dict(table.tags), STATUS_TAG: "retired" if table.retired else "active"},
    )
    def merge_table(context: AssetExecutionContext, config: MergeConfig, spark: LazyPySparkResource,
                    kafka: KafkaResource, delta: DeltaResource) -> MaterializeResult:
        session = spark.spark_session
        batch_limits = limits
        if config.max_records_per_batch:
            batch_limits = limits.model_copy(update={"max_records": config.max_records_per_batch})
        writer = delta.writer_for(session)
        report = merge_micro_batch(session, kafka.source(), writer, table, batch_limits)
        context.log.info(f"{table.topic}: {report.events_read} events read, offsets {report.offsets_json()}")
        metadata = report_metadata(report)
        if table.transaction_log is not None and table.watermarks is not None and report.outcome is not None:
            watermark = update_watermark(table.connector, table.transaction_log, peers or {}, table.watermarks)
            if watermark is not None:
                metadata["consistent_watermark"] = MetadataValue.json({
                    "transaction_id": watermark["transaction_id"], "end_offset": watermark["end_offset"],
                    "versions": json.loads(watermark["versions"])})
        schema = column_schema(writer.table_schema(table.target))
        if schema is not None:
            metadata["dagster/column_schema"] = schema
        return MaterializeResult(metadata=metadata)

    return merge_table
