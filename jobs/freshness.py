"""The checks on their own schedule: the freshness checks look at the topics and the Delta logs as
they are now, so a pipeline that stopped running fails them even though no run records anything; the
table checks that merge runs leave to it (``checks_after_merge: blocking``) look at what the merges left."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckKey,
    AssetSelection,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from cdc_assets.config import PipelineConfig
from jobs.merge import configured_schedule

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

FRESHNESS_JOB = "cdc_freshness_job"


def build_freshness_job(check_keys: Sequence[AssetCheckKey]) -> UnresolvedAssetJobDefinition:
    """The job that runs only the scheduled checks ``check_keys`` (no materialization)."""
    return define_asset_job(FRESHNESS_JOB, selection=AssetSelection.checks(*check_keys),
                            executor_def=in_process_executor,
                            description="Check every table now: its freshness (events waiting in its topic, the "
                                        "connector's heartbeats), and the checks its merge runs leave to this job "
                                        "(capture lag, dead letters, schema, transactions).")


def build_freshness_schedule(config: PipelineConfig, job: UnresolvedAssetJobDefinition) -> ScheduleDefinition:
    """The scheduled checks' schedule (``freshness_schedule``: every 5 minutes, running, by default)."""
    return configured_schedule("cdc_freshness_schedule", job, config.freshness_schedule)
