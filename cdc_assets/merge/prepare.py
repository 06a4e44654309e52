"""A batch prepared for its commit: read from Kafka, decoded in Spark, cut to whole transactions where the
table is transaction-consistent, and folded into the rows to MERGE. Nothing is written here."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core import BatchSummary, decode_change_events, value_type
from cdc_assets.core.envelope import OFFSET_COLUMN, PARTITION_COLUMN
from cdc_assets.core.layout import ChangeEventLayout
from cdc_assets.core.transaction_status import TransactionStatus
from cdc_assets.core.truncation import Truncation, after_truncation, latest_truncation, truncation_mark, wiped_by
from cdc_assets.core.types import placeholder_needles
from cdc_assets.io.delta import BatchWriter, CommitRequest, TableProgress
from cdc_assets.io.kafka import KafkaSource, RawBatch
from cdc_assets.io.spark import is_local, spark_records, without_schemas
from cdc_assets.merge.read import derive_batch_layout, key_change_cut_for, read_batch, sample_values
from cdc_assets.merge.transactions import before_cut, whole_transactions


@dataclass(frozen=True)
class Prepared:
    """A batch read and folded but not applied: what ``apply.apply_batch`` needs, its records let go (a run
    holds two batches at once). ``commit`` None: nothing to commit; ``rows`` None with a commit:
    offsets only (a batch of tombstones). ``events`` are kept only when some are bad."""

    raw: RawBatch
    tombstones: int
    timings: dict[str, float]
    commit: CommitRequest | None = None
    events: pa.Table | None = None
    samples: tuple[list[bytes], list[bytes]] | None = None  # keys and values the layout was derived from
    layout: ChangeEventLayout | None = None
    existing: StructType | None = None  # the table's schema the layout was derived with
    rows: pa.Table | None = None
    summary: BatchSummary | None = None
    transactions: TransactionStatus | None = None


def truncated_at(progress: TableProgress | None) -> str | None:
    """The truncation mark the table's last commit recorded (``core.truncation``)."""
    return progress.truncated_at if progress is not None else None


def batch_truncation(table: CapturedTable, summary: BatchSummary | None) -> Truncation | None:
    """The TRUNCATE a batch applies: its latest, for a table whose ``on_truncate`` is apply."""
    return latest_truncation(summary.truncates) if summary is not None and table.merge.on_truncate == "apply" else None


def fold(writer: BatchWriter, table: CapturedTable, layout: ChangeEventLayout, decoded: DataFrame,
         progress: TableProgress | None, folded: tuple[pa.Table, BatchSummary] | None = None
         ) -> tuple[pa.Table, BatchSummary]:
    """The rows to MERGE for ``table``'s apply mode, and the batch summary, from decoded events (``folded``:
    their ``fold_batch``, computed in a shared plan). A table that applies TRUNCATEs drops the events
    before the latest one (``core.truncation``), folding again only when the batch holds some: the summary
    still counts every event read."""
    def stored(keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        return writer.current_rows(table.target, keys, columns)

    rows, summary = table.mode.rows(decoded, layout, stored) if folded is None else \
        table.mode.completed(*folded, decoded, layout, stored)
    if table.merge.on_truncate != "apply":
        return rows, summary
    mark = truncation_mark(truncated_at(progress), latest_truncation(summary.truncates))
    if not wiped_by(summary, mark):
        return rows, summary
    assert mark is not None
    rows, kept = table.mode.rows(after_truncation(decoded, mark), layout, stored)
    return rows, replace(summary, unavailable_kept=kept.unavailable_kept,
                         unavailable_never_seen=kept.unavailable_never_seen,
                         null_updates_from_table=kept.null_updates_from_table,
                         before_truncate=summary.events - len(summary.truncates) - kept.events)


def _may_hold_placeholder(layout: ChangeEventLayout, values: pa.ChunkedArray) -> bool:
    """Whether a value of the batch may carry the connector's unavailable-value placeholder: some raw
    value contains one of its forms (``core.types.placeholder_needles``). A search of the raw bytes
    costs far less than testing every column of every event in Spark and folding what it finds."""
    if not layout.unavailable_tests:
        return False
    assert layout.placeholder is not None
    needles = placeholder_needles(layout.placeholder)
    if needles is None:
        return True
    buffers = [bytes(chunk.buffers()[2] or b"") for chunk in values.chunks]
    return any(needle in data for data in buffers for needle in needles)


@dataclass(frozen=True)
class ToFold:
    """A batch read and its layout derived, before anything is handed to Spark (``read_to_fold``): what
    ``fold_read`` folds alone, or a shared plan folds with other tables' batches (``merge.shared``)."""

    raw: RawBatch
    tombstones: int
    timings: dict[str, float]
    commit: CommitRequest
    events: pa.Table  # the batch's records less its tombstones, every byte kept (dead letters, error messages)
    handed: pa.Table  # ``events`` as handed to Spark: their values without schemas
    samples: tuple[list[bytes], list[bytes]]
    layout: ChangeEventLayout
    existing: StructType | None
    progress: TableProgress | None

    @property
    def read_as(self) -> ChangeEventLayout:
        """The layout the batch is decoded and folded with: without the placeholder's tests when no value of
        the batch can hold it."""
        may_hold = _may_hold_placeholder(self.layout, self.handed["value"])
        return self.layout if may_hold else replace(self.layout, placeholder=None)

    def prepared(self, rows: pa.Table, summary: BatchSummary, timings: Mapping[str, float]) -> Prepared:
        """The batch folded into ``rows`` and ``summary``, ready to commit."""
        return Prepared(self.raw.without_records(), self.tombstones, {**self.timings, **timings}, self.commit,
                        self.events if summary.bad_events else None, self.samples, self.layout, self.existing,
                        rows, summary)


def prepare(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
            limits: BatchLimits, progress: TableProgress | None, existing: StructType | None,
            until: Mapping[int, int] | None = None) -> Prepared:
    """Read the batch that starts at ``progress`` and fold it, for a table whose Delta schema is
    ``existing``: everything before the commit, nothing written. ``until``: where the batch stops in
    the partitions it names (``whole_transactions``)."""
    read = read_to_fold(source, table, limits, progress, existing, until)
    return read if isinstance(read, Prepared) else fold_read(spark, source, writer, table, limits, read, until)


def read_to_fold(source: KafkaSource, table: CapturedTable, limits: BatchLimits, progress: TableProgress | None,
                 existing: StructType | None, until: Mapping[int, int] | None = None) -> Prepared | ToFold:
    """The first half of ``prepare``: the batch read from Kafka and its layout derived (``ToFold``), or,
    for a batch with no event to fold (nothing new, tombstones only), what it commits (``Prepared``)."""
    # A primary-key change's old values are found only with its delete in the batch (``core.key_changes``).
    keep = key_change_cut_for(table, existing, progress.key_columns if progress else ())
    raw, tombstones, events = read_batch(source, table, limits, progress.offsets if progress else None, until, keep)
    while events.num_rows == 0 and existing is None and not raw.caught_up:
        # Tombstones only and no table to record their offsets in (nothing to create it from): read on,
        # and the first commit with rows records the offsets past them.
        following, more, events = read_batch(source, table, limits, raw.end_offsets, until, keep)
        raw = replace(following, start_offsets={**following.start_offsets, **raw.start_offsets},
                      records_read=raw.records_read + following.records_read,
                      bytes_read=raw.bytes_read + following.bytes_read,
                      timings={k: raw.timings.get(k, 0.0) + following.timings.get(k, 0.0)
                               for k in {*raw.timings, *following.timings}})
        tombstones += more
    timings = dict(raw.timings)
    if raw.end_offsets == raw.start_offsets:
        return Prepared(raw.without_records(), tombstones, timings, existing=existing)
    # A batch of tombstones alone carries the table's transaction status and applied position on: the next batch
    # reads them back.
    commit = CommitRequest(table.app_id, sum(raw.end_offsets.values()), table.topic, raw.end_offsets,
                           progress.key_columns if progress else (),
                           transactions=progress.transactions if progress else None,
                           truncated_at=truncated_at(progress),
                           source_position=progress.source_position if progress else None)
    if events.num_rows == 0:  # tombstones only: the offsets are committed to an existing table
        return Prepared(raw.without_records(), tombstones, timings, commit if existing is not None else None,
                        existing=existing)

    samples = (sample_values(events["key"]), sample_values(events["value"]))
    layout = derive_batch_layout(table, raw, samples, existing, progress.key_columns if progress else ())
    # Searched and handed over without their schemas (a sixth of the bytes); ``events`` keep every byte for
    # dead letters and error messages.
    handed = events.set_column(events.schema.get_field_index("value"), "value", without_schemas(events["value"]))
    return ToFold(raw, tombstones, timings, replace(commit, key_columns=layout.key_columns), events, handed,
                  samples, layout, existing, progress)


def fold_read(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
              limits: BatchLimits, read: ToFold, until: Mapping[int, int] | None = None) -> Prepared:
    """The second half of ``prepare``: a batch read (``read_to_fold``) handed to Spark, decoded, cut to whole
    transactions where the table is transaction-consistent, and folded, alone."""
    raw, commit, progress, existing, handed = read.raw, read.commit, read.progress, read.existing, read.handed
    timings = dict(read.timings)
    read_as = read.read_as
    # The local hand-over first reads a batch without its fallback for unreadable lines (less Spark CPU
    # a batch); a batch with any bad event is read again, exactly, so that bad events get the exact
    # verdict. Batches cut to whole transactions are read exactly at once: the cut counts good events.
    exact = table.transactions is not None or not is_local(spark)
    with contextlib.ExitStack() as scratch:
        mark = time.perf_counter()
        frame = scratch.enter_context(spark_records(spark, handed, value_type(read_as), exact))
        timings["to_spark_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
        decoded = decode_change_events(frame, read_as)
        transactions: TransactionStatus | None = None
        if table.transactions is not None:
            cut_offsets, transactions, read_again = whole_transactions(
                source, table, raw, progress, decoded, read_as.key_columns, limits, until)
            if read_again is not None:  # its first transaction fits once later ones are left out: read it whole
                scratch.close()
                return prepare(spark, source, writer, table, limits, progress, existing, read_again)
            if cut_offsets is None:  # nothing whole yet (an END not ingested): commit nothing, report what waits
                return Prepared(replace(raw.without_records(), end_offsets=dict(raw.start_offsets)), read.tombstones,
                                timings, existing=existing, transactions=transactions)
            if cut_offsets != raw.end_offsets:
                # ``events`` keep the records past the cut: bad events are looked up there by coordinates only.
                decoded = decoded.where(before_cut(cut_offsets, F.col(PARTITION_COLUMN), F.col(OFFSET_COLUMN)))
                raw = replace(raw, end_offsets=cut_offsets)
            # The same JSON as every version recorded, for the watermark and the next batch to read back.
            commit = replace(commit, version=sum(cut_offsets.values()), offsets=cut_offsets,
                             transactions=transactions.to_metadata())
        rows, summary = fold(writer, table, read_as, decoded, progress)
        if summary.bad_events and not exact:
            frame = scratch.enter_context(spark_records(spark, handed, value_type(read_as), exact=True))
            rows, summary = fold(writer, table, read_as, decode_change_events(frame, read_as), progress)
        timings["parse_fold_to_arrow_s"] = time.perf_counter() - mark
    prepared = replace(read, raw=raw, commit=commit).prepared(rows, summary, timings)
    return replace(prepared, transactions=transactions)
