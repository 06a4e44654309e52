"""Sensor-triggered backfill: a captured table whose Delta target is missing or empty gets an
execute-snapshot signal and a merge run."""

import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)
from deltalake import DeltaTable

from cdc_assets.catalog import CapturedTable
from cdc_assets.io.signals import data_collection
from cdc_assets.translator import CdcTranslator
from jobs.snapshots import execute_snapshot_run_config


def target_is_empty(table: CapturedTable) -> bool:
    """Whether the table's Delta target is missing or holds no rows."""
    options = dict(table.target.storage_options)
    if not DeltaTable.is_deltatable(table.target.path, storage_options=options):
        return True
    return DeltaTable(table.target.path, storage_options=options).count() == 0


def backfill_requests(tables: Sequence[CapturedTable], requested: set[str], snapshot_job_name: str,
                      merge_job_name: str, translator: CdcTranslator | None = None
                      ) -> tuple[list[RunRequest], set[str]]:
    """Run requests for tables whose target is missing or empty and that were not requested yet.

    Returns the requests and the new set of requested topics (a table leaves the set once it has
    rows, so emptying it again requests a new backfill).
    """
    requests: list[RunRequest] = []
    still_requested = set()
    for table in tables:
        if not target_is_empty(table):
            continue
        still_requested.add(table.topic)
        if table.topic in requested:
            continue
        run_key = f"snapshot-backfill:{table.topic}"
        requests.append(RunRequest(
            run_key=run_key, job_name=snapshot_job_name,
            run_config=execute_snapshot_run_config(table.connector, [data_collection(*table.name.split("."))]),
            tags={"cdc_assets/backfill": table.topic}))
        requests.append(RunRequest(
            run_key=f"{run_key}:merge", job_name=merge_job_name,
            asset_selection=[(translator or CdcTranslator()).get_asset_key(table)],
            tags={"cdc_assets/backfill": table.topic}))
    return requests, still_requested


def make_snapshot_backfill_sensor(tables: Sequence[CapturedTable], snapshot_job: JobDefinition,
                                  merge_job: Any, minimum_interval_seconds: int = 60,
                                  translator: CdcTranslator | None = None) -> SensorDefinition:
    """A sensor that backfills tables with a missing or empty Delta target: it requests an
    ``execute-snapshot`` signal run and a merge run for each, once, tracking them in its cursor.

    ``merge_job`` is the asset job that merges the tables (``cdc_merge_job``). Only tables of
    connectors that have a signal channel should be passed in.
    """

    @sensor(name="snapshot_backfill_sensor", jobs=[snapshot_job, merge_job],
            minimum_interval_seconds=minimum_interval_seconds,
            description="Incremental snapshot + merge for captured tables whose Delta target is missing or empty")
    def snapshot_backfill_sensor(context: SensorEvaluationContext):
        requested = set(json.loads(context.cursor)) if context.cursor else set()
        requests, still_requested = backfill_requests(tables, requested, snapshot_job.name, merge_job.name,
                                                      translator)
        context.update_cursor(json.dumps(sorted(still_requested)))
        if not requests:
            return SkipReason("every captured table with a signal channel has rows or was already requested")
        return requests

    return snapshot_backfill_sensor
