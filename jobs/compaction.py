"""Compaction: each micro-batch is one commit with files of its own, so small files pile up; this job
bin-packs them (OPTIMIZE) in every table that has at least ``compaction.min_files`` data files.

One op per connector, in the connector's pool: with the pool limit of 1 that keeps merges apart
(docs/operations.md), a compaction never races a merge of the same table. An OPTIMIZE commit records
no offsets; the writers read theirs from the latest commit that does, so merges resume exactly.
"""

from collections.abc import Sequence

from dagster import Field as DagsterField
from dagster import (
    Int,
    JobDefinition,
    OpDefinition,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import PipelineConfig
from cdc_assets.resources import DeltaResource, SparkResource
from cdc_assets.translator import dagster_name
from jobs.merge import configured_schedule

COMPACTION_JOB = "cdc_compaction_job"


def _compaction_op(connector: str, tables: Sequence[CapturedTable], min_files: int) -> OpDefinition:
    @op(name=f"{dagster_name(connector)}_compact", pool=f"cdc_connector_{dagster_name(connector)}",
        description=f"Compact the small files of connector {connector}'s tables.",
        config_schema={"min_files": DagsterField(Int, default_value=min_files,
                                                 description="compact tables with at least this many data files")})
    def compact(context: OpExecutionContext, spark: SparkResource, delta: DeltaResource) -> Output[int]:
        least = int(context.op_config["min_files"])
        writer = delta.writer_for_schema_changes(spark)
        compacted = 0
        report: dict[str, str] = {}
        for table in tables:
            outcome = writer.compact(table.target, least)
            if outcome is None:
                report[table.name] = "no table yet"
            elif outcome.compacted:
                compacted += 1
                report[table.name] = (f"{outcome.files_before} files: {outcome.files_removed} removed, "
                                      f"{outcome.files_added} added (version {outcome.delta_version})")
            else:
                report[table.name] = f"{outcome.files_before} files, below {least}: left as is"
            context.log.info(f"{table.name}: {report[table.name]}")
        return Output(compacted, metadata={"tables_compacted": compacted, **report})

    return compact


def build_compaction_job(config: PipelineConfig, live: Sequence[CapturedTable]) -> JobDefinition:
    """``cdc_compaction_job``: one op per connector compacting its ``live`` (not retired) tables."""
    by_connector: dict[str, list[CapturedTable]] = {}
    for table in live:
        by_connector.setdefault(table.connector, []).append(table)
    ops = [_compaction_op(connector, members, config.compaction.min_files)
           for connector, members in by_connector.items()]

    @job(name=COMPACTION_JOB, description="Compact the small files that one commit per micro-batch leaves "
                                          "(OPTIMIZE) in every table with at least min_files data files.")
    def compaction_job() -> None:
        for compact in ops:
            compact()

    return compaction_job


def build_compaction_schedule(config: PipelineConfig, compaction_job: JobDefinition) -> ScheduleDefinition:
    """The compaction schedule (``compaction``: daily at 03:00, stopped, by default)."""
    return configured_schedule("cdc_compaction_schedule", compaction_job, config.compaction)
