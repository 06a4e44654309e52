"""The cron schedules of the pipeline's jobs: merges, freshness checks and compaction."""

from __future__ import annotations

from pydantic import Field

from cdc_assets.config.base import ConfigModel


class MergeScheduleConfig(ConfigModel):
    """A cron schedule for ``cdc_merge_job``."""

    cron: str
    running: bool = False
    timezone: str = "UTC"


class FreshnessScheduleConfig(MergeScheduleConfig):
    """A cron schedule for the freshness checks (read-only, so running by default)."""

    cron: str = "*/5 * * * *"
    running: bool = True


class CompactionConfig(MergeScheduleConfig):
    """``cdc_compaction_job``'s schedule and threshold: tables with at least ``min_files`` data files are compacted."""

    cron: str = "0 3 * * *"
    min_files: int = Field(default=32, gt=0)
