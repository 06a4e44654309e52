"""Applying schema changes: ``apply_schema_change_job`` brings a table's Delta target to the schema
its latest change announces, before the next merge sees events of the new shape, and records the
change in the table registry.

Changes take effect in source order whatever order their runs finish in: each run records its change,
then brings the table to the registry's latest change of it by source position (``io.registry``), so
a change that arrives after a later one only adds to the registry. Each change carries the table's
whole column list, so the latest change alone decides the table's state.

- CREATE: the Delta table is created with the announced columns (wide-type policy) and the hidden
  columns of its apply mode; the registry entry makes it an asset at the next code-location load.
  A CREATE of a table that exists (a snapshot's) is an ALTER to its columns.
- CREATE after a DROP (a table dropped and created again at the source, or any change of it after
  such a DROP, whatever order the runs take): the new incarnation starts empty. The old one's rows
  (its pending events merged first, unless its DROP's run did) are copied to
  ``<table path>__retired_<n>`` (n = 1, 2, ...: the first free one), a retired Delta table of their
  own, listed in the table property ``cdc_assets.earlier_incarnations``; then the table is emptied
  and takes the new incarnation's columns in one commit that keeps its history (time travel reads
  the old rows too) and its offsets, so its next merge reads on from the events after the old
  incarnation's. ``cdc_assets.recreated_after`` holds the position of the DROP it came after.
  Events of the new incarnation already in the topic when the old one's last events are merged go
  with the old rows (both are in one topic, merged up to its end).
- ALTER: added columns are added (nullable; existing rows read null). Widened types need nothing
  (wide-type policy). Dropped columns stay, nullable, listed in the table property
  ``cdc_assets.dropped_columns``. A rename found in the DDL (``RENAME COLUMN a TO b``,
  ``CHANGE a b <type>``) is a drop + add whose new column takes the old one's values in the rows
  last changed before the rename (by source position), so they read as the source does; noted in
  ``cdc_assets.renamed_columns``. A type change the policy cannot absorb (e.g. a decimal scale
  change) fails the run with a clear message.
- DROP: the table and its data stay. The table's pending change events (all made before the DROP)
  are merged first, then the asset is retired (``cdc_assets.retired`` property, registry status),
  and ``cdc_merge_job`` no longer selects it. A snapshot's ``DROP TABLE IF EXISTS`` never gets here
  (``SchemaChangeEvent.acted_on``). A RENAME TABLE is a DROP of the old name and a change of the
  new one, whose run merges the old name's pending events and copies its rows.

Before a DROP, a RENAME TABLE's copy or a RENAME COLUMN's copy, every pending event of the table is
merged, however many batches that takes (``max_batches_per_run`` bounds each round, not the whole):
the run merges on until the table's offsets reach the topic's end as of its first round. If a round commits nothing (a
transaction that cannot complete yet), the run fails before applying the change, naming the offsets
it stopped at (the batches merged stay, as a merge run's would), and a retry goes on from there.

A run records its change in the registry only once the table has been brought to it: a failed run
leaves the registry as it was (and the asset as it was loaded), and its retry does the whole change.
Each run logs a materialization of the table's asset with the old and new schema and the DDL's
source position. The runs share the pool ``cdc_schema_changes``: with a limit of 1 they never race.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from dagster import (
    AssetKey,
    AssetMaterialization,
    Config,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)
from pydantic import Field
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from cdc_assets.api import apply_pending
from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core.apply_modes import ApplyModeName, apply_mode
from cdc_assets.core.layout import HIDDEN_PREFIX
from cdc_assets.core.schema_change import SchemaChangeError, diff_schema, source_type_changes
from cdc_assets.io.delta import DeltaTarget, DeltaWriter, open_table
from cdc_assets.io.kafka_source import SourceError
from cdc_assets.io.registry import RegistryEntry, append_change, change_row, read_history
from cdc_assets.resources import DeltaResource, KafkaResource, SparkResource

RETIRED_PROPERTY = "cdc_assets.retired"
DROPPED_COLUMNS_PROPERTY = "cdc_assets.dropped_columns"
RENAMED_COLUMNS_PROPERTY = "cdc_assets.renamed_columns"
RECREATED_AFTER_PROPERTY = "cdc_assets.recreated_after"
EARLIER_INCARNATIONS_PROPERTY = "cdc_assets.earlier_incarnations"
RETIRED_COPY_SUFFIX = "__retired_"


class SchemaChangeConfig(Config):
    """One table change from a schema-change event (the sensor fills this in)."""

    connector: str
    table: str = Field(description="<schema>.<table>")
    change: str = Field(description="CREATE, ALTER or DROP")
    columns: str = Field(description="announced columns: Spark StructType JSON")
    primary_keys: list[str] = []
    renames: list[list[str]] = []
    renamed_from: str | None = Field(default=None, description="<schema>.<table> before a RENAME TABLE")
    asset_key: list[str]
    delta_path: str
    apply_mode: ApplyModeName = "scd1"
    source_position: str = ""
    topic: str
    partition: int
    offset: int


def _arrow(schema: T.StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


def _schema_text(schema: T.StructType | None) -> str:
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields) if schema else "(no table)"


def _properties(target: DeltaTarget) -> dict[str, str]:
    table = open_table(target)
    return dict(table.metadata().configuration) if table is not None else {}


def build_apply_schema_change_job(table_for: Callable[[str, str], CapturedTable], limits: BatchLimits
                                  ) -> JobDefinition:
    """``apply_schema_change_job``; ``table_for(connector, table)`` gives a table's capture (for a DROP's
    last merge, with ``limits``)."""

    @op(description="Bring one table's Delta target to its latest schema change (create, evolve or retire).",
        pool="cdc_schema_changes")
    def apply_schema_change(context: OpExecutionContext, config: SchemaChangeConfig, spark: SparkResource,
                            kafka: KafkaResource, delta: DeltaResource) -> None:
        target = DeltaTarget(config.delta_path, dict(delta.as_config().storage_options))
        change = change_row(connector=config.connector, table=config.table, change=config.change,
                            primary_keys=tuple(config.primary_keys),
                            columns=T.StructType.fromJson(json.loads(config.columns)),
                            source_position=config.source_position, topic=config.topic, partition=config.partition,
                            offset=config.offset, run_id=context.run_id)
        history = read_history(delta.registry_path, delta.as_config().storage_options, pending=change)[
            (config.connector, config.table)]
        latest = history[-1]
        metadata: dict[str, Any] = {
            "change": config.change, "source_position": config.source_position,
            "schema_topic_offset": f"{config.topic}[{config.partition}]@{config.offset}",
        }
        if (latest.topic, latest.partition, latest.offset) != (config.topic, config.partition, config.offset):
            metadata["superseded_by"] = (f"{latest.change} at {latest.source_position} "
                                         f"({latest.topic}[{latest.partition}]@{latest.offset})")
            context.log.info(f"{config.change} of {config.table} at {config.source_position} arrived after the "
                             f"later {metadata['superseded_by']}: the table is brought to that one")
        table = table_for(config.connector, config.table)
        if latest.change == "DROP":
            metadata.update(_retire(context, table, target, spark, kafka, delta, limits))
        else:
            drop = _last_drop(history)
            if drop is not None and _holds_rows_from_before(target, drop):
                metadata.update(_start_anew(context, table, drop, history, target, spark, kafka, delta, limits))
            if config.renames:  # the rows a rename's copy reads must hold every change made before it
                metadata["events_merged_before_rename"] = _merge_pending(
                    context, table, spark, kafka, delta, limits, f"the RENAME COLUMN at {config.source_position}")
            if config.renamed_from:
                metadata.update(_take_over(context, config, table_for, target, spark, kafka, delta, limits))
            metadata.update(_evolve(config, history, target, spark, delta))
        # Only now: a run that failed above leaves the registry (and the asset it loads) as it was.
        append_change(delta.registry_path, delta.as_config().storage_options, change)
        context.log_event(AssetMaterialization(
            asset_key=AssetKey(config.asset_key),
            description=f"schema change {config.change} at {config.source_position or 'unknown position'}",
            metadata={**metadata, "delta_path": MetadataValue.path(config.delta_path)}))

    @job(name="apply_schema_change_job",
         description="Apply one schema change (CREATE/ALTER/DROP) to a table's Delta target; requested by "
                     "schema_change_sensor.")
    def apply_schema_change_job() -> None:
        apply_schema_change()

    return apply_schema_change_job


def _last_drop(history: Sequence[RegistryEntry]) -> RegistryEntry | None:
    """The table's latest DROP in source order, None if it was never dropped."""
    return next((entry for entry in reversed(history) if entry.change == "DROP"), None)


def _drop_mark(drop: RegistryEntry) -> str:
    """What ``cdc_assets.recreated_after`` holds for a table created again after ``drop``: its source position
    (shared by a replay of it after a connector restart), else its schema-change topic coordinates."""
    return drop.source_position or f"{drop.topic}[{drop.partition}]@{drop.offset}"


def _holds_rows_from_before(target: DeltaTarget, drop: RegistryEntry) -> bool:
    """Whether the table exists with the rows of an incarnation from before ``drop`` (not started anew since)."""
    table = open_table(target)
    return table is not None and dict(table.metadata().configuration).get(RECREATED_AFTER_PROPERTY, "") != \
        _drop_mark(drop)


def _columns_ever(history: Sequence[RegistryEntry]) -> T.StructType:
    """Every column the table's changes since its last DROP announced, in the order they first appeared, each
    with its latest type: what its Delta table holds after them in order, as a dropped column stays in Delta."""
    columns: dict[str, T.StructField] = {}
    drop = _last_drop(history)
    for entry in history[history.index(drop) + 1:] if drop is not None else history:
        if entry.change != "DROP":
            columns.update({field.name: field for field in entry.columns.fields})
    return T.StructType(list(columns.values()))


def _evolve(config: SchemaChangeConfig, history: Sequence[RegistryEntry], target: DeltaTarget,
            spark: SparkResource, delta: DeltaResource) -> dict[str, Any]:
    """Create or evolve the table to its changes' columns, the latest change (a CREATE or ALTER) deciding
    which are dropped: the same table whatever order the changes' runs took."""
    writer = delta.writer_for_schema_changes(spark)
    latest = history[-1]
    before = writer.table_schema(target)
    diff = diff_schema(before or T.StructType([]), _columns_ever(history))
    if diff.refused:
        raise SchemaChangeError(
            f"{config.topic} partition {config.partition} offset {config.offset}: {config.change} of "
            f"{config.table} changes types the wide-type policy cannot absorb: {list(diff.refused)}; rewrite "
            "the table (or recreate it and request an incremental snapshot)")
    held = [*(before.fieldNames() if before else []), *(field.name for field in diff.added)]
    dropped = [name for name in held if name not in latest.columns.fieldNames() and not name.startswith(HIDDEN_PREFIX)]
    current = _properties(target)
    wanted_properties = {DROPPED_COLUMNS_PROPERTY: ",".join(dropped)}
    drop = _last_drop(history)
    if drop is not None:  # a table created after a DROP holds only the rows since (``_start_anew``)
        wanted_properties[RECREATED_AFTER_PROPERTY] = _drop_mark(drop)
    renames = [(old, new) for old, new in config.renames if old in held and new in held]
    if renames:
        noted = [pair for pair in current.get(RENAMED_COLUMNS_PROPERTY, "").split(",") if pair]
        noted += [f"{old}->{new}" for old, new in renames if f"{old}->{new}" not in noted]
        wanted_properties[RENAMED_COLUMNS_PROPERTY] = ",".join(noted)
    # Only what differs: the snapshot's CREATE of a table as it is changes nothing, not even a property.
    properties = {k: v for k, v in wanted_properties.items() if current.get(k, "") != v}
    hidden = apply_mode(config.apply_mode).hidden_fields
    wanted = T.StructType([*diff.added, *hidden]) if before is None else T.StructType(list(diff.added))
    changed = writer.ensure_columns(target, _arrow(wanted), properties) if wanted.fields or properties else []
    # Rows last changed before the rename hold their value under the old name: the new one gets it, so a
    # row the rename did not touch reads as SELECT * does at the source. In any order: by source position.
    copied = writer.copy_renamed(target, renames, config.source_position,
                                 apply_mode(config.apply_mode).changed_at_column) if renames else 0
    source_changes = source_type_changes(history[-2].columns, latest.columns) if len(history) > 1 else []
    after = writer.table_schema(target)
    return {"old_schema": _schema_text(before), "new_schema": _schema_text(after),
            "added_columns": list(changed) if before is not None else [], "dropped_columns": dropped,
            "widened_columns": sorted({*diff.widened, *(c.split(":")[0] for c in source_changes)}),
            "source_type_changes": source_changes, "created": before is None, "renamed_rows_copied": copied}


def _take_over(context: OpExecutionContext, config: SchemaChangeConfig,
               table_for: Callable[[str, str], CapturedTable], target: DeltaTarget, spark: SparkResource,
               kafka: KafkaResource, delta: DeltaResource, limits: BatchLimits) -> dict[str, Any]:
    """A renamed table's rows go on under its new name: the old table's pending events are merged, then its
    rows (positions and all: the new name's events, all later, win over them) become the new table's."""
    assert config.renamed_from is not None
    writer = delta.writer_for_schema_changes(spark)
    if writer.table_schema(target) is not None:
        context.log.warning(f"{config.table} was renamed from {config.renamed_from} but already has a Delta table: "
                            "its rows from before the rename are not copied; request an incremental snapshot")
        return {"renamed_from": config.renamed_from, "rows_taken_over": 0}
    previous = table_for(config.connector, config.renamed_from)
    merged = _merge_pending(context, previous, spark, kafka, delta, limits,
                            f"the RENAME TABLE to {config.table} at {config.source_position}")
    copied = writer.copy_table(previous.target, target) if writer.table_schema(previous.target) is not None else 0
    return {"renamed_from": config.renamed_from, "events_merged_before_rename": merged, "rows_taken_over": copied}


def _merge_pending(context: OpExecutionContext, table: CapturedTable, spark: SparkResource, kafka: KafkaResource,
                   delta: DeltaResource, limits: BatchLimits, needed_by: str) -> int:
    """Merge every pending change event of the table, as merge runs would, in as many rounds of
    ``max_batches_per_run`` batches as it takes: until its offsets reach the topic's end as of the first round
    (every event made before the DDL is there: the run started after the DDL was read), or a batch reaches the
    topic's end as of its start. Returns the events read. Before a DROP they were all made before it; before a
    rename's copy, the rows they change hold their last values. A round that commits nothing fails the run
    (``needed_by`` says for what) before the change is applied: a retry goes on from there."""
    source = kafka.new_source()
    writer = delta.writer_for(spark.spark_session)
    events = 0
    stop: dict[int, int] = {}
    try:
        while True:
            before = _committed_offsets(writer, table)
            reports = apply_pending(table, kafka=source, spark=spark.spark_session, writer=writer, limits=limits)
            events += sum(report.events_read for report in reports)
            # Bounded by the first round's end: a busy table's later events need not be chased.
            stop = stop or dict(reports[0].raw.high_watermarks)
            after = _committed_offsets(writer, table)
            if reports[-1].raw.caught_up or all(after.get(p, 0) >= high for p, high in stop.items()):
                return events
            if after == before:
                raise SchemaChangeError(
                    f"{table.topic}: {needed_by} needs every event before it merged first, but a merge round stopped "
                    f"at offsets {after} below the high watermarks {reports[-1].raw.high_watermarks} and committed "
                    "nothing (a transaction not complete yet?); the change was not applied: retry the run")
            context.log.info(f"{table.topic}: {events} events merged for {needed_by}, not at the topic's end yet "
                             f"(offsets {after}): merging on")
    except SourceError as exc:
        if "does not exist" not in str(exc):
            raise
        context.log.info(f"{table.topic}: no topic, so no change event to merge")
        return events
    finally:
        source.close()


def _committed_offsets(writer: DeltaWriter, table: CapturedTable) -> dict[int, int]:
    """The offsets the table's latest batch commit recorded (empty: none yet)."""
    progress = writer.read_progress(table.target, table.app_id)
    return dict(progress.offsets) if progress is not None else {}


def _retire(context: OpExecutionContext, table: CapturedTable, target: DeltaTarget, spark: SparkResource,
            kafka: KafkaResource, delta: DeltaResource, limits: BatchLimits) -> Mapping[str, Any]:
    """Merge the dropped table's pending events (every one was made before the DROP), then retire it."""
    events = _merge_pending(context, table, spark, kafka, delta, limits, "its DROP")
    writer = delta.writer_for_schema_changes(spark)
    before = writer.table_schema(target)
    if before is not None and _properties(target).get(RETIRED_PROPERTY) != "true":
        writer.ensure_columns(target, _arrow(before), {RETIRED_PROPERTY: "true"})
    schema = _schema_text(before)
    return {"retired": True, "events_merged_before_drop": events, "old_schema": schema, "new_schema": schema}


def _start_anew(context: OpExecutionContext, table: CapturedTable, drop: RegistryEntry,
                history: Sequence[RegistryEntry], target: DeltaTarget, spark: SparkResource, kafka: KafkaResource,
                delta: DeltaResource, limits: BatchLimits) -> Mapping[str, Any]:
    """The table was created again after ``drop``, and its Delta table still holds the incarnation before: those
    rows (their pending events merged first, unless the DROP's run retired them) are copied to a retired table at
    ``<path>__retired_<n>``, then the table is emptied, with the new incarnation's columns and its offsets kept."""
    current = _properties(target)
    events = 0 if current.get(RETIRED_PROPERTY) == "true" else _merge_pending(
        context, table, spark, kafka, delta, limits, f"the DROP at {drop.source_position}")
    writer = delta.writer_for_schema_changes(spark)
    earlier = [path for path in current.get(EARLIER_INCARNATIONS_PROPERTY, "").split(",") if path]
    number = len(earlier) + 1
    while writer.table_schema(aside := DeltaTarget(f"{target.path}{RETIRED_COPY_SUFFIX}{number}",
                                                   target.storage_options)) is not None:
        number += 1  # left by a run that failed before emptying the table: kept, never overwritten
    rows = writer.copy_table(target, aside)
    old_schema = writer.table_schema(target)
    assert old_schema is not None  # ``_holds_rows_from_before`` found the table
    writer.ensure_columns(aside, _arrow(old_schema), {RETIRED_PROPERTY: "true"})
    columns = T.StructType([*_columns_ever(history).fields, *apply_mode(table.apply_mode).hidden_fields])
    writer.empty_table(target, _arrow(columns), {
        RETIRED_PROPERTY: "false", DROPPED_COLUMNS_PROPERTY: "", RENAMED_COLUMNS_PROPERTY: "",
        RECREATED_AFTER_PROPERTY: _drop_mark(drop), EARLIER_INCARNATIONS_PROPERTY: ",".join([*earlier, aside.path])})
    context.log.info(f"{table.name} was dropped at {drop.source_position} and created again: its {rows} rows from "
                     f"before are now at {aside.path} (retired); the table starts empty")
    return {"earlier_incarnation_path": MetadataValue.path(aside.path), "earlier_incarnation_rows": rows,
            "earlier_incarnation_schema": _schema_text(old_schema), "events_merged_before_drop": events}
