"""The fold rule: one row per key, the event with the latest position wins; and batch statistics.

``fold_events`` is one Spark aggregation that yields, per key, the columns of its latest good event
and the key's event counts, so parsing, folding and counting cost a single pass over the batch.
The result is small (at most one row per key of a bounded micro-batch) and leaves Spark as Arrow;
``fold_batch`` then separates the rows a MERGE applies from the batch's ``BatchSummary``, listing
bad events with a second pass only when the aggregation counted some.

A folded row's ``_cdc_op`` tells the writer whether the key ends deleted (``d``) or present
(``c``/``u``/``r``: snapshot reads are upserts), and its ``_cdc_position`` lets the MERGE refuse
anything not newer than the row already in Delta.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.arrow import to_arrow
from cdc_assets.core.envelope import (
    ERROR_COLUMN,
    OFFSET_COLUMN,
    PARTITION_COLUMN,
    SNAPSHOT_COLUMN,
    TABLE_COLUMN,
    TRUNCATE_OP,
)
from cdc_assets.core.key_changes import ORIGIN_COLUMN, key_change_create
from cdc_assets.core.key_changes import POSITION_FIELD as _AT
from cdc_assets.core.layout import (
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    UNAVAILABLE_COLUMN,
    ChangeEventLayout,
)
from cdc_assets.core.position import position_source_part

_COUNTS = {
    "_n_create": "c",
    "_n_update": "u",
    "_n_delete": "d",
    "_n_read": "r",
}
_N_INCREMENTAL = "_n_incremental_read"
_N_BAD = "_n_bad"
_N_TRUNCATE = "_n_truncate"
_MAX_TS = "_max_source_ts"
_MAX_INCREMENTAL_TS = "_max_incremental_read_ts"
_FIRST_POSITION = "_first_position"
STAT_COLUMNS = (*_COUNTS, _N_INCREMENTAL, _N_TRUNCATE, _N_BAD, _MAX_TS, _MAX_INCREMENTAL_TS, _FIRST_POSITION)


def fold_events(events: DataFrame, layout: ChangeEventLayout, by: Sequence[str] = ()) -> DataFrame:
    """Per key: the target columns of the latest good event (null if none) and the key's statistics.
    ``by``: columns grouped on before the key, and kept first (a shared plan's table: ``fold_tables``).

    A column the latest event left unavailable (the placeholder: unchanged) takes the value of the
    key's latest good event that carried one (a delete carries none); where no event of the batch did,
    it is null and the row's ``_cdc_unavailable`` lists it, for the pipeline to keep the value the table
    holds. A create that left columns unavailable is a primary-key change's (``core.key_changes``): the
    row started there, so only later events give values, and ``_cdc_origin`` names the create's source
    position, whose delete's key held the values before."""
    target_columns = layout.target_type.fieldNames()
    carried = [name for name in target_columns if name not in layout.key_columns]
    unavailable = [name for name in layout.unchanged_columns if name in carried]
    good = F.col(ERROR_COLUMN).isNull()
    op = F.col(OP_COLUMN)
    incremental = good & (op == "r") & (F.col(SNAPSHOT_COLUMN) == "incremental")
    truncate = op == TRUNCATE_OP  # keyless: counted, never a row
    if unavailable:
        left = F.col(UNAVAILABLE_COLUMN)
        position = F.col(POSITION_COLUMN)
        # Per such column, the latest event that knew it (a struct: a known null is not "unknown").
        known = [F.max_by(F.struct(F.col(name), position.alias(_AT)),
                          F.when(good & (op != "d") & ~F.array_contains(left, name), position))
                 .alias(f"_known_{index}") for index, name in enumerate(unavailable)]
        known.append(F.max_by(F.struct(position_source_part(position).alias("part"), position.alias(_AT)),
                              F.when(good & key_change_create(op, left), position)).alias("_anchor"))
    else:
        known = []
    # Only counts and max/max_by here: a collecting aggregate (collect_list) would switch the whole
    # aggregation to Spark's object-hash path, which falls back to sorting after 128 keys.
    folded = events.groupBy(*by, *layout.key_columns).agg(
        # max_by ignores null orderings: bad events never win.
        F.max_by(F.struct(*carried, *([UNAVAILABLE_COLUMN] if unavailable else [])),
                 F.when(good & ~truncate, F.col(POSITION_COLUMN))).alias("_latest"),
        *known,
        *[F.count_if(good & (op == code)).alias(name) for name, code in _COUNTS.items()],
        F.count_if(incremental).alias(_N_INCREMENTAL),
        F.count_if(good & truncate).alias(_N_TRUNCATE),
        F.count_if(~good).alias(_N_BAD),
        F.max(F.when(good, F.col(SOURCE_TS_COLUMN))).alias(_MAX_TS),
        F.max(F.when(incremental, F.col(SOURCE_TS_COLUMN))).alias(_MAX_INCREMENTAL_TS),
        F.min(F.when(good & ~truncate, F.col(POSITION_COLUMN))).alias(_FIRST_POSITION),
    )
    latest = F.col("_latest")
    values = {name: latest[name] for name in carried}
    extra: list[Column] = []
    if unavailable:
        deleted = latest[OP_COLUMN] == "d"
        anchor = F.col("_anchor")
        still: list[Column] = []
        for index, name in enumerate(unavailable):
            was_left = F.coalesce(F.array_contains(latest[UNAVAILABLE_COLUMN], name), F.lit(False)) & ~deleted
            known_value = F.col(f"_known_{index}")
            # A value known before the key's primary-key change create belongs to an earlier row of the key.
            valid = known_value.isNotNull() & (anchor.isNull() | (known_value[_AT] >= anchor[_AT]))
            values[name] = F.when(was_left, F.when(valid, known_value[name])).otherwise(latest[name])
            still.append(F.when(was_left & ~valid, F.lit(name)))
        remaining = F.array_compact(F.array(*still))
        extra.append(remaining.alias(UNAVAILABLE_COLUMN))
        extra.append(F.when(F.size(remaining) > 0, anchor["part"]).alias(ORIGIN_COLUMN))
    return folded.select(
        *by,
        *layout.key_columns,
        *[column.alias(name) for name, column in values.items()],
        *extra,
        *STAT_COLUMNS,
    ).select(*by, *target_columns, *([UNAVAILABLE_COLUMN, ORIGIN_COLUMN] if unavailable else []), *STAT_COLUMNS)


@dataclass(frozen=True, order=True)
class BadEvent:
    """An event that cannot be applied: its Kafka coordinates and why."""

    offset: int
    partition: int
    reason: str


@dataclass(frozen=True, order=True)
class TruncateEvent:
    """A TRUNCATE of the table at the source: its Kafka coordinates, source position and time."""

    offset: int
    partition: int
    position: str
    source_ts: datetime | None = None


@dataclass(frozen=True)
class BatchSummary:
    """What a batch of decoded events held; ``bad_events`` ordered by offset."""

    events: int
    creates: int
    updates: int
    deletes: int
    snapshot_reads: int
    incremental_snapshot_reads: int
    last_incremental_snapshot_read_ts: datetime | None
    max_source_ts: datetime | None
    median_key_source_ts: datetime | None  # median over keys of each key's newest change
    bad_events: tuple[BadEvent, ...]
    # Values the batch left unavailable (the placeholder, no event of the batch knew them), per row and
    # column: kept from the table's row, or null where the table had none (the row was never captured).
    unavailable_kept: int = 0
    unavailable_never_seen: int = 0
    # Update nulls the table ignores (``ignore_null_updates``) that no event of the batch filled: the table's
    # value kept, or the null written where the table had no row.
    null_updates_from_table: int = 0
    truncates: tuple[TruncateEvent, ...] = ()  # ordered by offset
    first_position: str | None = None  # the earliest position of the batch's good row events
    # Good events that a TRUNCATE after them wiped out at the source (``on_truncate: apply``): read, not applied.
    before_truncate: int = 0


def _median_timestamp(values: pa.ChunkedArray) -> datetime | None:
    present = values.drop_null()
    if not len(present):
        return None
    micros = pc.quantile(present.cast(pa.int64()), q=0.5, interpolation="lower")[0].as_py()
    return pa.scalar(micros, present.type).as_py()


def bad_events(events: DataFrame) -> tuple[BadEvent, ...]:
    """The bad events of decoded ``events``, ordered by offset: a second pass over the batch, taken
    only when the fold counted some."""
    rows = events.where(F.col(ERROR_COLUMN).isNotNull()).select(OFFSET_COLUMN, PARTITION_COLUMN, ERROR_COLUMN)
    return tuple(sorted(BadEvent(*row) for row in rows.collect()))


def truncate_events(events: DataFrame) -> tuple[TruncateEvent, ...]:
    """The TRUNCATE events of decoded ``events``, ordered by offset: a second pass, taken only when the
    fold counted some."""
    rows = events.where(F.col(ERROR_COLUMN).isNull() & (F.col(OP_COLUMN) == TRUNCATE_OP)).select(
        OFFSET_COLUMN, PARTITION_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN)
    return tuple(sorted(TruncateEvent(*row) for row in rows.collect()))


def fold_batch(events: DataFrame, layout: ChangeEventLayout) -> tuple[pa.Table, BatchSummary]:
    """The rows to MERGE (keys with a good event, as Arrow) and the batch summary of decoded ``events``."""
    return _summarized(to_arrow(fold_events(events, layout)), events)


def fold_tables(events: DataFrame, layout: ChangeEventLayout, tables: int) -> list[tuple[pa.Table, BatchSummary]]:
    """``fold_batch`` of each table of a shared plan, in one aggregation: decoded ``events`` of ``tables``
    tables of one layout, each event's table in ``_cdc_table`` (0 to ``tables`` - 1), folded with the table
    as the key's first column, collected as Arrow once and split per table. Bad events and TRUNCATEs are
    listed per table, from that table's events, only where the fold counted some."""
    folded = to_arrow(fold_events(events, layout, by=(TABLE_COLUMN,)))
    folded = folded.sort_by(TABLE_COLUMN)
    # Where each table's rows start: the sorted table ids searched for 0..tables.
    bounds = np.searchsorted(folded[TABLE_COLUMN].to_numpy(), np.arange(tables + 1), side="left")
    folded = folded.drop_columns([TABLE_COLUMN])
    return [_summarized(folded.slice(start, end - start), events.where(F.col(TABLE_COLUMN) == index))
            for index, (start, end) in enumerate(itertools.pairwise(bounds))]


def _summarized(folded: pa.Table, events: DataFrame) -> tuple[pa.Table, BatchSummary]:
    """The rows to MERGE and the batch summary of a batch's ``folded`` keys; ``events``: its decoded events,
    read again only where the fold counted bad events or TRUNCATEs."""

    def total(name: str) -> int:
        return int(pc.sum(folded[name]).as_py() or 0)

    counts = {name: total(name) for name in _COUNTS}
    bad = bad_events(events) if total(_N_BAD) else ()
    truncates = truncate_events(events) if total(_N_TRUNCATE) else ()
    summary = BatchSummary(
        events=sum(counts.values()) + len(truncates) + len(bad),
        creates=counts["_n_create"],
        updates=counts["_n_update"],
        deletes=counts["_n_delete"],
        snapshot_reads=counts["_n_read"],
        incremental_snapshot_reads=total(_N_INCREMENTAL),
        last_incremental_snapshot_read_ts=pc.max(folded[_MAX_INCREMENTAL_TS]).as_py() if folded.num_rows else None,
        max_source_ts=pc.max(folded[_MAX_TS]).as_py() if folded.num_rows else None,
        median_key_source_ts=_median_timestamp(folded[_MAX_TS]),
        bad_events=bad,
        truncates=truncates,
        first_position=pc.min(folded[_FIRST_POSITION]).as_py() if folded.num_rows else None,
    )
    rows = folded.filter(pc.is_valid(folded[OP_COLUMN])).drop_columns(list(STAT_COLUMNS))
    return rows, summary
