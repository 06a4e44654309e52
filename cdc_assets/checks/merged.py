"""The checks of what a table's merges left: unique non-null keys, capture lag, dead letters, the schema the
source announced and unavailable values kept; and what one op run reads once for all of them."""

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.compute as pc
from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey
from deltalake import DeltaTable

from cdc_assets.catalog import CapturedTable
from cdc_assets.check_names import CAPTURE_LAG_CHECK, DEAD_LETTERS_CHECK, KEY_CHECK, SCHEMA_CHECK, UNAVAILABLE_CHECK
from cdc_assets.checks.results import duration_text
from cdc_assets.core.schema_evolution import RegistryEntry
from cdc_assets.io.delta import DeltaTarget, DeltaWriter, KeyReport, open_table
from cdc_assets.io.registry import read_registry
from cdc_assets.resources import DeltaResource, SparkResource


class RunReads:
    """What the checks of one op run read once for all its tables (read per table, a run's checks grew with
    the square of the connector's tables): the schema registry, and the dead-letter table's count per topic,
    read again only when a commit has changed it."""

    def __init__(self, delta: DeltaResource):
        self._delta = delta
        self._dead_letters: dict[str, tuple[DeltaTable, int, dict[str, int]]] = {}

    def dead_letters(self, target: DeltaTarget) -> dict[str, int]:
        """The events in the dead-letter table ``target`` per topic, as of its latest version."""
        seen = self._dead_letters.get(target.path)
        table = seen[0] if seen is not None else open_table(target)
        if table is None:
            return {}  # none yet: looked for again by the next check, as a merge may create it
        if seen is not None:
            table.update_incremental()  # a merge of this run may have dead-lettered events since
            if table.version() == seen[1]:
                return seen[2]
        topics = table.to_pyarrow_dataset().to_table(columns=["topic"]).column("topic")
        counts = {str(row["values"]): int(row["counts"]) for row in pc.value_counts(topics).to_pylist()}
        self._dead_letters[target.path] = (table, table.version(), counts)
        return counts

    @functools.cached_property
    def registry(self) -> dict[tuple[str, str], RegistryEntry]:
        """The latest registry entry per (connector, table), as the run's first check found it."""
        return read_registry(self._delta.registry_path, self._delta.as_config().storage_options)


def key_report(table: CapturedTable, writer: DeltaWriter, merged_keys: Sequence[str]) -> KeyReport | None:
    """Key statistics of the table; its key columns are the configured ones, else those this step's merge
    recorded (``merged_keys``) or, if it applied nothing, its last batch commit (taken from the record keys)."""
    keys = table.merge.key_columns or tuple(merged_keys)
    if not keys:
        progress = writer.read_progress(table.target, table.app_id)
        keys = progress.key_columns if progress else ()
    return writer.key_report(table.target, keys) if keys else None


def primary_key_result(key: AssetKey, report: KeyReport | None) -> AssetCheckResult:
    """The ``primary_key`` check's result from the table's key statistics (None: no batch applied yet)."""
    if report is None:
        return AssetCheckResult(asset_key=key, check_name=KEY_CHECK, passed=True,
                                metadata={"rows": 0, "note": "no batch applied yet"})
    problems = [f"{report.duplicate_keys} key(s) appear more than once"] if report.duplicate_keys else []
    if report.null_keys:
        problems.append(f"{report.null_keys} row(s) have a null key")
    return AssetCheckResult(
        asset_key=key, check_name=KEY_CHECK, passed=not problems, description="; ".join(problems) or None,
        metadata={"rows": report.rows, "duplicate_keys": report.duplicate_keys, "null_keys": report.null_keys})


def capture_lag_result(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    """The ``capture_lag`` check's result from the last merge's metadata (``last``): a warning beyond the bound."""
    lag = last.get("capture_lag_s")
    if lag is None:
        return AssetCheckResult(asset_key=key, check_name=CAPTURE_LAG_CHECK, passed=True,
                                description="the last merge applied no change: no lag to measure",
                                metadata={"note": "the last merge applied no change"})
    passed = lag <= table.checks.max_capture_lag_s
    description = (f"the newest change the last merge applied was {duration_text(lag)} old "
                   f"({'within' if passed else 'beyond'} the bound of {duration_text(table.checks.max_capture_lag_s)})")
    return AssetCheckResult(asset_key=key, check_name=CAPTURE_LAG_CHECK, passed=passed, description=description,
                            severity=AssetCheckSeverity.WARN,
                            metadata={"capture_lag": duration_text(lag), "capture_lag_s": lag,
                                      "bound_s": table.checks.max_capture_lag_s})


def dead_letters_result(table: CapturedTable, key: AssetKey, reads: RunReads) -> AssetCheckResult:
    """The ``dead_letters`` check's result: a warning while any event of the table is in the dead-letter table."""
    dead_letter = table.merge.dead_letter
    count = reads.dead_letters(dead_letter).get(table.topic, 0) if dead_letter is not None else 0
    return AssetCheckResult(asset_key=key, check_name=DEAD_LETTERS_CHECK, passed=count == 0,
                            severity=AssetCheckSeverity.WARN, metadata={"dead_lettered_events": count})


def schema_result(table: CapturedTable, key: AssetKey, delta: DeltaResource, spark: SparkResource,
                  entry: RegistryEntry | None) -> AssetCheckResult:
    """The schema check's result: a warning naming the columns the source last announced (``entry``) that the
    Delta table lacks."""
    if entry is None:
        return AssetCheckResult(asset_key=key, check_name=SCHEMA_CHECK, passed=True,
                                metadata={"note": "no schema-change event announced this table"})
    schema = delta.writer_for_schema_changes(spark).table_schema(table.target)
    present = set(schema.fieldNames()) if schema is not None else set()
    missing = [column for column in entry.columns.fieldNames() if column not in present]
    return AssetCheckResult(asset_key=key, check_name=SCHEMA_CHECK, passed=not missing,
                            severity=AssetCheckSeverity.WARN,
                            metadata={"missing_columns": missing, "announced": entry.columns.fieldNames()})


def unavailable_result(table: CapturedTable, key: AssetKey, last: Mapping[str, Any]) -> AssetCheckResult:
    """Fails when the last merge stored unavailable values as null (``unavailable_never_seen``): neither its
    events nor the table held the value (a key change whose delete it did not read, a row never captured)."""
    never_seen = int(last.get("unavailable_never_seen") or 0)
    description = (f"the last merge of {table.name} stored {never_seen} value(s) the source left unavailable as "
                   "null: neither its events nor the table's rows held them (a primary-key change whose delete "
                   "it did not read, or a row the table never had)") if never_seen else None
    return AssetCheckResult(asset_key=key, check_name=UNAVAILABLE_CHECK, passed=not never_seen,
                            description=description, metadata={"unavailable_never_seen": never_seen})
