"""The ``rows_match_source`` check: a table's Delta table compared with the source table
(``cdc_assets.io.reconcile``)."""

import os
from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    MetadataValue,
    multi_asset_check,
)

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import ROWS_MATCH_SOURCE_CHECK
from cdc_assets.checks.freshness import live_freshness
from cdc_assets.checks.results import NOT_MATERIALIZED, not_evaluated
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.reconcile import DIALECT_OF_KIND, live_rows
from cdc_assets.io.delta import DeltaRsWriter
from cdc_assets.io.freshness import FreshnessProbe
from cdc_assets.io.kafka import SourceError, lost_to_retention
from cdc_assets.io.reconcile import (
    ConnectOffsets,
    DeltaSide,
    ReconcileError,
    Reconciliation,
    committed_position_reached,
    open_source,
    reconcile,
    recorded_position,
)
from cdc_assets.io.storage import StorageConfigError
from cdc_assets.resources import KafkaResource, SparkResource
from cdc_assets.translator import CdcTranslator

# The rows_match_source metadata entry holding the drifted keys machine-readable, for a repair.
DRIFTED_RANGES = "drifted_ranges"


# What rows_match_source compares in each apply mode.
_COMPARED_ROWS = {"scd1": "rows", "soft_delete": "live rows (not marked deleted)", "scd2": "current versions"}


def rows_match_source_spec(table: CapturedTable, key: AssetKey) -> AssetCheckSpec:
    """The spec of ``table``'s ``rows_match_source`` check (a table whose connector names a source DSN)."""
    return AssetCheckSpec(ROWS_MATCH_SOURCE_CHECK, asset=key, description=(
        f"On demand or on its schedule: the {_COMPARED_ROWS[table.merge.apply_mode]} of {table.name}'s Delta table "
        f"equal the source table's, by counts and checksums per key bucket; a difference is drift only once the "
        f"changes in flight when it was seen have been applied."))


def evaluate_rows_match_source(table: CapturedTable, key: AssetKey, spark: SparkResource,
                               kafka: KafkaResource) -> AssetCheckResult:
    """``table``'s ``rows_match_source`` result: the comparison of ``cdc_assets.io.reconcile``, waiting for the
    changes in flight with the table's topic (``events_waiting``) for a table that has none of its own."""
    settings, dsn_env = table.checks.rows_match_source, table.checks.source_dsn_env
    assert settings is not None and dsn_env is not None
    dsn = os.environ.get(dsn_env)
    if not dsn:
        return not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, f"cannot evaluate: the environment variable {dsn_env} "
                             "(the source database's connection string) is not set")
    writer = DeltaRsWriter()
    progress = writer.read_progress(table.target, table.app_id)
    keys = table.merge.key_columns or (progress.key_columns if progress else ())
    if progress is None or not keys:
        return not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, NOT_MATERIALIZED.format(name=table.name))
    connect_url = settings.kafka_connect_url
    connector = (ConnectOffsets(connect_url, settings.kafka_connect_connector or table.connector, table.kind)
                 if connect_url is not None else None)
    try:
        session = spark.delta_reading_session
        source = open_source(table.kind, dsn, connector)
        delta = DeltaSide(session, table.target.path, apply_mode(table.merge.apply_mode, table.kind),
                          recorded_position(table.target, table.app_id, writer))
        try:
            with FreshnessProbe(kafka.client_settings()) as probe:
                # Events deleted before they were merged halt the table's merge (the source's SourceError):
                # it will never catch up, so the check does not wait for it, and fails whatever it finds.
                lost = [str(error) for partition, (earliest, _) in probe.retained_offsets(table.topic).items()
                        if (error := lost_to_retention(table.topic, partition, progress.offsets.get(partition),
                                                       earliest)) is not None]

                def events_waiting() -> int:
                    return live_freshness(table, probe)[0].events_waiting

                result = reconcile(source, delta, table.source_table, keys, settings.buckets,
                                   committed_position_reached(delta, source, events_waiting),
                                   0.0 if lost else settings.settle_timeout_s)
        finally:
            delta.close()
            source.close()
    except (ReconcileError, SourceError, StorageConfigError) as exc:
        return not_evaluated(key, ROWS_MATCH_SOURCE_CHECK, f"cannot evaluate: {exc}")
    return _rows_match_source_result(table, key, result, settings.sample_keys, lost)


def _rows_match_source_result(table: CapturedTable, key: AssetKey, result: Reconciliation, sample_keys: int,
                              lost: list[str]) -> AssetCheckResult:
    drifted = [{"bucket": bucket.bucket, **bucket.counts(),
                "sample_keys": [f"{d.kind}: {d.display}" for d in bucket.differences[:sample_keys]]}
               for bucket in result.drifted]
    compared = _COMPARED_ROWS[table.merge.apply_mode]
    if lost:
        # Keys settle only when nothing of the table waits in its topic (retention deleted it all); else the
        # differing buckets hold the changes the halted merge has not applied beside those lost.
        found = (f"{sum(len(bucket.differences) for bucket in result.drifted)} key(s) differ with nothing of the "
                 "table left in its topic (drifted_buckets)" if result.drifted else
                 f"the keys those events changed cannot be named: {len(result.differing_first)} of {result.buckets} "
                 "key buckets differ from the source now, changes in flight among them")
        description = (f"{table.name}: events of its topic were deleted by retention before they were merged "
                       f"({'; '.join(lost)}): its merge halts, so the table cannot catch up with the source ({found})")
    elif result.drifted:
        totals = {kind: sum(bucket.counts()[kind] for bucket in result.drifted)
                  for kind in ("missing", "extra", "different")}
        description = (f"{table.name}: {len(drifted)} of {result.buckets} key buckets drifted from the source "
                       f"({totals['missing']} key(s) missing, {totals['extra']} extra, {totals['different']} with "
                       "different values)")
    elif result.unsettled:
        description = (f"{table.name}: {len(result.unsettled)} key bucket(s) differed and the table did not apply "
                       f"the source up to position {result.first_position} in time: not compared again (no drift "
                       "claimed)")
        if DIALECT_OF_KIND.get(table.kind) == "mysql" and table.checks.rows_match_source is not None and \
                table.checks.rows_match_source.kafka_connect_url is None:
            description += ("; a quiet MariaDB/MySQL table settles only with rows_match_source.kafka_connect_url "
                            "(the server does not know how far the connector has read)")
    else:
        description = f"{table.name}: its {compared} equal the source table's ({result.source_rows} rows)"
    metadata: dict[str, Any] = {
        "compared": compared, "buckets": result.buckets, "source_rows": result.source_rows,
        "delta_rows": result.delta_rows, "columns_compared": result.columns, "columns_left_out": result.left_out,
        "differing_at_first_look": len(result.differing_first), "drifted_buckets": MetadataValue.json(drifted),
        "in_flight_keys": result.in_flight_keys, "unsettled_buckets": result.unsettled,
        "source_position": result.first_position, "last_source_position": result.last_position,
        "source_s": round(result.source_s, 3), "delta_s": round(result.delta_s, 3),
        "side_by_side_s": round(result.side_by_side_s, 3), "waited_s": round(result.waited_s, 3),
        "wall_s": round(result.wall_s, 3), "looks": MetadataValue.json([look.to_metadata() for look in result.looks]),
        "live_rows_filter": live_rows(apply_mode(table.merge.apply_mode)) or "",
        "lost_to_retention": lost,
    }
    # What drift_repair_sensor's targeted snapshot reads (``core.reconcile.DriftedRanges``); none while the merge
    # halts, which would never apply the snapshot's reads.
    if result.drifted and not lost:
        metadata[DRIFTED_RANGES] = MetadataValue.json(result.drifted_ranges().to_metadata())
    return AssetCheckResult(asset_key=key, check_name=ROWS_MATCH_SOURCE_CHECK, passed=result.passed and not lost,
                            severity=AssetCheckSeverity.ERROR if result.drifted or lost else AssetCheckSeverity.WARN,
                            description=description, metadata=metadata)


def build_rows_match_source_checks(name: str, tables: Sequence[CapturedTable],
                                   translator: CdcTranslator | None = None) -> AssetChecksDefinition | None:
    """The ``rows_match_source`` checks of ``tables`` (one connector's) whose connector names a source DSN, in
    one subsettable check op named ``name`` (None: no table has one). No job but their own runs them."""
    translator = translator or CdcTranslator()
    by_key = {translator.get_asset_key(table): table for table in tables
              if table.checks.rows_match_source is not None and not table.retired}
    if not by_key:
        return None

    @multi_asset_check(name=name, specs=[rows_match_source_spec(table, key) for key, table in by_key.items()],
                       can_subset=True)
    def rows_match_source(context: AssetCheckExecutionContext, spark: SparkResource,
                          kafka: KafkaResource) -> Iterator[AssetCheckResult]:
        for check_key in context.selected_asset_check_keys:
            yield evaluate_rows_match_source(by_key[check_key.asset_key], check_key.asset_key, spark, kafka)

    return rows_match_source
