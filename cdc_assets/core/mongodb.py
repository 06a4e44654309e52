"""MongoDB documents: rebuilt from creates/reads (full documents) and update patches, per key, in
position order, starting from the document already in Delta.

A document is kept as one JSON string column (``document``, MongoDB extended JSON as Debezium sends
it) next to its id. Patches are applied as Spark column logic on ``map<string, variant>``:
``$set`` replaces top-level fields, ``$unset`` removes them, a patch without operators replaces the
whole document, and an update that carries ``after`` (newer connectors) replaces it too. A patch
for a document never seen (nothing in Delta, no create or read before it) is a bad event: it is
reported with its coordinates and never applied silently. Patches on nested paths (``"a.b"``) are
reported as bad events too.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.envelope import (
    DOCUMENT_TYPE,
    ERROR_COLUMN,
    OFFSET_COLUMN,
    PARTITION_COLUMN,
    PATCH_COLUMN,
    PATCH_TYPE,
)
from cdc_assets.core.layout import (
    MONGODB_DOCUMENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    ChangeEventLayout,
)

ORPHAN_COLUMN = "_orphan"
ORPHAN_REASON = "op 'u' patches a document never seen (no create or read before it, nothing in Delta)"


def fold_documents(events: DataFrame, layout: ChangeEventLayout, base: DataFrame | None) -> DataFrame:
    """Per key: the rebuilt document after the batch's good events, newer than ``base``'s position.

    ``base`` holds the keys' current rows in Delta (key columns, ``document``, ``_cdc_position``).
    Output: key columns, ``document``, ``_cdc_op``, ``_cdc_position``, ``_cdc_source_ts`` and
    ``_orphan`` (coordinates of the first patch without a document, else null).
    """
    keys = list(layout.key_columns)
    empty = F.create_map().cast(DOCUMENT_TYPE)
    per_key = events.where(F.col(ERROR_COLUMN).isNull()).groupBy(*keys).agg(
        F.array_sort(F.collect_list(F.struct(
            F.col(POSITION_COLUMN).alias("position"), F.col(OP_COLUMN).alias("op"),
            F.col(MONGODB_DOCUMENT_COLUMN).alias("document"), F.col(PATCH_COLUMN).alias("patch"),
            F.col(SOURCE_TS_COLUMN).alias("ts"), F.col(PARTITION_COLUMN).alias("partition"),
            F.col(OFFSET_COLUMN).alias("offset")))).alias("_events"))
    if base is not None:
        per_key = per_key.join(base.select(*keys, F.col(MONGODB_DOCUMENT_COLUMN).alias("_base_document"),
                                           F.col(POSITION_COLUMN).alias("_base_position")), keys, "left")
    else:
        per_key = per_key.select("*", F.lit(None).cast("string").alias("_base_document"),
                                 F.lit(None).cast("string").alias("_base_position"))
    newer = F.filter("_events", lambda e: e["position"] > F.coalesce(F.col("_base_position"), F.lit("")))
    initial = F.struct(
        F.from_json(F.col("_base_document"), DOCUMENT_TYPE).alias("doc"),
        F.lit(None).cast("string").alias("op"),
        F.lit(None).cast("string").alias("position"),
        F.lit(None).cast("timestamp").alias("ts"),
        F.lit(None).cast("struct<partition:int,offset:bigint>").alias("orphan"),
    )

    def step(state: Column, event: Column) -> Column:
        operators = F.from_json(event["patch"], PATCH_TYPE)
        sets = F.coalesce(operators["$set"], empty)
        unset = F.coalesce(F.map_keys(operators["$unset"]), F.array().cast("array<string>"))
        is_replacement = operators["$set"].isNull() & operators["$unset"].isNull()
        patched = F.map_concat(
            F.map_filter(state["doc"], lambda k, _: ~F.array_contains(F.map_keys(sets), k)
                         & ~F.array_contains(unset, k)), sets)
        full = event["document"].isNotNull()
        orphan = (event["op"] == "u") & ~full & ~is_replacement & state["doc"].isNull()
        document = (
            F.when(event["op"] == "d", F.lit(None).cast(DOCUMENT_TYPE))
            .when(full, F.from_json(event["document"], DOCUMENT_TYPE))
            .when(is_replacement, F.from_json(event["patch"], DOCUMENT_TYPE))
            .when(state["doc"].isNull(), F.lit(None).cast(DOCUMENT_TYPE))
            .otherwise(patched)
        )
        first_orphan = F.coalesce(state["orphan"], F.when(orphan, F.struct(
            event["partition"].alias("partition"), event["offset"].alias("offset"))))
        return F.struct(document.alias("doc"), event["op"].alias("op"), event["position"].alias("position"),
                        event["ts"].alias("ts"), first_orphan.alias("orphan"))

    final = F.aggregate(newer, initial, step)
    return per_key.select(
        *keys,
        F.to_json(final["doc"]).alias(MONGODB_DOCUMENT_COLUMN),
        final["op"].alias(OP_COLUMN),
        final["position"].alias(POSITION_COLUMN),
        final["ts"].alias(SOURCE_TS_COLUMN),
        final["orphan"].alias(ORPHAN_COLUMN),
    )
