"""A table's micro-batches, one commit each: ``merge_micro_batches`` prepares a batch (``prepare``) and commits it
(``apply``), the next one prepared meanwhile where its fold does not depend on that commit.

No Dagster here: the assets (and ``cdc_assets.api``) call ``merge_micro_batches`` with a Spark session, a Kafka
source and a Delta writer, and turn the ``BatchReport`` of each batch into what they show.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core.truncation import truncation_mark
from cdc_assets.io.delta import BatchWriter, TableProgress
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge.apply import apply_batch
from cdc_assets.merge.prepare import Prepared, batch_truncation, fold_read, prepare
from cdc_assets.merge.read import derive_batch_layout
from cdc_assets.merge.report import BatchReport
from cdc_assets.merge.shared import FirstBatch


def merge_micro_batches(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
                        limits: BatchLimits, first: FirstBatch | None = None) -> Iterator[BatchReport]:
    """Apply ``table``'s new change events to Delta, one bounded micro-batch (one commit) after another,
    each read from the offsets the previous one committed: up to ``limits.max_batches_per_run``
    batches, until one reaches the high watermarks seen at its start or can apply nothing.

    A batch ends at those high watermarks, or earlier at ``limits``. Its data and offsets are
    committed together; on any bad event nothing of it is committed (the batches before it stay).

    Where a batch's fold does not depend on the previous batch's commit (``_pipelined``), batch N+1
    is read, handed over and folded while batch N is merged, from N's end offsets and the layout
    the table had before N's merge. N+1 is applied only if N's commit left the table where N+1
    assumed; otherwise it is prepared again from what Delta holds.

    ``first``: the first batch, read (and maybe folded in a shared plan) before this merge
    (``shared.first_batches``); taken if the table is still where it was read from, else read again.
    """
    # The batch being prepared ahead, and the progress it assumes the batch before it commits.
    ahead: tuple[Future[Prepared], TableProgress] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-batch-ahead") as pool:
        try:
            for number in range(1, limits.max_batches_per_run + 1):
                started = time.perf_counter()
                progress = writer.read_progress(table.target, table.app_id)
                schema = writer.table_schema(table.target)
                read_progress_s = time.perf_counter() - started
                taken = _taken(*ahead, table, progress, schema) if ahead is not None else None
                if first is not None and first.holds_for(progress, schema):
                    batch = first.batch
                    taken = batch if isinstance(batch, Prepared) else fold_read(spark, source, writer, table,
                                                                                limits, batch)
                ahead, first = None, None
                prepared = taken or prepare(spark, source, writer, table, limits, progress, schema)
                prepared.timings["read_progress_s"] = read_progress_s
                if (_pipelined(table, writer) and prepared.rows is not None and not prepared.raw.caught_up
                        and number < limits.max_batches_per_run):
                    assumed = _progress_after(prepared, table)
                    ahead = pool.submit(prepare, spark, source, writer, table, limits, assumed, schema), assumed
                report = apply_batch(writer, table, prepared)
                report.timings["total_s"] = time.perf_counter() - started
                yield report
                if report.raw.caught_up or report.raw.end_offsets == report.raw.start_offsets:
                    return
        finally:
            if ahead is not None:
                with contextlib.suppress(Exception):
                    ahead[0].result()  # let it finish before the source and session are used or closed


def merge_micro_batch(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
                      limits: BatchLimits) -> BatchReport:
    """One micro-batch of ``merge_micro_batches``: read from ``table``'s committed offsets and applied."""
    return next(merge_micro_batches(spark, source, writer, table, limits.model_copy(update={"max_batches_per_run": 1})))


def _pipelined(table: CapturedTable, writer: BatchWriter) -> bool:
    """Whether ``table``'s next batch can be folded while the current one is merged: its apply mode must
    allow it (``folds_ahead``), its batches must not be cut to whole transactions (which reads the
    transaction topic with the same consumer), and the writer must not use the Spark session that
    folds (delta-spark MERGEs through it)."""
    return table.mode.folds_ahead and table.transactions is None and writer.name == "delta-rs"


def _progress_after(prepared: Prepared, table: CapturedTable) -> TableProgress:
    """The table's progress once ``prepared`` is committed (its txn and Delta versions unknown yet)."""
    assert prepared.commit is not None
    commit = prepared.commit
    return TableProgress(dict(commit.offsets), commit.version, -1, commit.key_columns,
                         truncated_at=truncation_mark(commit.truncated_at, batch_truncation(table, prepared.summary)))


def _taken(following: Future[Prepared], assumed: TableProgress, table: CapturedTable,
           progress: TableProgress | None, schema: StructType | None) -> Prepared | None:
    """The batch prepared ahead, if the commit before it left the table as it assumed: the offsets
    (and key columns) it starts from, and a layout derived anew from its sampled events and the
    table's schema now the same as the one it was folded with. None: prepare it again."""
    try:
        prepared = following.result()
    except Exception:
        return None  # prepared again from what Delta holds, and fails again if it must
    summary = prepared.summary
    if summary is not None and summary.unavailable_kept + summary.unavailable_never_seen + \
            summary.null_updates_from_table:
        return None  # it read the table's values before the commit before it: read them again
    if progress is None or (progress.offsets, progress.key_columns, progress.truncated_at) != (
            assumed.offsets, assumed.key_columns, assumed.truncated_at):
        return None
    if prepared.commit is not None:  # folded before the commit before it recorded the position it carries on
        prepared = replace(prepared, commit=replace(prepared.commit, source_position=progress.source_position))
    if prepared.layout is None or prepared.samples is None:
        return prepared if schema == prepared.existing else None
    layout = derive_batch_layout(table, prepared.raw, prepared.samples, schema, progress.key_columns)
    return prepared if layout == prepared.layout else None
