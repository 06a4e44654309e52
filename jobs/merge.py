"""The micro-batch merge job: one MERGE per captured table, in one process and one Spark session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from cdc_assets.config import MergeScheduleConfig, PipelineConfig
from cdc_assets.translator import STATUS_TAG

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster import JobDefinition
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

cdc_merge_job = define_asset_job(
    "cdc_merge_job",
    # Every CDC table asset (kinds delta and kafka) whose source table was not dropped.
    selection=(AssetSelection.kind("delta") & AssetSelection.kind("kafka"))
    - AssetSelection.tag(STATUS_TAG, "retired"),
    executor_def=in_process_executor,
    description="Merge each captured table's new change events into its Delta table (one micro-batch each).",
)


def build_merge_schedules(config: PipelineConfig) -> list[ScheduleDefinition]:
    """The merge schedule from the config (none if the config has no ``merge_schedule``)."""
    schedule = config.merge_schedule
    if schedule is None:
        return []
    return [configured_schedule("cdc_merge_schedule", cdc_merge_job, schedule)]


def configured_schedule(name: str, job: JobDefinition | UnresolvedAssetJobDefinition,
                        schedule: MergeScheduleConfig) -> ScheduleDefinition:
    """A schedule of ``job`` as a config section gives it: cron, time zone, running or stopped."""
    return ScheduleDefinition(
        name=name, job=job, cron_schedule=schedule.cron, execution_timezone=schedule.timezone,
        default_status=DefaultScheduleStatus.RUNNING if schedule.running else DefaultScheduleStatus.STOPPED)
