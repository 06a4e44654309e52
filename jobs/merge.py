"""The micro-batch merge job: one MERGE per captured table, in one process and one Spark session."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    in_process_executor,
    schedule,
)

from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import merge_run_checks
from cdc_assets.config import MergeScheduleConfig, PipelineConfig
from cdc_assets.io.kafka import TopicProbe
from cdc_assets.merge.quiet import caught_up
from cdc_assets.topics import recorded_ends
from cdc_assets.translator import STATUS_TAG, CdcTranslator

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export its name
    from dagster import JobDefinition
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

MERGE_JOB = "cdc_merge_job"
# The UI's Materialize runs the first job, by name, that holds every selected asset, with each of their checks
# that job holds. Dagster's __ASSET_JOB holds every check (the scheduled ones too); a capital sorts before it.
UI_MERGE_JOB = "CDC_merge_from_UI"


def build_merge_job(scheduled_checks: Sequence[AssetCheckKey], name: str = MERGE_JOB) -> UnresolvedAssetJobDefinition:
    """The merge job: every CDC table asset (kinds delta and kafka) whose source table was not dropped,
    with the checks its merge evaluates, but not ``scheduled_checks``: those on the freshness schedule.
    The live freshness checks look at the topic as it is now, and after a merge would only repeat its
    ``caught_up``, for a Kafka and Delta round trip per table (12 s of a 200-table run); the others are
    warnings a merge run leaves to that schedule (``cdc_assets.checks.evaluated_after_merge``).

    ``name``: ``MERGE_JOB``, or ``UI_MERGE_JOB`` for the same job under the name the UI's Materialize picks."""
    description = "Merge each captured table's new change events into its Delta table (one micro-batch each)."
    if name == UI_MERGE_JOB:
        description = (f"{MERGE_JOB} as the UI's Materialize runs it: with the checks {MERGE_JOB} evaluates "
                       "(the UI runs the first job, by name, holding the selected assets).")
    return define_asset_job(
        name,
        selection=(AssetSelection.kind("delta") & AssetSelection.kind("kafka"))
        - AssetSelection.tag(STATUS_TAG, "retired") - AssetSelection.checks(*scheduled_checks),
        executor_def=in_process_executor,
        description=description,
    )


def build_merge_schedules(config: PipelineConfig, job: UnresolvedAssetJobDefinition,
                          tables: Sequence[CapturedTable], kafka_settings: Mapping[str, Any],
                          translator: CdcTranslator | None = None) -> list[ScheduleDefinition]:
    """The merge schedule of ``job`` from the config (none if the config has no ``merge_schedule``): each tick
    requests a run of the live ``tables`` with new events in their topics (``pending_tables``), and no run
    when there are none, so quiet tables cost a tick nothing but one look at their topics' end offsets."""
    settings = config.merge_schedule
    if settings is None:
        return []
    translator = translator or CdcTranslator()
    live = {translator.get_asset_key(table): table for table in tables if not table.retired}

    @schedule(name="cdc_merge_schedule", job=job, cron_schedule=settings.cron,
              execution_timezone=settings.timezone,
              default_status=DefaultScheduleStatus.RUNNING if settings.running else DefaultScheduleStatus.STOPPED,
              description="Merges the tables whose topics hold events their last merge did not apply; "
                          "no run when every table is caught up")
    def cdc_merge_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        with TopicProbe(kafka_settings) as probe:
            pending = pending_tables(live, context.instance, probe)
        if not pending:
            return SkipReason(f"all {len(live)} tables are caught up: no new events in their topics")
        return RunRequest(asset_selection=list(pending), asset_check_keys=merge_run_checks(pending),
                          tags={"cdc_assets/pending_tables": str(len(pending))})

    return [cdc_merge_schedule]


def pending_tables(tables: Mapping[AssetKey, CapturedTable], instance: DagsterInstance, probe: TopicProbe
                   ) -> dict[AssetKey, CapturedTable]:
    """The ``tables`` whose topics end past the offsets their latest materialization recorded (or that have
    none): one event-log query and one look at every topic's end offsets, no Delta read.

    The materialization records the offsets its Delta commit made; a table is skipped only when its topic
    ends exactly there (``merge.quiet.caught_up``, the rule a run applies to the offsets in Delta). A table
    whose Delta table went back (a RESTORE) waits for its next event; one whose merge failed, or whose topic
    is missing, is requested again (the run then says why)."""
    recorded = recorded_ends(instance, list(tables))
    ends = probe.end_offsets(table.topic for table in tables.values())
    return {key: table for key, table in tables.items() if not caught_up(recorded[key], ends.get(table.topic))}


def configured_schedule(name: str, job: JobDefinition | UnresolvedAssetJobDefinition,
                        schedule: MergeScheduleConfig, checks: Sequence[AssetCheckKey] | None = None
                        ) -> ScheduleDefinition:
    """A schedule of ``job`` as a config section gives it: cron, time zone, running or stopped; ``checks``: its
    runs are of those checks of the job alone."""
    def checks_alone(context: ScheduleEvaluationContext) -> RunRequest:
        return RunRequest(asset_check_keys=checks)

    return ScheduleDefinition(
        name=name, job=job, cron_schedule=schedule.cron, execution_timezone=schedule.timezone,
        default_status=DefaultScheduleStatus.RUNNING if schedule.running else DefaultScheduleStatus.STOPPED,
        execution_fn=checks_alone if checks is not None else None)
