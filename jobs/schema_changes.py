"""Applying schema changes: ``apply_schema_change_job`` brings a table's Delta target to the schema
its latest change announces, before the next merge sees events of the new shape, and records the
change in the table registry. What each change does is ``core.schema_evolution``'s policy, carried out
by ``cdc_assets.schema_changes.SchemaChangeRun``; this module wires it into an op.

Each run logs a materialization of the table's asset with the old and new schema and the DDL's
source position. The runs share the pool ``cdc_schema_changes``: with a limit of 1 they never race.
"""

import json
from collections.abc import Callable
from typing import Any

from dagster import (
    AssetKey,
    AssetMaterialization,
    Config,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunConfig,
    job,
    op,
)
from pydantic import Field
from pyspark.sql import types as T

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core.apply_modes import ApplyModeName
from cdc_assets.core.schema_change import TableChange
from cdc_assets.core.schema_evolution import AnnouncedChange
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.resources import DeltaResource, KafkaResource, SparkResource
from cdc_assets.schema_changes import SchemaChangeRun, merge_pending

APPLY_OP = "apply_schema_change"


class SchemaChangeConfig(Config):
    """One table change from a schema-change event (the sensor fills this in: ``of``)."""

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

    @classmethod
    def of(cls, announced: AnnouncedChange, asset_key: AssetKey, delta_path: str) -> "SchemaChangeConfig":
        """The config of a run applying ``announced`` to the table of ``asset_key`` at ``delta_path``."""
        change = announced.change
        return cls(connector=announced.connector, table=change.name, change=change.type,
                   columns=change.columns.json(), primary_keys=list(change.primary_keys),
                   renames=[list(pair) for pair in change.renames], renamed_from=change.renamed_from,
                   asset_key=list(asset_key.path), delta_path=delta_path, apply_mode=announced.apply_mode,
                   source_position=announced.source_position, topic=announced.topic,
                   partition=announced.partition, offset=announced.offset)

    def run_config(self) -> dict[str, Any]:
        """The run config of an ``apply_schema_change_job`` run with this config."""
        return {"ops": RunConfig(ops={APPLY_OP: self}).to_config_dict()["ops"]}

    def announced(self) -> AnnouncedChange:
        """The change this config names."""
        change = TableChange(self.change, self.table, tuple(self.primary_keys),
                             T.StructType.fromJson(json.loads(self.columns)),
                             tuple((old, new) for old, new in self.renames), self.renamed_from)
        return AnnouncedChange(self.connector, change, self.source_position, self.topic, self.partition,
                               self.offset, self.apply_mode)


def build_apply_schema_change_job(table_for: Callable[[str, str], CapturedTable], limits: BatchLimits
                                  ) -> JobDefinition:
    """``apply_schema_change_job``; ``table_for(connector, table)`` gives a table's capture (for a DROP's
    last merge, with ``limits``)."""

    @op(name=APPLY_OP, pool="cdc_schema_changes",
        description="Bring one table's Delta target to its latest schema change (create, evolve or retire).")
    def apply_schema_change(context: OpExecutionContext, config: SchemaChangeConfig, spark: SparkResource,
                            kafka: KafkaResource, delta: DeltaResource) -> None:
        def merge(table: CapturedTable, needed_by: str) -> int:
            return merge_pending(table, kafka.new_source(), spark.spark_session, delta.writer_for(spark.spark_session),
                                 limits, needed_by, context.log)

        run = SchemaChangeRun(table_for, delta.writer_for_schema_changes(spark), merge, context.log)
        storage_options = delta.as_config().storage_options
        metadata = run.apply(config.announced(), DeltaTarget(config.delta_path, dict(storage_options)),
                             delta.registry_path, storage_options, context.run_id)
        if "earlier_incarnation_path" in metadata:
            metadata["earlier_incarnation_path"] = MetadataValue.path(metadata["earlier_incarnation_path"])
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
