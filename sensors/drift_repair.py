"""The drift repair sensor: heals the rows ``rows_match_source`` found drifted with a targeted incremental snapshot,
then has the check run again. One sensor for every table whose connector has both the check and a signal
channel (one cursor, one switch to start it); stopped by default.

For each table, at each tick:

1. A failed evaluation not seen before, whose metadata names drifted ranges (``core.reconcile.DriftedRanges``):
   one ``incremental_snapshot_job`` run, ``execute-snapshot`` of the table with ``additional-conditions`` selecting
   exactly the drifted keys (past ``MAX_LISTED_KEYS`` keys, or a condition too long for the signal table's
   ``data`` column, their whole buckets). Its run key names the evaluation, so a tick evaluated again launches it
   once. An evaluation made by a repair's own re-check is never repaired again: drift a snapshot did not heal
   needs a person (a key in Delta only, a column compared differently).
2. Once that run has sent the signal: the source's rows the condition selects are counted (the check's
   read-only connection). The snapshot's reads are merged when the table's materializations since the request
   applied at least that many incremental-snapshot reads (``incremental_snapshot_reads``): a snapshot emits one
   read per selected row, and a read counts only once merged. A snapshot that cannot reach the count (rows
   deleted meanwhile, a stopped connector) is taken as done after ``repair_timeout_s``, which the record says.
3. Then one run of the connector's rows_match_source job for the table's check alone, tagged with the repair.

Each step also records an observation of the table (``drift_repair``: snapshot requested for the ranges, snapshot
done), so its history reads: check failed, snapshot requested for ranges X, snapshot done, check passed.
Cursor: per check, the newest evaluation acted on, and the repair under way.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetObservation,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import ROWS_MATCH_SOURCE_CHECK
from cdc_assets.checks import DRIFTED_RANGES
from cdc_assets.config import ConnectorConfig
from cdc_assets.core.reconcile import DIALECT_OF_KIND, DriftedRanges
from cdc_assets.io.reconcile import ReconcileError, open_source, rows_matching
from cdc_assets.io.signals import SignalError, SnapshotSignal, data_collection
from cdc_assets.translator import CdcTranslator
from jobs.snapshots import execute_snapshot_run_config

REPAIR_TAG = "cdc_assets/drift_repair"  # a repair's runs: its id, ``<check key>:<evaluation id>``
STEP_TAG = "cdc_assets/drift_repair_step"  # snapshot or recheck
RANGES_TAG = "cdc_assets/drift_ranges"
# The ``data`` column of the signal table Debezium's documentation creates: varchar(2048).
SOURCE_SIGNAL_DATA_CHARS = 2048
_FAILED_RUN = {DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


@dataclass
class Repair:
    """A repair under way: what the cursor keeps of it."""

    id: str
    condition: str
    ranges: str  # as a person reads them
    requested_at: float
    materialized_after: int  # the table's latest materialization's storage id when it was requested
    expected_reads: int | None = None  # the source's rows the condition selected once the signal was sent
    source_position: str | None = None  # the source position of that count


def _latest_evaluation(instance: DagsterInstance, check_key: AssetCheckKey
                       ) -> tuple[int, str, AssetCheckEvaluation] | None:
    """The newest completed evaluation of ``check_key``: its record id, run id and evaluation."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        check_key, limit=1, status={AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED})
    if not records or records[0].event is None or records[0].event.dagster_event is None:
        return None
    evaluation = records[0].event.dagster_event.event_specific_data
    assert isinstance(evaluation, AssetCheckEvaluation)
    return records[0].id, records[0].run_id, evaluation


def _latest_materialization(instance: DagsterInstance, key: AssetKey) -> int:
    """The storage id of ``key``'s latest materialization (0: none)."""
    records = instance.fetch_materializations(key, limit=1).records
    return records[0].storage_id if records else 0


def snapshot_reads_since(instance: DagsterInstance, key: AssetKey, after: int) -> int:
    """The incremental-snapshot reads ``key``'s materializations after storage id ``after`` merged."""
    reads, cursor = 0, None
    while True:
        page = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=1000,
                                               cursor=cursor)
        for record in page.records:
            materialization = record.asset_materialization
            value = materialization.metadata.get("incremental_snapshot_reads") if materialization else None
            reads += int(value.value) if value is not None else 0  # type: ignore[arg-type]  # an int entry
        if not page.has_more:
            return reads
        cursor = page.cursor


def _fits(connector: ConnectorConfig, collection: str) -> Callable[[str], bool]:
    """Whether a condition fits the connector's signal channel: the source channel's signal table holds the
    signal's data in a varchar(2048); a Kafka signal has room for any."""
    assert connector.signal is not None
    if connector.signal.channel != "source":
        return lambda _: True
    version = connector.signal.debezium_version

    def fits(condition: str) -> bool:
        signal = SnapshotSignal(id="fits", type="execute-snapshot", data_collections=(collection,),
                                additional_conditions=((collection, condition),), debezium_version=version)
        return len(json.dumps(signal.data())) <= SOURCE_SIGNAL_DATA_CHARS

    return fits


def make_drift_repair_sensor(tables: Sequence[CapturedTable], connectors: Sequence[ConnectorConfig],
                             snapshot_job: JobDefinition, check_jobs: Mapping[str, Any],
                             minimum_interval_seconds: int = 60,
                             translator: CdcTranslator | None = None) -> SensorDefinition | None:
    """The drift repair sensor of ``tables`` whose connector (among ``connectors``) has a signal channel and
    whose ``rows_match_source`` check is defined; ``check_jobs``: each connector's rows_match_source job. None
    when no table is repairable."""
    translator = translator or CdcTranslator()
    by_name = {connector.name: connector for connector in connectors}
    repairable = {translator.get_asset_key(table): table for table in tables
                  if table.checks.rows_match_source is not None and not table.retired
                  and by_name[table.connector].signal is not None and table.connector in check_jobs}
    if not repairable:
        return None

    @sensor(name="drift_repair_sensor", jobs=[snapshot_job, *{job.name: job for job in check_jobs.values()}.values()],
            minimum_interval_seconds=minimum_interval_seconds, default_status=DefaultSensorStatus.STOPPED,
            description="Heals the keys rows_match_source found drifted: one incremental snapshot of exactly those "
                        "keys per failed evaluation, then the check again once the snapshot's reads are merged. "
                        "Cursor: per check, the newest evaluation acted on and the repair under way")
    def drift_repair_sensor(context: SensorEvaluationContext) -> SensorResult:
        cursor = json.loads(context.cursor) if context.cursor else {}
        handled: dict[str, int] = cursor.get("handled", {})
        repairs = {name: Repair(**repair) for name, repair in cursor.get("repairs", {}).items()}
        requests: list[RunRequest] = []
        observations: list[AssetObservation] = []
        for key, table in repairable.items():
            check_key = AssetCheckKey(key, ROWS_MATCH_SOURCE_CHECK)
            name = check_key.to_user_string()
            step = (_advance if name in repairs else _start)(context, table, check_key, handled, repairs,
                                                             by_name[table.connector])
            if step is not None:
                requests.append(step[0])
                observations.append(step[1])
        new_cursor = {"handled": handled, "repairs": {name: asdict(repair) for name, repair in repairs.items()}}
        return SensorResult(run_requests=requests, asset_events=observations,
                            cursor=json.dumps(new_cursor, sort_keys=True))

    def _start(context: SensorEvaluationContext, table: CapturedTable, check_key: AssetCheckKey,
               handled: dict[str, int], repairs: dict[str, Repair], connector: ConnectorConfig
               ) -> tuple[RunRequest, AssetObservation] | None:
        """A repair's snapshot run for the check's newest evaluation, if it failed with drift not seen before."""
        name = check_key.to_user_string()
        latest = _latest_evaluation(context.instance, check_key)
        if latest is None or latest[0] <= handled.get(name, 0):
            return None
        record_id, run_id, evaluation = latest
        handled[name] = record_id
        entry = evaluation.metadata.get(DRIFTED_RANGES)
        if evaluation.passed or entry is None:
            return None  # passed, or no drift claimed (unsettled, not evaluated)
        run = context.instance.get_run_by_id(run_id)
        if run is not None and REPAIR_TAG in run.tags:
            context.log.error(f"{name}: still drifted after repair {run.tags[REPAIR_TAG]} (evaluation {record_id}): "
                              "not repaired again; the check's metadata names the keys")
            return None
        ranges = DriftedRanges.from_metadata(entry.value)  # type: ignore[arg-type]  # a JSON entry
        collection = data_collection(*table.source_table.split("."))
        condition = ranges.condition(DIALECT_OF_KIND[table.kind], _fits(connector, collection))
        if condition is None:
            context.log.warning(f"{name}: evaluation {record_id} drifted in ways no targeted snapshot heals "
                                f"({ranges.extra_keys} key(s) in Delta only, or too many buckets for the signal)")
            return None
        repair = Repair(f"{name}:{record_id}", condition, ranges.describe(), time.time(),
                        _latest_materialization(context.instance, check_key.asset_key))
        repairs[name] = repair
        context.log.info(f"{name}: evaluation {record_id} failed; snapshot requested for {repair.ranges}")
        request = RunRequest(
            run_key=f"drift-repair:{repair.id}", job_name=snapshot_job.name,
            run_config=execute_snapshot_run_config(table.connector, [collection],
                                                   additional_conditions=[(collection, condition)]),
            tags={REPAIR_TAG: repair.id, STEP_TAG: "snapshot", RANGES_TAG: repair.ranges[:200]})
        return request, AssetObservation(
            check_key.asset_key, description=f"drift repair: snapshot requested for {repair.ranges}",
            metadata={"drift_repair": "snapshot requested", "repair": repair.id, "ranges": repair.ranges,
                      "additional_condition": condition, "failed_evaluation": record_id})

    def _advance(context: SensorEvaluationContext, table: CapturedTable, check_key: AssetCheckKey,
                 handled: dict[str, int], repairs: dict[str, Repair], connector: ConnectorConfig
                 ) -> tuple[RunRequest, AssetObservation] | None:
        """The re-check of a repair whose snapshot's reads are merged; None while they are not."""
        name = check_key.to_user_string()
        repair = repairs[name]
        runs = context.instance.get_runs(RunsFilter(tags={REPAIR_TAG: repair.id, STEP_TAG: "snapshot"}), limit=1)
        if not runs or runs[0].status in _FAILED_RUN:
            if runs:
                context.log.error(f"{name}: repair {repair.id}'s snapshot run {runs[0].run_id} failed: dropped")
                del repairs[name]
            return None
        if runs[0].status != DagsterRunStatus.SUCCESS:
            return None  # the signal is not sent yet
        settings = table.checks.rows_match_source
        assert settings is not None and table.checks.source_dsn_env is not None
        if repair.expected_reads is None:
            dsn = os.environ.get(table.checks.source_dsn_env)
            if not dsn:
                context.log.warning(f"{name}: the environment variable {table.checks.source_dsn_env} (the source "
                                    f"database's connection string) is not set: repair {repair.id} waits for it")
                return None
            try:
                source = open_source(table.kind, dsn)
                try:
                    repair.source_position, repair.expected_reads = rows_matching(source, table.source_table,
                                                                                  repair.condition)
                finally:
                    source.close()
            except (ReconcileError, SignalError) as exc:
                context.log.warning(f"{name}: cannot count the rows repair {repair.id} reads, tried again next "
                                    f"tick: {exc}")
                return None
        reads = snapshot_reads_since(context.instance, check_key.asset_key, repair.materialized_after)
        waited = time.time() - repair.requested_at
        if reads < repair.expected_reads and waited < settings.repair_timeout_s:
            return None
        done = (f"{reads} incremental-snapshot read(s) merged for the {repair.expected_reads} source row(s) "
                f"selected" + ("" if reads >= repair.expected_reads else
                               f"; fewer, and re-checked after repair_timeout_s ({settings.repair_timeout_s:.0f} s)"))
        context.log.info(f"{name}: repair {repair.id}'s snapshot done ({done}); check requested again")
        del repairs[name]
        request = RunRequest(run_key=f"drift-repair:{repair.id}:recheck",
                             job_name=check_jobs[table.connector].name, asset_selection=[],
                             asset_check_keys=[check_key], tags={REPAIR_TAG: repair.id, STEP_TAG: "recheck"})
        return request, AssetObservation(
            check_key.asset_key, description=f"drift repair: snapshot done, {done}",
            metadata={"drift_repair": "snapshot done", "repair": repair.id, "ranges": repair.ranges,
                      "snapshot_reads_merged": reads, "source_rows_selected": repair.expected_reads,
                      "source_position": repair.source_position or "", "timed_out": reads < repair.expected_reads})

    return drift_repair_sensor
