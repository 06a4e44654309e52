"""The fold rule: one row per key, the event with the latest position wins; and batch statistics.

The folded batch is what a MERGE applies. Its ``_cdc_op`` tells the writer whether the key ends
deleted (``d``) or present (``c``/``u``/``r``: snapshot reads are upserts), and its
``_cdc_position`` lets the MERGE refuse anything not newer than the row already in Delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.envelope import ERROR_COLUMN, OFFSET_COLUMN, PARTITION_COLUMN, SNAPSHOT_COLUMN
from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN, ChangeEventLayout


def fold_to_latest(events: DataFrame, layout: ChangeEventLayout) -> DataFrame:
    """Fold decoded events (errors excluded) to the latest event per key, in the target's columns."""
    target_columns = layout.target_type.fieldNames()
    carried = [name for name in target_columns if name not in layout.key_columns]
    latest = (
        events.where(F.col(ERROR_COLUMN).isNull())
        .groupBy(*layout.key_columns)
        .agg(F.max_by(F.struct(*carried), F.col(POSITION_COLUMN)).alias("_latest"))
    )
    return latest.select(*layout.key_columns, *[F.col("_latest")[name].alias(name) for name in carried]).select(
        *target_columns
    )


@dataclass(frozen=True)
class BatchSummary:
    """What a batch of decoded events holds, computed in one Spark aggregation."""

    events: int
    creates: int
    updates: int
    deletes: int
    snapshot_reads: int
    incremental_snapshot_reads: int
    max_source_ts: datetime | None
    bad_events: int
    first_bad_partition: int | None
    first_bad_offset: int | None
    first_bad_reason: str | None


def summarize(events: DataFrame) -> BatchSummary:
    """Count events by op, find the newest source timestamp and the first bad event (by offset)."""
    op = F.col(OP_COLUMN)
    bad = F.col(ERROR_COLUMN).isNotNull()
    good = ~bad
    first_bad = F.min_by(
        F.struct(F.col(PARTITION_COLUMN).alias("partition"), F.col(OFFSET_COLUMN).alias("offset"),
                 F.col(ERROR_COLUMN).alias("reason")),
        F.when(bad, F.struct(F.col(OFFSET_COLUMN), F.col(PARTITION_COLUMN))),
    )
    row = events.agg(
        F.count(F.lit(1)).alias("events"),
        F.count_if(good & (op == "c")).alias("creates"),
        F.count_if(good & (op == "u")).alias("updates"),
        F.count_if(good & (op == "d")).alias("deletes"),
        F.count_if(good & (op == "r")).alias("snapshot_reads"),
        F.count_if(good & (op == "r") & (F.col(SNAPSHOT_COLUMN) == "incremental")).alias("incremental"),
        F.max(F.when(good, F.col(SOURCE_TS_COLUMN))).alias("max_source_ts"),
        F.count_if(bad).alias("bad"),
        first_bad.alias("first_bad"),
    ).first()
    assert row is not None
    first = row["first_bad"] if row["bad"] else None
    return BatchSummary(
        events=row["events"],
        creates=row["creates"],
        updates=row["updates"],
        deletes=row["deletes"],
        snapshot_reads=row["snapshot_reads"],
        incremental_snapshot_reads=row["incremental"],
        max_source_ts=row["max_source_ts"],
        bad_events=row["bad"],
        first_bad_partition=first["partition"] if first else None,
        first_bad_offset=first["offset"] if first else None,
        first_bad_reason=first["reason"] if first else None,
    )
