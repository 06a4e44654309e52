"""Sensor-triggered backfill: a captured table whose Delta target is missing or empty gets a merge
run, and an execute-snapshot signal run only where its topic cannot fill it.

A topic can fill its table when it holds records and every partition is retained from offset 0:
its whole history is there (a compacted topic keeps each key's latest record, which is all the
table needs). Once retention (or a records deletion) has moved a partition's start past 0, changes
of keys that were not written since are gone, and only a snapshot of the source brings them back.
So a first deployment on topics that hold their history does not re-snapshot every table at the
source.
"""

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

from cdc_assets.catalog import CapturedTable
from cdc_assets.checks import merge_run_checks
from cdc_assets.io.delta import open_table
from cdc_assets.io.kafka import SourceError, TopicProbe
from cdc_assets.io.signals import data_collection
from cdc_assets.translator import CdcTranslator
from jobs.snapshots import execute_snapshot_run_config


def target_is_empty(table: CapturedTable) -> bool:
    """Whether the table's Delta target is missing or holds no rows."""
    target = open_table(table.target)
    return target is None or target.count() == 0


def topic_can_fill(probe: TopicProbe, table: CapturedTable) -> bool:
    """Whether the table's topic holds its whole history: records, every partition retained from offset 0."""
    try:
        offsets = probe.retained_offsets(table.topic)
    except SourceError:
        return False  # no topic yet: nothing to fill the table from
    return any(high > 0 for _, high in offsets.values()) and all(low == 0 for low, _ in offsets.values())


def backfill_requests(tables: Sequence[CapturedTable], requested: set[str], snapshot_job_name: str,
                      merge_job_name: str, kafka_settings: Mapping[str, Any],
                      translator: CdcTranslator | None = None) -> tuple[list[RunRequest], set[str]]:
    """Run requests for tables whose target is missing or empty and that were not requested yet: a
    merge run each, and before it a snapshot run where the topic cannot fill the table (``topic_can_fill``).

    Returns the requests and the new set of requested topics (a table leaves the set once it has
    rows, so emptying it again requests a new backfill).
    """
    requests: list[RunRequest] = []
    still_requested = set()
    with TopicProbe(kafka_settings) as probe:
        for table in tables:
            if not target_is_empty(table):
                continue
            still_requested.add(table.topic)
            if table.topic in requested:
                continue
            run_key = f"snapshot-backfill:{table.topic}"
            if not topic_can_fill(probe, table):
                requests.append(RunRequest(
                    run_key=run_key, job_name=snapshot_job_name,
                    run_config=execute_snapshot_run_config(table.connector, [data_collection(*table.name.split("."))]),
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
