"""SCD type 2: every change becomes a version row with the positions and times it was valid.

``history_versions`` turns a batch of decoded events into
- version rows (``_merge_kind = 'version'``), one per good create/update/read event, with
  ``_cdc_valid_from``/``_cdc_valid_from_ts`` (its position and source time), ``_cdc_valid_to``/
  ``_cdc_valid_to_ts`` (the next event of the same key in the batch, null if none) and
  ``_cdc_current`` (no later event in the batch);
- close markers (``_merge_kind = 'close'``), one per key, carrying the key's first position in the
  batch: the MERGE ends the table's current version of that key there, when it is older.
A delete produces no version: it ends the previous one.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc_assets.core.envelope import ERROR_COLUMN
from cdc_assets.core.layout import (
    CURRENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    VALID_FROM_COLUMN,
    VALID_FROM_TS_COLUMN,
    VALID_TO_COLUMN,
    VALID_TO_TS_COLUMN,
    ChangeEventLayout,
)

KIND_COLUMN = "_merge_kind"
CLOSE_AT_COLUMN = "_merge_close_at"
CLOSE_TS_COLUMN = "_merge_close_ts"


def history_versions(events: DataFrame, layout: ChangeEventLayout) -> DataFrame:
    """Version rows and per-key close markers for an SCD2 MERGE (bad events excluded)."""
    keys = list(layout.key_columns)
    data = [name for name in layout.target_type.fieldNames() if not name.startswith("_cdc_")]
    good = events.where(F.col(ERROR_COLUMN).isNull())
    by_key = Window.partitionBy(*keys).orderBy(POSITION_COLUMN)
    versions = (
        good.select(
            *data, OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN,
            F.lead(POSITION_COLUMN).over(by_key).alias(VALID_TO_COLUMN),
            F.lead(SOURCE_TS_COLUMN).over(by_key).alias(VALID_TO_TS_COLUMN),
        )
        .where(F.col(OP_COLUMN) != "d")
        .select(
            *data,
            OP_COLUMN,
            F.col(POSITION_COLUMN).alias(VALID_FROM_COLUMN),
            F.col(SOURCE_TS_COLUMN).alias(VALID_FROM_TS_COLUMN),
            VALID_TO_COLUMN,
            VALID_TO_TS_COLUMN,
            F.col(VALID_TO_COLUMN).isNull().alias(CURRENT_COLUMN),
            F.lit("version").alias(KIND_COLUMN),
        )
    )
    closes = good.groupBy(*keys).agg(
        F.min(POSITION_COLUMN).alias(CLOSE_AT_COLUMN),
        F.min_by(SOURCE_TS_COLUMN, F.col(POSITION_COLUMN)).alias(CLOSE_TS_COLUMN),
    ).withColumn(KIND_COLUMN, F.lit("close"))
    return versions.unionByName(closes, allowMissingColumns=True)
