"""Applying one schema change to a table's Delta target: ``core.schema_evolution``'s decisions carried out
with a Delta writer, the table registry (``io.registry``) and merges of the table's pending events. No
Dagster: ``jobs.schema_changes`` runs ``SchemaChangeRun`` in an op and logs what it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from cdc_assets.api import apply_pending
from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.schema_change import SchemaChangeError
from cdc_assets.core.schema_evolution import (
    RETIRED_PROPERTY,
    AnnouncedChange,
    RegistryEntry,
    earlier_incarnations,
    holds_rows_from_before,
    incarnation_columns,
    incarnation_properties,
    is_retired,
    last_drop,
    merged_up_to,
    plan_evolution,
    retired_copy_path,
    schema_text,
    superseded_by,
)
from cdc_assets.io.delta import DeltaTarget, DeltaWriter, open_table
from cdc_assets.io.kafka import KafkaSource, UnknownTopicError
from cdc_assets.io.registry import append_change, change_row, read_history

# Merges a table's pending events before a change that needs them all (its argument says which change, for
# the messages); returns the events read. ``merge_pending`` with the run's Kafka, Spark and writer.
MergePending = Callable[[CapturedTable, str], int]


def _arrow(schema: T.StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


def table_properties(target: DeltaTarget) -> dict[str, str] | None:
    """The Delta table's properties (its configuration); None when there is no table."""
    table = open_table(target)
    return dict(table.metadata().configuration) if table is not None else None


def merge_pending(table: CapturedTable, source: KafkaSource, spark: SparkSession, writer: DeltaWriter,
                  limits: BatchLimits, needed_by: str, log: logging.Logger) -> int:
    """Merge every pending change event of the table, as merge runs would, in as many rounds of
    ``max_batches_per_run`` batches as it takes: until its offsets reach the topic's end as of the first round
    (``merged_up_to``), or a batch reaches the topic's end as of its start. Returns the events read. Before a
    DROP they were all made before it; before a rename's copy, the rows they change hold their last values. A
    round that commits nothing fails the run (``needed_by`` says for what) before the change is applied: a
    retry goes on from there. ``source`` is closed when done; a table without a topic has nothing to merge."""
    events = 0
    stop: dict[int, int] = {}
    try:
        while True:
            before = _committed_offsets(writer, table)
            reports = apply_pending(table, kafka=source, spark=spark, writer=writer, limits=limits)
            events += sum(report.events_read for report in reports)
            stop = stop or dict(reports[0].raw.high_watermarks)
            after = _committed_offsets(writer, table)
            if reports[-1].raw.caught_up or merged_up_to(after, stop):
                return events
            if after == before:
                raise SchemaChangeError(
                    f"{table.topic}: {needed_by} needs every event before it merged first, but a merge round stopped "
                    f"at offsets {after} below the high watermarks {reports[-1].raw.high_watermarks} and committed "
                    "nothing (a transaction not complete yet?); the change was not applied: retry the run")
            log.info(f"{table.topic}: {events} events merged for {needed_by}, not at the topic's end yet "
                     f"(offsets {after}): merging on")
    except UnknownTopicError:
        log.info(f"{table.topic}: no topic, so no change event to merge")
        return events
    finally:
        source.close()


def _committed_offsets(writer: DeltaWriter, table: CapturedTable) -> dict[int, int]:
    """The offsets the table's latest batch commit recorded (empty: none yet)."""
    progress = writer.read_progress(table.target, table.app_id)
    return dict(progress.offsets) if progress is not None else {}


class SchemaChangeRun:
    """Brings a table's Delta target to its latest schema change and records the change in the registry.

    ``table_for(connector, table)``: a table's capture; ``writer``: the Delta writer for schema changes;
    ``merge``: merges a table's pending events (``merge_pending``); ``log``: the run's log."""

    def __init__(self, table_for: Callable[[str, str], CapturedTable], writer: DeltaWriter, merge: MergePending,
                 log: logging.Logger):
        self._table_for = table_for
        self._writer = writer
        self._merge = merge
        self._log = log

    def apply(self, announced: AnnouncedChange, target: DeltaTarget, registry_path: str,
              storage_options: Mapping[str, str], run_id: str) -> dict[str, Any]:
        """Record ``announced`` (whose table's Delta target is ``target``), bring the table to the registry's
        latest change of it by source position, then append ``announced`` to the registry at
        ``registry_path``: a run that fails before leaves the registry (and the asset it loads) as it was.
        Returns the run's metadata: old and new schema, the DDL's source position and what was done."""
        change = announced.change
        row = change_row(connector=announced.connector, table=change.name, change=change.type,
                         primary_keys=change.primary_keys, columns=change.columns,
                         source_position=announced.source_position, topic=announced.topic,
                         partition=announced.partition, offset=announced.offset, run_id=run_id)
        history = read_history(registry_path, storage_options, pending=row)[(announced.connector, change.name)]
        metadata: dict[str, Any] = {"change": change.type, "source_position": announced.source_position,
                                    "schema_topic_offset": announced.coordinates}
        superseded = superseded_by(history, announced)
        if superseded is not None:
            metadata["superseded_by"] = superseded
            self._log.info(f"{change.type} of {change.name} at {announced.source_position} arrived after the "
                           f"later {superseded}: the table is brought to that one")
        table = self._table_for(announced.connector, change.name)
        if history[-1].change == "DROP":
            metadata.update(self._retire(table, target))
        else:
            drop = last_drop(history)
            if drop is not None and holds_rows_from_before(table_properties(target), drop):
                metadata.update(self._start_anew(table, drop, history, target))
            if change.renames:  # the rows a rename's copy reads must hold every change made before it
                metadata["events_merged_before_rename"] = self._merge(
                    table, f"the RENAME COLUMN at {announced.source_position}")
            if change.renamed_from:
                metadata.update(self._take_over(announced, target))
            metadata.update(self._evolve(announced, history, target, table))
        append_change(registry_path, storage_options, row)
        return metadata

    def _evolve(self, announced: AnnouncedChange, history: list[RegistryEntry], target: DeltaTarget,
                table: CapturedTable) -> dict[str, Any]:
        """Create or evolve the table to its changes' columns that it keeps (``plan_evolution``)."""
        before = self._writer.table_schema(target)
        plan = plan_evolution(announced, history, before, table_properties(target) or {}, table.merge.column_choices)
        changed = self._writer.ensure_columns(target, _arrow(plan.columns), plan.properties) \
            if plan.alters_table else []
        # Rows last changed before the rename hold their value under the old name: the new one gets it, so a
        # row the rename did not touch reads as SELECT * does at the source. In any order: by source position.
        copied = self._writer.copy_renamed(target, plan.renames, announced.source_position,
                                           apply_mode(announced.apply_mode).changed_at_column) if plan.renames else 0
        after = self._writer.table_schema(target)
        return {"old_schema": schema_text(before), "new_schema": schema_text(after),
                "added_columns": list(changed) if before is not None else [], "dropped_columns": plan.dropped,
                "widened_columns": plan.widened, "source_type_changes": plan.source_type_changes,
                "created": before is None, "renamed_rows_copied": copied}

    def _take_over(self, announced: AnnouncedChange, target: DeltaTarget) -> dict[str, Any]:
        """A renamed table's rows go on under its new name: the old table's pending events are merged, then its
        rows (positions and all: the new name's events, all later, win over them) become the new table's."""
        renamed_from = announced.change.renamed_from
        assert renamed_from is not None
        if self._writer.table_schema(target) is not None:
            self._log.warning(f"{announced.change.name} was renamed from {renamed_from} but already has a Delta "
                              "table: its rows from before the rename are not copied; request an incremental snapshot")
            return {"renamed_from": renamed_from, "rows_taken_over": 0}
        previous = self._table_for(announced.connector, renamed_from)
        merged = self._merge(previous, f"the RENAME TABLE to {announced.change.name} at {announced.source_position}")
        copied = self._writer.copy_table(previous.target, target) \
            if self._writer.table_schema(previous.target) is not None else 0
        return {"renamed_from": renamed_from, "events_merged_before_rename": merged, "rows_taken_over": copied}

    def _retire(self, table: CapturedTable, target: DeltaTarget) -> dict[str, Any]:
        """Merge the dropped table's pending events (every one was made before the DROP), then retire it."""
        events = self._merge(table, "its DROP")
        before = self._writer.table_schema(target)
        if before is not None and not is_retired(table_properties(target) or {}):
            self._writer.ensure_columns(target, _arrow(before), {RETIRED_PROPERTY: "true"})
        schema = schema_text(before)
        return {"retired": True, "events_merged_before_drop": events, "old_schema": schema, "new_schema": schema}

    def _start_anew(self, table: CapturedTable, drop: RegistryEntry, history: list[RegistryEntry],
                    target: DeltaTarget) -> dict[str, Any]:
        """The table was created again after ``drop``, and its Delta table still holds the incarnation before:
        those rows (their pending events merged first, unless the DROP's run retired them) are copied to a
        retired table (``retired_copy_path``), then the table is emptied, with the new incarnation's columns and
        its offsets kept."""
        current = table_properties(target) or {}
        events = 0 if is_retired(current) else self._merge(table, f"the DROP at {drop.source_position}")
        earlier = earlier_incarnations(current)
        number = len(earlier) + 1
        while self._writer.table_schema(aside := DeltaTarget(retired_copy_path(target.path, number),
                                                             target.storage_options)) is not None:
            number += 1  # left by a run that failed before emptying the table: kept, never overwritten
        rows = self._writer.copy_table(target, aside)
        old_schema = self._writer.table_schema(target)
        assert old_schema is not None  # ``holds_rows_from_before`` found the table
        self._writer.ensure_columns(aside, _arrow(old_schema), {RETIRED_PROPERTY: "true"})
        columns = incarnation_columns(history, table.merge.apply_mode, table.merge.column_choices)
        self._writer.empty_table(target, _arrow(columns),
                                 incarnation_properties(drop, earlier, aside.path))
        self._log.info(f"{table.name} was dropped at {drop.source_position} and created again: its {rows} rows "
                       f"from before are now at {aside.path} (retired); the table starts empty")
        return {"earlier_incarnation_path": aside.path, "earlier_incarnation_rows": rows,
                "earlier_incarnation_schema": schema_text(old_schema), "events_merged_before_drop": events}
