"""The micro-batch merge job: one MERGE per captured table, in one process and one Spark session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckKey,
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

MERGE_JOB = "cdc_merge_job"


def build_merge_job(scheduled_checks: Sequence[AssetCheckKey]) -> UnresolvedAssetJobDefinition:
    """The merge job: every CDC table asset (kinds delta and kafka) whose source table was not dropped,
    with the checks its merge evaluates, but not ``scheduled_checks``: those on the freshness schedule.
    The live freshness checks look at the topic as it is now, and after a merge would only repeat its
    ``caught_up``, for a Kafka and Delta round trip per table (12 s of a 200-table run); the others are
    warnings a merge run leaves to that schedule (``cdc_assets.checks.evaluated_after_merge``)."""
    return define_asset_job(
        MERGE_JOB,
        selection=(AssetSelection.kind("delta") & AssetSelection.kind("kafka"))
        - AssetSelection.tag(STATUS_TAG, "retired") - AssetSelection.checks(*scheduled_checks),
        executor_def=in_process_executor,
        description="Merge each captured table's new change events into its Delta table (one micro-batch each).",
    )


def build_merge_schedules(config: PipelineConfig, job: UnresolvedAssetJobDefinition) -> list[ScheduleDefinition]:
    """The merge schedule of ``job`` from the config (none if the config has no ``merge_schedule``)."""
    schedule = config.merge_schedule
    if schedule is None:
        return []
    return [configured_schedule("cdc_merge_schedule", job, schedule)]


def configured_schedule(name: str, job: JobDefinition | UnresolvedAssetJobDefinition,
                        schedule: MergeScheduleConfig) -> ScheduleDefinition:
    """A schedule of ``job`` as a config section gives it: cron, time zone, running or stopped."""
    return ScheduleDefinition(
        name=name, job=job, cron_schedule=schedule.cron, execution_timezone=schedule.timezone,
        default_status=DefaultScheduleStatus.RUNNING if schedule.running else DefaultScheduleStatus.STOPPED)
