"""SCD type 2: every change becomes a version row with the positions and times it was valid.

``history_versions`` turns a batch of decoded events into
- version rows (``_merge_kind = 'version'``), one per good create/update/read event, with
  ``_cdc_valid_from``/``_cdc_valid_from_ts`` (its position and source time), ``_cdc_valid_to``/
  ``_cdc_valid_to_ts`` (the next event of the same key in the batch, null if none) and
  ``_cdc_current`` (no later event in the batch);
- close markers (``_merge_kind = 'close'``), one per key, carrying the key's first position in the
  batch: the MERGE ends the table's current version of that key there, when it is older.
A delete produces no version: it ends the previous one. Where some columns' history is not tracked
(``track_history_columns``), only a change to a tracked column opens a version (``_tracked_versions``).

Reads are position-guarded as in the other modes: an event not newer than the key's latest position
(in the table, ``latest_positions``, or earlier in the topic) changes nothing, so a late event (an
incremental-snapshot read, an older event in a later batch) neither adds a second current version
nor reorders the history, whichever batch it arrives in.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from cdc_assets.core.envelope import ERROR_COLUMN, OFFSET_COLUMN, PARTITION_COLUMN
from cdc_assets.core.key_changes import ORIGIN_COLUMN, key_change_create
from cdc_assets.core.key_changes import POSITION_FIELD as _AT
from cdc_assets.core.layout import (
    CURRENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    UNAVAILABLE_COLUMN,
    VALID_FROM_COLUMN,
    VALID_FROM_TS_COLUMN,
    VALID_TO_COLUMN,
    VALID_TO_TS_COLUMN,
    ChangeEventLayout,
)
from cdc_assets.core.position import position_source_part

KIND_COLUMN = "_merge_kind"
CLOSE_AT_COLUMN = "_merge_close_at"
CLOSE_TS_COLUMN = "_merge_close_ts"
LATEST_COLUMN = "_merge_latest"


def latest_positions(versions: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Per key, the latest position a table's versions hold: the current version's start, or its latest
    change in place (``_cdc_position``, where columns' history is not tracked), or the end of the last
    closed one (its delete's position)."""
    ends = F.greatest(F.col(VALID_FROM_COLUMN), F.coalesce(F.col(VALID_TO_COLUMN), F.col(VALID_FROM_COLUMN)),
                      *([F.col(POSITION_COLUMN)] if POSITION_COLUMN in versions.columns else []))
    return versions.groupBy(*key_columns).agg(F.max(ends).alias(LATEST_COLUMN))


def _carried_values(data: Sequence[str], layout: ChangeEventLayout, by_key: WindowSpec
                    ) -> tuple[list[Column], list[str]]:
    """The version rows' values: a column an event left unavailable (the placeholder: unchanged)
    carries the previous version's value, the latest of the key's earlier events that knew it (a delete
    knows none); where none did, ``_cdc_unavailable`` lists it, for the pipeline to carry the table's
    current version's, or, after a primary-key change's create (``core.key_changes``), the old key's:
    ``_cdc_origin`` names that create's source position, and values known before it are an earlier row's."""
    unavailable = [name for name in layout.unchanged_columns if name in data]
    if not unavailable:
        return [F.col(name) for name in data], []
    so_far = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    left, op, position = F.col(UNAVAILABLE_COLUMN), F.col(OP_COLUMN), F.col(POSITION_COLUMN)
    known = {name: F.last(F.when((op != "d") & ~F.array_contains(left, name),
                                 F.struct(F.col(name), position.alias(_AT))), ignorenulls=True).over(so_far)
             for name in unavailable}
    anchor = F.last(F.when(key_change_create(op, left), F.struct(position_source_part(position).alias("part"),
                                                                 position.alias(_AT))),
                    ignorenulls=True).over(so_far)
    valid = {name: known[name].isNotNull() & (anchor.isNull() | (known[name][_AT] >= anchor[_AT]))
             for name in unavailable}
    values = [F.when(valid[name], known[name][name]).alias(name) if name in known else F.col(name) for name in data]
    still = F.array_compact(F.array(*[F.when(~valid[name], F.lit(name)) for name in unavailable]))
    origin = F.when(F.size(still) > 0, anchor["part"])
    return [*values, still.alias(UNAVAILABLE_COLUMN), origin.alias(ORIGIN_COLUMN)], [UNAVAILABLE_COLUMN,
                                                                                       ORIGIN_COLUMN]


def history_versions(events: DataFrame, layout: ChangeEventLayout, latest: DataFrame | None = None,
                     current: DataFrame | None = None) -> DataFrame:
    """Version rows and per-key close markers for an SCD2 MERGE (bad events excluded), from the
    events newer than ``latest`` (``latest_positions`` of the table's versions of the batch's keys)
    and than every event of their key before them in the topic. Where some columns' history is not
    tracked (``layout.untracked``), ``current`` holds the table's current versions of the batch's keys
    (``_tracked_versions``)."""
    keys = list(layout.key_columns)
    data = [name for name in layout.target_type.fieldNames() if not name.startswith("_cdc_")]
    good = events.where(F.col(ERROR_COLUMN).isNull())
    before = Window.partitionBy(*keys).orderBy(PARTITION_COLUMN, OFFSET_COLUMN).rowsBetween(
        Window.unboundedPreceding, -1)
    newest_before = F.max(POSITION_COLUMN).over(before)
    if latest is not None:
        good = good.join(latest, keys, "left")
        newest_before = F.greatest(newest_before, F.col(LATEST_COLUMN))  # greatest skips nulls
    good = good.withColumn(LATEST_COLUMN, newest_before).where(
        F.col(LATEST_COLUMN).isNull() | (F.col(POSITION_COLUMN) > F.col(LATEST_COLUMN)))
    by_key = Window.partitionBy(*keys).orderBy(POSITION_COLUMN)
    values, left = _carried_values(data, layout, by_key)
    if layout.untracked:
        return _tracked_versions(good, layout, data, values, left, by_key, current)
    versions = (
        good.select(
            *values, OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN,
            F.lead(POSITION_COLUMN).over(by_key).alias(VALID_TO_COLUMN),
            F.lead(SOURCE_TS_COLUMN).over(by_key).alias(VALID_TO_TS_COLUMN),
        )
        .where(F.col(OP_COLUMN) != "d")
        .select(
            *data,
            *left,
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


IN_PLACE_COLUMN = "_merge_in_place"
_HELD = "_merge_held"  # the table's current version of the key: its tracked values and start


def _tracked_versions(good: DataFrame, layout: ChangeEventLayout, data: Sequence[str], values: Sequence[Column],
                      left: Sequence[str], by_key: WindowSpec, current: DataFrame | None) -> DataFrame:
    """Versions where only the tracked columns' changes open one: an event that changes no tracked column
    (against the key's previous event, or the table's current version) updates the version it follows in
    place, keeping its start. Each version row holds its last event's values and position
    (``_cdc_position``); one that updates the table's current version (``_merge_in_place``) is merged into
    that row, and its key gets no close marker, the row itself carrying where it ends. A delete ends the
    version before it, as without tracking; an event after it opens one. A value the batch left unavailable
    (the placeholder, an ignored null) is unchanged, compared as the table's current version holds it."""
    keys = list(layout.key_columns)
    tracked = [name for name in data if name not in keys and name not in layout.untracked]
    op, position, ts = F.col(OP_COLUMN), F.col(POSITION_COLUMN), F.col(SOURCE_TS_COLUMN)
    rows = good.select(*values, OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN)
    held_names = {name: f"{_HELD}_{index}" for index, name in enumerate(tracked)}
    if current is not None:
        held = current.select(*keys, *[F.col(name).alias(alias) for name, alias in held_names.items()],
                              F.col(VALID_FROM_COLUMN).alias(f"{_HELD}_from"),
                              F.col(VALID_FROM_TS_COLUMN).alias(f"{_HELD}_from_ts"), F.lit(True).alias(_HELD))
        rows = rows.join(held, keys, "left")
    else:
        rows = rows.select("*", *[F.lit(None).alias(alias) for alias in held_names.values()],
                           F.lit(None).cast("string").alias(f"{_HELD}_from"),
                           F.lit(None).cast("timestamp").alias(f"{_HELD}_from_ts"), F.lit(None).alias(_HELD))

    def effective(name: str) -> Column:
        if UNAVAILABLE_COLUMN not in left:
            return F.col(name)
        return F.when(F.array_contains(F.col(UNAVAILABLE_COLUMN), name), F.col(held_names[name])).otherwise(
            F.col(name))

    first = F.lag(POSITION_COLUMN).over(by_key).isNull()
    changed = F.lit(False)
    for name in tracked:
        before = F.when(first, F.col(held_names[name])).otherwise(F.lag(effective(name)).over(by_key))
        changed = changed | ~effective(name).eqNullSafe(before)
    opens = (op != "d") & ((first & F.col(_HELD).isNull()) | (~first & (F.lag(OP_COLUMN).over(by_key) == "d"))
                           | changed)
    so_far = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    rows = rows.withColumn("_merge_opens", opens).withColumn(
        "_merge_version", F.sum(F.col("_merge_opens").cast("int")).over(so_far))
    group = Window.partitionBy(*keys, "_merge_version").orderBy(POSITION_COLUMN)
    in_place = F.col("_merge_version") == 0
    ends_version = F.lead(F.col("_merge_opens") | (op == "d")).over(by_key)
    rows = rows.select(
        "*",
        F.coalesce(ends_version, F.lit(True)).alias("_merge_last"),
        F.lead(POSITION_COLUMN).over(by_key).alias(VALID_TO_COLUMN),
        F.lead(SOURCE_TS_COLUMN).over(by_key).alias(VALID_TO_TS_COLUMN),
        F.when(in_place, F.col(f"{_HELD}_from")).otherwise(F.first(position).over(group)).alias(VALID_FROM_COLUMN),
        F.when(in_place, F.col(f"{_HELD}_from_ts")).otherwise(F.first(ts).over(group)).alias(VALID_FROM_TS_COLUMN),
    )
    versions = rows.where((op != "d") & F.col("_merge_last")).select(
        *data, *left, OP_COLUMN, POSITION_COLUMN, VALID_FROM_COLUMN, VALID_FROM_TS_COLUMN, VALID_TO_COLUMN,
        VALID_TO_TS_COLUMN, F.col(VALID_TO_COLUMN).isNull().alias(CURRENT_COLUMN), F.lit("version").alias(KIND_COLUMN),
        in_place.alias(IN_PLACE_COLUMN))
    # A key whose first events update the table's current version in place: that version row ends it.
    closes = rows.groupBy(*keys).agg(
        F.min(POSITION_COLUMN).alias(CLOSE_AT_COLUMN),
        F.min_by(SOURCE_TS_COLUMN, position).alias(CLOSE_TS_COLUMN),
        F.max((in_place & (op != "d")).cast("int")).alias("_merge_updated"),
    ).where(F.col("_merge_updated") == 0).drop("_merge_updated").withColumn(KIND_COLUMN, F.lit("close"))
    return versions.unionByName(closes, allowMissingColumns=True)
