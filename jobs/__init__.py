"""Jobs of the code location: the micro-batch merge, the snapshot signals and compaction."""

from jobs.compaction import build_compaction_job, build_compaction_schedule
from jobs.freshness import build_freshness_job, build_freshness_schedule
from jobs.merge import build_merge_job, build_merge_schedules
from jobs.preflight import build_preflight_job
from jobs.reconcile import build_rows_match_source_job
from jobs.schema_changes import build_apply_schema_change_job
from jobs.snapshots import (
    build_snapshot_schedules,
    execute_snapshot_run_config,
    incremental_snapshot_job,
    pause_snapshot_job,
    resume_snapshot_job,
    stop_snapshot_job,
)

__all__ = [
    "build_apply_schema_change_job",
    "build_compaction_job",
    "build_compaction_schedule",
    "build_freshness_job",
    "build_freshness_schedule",
    "build_merge_job",
    "build_merge_schedules",
    "build_preflight_job",
    "build_rows_match_source_job",
    "build_snapshot_schedules",
    "execute_snapshot_run_config",
    "incremental_snapshot_job",
    "pause_snapshot_job",
    "resume_snapshot_job",
    "stop_snapshot_job",
]
