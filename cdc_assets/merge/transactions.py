"""A batch of a transaction-consistent table cut to whole transactions (``core.transactions``): where it ends,
what waits, and the ``TransactionStatus`` its commit records."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core.envelope import OFFSET_COLUMN, PARTITION_COLUMN, TRANSACTION_COLUMN
from cdc_assets.core.layout import SOURCE_TS_COLUMN
from cdc_assets.core.transaction_status import LISTED_WAITING, TransactionCount, TransactionStatus
from cdc_assets.core.transactions import (
    ReadOn,
    applied_positions,
    cut_batch,
    event_identity,
    exact_horizon,
    read_on,
    transaction_key,
)
from cdc_assets.io.delta import TableProgress
from cdc_assets.io.kafka import KafkaSource, RawBatch
from cdc_assets.io.transactions import ingest_transactions, table_horizon
from cdc_assets.merge.report import BatchTooSmallError


def before_cut(cut: dict[int, int], partition: Column, offset: Column) -> Column:
    """Events before the cut offsets."""
    condition = F.lit(False)
    for p, end in cut.items():
        condition = condition | ((partition == p) & (offset < end))
    return condition


def whole_transactions(source: KafkaSource, table: CapturedTable, raw: RawBatch, progress: TableProgress | None,
                       decoded: DataFrame, key_columns: Sequence[str], limits: BatchLimits,
                       until: Mapping[int, int] | None = None
                       ) -> tuple[dict[int, int] | None, TransactionStatus, dict[int, int] | None]:
    """Cut the batch to whole transactions of the table (``core.transactions``): the cut offsets
    (None when no event can be applied yet), the transaction status its commit records, and where to read
    again (None: no need).

    A transaction's events are counted once each: an event delivered again (Debezium is at-least-once; a
    restarted connector sends what it sent before its last stored offset) has the same source position,
    op and key (``core.transactions.event_identity``). Events of a transaction the table applied before, delivered
    again after it, are taken as they are, never waited for (``core.transactions.cut_batch``, from the commit
    positions each partition applied, which the commit records). Bad events count: they belong to their
    transaction, and the batch that holds them halts or dead-letters them as the table's ``on_bad_event`` says.

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
    assert table.transactions is not None
    log = table.transactions.log
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
    recorded = progress.transactions if progress is not None else None
    before = TransactionStatus.from_metadata(recorded) if recorded else None
    applied_in = before.applied_in if before is not None else {}
    cut = cut_batch(table.name, raw.start_offsets, raw.end_offsets, seen, ends, applied_in)
    applied_end = max([before.applied_end if before is not None else -1, *(ends[tx][0] for tx in cut.applied)])
    caught_up = raw.caught_up
    applicable = cut.end_offsets if cut.end_offsets != raw.start_offsets else None
    read_again: dict[int, int] | None = None
    if applicable is None and not caught_up:
        stop = {p: min(high, (until or {}).get(p, high)) for p, high in raw.high_watermarks.items()}
        blocked = read_on(cut, raw.start_offsets, raw.end_offsets, stop, seen, ends)
        if blocked is not None and blocked.helps:
            read_again = blocked.until
        elif blocked is not None and blocked.open:
            raise _too_small(table, raw, limits, blocked)
    now_ms = time.time() * 1000
    waited = {tx: round(max(0.0, now_ms - since[tx]) / 1000, 3) for tx in cut.waiting if tx in since}
    waiting = sorted(cut.waiting.items())
    status = TransactionStatus(
        applied_end=applied_end,
        horizon=exact_horizon(applied_end, table_horizon(log, table.name, applied_end), cut, ends),
        applied=len(cut.applied),
        waiting={tx: TransactionCount(n, e) for tx, (n, e) in waiting[:LISTED_WAITING]},
        waiting_s=dict(sorted(waited.items())[:LISTED_WAITING]),  # since each one's first event's source time
        # a transaction whose END announces more events than the whole topic holds for this table
        incomplete={tx: TransactionCount(n, e) for tx, (n, e) in waiting if e is not None and caught_up},
        # the batch applies nothing while these wait, and they have waited past the table's timeout
        stalled={tx: TransactionCount(n, e, waited[tx]) for tx, (n, e) in waiting
                 if applicable is None and read_again is None and waited.get(tx, 0.0) >= table.transactions.timeout_s},
        applied_in=applied_positions(applied_in, cut, seen, ends),
    )
    return applicable, status, read_again


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
