"""The ``rows_match_source`` checks' jobs: one per connector whose tables have the check, scheduled when the
connector's ``rows_match_source.cron`` is set (stopped unless ``running``). The checks are in no other job: a
merge run or the freshness schedule never waits for a comparison with the source database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import AssetCheckKey, AssetSelection, ScheduleDefinition, define_asset_job, in_process_executor

from cdc_assets.config import ConnectorConfig, MergeScheduleConfig
from cdc_assets.translator import dagster_name
from jobs.merge import configured_schedule

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def build_rows_match_source_job(connector: ConnectorConfig, check_keys: Sequence[AssetCheckKey]
                                ) -> tuple[UnresolvedAssetJobDefinition, ScheduleDefinition | None]:
    """The job running ``connector``'s ``rows_match_source`` checks ``check_keys``, and its schedule (None
    without a cron)."""
    name = f"{dagster_name(connector.name)}_rows_match_source"
    job = define_asset_job(f"{name}_job", selection=AssetSelection.checks(*check_keys),
                           executor_def=in_process_executor,
                           description=f"Compare each table of {connector.name} with its source table "
                                       "(rows_match_source).")
    settings = connector.rows_match_source
    if settings is None or settings.cron is None:
        return job, None
    schedule = MergeScheduleConfig(cron=settings.cron, running=settings.running, timezone=settings.timezone)
    return job, configured_schedule(f"{name}_schedule", job, schedule)
