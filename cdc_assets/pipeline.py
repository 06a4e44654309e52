"""A table's micro-batches: topic -> decoded events -> folded batch -> MERGE -> commit + offsets.

No Dagster here: the assets call ``merge_micro_batches`` with a Spark session, a Kafka source and a
Delta writer, and turn the ``BatchReport`` of each batch into materialization metadata.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core import (
    BatchSummary,
    decode_change_events,
    derive_layout,
    value_type,
)
from cdc_assets.core.envelope import (
    OFFSET_COLUMN,
    PARTITION_COLUMN,
    TRANSACTION_COLUMN,
    explain_bad_value,
)
from cdc_assets.core.key_changes import key_change_cut, unfinished_partitions
from cdc_assets.core.layout import (
    HIDDEN_PREFIX,
    PLACEHOLDER_KINDS,
    SOURCE_TS_COLUMN,
    ChangeEventLayout,
    LayoutError,
)
from cdc_assets.core.transactions import ReadOn, cut_batch, event_identity, read_on, transaction_key
from cdc_assets.core.truncation import Truncation, after_truncation, latest_truncation, truncation_mark, wiped_by
from cdc_assets.core.types import placeholder_needles
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.dead_letter import dead_letter_rows, write_dead_letters
from cdc_assets.io.delta import BatchWriter, CommitRequest, MergeOutcome, TableProgress
from cdc_assets.io.kafka import Cut, KafkaSource, RawBatch
from cdc_assets.io.spark import is_local, spark_records, without_schemas
from cdc_assets.io.transactions import ingest_transactions, table_horizon

_SAMPLE = 100

# Fault injection: benchmarks/crash_trials.py sets this to kill the process at a named point.
fault_hook: Callable[[str], None] | None = None


def _checkpoint(point: str) -> None:
    if fault_hook is not None:
        fault_hook(point)


class BadEventError(RuntimeError):
    """An event cannot be applied; nothing of its batch was committed."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str, table: str, bad_events: int = 1):
        self.topic, self.partition, self.offset, self.reason = topic, partition, offset, reason
        super().__init__(
            f"{topic} partition {partition} offset {offset}: {reason}. Halted: nothing of this batch was committed "
            f"to table '{table}' ({bad_events} bad event(s) in the batch). Fix the producer or the table's config "
            "and run again, or set the table's on_bad_event: dead_letter to apply the rest and keep bad events in "
            "the dead-letter table")


class TruncateError(RuntimeError):
    """A TRUNCATE reached a table whose ``on_truncate`` is halt; nothing of its batch was committed."""

    def __init__(self, topic: str, partition: int, offset: int, table: str):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic} partition {partition} offset {offset}: TRUNCATE of table '{table}' at the source. Halted "
            "(the table's on_truncate is halt): nothing of this batch was committed and the Delta table keeps its "
            "rows. Decide for the table: on_truncate: apply removes the rows from before it as the source did, "
            "ignore skips TRUNCATE events (counted); then run again")


class BatchTooSmallError(RuntimeError):
    """A transaction has more events for a table than one batch may hold."""


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch read, applied and committed."""

    table: CapturedTable
    writer: str
    raw: RawBatch
    tombstones: int
    summary: BatchSummary | None
    outcome: MergeOutcome | None
    timings: dict[str, float] = field(default_factory=dict)
    dead_lettered: int = 0
    transactions: dict[str, object] | None = None
    key_columns: tuple[str, ...] = ()  # the key its commit recorded

    @property
    def events_read(self) -> int:
        return self.raw.records_read

    @property
    def capture_lag_s(self) -> float | None:
        """Seconds from the newest applied change in the source database to now."""
        return _seconds_since(self.summary.max_source_ts if self.summary else None)

    @property
    def capture_lag_p50_s(self) -> float | None:
        """The median over the batch's keys of the seconds since each key's newest change."""
        return _seconds_since(self.summary.median_key_source_ts if self.summary else None)

    def offsets(self, since: Mapping[int, int] | None = None) -> dict[str, dict[str, int]]:
        """``{partition: {from, to, high_watermark}}``, from ``since`` (an earlier batch's start
        offsets) where it names the partition, else from this batch's start."""
        start = {**self.raw.start_offsets, **(since or {})}
        return {str(p): {"from": start[p], "to": self.raw.end_offsets[p], "high_watermark": self.raw.high_watermarks[p]}
                for p in sorted(self.raw.start_offsets)}

    def offsets_json(self) -> str:
        """``offsets()`` as JSON."""
        return json.dumps(self.offsets())


def _seconds_since(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - moment).total_seconds()


def _sample(column: pa.ChunkedArray) -> list[bytes]:
    """The first and last few non-null values (newest last), for layout derivation."""
    if column.null_count:  # their positions, not a filtered copy of the whole column
        present = pc.indices_nonzero(pc.is_valid(column))
        if len(present) > 2 * _SAMPLE:
            present = pa.concat_arrays([present.slice(0, _SAMPLE), present.slice(len(present) - _SAMPLE)])
        return column.take(present).to_pylist()
    if len(column) <= 2 * _SAMPLE:
        return column.to_pylist()
    return column.slice(0, _SAMPLE).to_pylist() + column.slice(len(column) - _SAMPLE).to_pylist()


def _value_at(events: pa.Table, partition: int, offset: int) -> bytes | None:
    """The raw value of the event at (partition, offset)."""
    mask = pc.and_(pc.equal(events["partition"], partition), pc.equal(events["offset"], offset))
    values = events.filter(mask)["value"].to_pylist()
    return values[0] if values else None


def _fold(writer: BatchWriter, table: CapturedTable, layout: ChangeEventLayout, decoded: DataFrame,
          progress: TableProgress | None) -> tuple[pa.Table, BatchSummary]:
    """The rows to MERGE for ``table``'s apply mode, and the batch summary, from decoded events. A table
    that applies TRUNCATEs drops the events before the latest one (``core.truncation``), folding again
    only when the batch holds some: the summary still counts every event read."""
    def stored(keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        return writer.current_rows(table.target, keys, columns)

    rows, summary = table.mode.rows(decoded, layout, stored)
    if table.on_truncate != "apply":
        return rows, summary
    mark = truncation_mark(_truncated_at(progress), latest_truncation(summary.truncates))
    if not wiped_by(summary, mark):
        return rows, summary
    assert mark is not None
    rows, kept = table.mode.rows(after_truncation(decoded, mark), layout, stored)
    return rows, replace(summary, unavailable_kept=kept.unavailable_kept,
                         unavailable_never_seen=kept.unavailable_never_seen,
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


def _before(cut: dict[int, int], partition: Column, offset: Column) -> Column:
    """Events before the cut offsets."""
    condition = F.lit(False)
    for p, end in cut.items():
        condition = condition | ((partition == p) & (offset < end))
    return condition


def _whole_transactions(source: KafkaSource, table: CapturedTable, raw: RawBatch, progress: TableProgress | None,
                        decoded: DataFrame, key_columns: Sequence[str], limits: BatchLimits,
                        until: Mapping[int, int] | None = None
                        ) -> tuple[dict[int, int] | None, dict[str, object], dict[int, int] | None]:
    """Cut the batch to whole transactions of the table (``core.transactions``): the cut offsets
    (None when no event can be applied yet), the commit's transaction metadata, and where to read
    again (None: no need).

    A transaction's events are counted once each: an event delivered again (Debezium is at-least-once; a
    restarted connector sends what it sent before its last stored offset) has the same source position,
    op and key (``core.transactions.event_identity``). Bad events count: they belong to their transaction, and the batch
    that holds them halts or dead-letters them as the table's ``on_bad_event`` says.

    A batch that can apply nothing because its first transaction is incomplete is read again, from
    the same offsets, up to the first event of a later transaction in each partition
    (``core.transactions.read_on``): a transaction that fits in the batch limits is always applied,
    whatever later transactions' events the partitions hold. It waits when the transactions blocking
    it have no END in the log yet (still being emitted, or not ingested yet): a later batch applies
    them; one that has waited ``transaction_timeout_s`` (from its first event's source time) is stalled,
    and the table's blocking ``transactions_reconciled`` check fails naming it. It fails with
    ``BatchTooSmallError`` when the first one does not fit: the batch, with every later transaction left
    out, is full before it holds the events its END announces.
    ``until``: the offsets the batch was read up to, when it was such a second read."""
    log = table.transaction_log
    assert log is not None
    ingest_transactions(source, log)
    events = (decoded.where(F.col(TRANSACTION_COLUMN).isNotNull())
              .select(TRANSACTION_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN, event_identity(key_columns).alias("event"),
                      F.unix_millis(F.col(SOURCE_TS_COLUMN)).alias("ts")))
    stats = (events.groupBy(TRANSACTION_COLUMN, PARTITION_COLUMN, "event")
             .agg(F.min(OFFSET_COLUMN).alias("first"), F.min("ts").alias("ts"))
             .groupBy(TRANSACTION_COLUMN, PARTITION_COLUMN)
             .agg(F.count(F.lit(1)).alias("events"), F.min("first").alias("first"), F.min("ts").alias("ts"))
             .collect())
    seen: dict[str, tuple[int, dict[int, int]]] = {}
    since: dict[str, int] = {}  # per transaction, its first event's source time (epoch ms)
    for row in stats:
        key = transaction_key(table.kind, row[TRANSACTION_COLUMN])
        count, firsts = seen.get(key, (0, {}))
        first = min(row["first"], firsts.get(row[PARTITION_COLUMN], row["first"]))
        seen[key] = (count + row["events"], {**firsts, row[PARTITION_COLUMN]: first})
        if row["ts"] is not None:
            since[key] = min(row["ts"], since.get(key, row["ts"]))
    ends = log.ends(seen)
    cut = cut_batch(table.name, raw.start_offsets, raw.end_offsets, seen,
                    {tx: collections for tx, (_, collections) in ends.items()})
    previous = int(str((progress.transactions or {}).get("applied_end", -1))) if progress else -1
    applied_end = max([previous, *(ends[tx][0] for tx in cut.applied)])
    caught_up = raw.caught_up
    applicable = cut.end_offsets if cut.end_offsets != raw.start_offsets else None
    read_again: dict[int, int] | None = None
    if applicable is None and not caught_up:
        stop = {p: min(high, (until or {}).get(p, high)) for p, high in raw.high_watermarks.items()}
        blocked = read_on(table.name, cut, raw.start_offsets, raw.end_offsets, stop, seen, ends)
        if blocked is not None and blocked.helps:
            read_again = blocked.until
        elif blocked is not None and blocked.open:
            raise _too_small(table, raw, limits, blocked)
    now_ms = time.time() * 1000
    waited = {tx: round(max(0.0, now_ms - since[tx]) / 1000, 3) for tx in cut.waiting if tx in since}
    return applicable, {
        "applied_end": applied_end,
        "horizon": table_horizon(log, table.name, applied_end),
        "applied": len(cut.applied),
        "waiting": {tx: {"seen": n, "expected": e} for tx, (n, e) in sorted(cut.waiting.items())[:20]},
        "waiting_s": dict(sorted(waited.items())[:20]),  # since each one's first event's source time
        # a transaction whose END announces more events than the whole topic holds for this table
        "incomplete": {tx: {"seen": n, "expected": e} for tx, (n, e) in sorted(cut.waiting.items())
                       if e is not None and caught_up},
        # the batch applies nothing while these wait, and they have waited past the table's timeout
        "stalled": {tx: {"seen": n, "expected": e, "waiting_s": waited[tx]}
                    for tx, (n, e) in sorted(cut.waiting.items()) if applicable is None and read_again is None
                    and waited.get(tx, 0.0) >= table.transaction_timeout_s},
    }, read_again


def _too_small(table: CapturedTable, raw: RawBatch, limits: BatchLimits, blocked: ReadOn) -> BatchTooSmallError:
    """The error for a transaction that does not fit in a batch, with the record limit it needs: the
    events its END announces for the table and the tombstones read after its deletes (a record each)."""
    spans = {p: blocked.until.get(p, raw.end_offsets[p]) for p in raw.start_offsets}
    records = raw.records
    mask = pc.is_null(records["value"])
    tombstones = sum(pc.sum(pc.and_(mask, pc.and_(pc.equal(records["partition"], p),
                                                    pc.less(records["offset"], span)))).as_py() or 0
                     for p, span in spans.items())
    by_bytes = raw.bytes_read >= limits.max_bytes
    return BatchTooSmallError(
        f"table '{table.name}' (topic {table.topic}): transaction {blocked.transaction} does not fit in a batch of "
        f"{limits.max_records} records / {limits.max_bytes} bytes: its END announces {blocked.expected} events "
        f"for the table, and a batch from offsets {dict(sorted(raw.start_offsets.items()))} holding nothing of later "
        f"transactions ends after {blocked.seen} of them ({tombstones} tombstone(s) among its records); nothing was "
        f"committed. Raise the batch limits: max_records_per_batch (run config) to at least "
        f"{blocked.expected + tombstones} (the {blocked.expected} events, and a record for each tombstone after one "
        "of its deletes)" + (f", and max_bytes above the {raw.bytes_read} bytes the batch stopped at" if by_bytes
                             else ""))


def merge_micro_batches(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
                        limits: BatchLimits) -> Iterator[BatchReport]:
    """Apply ``table``'s new change events to Delta, one bounded micro-batch (one commit) after another,
    each read from the offsets the previous one committed: up to ``limits.max_batches_per_run``
    batches, until one reaches the high watermarks seen at its start or can apply nothing.

    A batch ends at those high watermarks, or earlier at ``limits``. Its data and offsets are
    committed together; on any bad event nothing of it is committed (the batches before it stay).

    Where a batch's fold does not depend on the previous batch's commit (``_pipelined``), batch N+1
    is read, handed over and folded while batch N is merged, from N's end offsets and the layout
    the table had before N's merge. N+1 is applied only if N's commit left the table where N+1
    assumed; otherwise it is prepared again from what Delta holds.
    """
    # The batch being prepared ahead, and the progress it assumes the batch before it commits.
    ahead: tuple[Future[_Prepared], TableProgress] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-batch-ahead") as pool:
        try:
            for number in range(1, limits.max_batches_per_run + 1):
                started = time.perf_counter()
                progress = writer.read_progress(table.target, table.app_id)
                schema = writer.table_schema(table.target)
                read_progress_s = time.perf_counter() - started
                taken = _taken(*ahead, table, progress, schema) if ahead is not None else None
                ahead = None
                prepared = taken or _prepare(spark, source, writer, table, limits, progress, schema)
                prepared.timings["read_progress_s"] = read_progress_s
                if (_pipelined(table, writer) and prepared.rows is not None and not prepared.raw.caught_up
                        and number < limits.max_batches_per_run):
                    assumed = _progress_after(prepared, table)
                    ahead = pool.submit(_prepare, spark, source, writer, table, limits, assumed, schema), assumed
                report = _apply(writer, table, prepared)
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
    return table.mode.folds_ahead and table.transaction_log is None and writer.name == "delta-rs"


@dataclass(frozen=True)
class _Prepared:
    """A batch read and folded but not applied: what ``_apply`` needs, its records let go (a run
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
    transactions: dict[str, object] | None = None


def _progress_after(prepared: _Prepared, table: CapturedTable) -> TableProgress:
    """The table's progress once ``prepared`` is committed (its txn and Delta versions unknown yet)."""
    assert prepared.commit is not None
    commit = prepared.commit
    return TableProgress(dict(commit.offsets), commit.version, -1, commit.key_columns,
                         truncated_at=truncation_mark(commit.truncated_at, _truncation(table, prepared.summary)))


def _truncated_at(progress: TableProgress | None) -> str | None:
    """The truncation mark the table's last commit recorded (``core.truncation``)."""
    return progress.truncated_at if progress is not None else None


def _truncation(table: CapturedTable, summary: BatchSummary | None) -> Truncation | None:
    """The TRUNCATE a batch applies: its latest, for a table whose ``on_truncate`` is apply."""
    return latest_truncation(summary.truncates) if summary is not None and table.on_truncate == "apply" else None


def _taken(following: Future[_Prepared], assumed: TableProgress, table: CapturedTable,
           progress: TableProgress | None, schema: StructType | None) -> _Prepared | None:
    """The batch prepared ahead, if the commit before it left the table as it assumed: the offsets
    (and key columns) it starts from, and a layout derived anew from its sampled events and the
    table's schema now the same as the one it was folded with. None: prepare it again."""
    try:
        prepared = following.result()
    except Exception:
        return None  # prepared again from what Delta holds, and fails again if it must
    if prepared.summary is not None and prepared.summary.unavailable_kept + prepared.summary.unavailable_never_seen:
        return None  # it read the table's values before the commit before it: read them again
    if progress is None or (progress.offsets, progress.key_columns, progress.truncated_at) != (
            assumed.offsets, assumed.key_columns, assumed.truncated_at):
        return None
    if prepared.layout is None or prepared.samples is None:
        return prepared if schema == prepared.existing else None
    layout = _derive_layout(table, prepared.raw, prepared.samples, schema, progress.key_columns)
    return prepared if layout == prepared.layout else None


def _derive_layout(table: CapturedTable, raw: RawBatch, samples: tuple[list[bytes], list[bytes]],
                   existing: StructType | None, key_columns: tuple[str, ...] = ()) -> ChangeEventLayout:
    """The layout of the batch's sampled keys and values (``core.layout``), given the table's Delta schema
    and the key columns its last commit recorded (for a batch of keyless events: TRUNCATE)."""
    existing_rows = None
    if existing is not None:
        existing_rows = StructType([f for f in existing.fields if not f.name.startswith(HIDDEN_PREFIX)])
    try:
        return derive_layout(table.kind, *samples, table.key_columns, table.columns, existing_rows,
                             table.unavailable_placeholder, key_columns)
    except LayoutError as exc:
        offsets = {p: f"{raw.start_offsets[p]}..{raw.end_offsets[p]}" for p in sorted(raw.start_offsets)}
        # Sampled events that cannot be read are the cause an operator must see, not the layout they left empty.
        unreadable = [reason for value in samples[1] if (reason := explain_bad_value(value, ""))]
        cause = f" (sampled events cannot be read, e.g. {unreadable[-1]})" if unreadable else ""
        raise LayoutError(f"table '{table.name}', topic {table.topic}, batch offsets by partition {offsets}: "
                          f"{exc}{cause}. Nothing was committed") from exc


def _read(source: KafkaSource, table: CapturedTable, limits: BatchLimits, offsets: Mapping[int, int] | None,
          until: Mapping[int, int] | None = None, cut: Cut | None = None) -> tuple[RawBatch, int, pa.Table]:
    """The batch of ``table``'s topic that starts at ``offsets`` (and stops before ``until``, where it
    names a partition, or where ``cut`` ends it), its tombstones and its other records."""
    # Read the next batch while this one is applied; not for tables cut to whole transactions, whose
    # batches also read the transaction topic with the same consumer.
    raw = source.read_batch(table.topic, offsets, limits.max_records, limits.max_bytes, limits.poll_timeout_s,
                            read_ahead=table.transaction_log is None, until=until, cut=cut,
                            decode=record_decoder(table.schema_registry))
    _checkpoint("consumed")
    is_tombstone = pc.is_null(raw.records["value"])
    tombstones = pc.sum(is_tombstone).as_py() or 0
    return raw, tombstones, raw.records.filter(pc.invert(is_tombstone)) if tombstones else raw.records


def _key_change_cut(table: CapturedTable, existing: StructType | None, key_columns: tuple[str, ...]) -> Cut | None:
    """Where a batch of ``table`` can end without separating a primary-key change's delete and create
    (``core.key_changes``), for the source to cut it before it reads the next batch ahead: only where
    values can carry the unavailable-value placeholder (None: never cut; batches cut to whole transactions
    keep a key change's two events together already)."""
    if table.kind not in PLACEHOLDER_KINDS or table.transaction_log is not None:
        return None

    def cut(raw: RawBatch) -> dict[int, int] | None:
        values = raw.records["value"]
        # Asked before the layout, which costs a parse of the sampled values (most batches of small tables).
        if values.null_count == len(values) or not (raw.key_change_halves or unfinished_partitions(
                raw.end_offsets, raw.high_watermarks)):
            return None
        layout = _derive_layout(table, raw, (_sample(raw.records["key"]), _sample(values)), existing, key_columns)
        if not layout.unavailable_tests:
            return None
        return key_change_cut(raw.records, raw.end_offsets, raw.high_watermarks, table.kind, layout.placeholder,
                              raw.key_change_halves)

    return cut


def _prepare(spark: SparkSession, source: KafkaSource, writer: BatchWriter, table: CapturedTable,
             limits: BatchLimits, progress: TableProgress | None, existing: StructType | None,
             until: Mapping[int, int] | None = None) -> _Prepared:
    """Read the batch that starts at ``progress`` and fold it, for a table whose Delta schema is
    ``existing``: everything before the commit, nothing written. ``until``: where the batch stops in
    the partitions it names (``_whole_transactions``)."""
    # A primary-key change's old values are found only with its delete in the batch (``core.key_changes``).
    keep = _key_change_cut(table, existing, progress.key_columns if progress else ())
    raw, tombstones, events = _read(source, table, limits, progress.offsets if progress else None, until, keep)
    while events.num_rows == 0 and existing is None and not raw.caught_up:
        # Tombstones only and no table to record their offsets in (nothing to create it from): read on,
        # and the first commit with rows records the offsets past them.
        following, more, events = _read(source, table, limits, raw.end_offsets, until, keep)
        raw = replace(following, start_offsets={**following.start_offsets, **raw.start_offsets},
                      records_read=raw.records_read + following.records_read,
                      bytes_read=raw.bytes_read + following.bytes_read,
                      timings={k: raw.timings.get(k, 0.0) + following.timings.get(k, 0.0)
                               for k in {*raw.timings, *following.timings}})
        tombstones += more
    timings = dict(raw.timings)
    if raw.end_offsets == raw.start_offsets:
        return _Prepared(raw.without_records(), tombstones, timings, existing=existing)
    commit = CommitRequest(table.app_id, sum(raw.end_offsets.values()), table.topic, raw.end_offsets,
                           progress.key_columns if progress else (), truncated_at=_truncated_at(progress))
    if events.num_rows == 0:  # tombstones only: the offsets are committed to an existing table
        return _Prepared(raw.without_records(), tombstones, timings, commit if existing is not None else None,
                         existing=existing)

    samples = (_sample(events["key"]), _sample(events["value"]))
    layout = _derive_layout(table, raw, samples, existing, progress.key_columns if progress else ())
    # Searched and handed over without their schemas (a sixth of the bytes); ``events`` keep every byte for
    # dead letters and error messages.
    handed = events.set_column(events.schema.get_field_index("value"), "value", without_schemas(events["value"]))
    # Decoded and folded without the placeholder's tests when no value of the batch can hold it.
    read_as = layout if _may_hold_placeholder(layout, handed["value"]) else replace(layout, placeholder=None)
    commit = replace(commit, key_columns=layout.key_columns)
    # The local hand-over first reads a batch without its fallback for unreadable lines (less Spark CPU
    # a batch); a batch with any bad event is read again, exactly, so that bad events get the exact
    # verdict. Batches cut to whole transactions are read exactly at once: the cut counts good events.
    exact = table.transaction_log is not None or not is_local(spark)
    with contextlib.ExitStack() as scratch:
        mark = time.perf_counter()
        frame = scratch.enter_context(spark_records(spark, handed, value_type(read_as), exact))
        timings["to_spark_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
        decoded = decode_change_events(frame, read_as)
        transactions: dict[str, object] | None = None
        if table.transaction_log is not None:
            cut_offsets, transactions, read_again = _whole_transactions(
                source, table, raw, progress, decoded, read_as.key_columns, limits, until)
            if read_again is not None:  # its first transaction fits once later ones are left out: read it whole
                scratch.close()
                return _prepare(spark, source, writer, table, limits, progress, existing, read_again)
            if cut_offsets is None:  # nothing whole yet (an END not ingested): commit nothing, report what waits
                return _Prepared(replace(raw.without_records(), end_offsets=dict(raw.start_offsets)), tombstones,
                                 timings, existing=existing, transactions=transactions)
            if cut_offsets != raw.end_offsets:
                # ``events`` keep the records past the cut: bad events are looked up there by coordinates only.
                decoded = decoded.where(_before(cut_offsets, F.col(PARTITION_COLUMN), F.col(OFFSET_COLUMN)))
                raw = replace(raw, end_offsets=cut_offsets)
            commit = replace(commit, version=sum(cut_offsets.values()), offsets=cut_offsets,
                             transactions=transactions)
        rows, summary = _fold(writer, table, read_as, decoded, progress)
        if summary.bad_events and not exact:
            frame = scratch.enter_context(spark_records(spark, handed, value_type(read_as), exact=True))
            rows, summary = _fold(writer, table, read_as, decode_change_events(frame, read_as), progress)
        timings["parse_fold_to_arrow_s"] = time.perf_counter() - mark
    return _Prepared(raw.without_records(), tombstones, timings, commit, events if summary.bad_events else None,
                     samples, layout, existing, rows, summary, transactions)


def _apply(writer: BatchWriter, table: CapturedTable, prepared: _Prepared) -> BatchReport:
    """Commit a prepared batch: its rows and offsets, or its offsets alone; or halt on bad events
    (or put them in the dead-letter table, as the table is configured) before anything is committed."""
    raw, timings = prepared.raw, prepared.timings
    report = BatchReport(table, writer.name, raw, prepared.tombstones, prepared.summary, None, timings,
                         transactions=prepared.transactions,
                         key_columns=prepared.commit.key_columns if prepared.commit is not None else ())
    if prepared.commit is None:
        return report
    if prepared.rows is None:
        mark = time.perf_counter()
        outcome = writer.commit_progress(table.target, prepared.commit)
        timings["merge_commit_s"] = time.perf_counter() - mark
        return replace(report, outcome=outcome)
    assert prepared.summary is not None and prepared.layout is not None
    dead_lettered = 0
    if prepared.summary.bad_events:
        bad, events = prepared.summary.bad_events, prepared.events
        assert events is not None
        if table.on_bad_event != "dead_letter" or table.dead_letter is None:
            first = bad[0]
            reason = explain_bad_value(_value_at(events, first.partition, first.offset), first.reason)
            raise BadEventError(table.topic, first.partition, first.offset, reason, table.name, len(bad))
        mark = time.perf_counter()
        write_dead_letters(table.dead_letter, dead_letter_rows(table.topic, table.name, events, bad))
        dead_lettered = len(bad)
        timings["dead_letter_s"] = time.perf_counter() - mark
    if prepared.summary.truncates and table.on_truncate == "halt":
        truncate = prepared.summary.truncates[0]
        raise TruncateError(table.topic, truncate.partition, truncate.offset, table.name)
    truncation = _truncation(table, prepared.summary)
    commit = replace(prepared.commit, truncated_at=truncation_mark(prepared.commit.truncated_at, truncation))
    _checkpoint("folded")
    mark = time.perf_counter()
    if prepared.rows.num_rows == 0 and prepared.existing is not None and truncation is None:
        # Nothing to change (every event older than the table's rows, or dead-lettered): the offsets alone.
        outcome = writer.commit_progress(table.target, commit)
    else:
        outcome = writer.merge(table.target, prepared.rows, prepared.layout.key_columns, commit, table.mode,
                               truncation)
    timings["merge_commit_s"] = time.perf_counter() - mark
    _checkpoint("committed")
    return replace(report, outcome=outcome, dead_lettered=dead_lettered)
