"""The ``rows_match_source`` checks' jobs: one per connector whose tables have the check, scheduled when the
connector's ``rows_match_source.cron`` is set (stopped unless ``running``), and a schedule of its own for each
table that sets one (``tables[].rows_match_source``), which the connector's schedule then leaves out. The checks
are in no other job: a merge run or the freshness schedule never waits for a comparison with the source
database."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dagster import AssetCheckKey, AssetSelection, ScheduleDefinition, define_asset_job, in_process_executor

from cdc_assets.config import ConnectorConfig, MergeScheduleConfig
from cdc_assets.translator import dagster_name
from jobs.merge import configured_schedule

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def build_rows_match_source_job(connector: ConnectorConfig, check_keys: Mapping[str, AssetCheckKey]
                                ) -> tuple[UnresolvedAssetJobDefinition, list[ScheduleDefinition]]:
    """The job running ``connector``'s ``rows_match_source`` checks (``check_keys``, by table name) and its
    schedules: the connector's (its cron, for the tables without one of their own) and one per table that sets
    its own."""
    name = f"{dagster_name(connector.name)}_rows_match_source"
    job = define_asset_job(f"{name}_job", selection=AssetSelection.checks(*check_keys.values()),
                           executor_def=in_process_executor,
                           description=f"Compare each table of {connector.name} with its source table "
                                       "(rows_match_source).")
    own = {table.name: table.rows_match_source for table in connector.tables
           if table.rows_match_source is not None and table.name in check_keys}
    schedules = [configured_schedule(f"{dagster_name(connector.name)}_{dagster_name(table)}_rows_match_source_schedule",
                                     job, settings, [check_keys[table]]) for table, settings in own.items()]
    settings = connector.rows_match_source
    rest = [key for table, key in check_keys.items() if table not in own]
    if settings is not None and settings.cron is not None and rest:
        schedules.append(configured_schedule(f"{name}_schedule", job, MergeScheduleConfig(
            cron=settings.cron, running=settings.running, timezone=settings.timezone), rest))
    return job, schedules
