"""A run's first batches of many tables, read before their merges, and those of one layout folded in one
Spark query (a shared plan).

A small table's Spark query is mostly the query's fixed cost (planning, analysis, scheduling), not its
events (docs/performance.md). ``first_batches`` reads each table's first batch of the run, and hands the
batches that can share a plan to Spark as one input: their records in one hand-over with their table's
index beside each record, decoded once (``core.envelope.decode_change_events``) and folded once with the
table as the key's first column (``core.fold.fold_tables``), collected as Arrow once and split per table.
Each table then completes its fold alone (values left unavailable, a primary-key change's old values,
its TRUNCATE's refold: ``prepare.fold`` on its own events of the shared frame) and is MERGEd and committed
by its own merge, concurrently, as any batch (``batches.merge_micro_batches``, from its ``FirstBatch``).

A table's batch joins a shared plan (``shares_plan``) when the table is not cut to whole transactions, its
apply mode folds with ``fold_batch`` alone (scd1, soft_delete: not scd2, not MongoDB's documents), and the
batch reached the end of every partition with at most ``batch.shared_plan_max_records`` records (a backlog
merges alone, batch after batch). Batches join the same plan when their layouts are equal (connector
kind, key columns, row columns and their types, placeholder, ignored nulls); a plan holds at most
``batch.max_records`` records. Any other batch, and one whose shared plan fails, is folded alone by its
table's merge.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core import decode_change_events, value_type
from cdc_assets.core.envelope import TABLE_COLUMN
from cdc_assets.core.fold import fold_tables
from cdc_assets.io.delta import BatchWriter, TableProgress
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.io.spark import is_local, spark_records
from cdc_assets.merge.prepare import Prepared, ToFold, fold, read_to_fold
from cdc_assets.merge.quiet import TableState

K = TypeVar("K", bound=Hashable)

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class FirstBatch:
    """A table's first batch of a run, read before its merge from the table's ``progress`` and Delta schema
    (``existing``): folded (``Prepared``, by a shared plan, or with nothing to fold), or to fold alone
    (``ToFold``). Its merge takes it while the table is still where it was read from."""

    progress: TableProgress | None
    existing: StructType | None
    batch: Prepared | ToFold

    def holds_for(self, progress: TableProgress | None, existing: StructType | None) -> bool:
        """Whether the table's progress and schema are still those the batch was read with."""
        return (progress, existing) == (self.progress, self.existing)


def reads_first(table: CapturedTable) -> bool:
    """Whether ``table``'s first batch may join a shared plan: a table not cut to whole transactions (those
    read the transaction topic with the batch), whose apply mode's fold is ``fold_batch`` alone."""
    return table.transactions is None and table.mode.folds_together


def shares_plan(read: ToFold, limits: BatchLimits) -> bool:
    """Whether a first batch joins a shared plan: it holds the table's whole backlog (read to the end of every
    partition), of at most ``limits.shared_plan_max_records`` records."""
    return read.raw.caught_up and read.raw.records_read <= limits.shared_plan_max_records


def first_batches(spark: SparkSession, sources: Sequence[KafkaSource],
                  members: Mapping[K, tuple[CapturedTable, BatchWriter]], limits: BatchLimits,
                  known: Mapping[K, TableState] | None = None) -> dict[K, FirstBatch]:
    """The first batch of each of ``members`` (tables whose ``reads_first``, each with its writer), read with
    ``sources`` side by side, those that ``shares_plan`` folded in shared plans of one layout each. ``known``:
    the progress and schema the run just read of some of them (``quiet.table_states``), not read again.

    A run holds about one batch's records at a time, whatever its tables: each table's first batch is read
    with at most ``shared_plan_max_records`` records (a table with more gets no first batch: its merge reads
    its batches alone), at most two reads a source ahead of the plans, and a plan is folded as soon as the
    next batch of its layout would take it past ``max_records`` records. A table whose read fails gets no
    first batch either: its merge reads it again and reports the error."""
    firsts: dict[K, FirstBatch] = {}
    waiting: list[dict[K, ToFold]] = []  # per layout, the batches of the plan being filled, in the members' order
    bounded = limits.model_copy(update={"max_records": min(limits.max_records, limits.shared_plan_max_records)})
    idle: queue.SimpleQueue[KafkaSource] = queue.SimpleQueue()
    for source in sources:
        idle.put(source)

    def read(key: K) -> FirstBatch | None:
        table, writer = members[key]
        source = idle.get()
        try:
            state = (known or {}).get(key)
            progress = writer.read_progress(table.target, table.app_id) if state is None else state.progress
            existing = writer.table_schema(table.target) if state is None else state.schema
            return FirstBatch(progress, existing, read_to_fold(source, table, bounded, progress, existing))
        except Exception:  # read again by the table's merge, which reports it
            _LOG.debug("%s: first batch not read ahead of the merge", table.topic, exc_info=True)
            return None
        finally:
            idle.put(source)

    def fold(plan: dict[K, ToFold]) -> None:
        if len(plan) < 2:
            return  # folded alone by its merge, side by side with the others
        try:
            folded = fold_together(spark, [members[key] for key in plan], list(plan.values()))
        except Exception:  # each folds alone in its merge, which reports what fails
            _LOG.warning("a shared plan of %d tables failed; they fold alone", len(plan), exc_info=True)
            return
        for key, prepared in zip(plan, folded, strict=True):
            firsts[key] = replace(firsts[key], batch=prepared)

    keys = iter(members)
    with ThreadPoolExecutor(max_workers=max(1, len(sources)), thread_name_prefix="cdc-first-batch") as pool:
        ahead = collections.deque((key, pool.submit(read, key)) for key in itertools.islice(keys, 2 * len(sources)))
        while ahead:
            key, reading = ahead.popleft()
            following = next(keys, None)
            if following is not None:
                ahead.append((following, pool.submit(read, following)))
            first = reading.result()
            if first is None or (isinstance(first.batch, ToFold) and not shares_plan(first.batch, limits)):
                continue  # a backlog (or a failed read): its merge reads its batches alone
            firsts[key] = first
            batch = first.batch
            if not isinstance(batch, ToFold):
                continue  # nothing to fold
            plan = next((plan for plan in waiting if next(iter(plan.values())).layout == batch.layout), None)
            if plan is not None and sum(b.raw.records_read for b in plan.values()) + batch.raw.records_read > \
                    limits.max_records:
                fold(plan)
                waiting.remove(plan)
                plan = None
            if plan is None:
                waiting.append({key: batch})
            else:
                plan[key] = batch
    for plan in waiting:
        fold(plan)
    return firsts


def fold_together(spark: SparkSession, tables: Sequence[tuple[CapturedTable, BatchWriter]], reads: Sequence[ToFold],
                  exact: bool = False) -> list[Prepared]:
    """The batches ``reads`` of ``tables`` (one layout) folded in one Spark query, each then completed alone
    (``prepare.fold``: unavailable values, key changes, a TRUNCATE's refold): each table's ``Prepared``.
    As ``prepare.fold_read`` does for one table, the local hand-over is first read without its fallback for
    unreadable lines; the batches with bad events are folded again, together, exactly (``exact``)."""
    started = time.perf_counter()
    layout = reads[0].layout
    # The placeholder's tests where some batch may hold it: in the others no value matches them.
    read_as = layout if any(read.read_as.placeholder is not None for read in reads) else \
        replace(layout, placeholder=None)
    records = pa.concat_tables([read.handed.append_column("table", pa.repeat(pa.scalar(index, pa.int32()),
                                                                                read.handed.num_rows))
                                for index, read in enumerate(reads)])
    exact = exact or not is_local(spark)
    share = {"shared_plan": 1.0}
    prepared: list[Prepared | None] = [None] * len(reads)
    again: list[int] = []
    with contextlib.ExitStack() as scratch:
        frame = scratch.enter_context(spark_records(spark, records, value_type(read_as), exact))
        decoded = decode_change_events(frame, read_as, tables=True)
        folds = fold_tables(decoded, read_as, len(reads))
        share["parse_fold_to_arrow_s"] = (time.perf_counter() - started) / len(reads)
        for index, ((table, writer), read, folded) in enumerate(zip(tables, reads, folds, strict=True)):
            if folded[1].bad_events and not exact:
                again.append(index)  # its bad events' exact verdicts: after the shared frame is let go
                continue
            mark = time.perf_counter()
            mine = decoded.where(F.col(TABLE_COLUMN) == index)
            rows, summary = fold(writer, table, read_as, mine, read.progress, folded)
            prepared[index] = read.prepared(rows, summary, {**share, "complete_s": time.perf_counter() - mark})
    if again:
        exactly = fold_together(spark, [tables[index] for index in again], [reads[index] for index in again], True)
        for index, batch in zip(again, exactly, strict=True):
            prepared[index] = batch
    return [batch for batch in prepared if batch is not None]
