"""MongoDB documents: each event's document rebuilt from creates/reads (full documents), updates (patches,
change streams' update descriptions) and deletes, per key, in position order, starting from the document
already in Delta; and a collection's declared top-level fields as typed columns beside the document.

A document is kept as one JSON string column (``document``, MongoDB extended JSON as Debezium sends it)
next to its id. ``replayed_events`` turns a batch's good events into the same events carrying the document
after each of them, which the apply mode then folds (scd1, soft_delete) or turns into versions (scd2) as it
does a relational table's events. An event that cannot be applied (a patch for a document never seen,
nothing in Delta and no create or read before it; an update MongoDB itself would have refused on the stored
document) gets ``_cdc_error``, with its coordinates, and is never applied silently.

Updates are applied by MongoDB's rules (``core.document_updates``): ``$set`` and ``$unset`` on top-level and
nested paths (``"a.b"``, ``"items.2.qty"``), ``updateDescription``'s updated and removed fields and truncated
arrays; a patch without operators replaces the whole document, and an update carrying ``after`` (change
streams with full documents) replaces it too. Spark has no column function that sets a value at a path of
arbitrary depth in JSON or a variant, so each key's sorted events are replayed in Python on Spark's workers
(``mapInArrow``, one call per Arrow batch of keys), after one aggregation groups them as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.core import document_updates
from cdc_assets.core.document_updates import replay
from cdc_assets.core.envelope import (
    ERROR_COLUMN,
    OFFSET_COLUMN,
    PARTITION_COLUMN,
    PATCH_COLUMN,
    SNAPSHOT_COLUMN,
    TRANSACTION_COLUMN,
    TRUNCATE_OP,
)
from cdc_assets.core.layout import (
    MONGODB_DOCUMENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    ChangeEventLayout,
)

# The replay runs on Spark's Python workers, which need not have this project installed.
cloudpickle.register_pickle_by_value(document_updates)

BASE_DOCUMENT_COLUMN = "_base_document"
BASE_POSITION_COLUMN = "_base_position"
_EVENTS = "_events"
# The events' fields the replay keeps, in the order they sort by (position first).
_EVENT_FIELDS = (POSITION_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN, OP_COLUMN, MONGODB_DOCUMENT_COLUMN, PATCH_COLUMN,
                 SOURCE_TS_COLUMN, SNAPSHOT_COLUMN, TRANSACTION_COLUMN)


def _replay_batches(batches: Iterator[pa.RecordBatch], keys: Sequence[str], every: bool
                    ) -> Iterator[pa.RecordBatch]:
    """Per Arrow batch of keys (key columns, stored document, sorted events): one row per event, with the
    document after it and why it could not be applied (``document_updates.replay``); with ``every`` false,
    only each key's last applied event and the events that could not be applied."""
    for batch in batches:
        events = batch.column(_EVENTS)
        # A child of a struct array taken with ``field`` ignores the struct's offset: ``flatten`` keeps it.
        fields = dict(zip(_EVENT_FIELDS, events.flatten().flatten(), strict=True))
        ops, fulls, patches = (fields[name].to_pylist() for name in (OP_COLUMN, MONGODB_DOCUMENT_COLUMN, PATCH_COLUMN))
        bounds = pc.subtract(events.offsets, events.offsets[0]).to_pylist()
        kept: list[int] = []  # of the batch's events, in order
        documents: list[str | None] = []
        problems: list[str | None] = []
        for row, stored in enumerate(batch.column(BASE_DOCUMENT_COLUMN).to_pylist()):
            span = range(bounds[row], bounds[row + 1])
            replayed = replay(stored, ({"op": ops[i], "document": fulls[i], "patch": patches[i]} for i in span))
            applied = [at for at, (_, problem) in enumerate(replayed) if problem is None]
            for at, (document, problem) in enumerate(replayed):
                if every or problem is not None or at == applied[-1]:
                    kept.append(span[at])
                    documents.append(document)
                    problems.append(problem)
        chosen = pa.array(kept, pa.int64())
        columns = {name: batch.column(name).take(pc.list_parent_indices(events).take(chosen)) for name in keys}
        columns.update({name: array.take(chosen) for name, array in fields.items() if name != PATCH_COLUMN})
        columns[MONGODB_DOCUMENT_COLUMN] = pa.array(documents, pa.string())
        columns[ERROR_COLUMN] = pa.array(problems, pa.string())
        yield pa.RecordBatch.from_pydict(columns)


def replayed_events(events: DataFrame, layout: ChangeEventLayout, stored: DataFrame | None, every: bool = True
                    ) -> DataFrame:
    """The batch's good keyed ``events`` newer than their key's stored position, each with ``document``: the
    document after it (null after a delete), and ``_cdc_error``: why it could not be applied (null if it
    was). With ``every`` false, of the events applied only each key's last (all a fold needs). Output: the key
    columns, ``document``, the declared document fields (``document_fields``), the hidden columns, the Kafka
    coordinates and ``_cdc_snapshot`` / ``_cdc_transaction_id``, as decoded.

    ``stored`` holds the keys' state in Delta: key columns, ``_base_document`` (null for a deleted key) and
    ``_base_position`` (the latest position the table holds for the key)."""
    keys = list(layout.key_columns)
    good = events.where(F.col(ERROR_COLUMN).isNull() & (F.col(OP_COLUMN) != TRUNCATE_OP))
    per_key = good.groupBy(*keys).agg(F.array_sort(F.collect_list(F.struct(*_EVENT_FIELDS))).alias(_EVENTS))
    if stored is not None:
        per_key = per_key.join(stored.select(*keys, BASE_DOCUMENT_COLUMN, BASE_POSITION_COLUMN), keys, "left")
    else:
        per_key = per_key.select("*", F.lit(None).cast("string").alias(BASE_DOCUMENT_COLUMN),
                                 F.lit(None).cast("string").alias(BASE_POSITION_COLUMN))
    since = F.coalesce(F.col(BASE_POSITION_COLUMN), F.lit(""))
    per_key = per_key.select(*keys, BASE_DOCUMENT_COLUMN,
                             F.filter(_EVENTS, lambda e: e[POSITION_COLUMN] > since).alias(_EVENTS))
    by_name = {f.name: f for f in good.schema.fields}
    out = T.StructType([*(by_name[name] for name in keys),
                        *(by_name[name] for name in _EVENT_FIELDS if name != PATCH_COLUMN),
                        T.StructField(ERROR_COLUMN, T.StringType())])
    replayed = per_key.mapInArrow(partial(_replay_batches, keys=keys, every=every), out)
    return with_document_fields(replayed, layout)


def with_document_fields(rows: DataFrame, layout: ChangeEventLayout) -> DataFrame:
    """``rows`` with the layout's declared document fields as typed columns read from ``document``; a value
    that does not fit its type makes the row's ``_cdc_error``."""
    fields = layout.document_fields
    if not fields.fields:
        return rows
    document = F.col(MONGODB_DOCUMENT_COLUMN)
    texts = {f.name: field_text(document, f.name) for f in fields.fields}
    values = {f.name: field_value(texts[f.name], f.dataType) for f in fields.fields}
    misfits = [F.when(texts[f.name].isNotNull() & values[f.name].isNull(),
                      F.lit(f"document field '{f.name}' value does not fit type {f.dataType.simpleString()} "
                            "(declare it 'string' in document_fields to keep any value as text)"))
               for f in fields.fields]
    return rows.select(*[F.col(name) for name in rows.columns if name != ERROR_COLUMN],
                       *[value.alias(name) for name, value in values.items()],
                       F.coalesce(F.col(ERROR_COLUMN), *misfits).alias(ERROR_COLUMN))


# Extended-JSON type wrappers whose inner value is the field's (``{"$numberLong": "5"}``, ``{"$oid": "5f1e..."}``).
_WRAPPERS = ("$numberLong", "$numberInt", "$numberDouble", "$numberDecimal", "$oid", "$symbol")


def field_text(document: Column, name: str) -> Column:
    """A top-level field's value as text: a string as itself, a number or a boolean as written, an extended-JSON
    wrapper's inner value (a date's milliseconds or ISO text), another document or an array as JSON."""
    at = f"$['{name}']"
    unwrapped = [F.get_json_object(document, f"{at}['{wrapper}']") for wrapper in _WRAPPERS]
    date = F.coalesce(F.get_json_object(document, f"{at}['$date']['$numberLong']"),
                      F.get_json_object(document, f"{at}['$date']"))
    return F.coalesce(*unwrapped, date, F.get_json_object(document, at))


def field_value(text: Column, data_type: T.DataType) -> Column:
    """A field's text (``field_text``) as ``data_type``: a timestamp from a date's milliseconds or ISO text."""
    if isinstance(data_type, T.TimestampType):
        return F.when(text.rlike(r"^-?[0-9]+$"), F.timestamp_millis(text.try_cast("long"))).otherwise(
            text.try_cast(data_type))
    return text.try_cast(data_type)
