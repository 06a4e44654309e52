"""Sensor-triggered backfill: a captured table whose Delta target is missing or empty gets a merge
run, and an execute-snapshot signal run only where its topic cannot fill it (``cdc_assets.backfill``
decides which)."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from cdc_assets.backfill import backfills
from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import merge_run_checks
from cdc_assets.io.kafka import TopicProbe
from cdc_assets.io.signals import data_collection
from cdc_assets.translator import CdcTranslator
from jobs.snapshots import execute_snapshot_run_config


def backfill_requests(tables: Sequence[CapturedTable], requested: set[str], snapshot_job_name: str,
                      merge_job_name: str, kafka_settings: Mapping[str, Any],
                      translator: CdcTranslator | None = None) -> tuple[list[RunRequest], set[str]]:
    """Run requests for the tables to backfill (``cdc_assets.backfill.backfills``): a merge run each, and
    before it a snapshot run where the topic cannot fill the table. Returns the requests and the new set of
    requested topics."""
    requests: list[RunRequest] = []
    with TopicProbe(kafka_settings) as probe:
        wanted, still_requested = backfills(tables, requested, probe)
    for backfill in wanted:
        table = backfill.table
        run_key = f"snapshot-backfill:{table.topic}"
        if backfill.snapshot:
            requests.append(RunRequest(
                run_key=run_key, job_name=snapshot_job_name,
                run_config=execute_snapshot_run_config(table.connector,
                                                       [data_collection(*table.source_table.split("."))]),
                tags={"cdc_assets/backfill": table.topic}))
        key = (translator or CdcTranslator()).get_asset_key(table)
        requests.append(RunRequest(
            run_key=f"{run_key}:merge", job_name=merge_job_name, asset_selection=[key],
            asset_check_keys=merge_run_checks({key: table}),
            tags={"cdc_assets/backfill": table.topic}))
    return requests, still_requested


def make_snapshot_backfill_sensor(tables: Sequence[CapturedTable], snapshot_job: JobDefinition,
                                  merge_job: Any, kafka_settings: Mapping[str, Any], minimum_interval_seconds: int = 60,
                                  translator: CdcTranslator | None = None) -> SensorDefinition:
    """A sensor that backfills tables with a missing or empty Delta target: it requests a merge run
    for each, and an ``execute-snapshot`` signal run where the topic cannot fill the table, once,
    tracking them in its cursor.

    ``merge_job`` is the asset job that merges the tables (``cdc_merge_job``). Only tables of
    connectors that have a signal channel should be passed in.
    """

    @sensor(name="snapshot_backfill_sensor", jobs=[snapshot_job, merge_job],
            minimum_interval_seconds=minimum_interval_seconds,
            description="Merge, and an incremental snapshot where the topic lacks history, for captured tables "
                        "whose Delta target is missing or empty. Cursor: the topics of the tables already requested "
                        "(each dropped once its table has rows)")
    def snapshot_backfill_sensor(context: SensorEvaluationContext):
        requested = set(json.loads(context.cursor)) if context.cursor else set()
        requests, still_requested = backfill_requests(tables, requested, snapshot_job.name, merge_job.name,
                                                      kafka_settings, translator)
        context.update_cursor(json.dumps(sorted(still_requested)))
        if not requests:
            return SkipReason("every captured table with a signal channel has rows or was already requested")
        return requests

    return snapshot_backfill_sensor
