"""Applying schema changes: ``apply_schema_change_job`` evolves a table's Delta schema before the
next merge sees events of the new shape, and records the change in the table registry.

- CREATE: the Delta table is created with the announced columns (wide-type policy) and the hidden
  columns of its apply mode; the registry entry makes it an asset at the next code-location load.
- ALTER: added columns are added (nullable; existing rows read null). Widened types need nothing
  (wide-type policy). Dropped columns stay, nullable, listed in the table property
  ``cdc_assets.dropped_columns``. A rename found in the DDL is applied as drop + add and noted in
  ``cdc_assets.renamed_columns``. A type change the policy cannot absorb (e.g. a decimal scale
  change) fails the run with a clear message.
- DROP: the table and its data stay; the asset is retired (``cdc_assets.retired`` property,
  registry status), and ``cdc_merge_job`` no longer selects it.
Each run logs a materialization of the table's asset with the old and new schema and the DDL's
source position.
"""

import json
from typing import Any

import pyarrow as pa
from dagster import AssetKey, AssetMaterialization, Config, MetadataValue, OpExecutionContext, job, op
from pydantic import Field
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from cdc_assets.core.apply_modes import ApplyModeName, apply_mode
from cdc_assets.core.schema_change import SchemaChangeError, diff_schema, source_type_changes
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.registry import read_registry, record_change
from cdc_assets.resources import DeltaResource, SparkResource


class SchemaChangeConfig(Config):
    """One table change from a schema-change event (the sensor fills this in)."""

    connector: str
    table: str = Field(description="<schema>.<table>")
    change: str = Field(description="CREATE, ALTER or DROP")
    columns: str = Field(description="announced columns: Spark StructType JSON")
    primary_keys: list[str] = []
    renames: list[list[str]] = []
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


@op(description="Create, evolve or retire one table's Delta target for a schema change.")
def apply_schema_change(context: OpExecutionContext, config: SchemaChangeConfig, spark: SparkResource,
                        delta: DeltaResource) -> None:
    writer = delta.writer_for_schema_changes(spark)
    target = DeltaTarget(config.delta_path, dict(delta.storage_options))
    announced = T.StructType.fromJson(json.loads(config.columns))
    before = writer.table_schema(target)
    metadata: dict[str, Any] = {
        "change": config.change, "source_position": config.source_position,
        "schema_topic_offset": f"{config.topic}[{config.partition}]@{config.offset}",
        "old_schema": _schema_text(before),
    }
    properties: dict[str, str] = {}
    if config.change == "DROP":
        if before is not None:
            writer.ensure_columns(target, _arrow(before), {"cdc_assets.retired": "true"})
        metadata["retired"] = True
    else:
        diff = diff_schema(before or T.StructType([]), announced)
        if diff.refused:
            raise SchemaChangeError(
                f"{config.topic} partition {config.partition} offset {config.offset}: {config.change} of "
                f"{config.table} changes types the wide-type policy cannot absorb: {list(diff.refused)}; rewrite "
                "the table (or recreate it and request an incremental snapshot)")
        if diff.dropped:
            properties["cdc_assets.dropped_columns"] = ",".join(diff.dropped)
        if config.renames:
            properties["cdc_assets.renamed_columns"] = ",".join(f"{old}->{new}" for old, new in config.renames)
        hidden = apply_mode(config.apply_mode).hidden_fields
        wanted = T.StructType([*announced.fields, *hidden]) if before is None else T.StructType(list(diff.added))
        changed = writer.ensure_columns(target, _arrow(wanted),
                                        properties)
        previous = read_registry(delta.registry_path, delta.storage_options).get((config.connector, config.table))
        source_changes = source_type_changes(previous.columns, announced) if previous else []
        metadata.update(added_columns=list(changed) if before is not None else [], dropped_columns=list(diff.dropped),
                        widened_columns=sorted({*diff.widened, *(c.split(":")[0] for c in source_changes)}),
                        source_type_changes=source_changes, created=before is None)
    after = writer.table_schema(target)
    metadata["new_schema"] = _schema_text(after)
    record_change(delta.registry_path, delta.storage_options, connector=config.connector, table=config.table,
                  change=config.change, primary_keys=tuple(config.primary_keys), columns=announced,
                  source_position=config.source_position, topic=config.topic, partition=config.partition,
                  offset=config.offset, run_id=context.run_id)
    context.log_event(AssetMaterialization(
        asset_key=AssetKey(config.asset_key),
        description=f"schema change {config.change} at {config.source_position or 'unknown position'}",
        metadata={**metadata, "delta_path": MetadataValue.path(config.delta_path)}))


@job(description="Apply one schema change (CREATE/ALTER/DROP) to a table's Delta target; requested by "
                 "schema_change_sensor.")
def apply_schema_change_job() -> None:
    apply_schema_change()
