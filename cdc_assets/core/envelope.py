"""Decoding Debezium change events (key + envelope) into typed rows, as Spark column logic.

Input: a DataFrame of Kafka records ``partition, offset, key, value`` (tombstones already
removed), the value parsed as ``value_type(layout)`` by Spark's JSON reader (``io.spark``).
Output: one row per event with the table's columns, the hidden ``_cdc_*`` columns, the Kafka
coordinates and ``_cdc_error``: the reason an event cannot be applied, or null. Where the layout has
columns that can carry the connector's unavailable-value placeholder (PostgreSQL unchanged TOAST),
such a column is null in an event that carries the placeholder, and ``_cdc_unavailable`` lists it.

Values are accepted with or without the JSON converter's ``schema``/``payload`` wrapper, decided
per event. Row columns are read as JSON text and then converted (``core.types``), so numbers sent
as strings (``"pk": "1"``), ISO timestamps and Debezium logical types parse, and a value that does
not fit its type is reported instead of silently becoming null.
"""

from __future__ import annotations

import base64
import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.core.layout import (
    MONGODB_DOCUMENT_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    SOURCE_TS_COLUMN,
    UNAVAILABLE_COLUMN,
    UNDECODABLE_MEMBER,
    ChangeEventLayout,
    unwrap,
)
from cdc_assets.core.position import POSITION_FIELDS, event_position
from cdc_assets.core.types import convert, is_nested

PARTITION_COLUMN = "_kafka_partition"
OFFSET_COLUMN = "_kafka_offset"
ERROR_COLUMN = "_cdc_error"
SNAPSHOT_COLUMN = "_cdc_snapshot"
PATCH_COLUMN = "_cdc_patch"  # MongoDB only
TRANSACTION_COLUMN = "_cdc_transaction_id"
# Which table of a shared plan an event belongs to (its index among the plan's tables; ``merge.shared``).
TABLE_COLUMN = "_cdc_table"
# Beside it, the record's key and value as read (base64), so that a dead letter keeps what can be replayed.
_AS_READ_MEMBER = "__cdc_assets_as_read"
KNOWN_OPS = ("c", "u", "d", "r", "t")
TRUNCATE_OP = "t"  # one per table, no key and no row: the table policy (on_truncate) decides

TRANSACTION_TYPE = T.StructType([T.StructField("id", T.StringType())])


def source_type(kind: str) -> T.StructType:
    """The ``source`` fields a connector ``kind``'s events are read for: the change's time, whether
    it is a snapshot read, and the fields of its position. Jackson skips the others unconverted."""
    if kind not in POSITION_FIELDS:
        raise ValueError(f"unknown connector kind '{kind}'")
    names = dict.fromkeys(("ts_ms", "snapshot", *POSITION_FIELDS[kind]))
    return T.StructType([T.StructField(name, T.StringType()) for name in names])


DOCUMENT_TYPE = "map<string,variant>"
# Change streams' update of a document without its full document (``capture.mode: change_streams``).
UPDATE_DESCRIPTION_TYPE = T.StructType([
    T.StructField("updatedFields", T.StringType()),  # a JSON object's text: dotted path -> value
    T.StructField("removedFields", T.ArrayType(T.StringType())),
    T.StructField("truncatedArrays", T.ArrayType(T.StructType([T.StructField("field", T.StringType()),
                                                               T.StructField("size", T.IntegerType())]))),
])


def description_patch(description: Column) -> Column:
    """An ``updateDescription`` as the update a patch holds (``core.document_updates``): its updated fields as
    ``$set`` (their text as sent), its removed fields as ``$unset``, its truncated arrays as ``$truncate``."""
    truncated = F.coalesce(description["truncatedArrays"], F.array().cast(UPDATE_DESCRIPTION_TYPE["truncatedArrays"]
                                                                          .dataType))
    return F.when(description.isNotNull(), F.concat(
        F.lit('{"$set":'), F.coalesce(description["updatedFields"], F.lit("{}")),
        F.lit(',"$unset":'), F.to_json(F.coalesce(description["removedFields"], F.array().cast("array<string>"))),
        F.lit(',"$truncate":'), F.to_json(truncated), F.lit("}")))


def patch_problem(patch: Column, description: Column) -> Column:
    """Why an update's patch (``patch``: as sent, or ``description_patch`` of ``description``) cannot be
    applied (null: it can)."""
    updated = description["updatedFields"]
    keys = F.map_keys(F.from_json(patch, DOCUMENT_TYPE))
    operators = F.filter(keys, lambda key: key.startswith("$"))
    unknown = F.filter(operators, lambda key: ~key.isin("$set", "$unset", "$v"))
    version = F.get_json_object(patch, "$['$v']")
    diff_form = F.coalesce(version == "2", F.lit(False))  # MongoDB 5.0's oplog: {"$v": 2, "diff": {...}}
    return (
        F.when(updated.isNotNull() & F.from_json(updated, DOCUMENT_TYPE).isNull(),
               F.lit("updateDescription.updatedFields is not a valid JSON object"))
        .when(keys.isNull(), F.lit("patch is not a valid JSON object"))
        .when(description.isNotNull(), F.lit(None).cast("string"))
        .when(version.isNotNull() & ~version.isin("1", "2"),
              F.concat(F.lit("patch has oplog version $v "), version, F.lit(", which is not supported")))
        .when(diff_form & ((F.size(keys) != 2)
                           | F.from_json(F.get_json_object(patch, "$.diff"), DOCUMENT_TYPE).isNull()),
              F.lit("patch is an oplog diff ($v 2) without a diff object, or with other members"))
        .when(F.size(unknown) > 0, F.concat(F.lit("patch operator(s) "), F.array_join(unknown, ", "),
                                            F.lit(" not supported (only $set and $unset)")))
        .when(~diff_form & (F.size(operators) > 0) & (F.size(operators) < F.size(keys)),
              F.lit("patch mixes update operators and fields"))
    )


def json_payload(value: bytes | None) -> object:
    """The payload of a JSON-converter record value (``unwrap``), for the few non-change events
    decoded in Python: schema changes, transaction metadata."""
    if value is None:
        raise ValueError("record has no value")
    try:
        body = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"value is not valid JSON ({exc})") from exc
    if isinstance(body, dict) and UNDECODABLE_MEMBER in body:
        raise ValueError(str(body[UNDECODABLE_MEMBER]))
    return unwrap(body)[1]


def undecodable_value(reason: str, key: bytes | None, value: bytes | None) -> bytes:
    """The value a record format's decoder puts in place of a record it cannot read: a bad event whose
    reason is ``reason``, carrying the record's ``key`` and ``value`` as read."""
    as_read = {name: None if part is None else base64.b64encode(part).decode()
               for name, part in (("key", key), ("value", value))}
    return json.dumps({UNDECODABLE_MEMBER: reason, _AS_READ_MEMBER: as_read}).encode()


def record_as_read(key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes | None]:
    """A record's key and value as they were in Kafka: those an undecodable value carries, else themselves."""
    try:
        body = json.loads(value) if value is not None else None
    except (ValueError, UnicodeDecodeError):
        return key, value
    as_read = body.get(_AS_READ_MEMBER) if isinstance(body, dict) else None
    if not isinstance(as_read, dict):
        return key, value

    def part(name: str) -> bytes | None:
        return None if as_read.get(name) is None else base64.b64decode(as_read[name])

    return part("key"), part("value")


def explain_bad_value(value: bytes | None, reason: str) -> str:
    """Sharpen Spark's verdict on a bad event (``reason``) by looking at its raw value."""
    if value is None:
        return reason
    try:
        decoded = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"value is not valid JSON ({exc})"
    if not isinstance(decoded, dict):
        return f"value is JSON {type(decoded).__name__}, not a Debezium envelope object"
    if UNDECODABLE_MEMBER in decoded:
        return str(decoded[UNDECODABLE_MEMBER])
    return reason


def _as_parsed(row_type: T.StructType) -> T.StructType:
    """The row type as ``from_json`` reads it: top-level values as JSON text, nested types as themselves."""
    return T.StructType(
        [T.StructField(f.name, f.dataType if is_nested(f.dataType) else T.StringType()) for f in row_type.fields]
    )


def envelope_type(layout: ChangeEventLayout) -> T.StructType:
    """The Spark type an envelope parses as, for this table's layout."""
    image: T.DataType = T.StringType() if layout.documents else _as_parsed(layout.row_type)
    return T.StructType(
        [
            T.StructField("before", image),
            T.StructField("after", image),
            T.StructField("op", T.StringType()),
            T.StructField("source", source_type(layout.kind)),
            T.StructField("transaction", TRANSACTION_TYPE),
            *([T.StructField("patch", T.StringType()), T.StructField("updateDescription", UPDATE_DESCRIPTION_TYPE)]
              if layout.documents else []),
        ]
    )


def _either(body: T.StructType) -> T.StructType:
    """The type of JSON that is either ``body`` itself or ``{"schema": ..., "payload": body}``: parsed in one pass."""
    return T.StructType([T.StructField("payload", body), *body.fields])


def value_type(layout: ChangeEventLayout) -> T.StructType:
    """The Spark type a record value parses as, for this table's layout: the envelope, wrapped or not."""
    return _either(envelope_type(layout))


def _field(parsed: Column, name: str) -> Column:
    """Field ``name`` of JSON parsed as ``_either``: the payload's if wrapped, else the value's own.

    ``parsed`` should be a column reference: an expression here would be evaluated once per use.
    """
    return F.when(parsed["payload"].isNotNull(), parsed["payload"][name]).otherwise(parsed[name])


def _key_field(key: Column, name: str, data_type: T.DataType) -> Column:
    """Field ``name`` of the record key's JSON text, the ``payload``'s if the key is wrapped: as text,
    or parsed as ``data_type`` if that is nested.

    ``get_json_object`` reads it where it can (as ``from_json`` would read a string field: numbers
    and objects as their JSON text): ``from_json`` has no generated code, and one use of it in the
    decode keeps the whole decode out of Spark's whole-stage code generation. A wrapped key is one
    with a non-null ``payload``."""
    if is_nested(data_type) or "'" in name:  # not nameable in get_json_object's path syntax
        return _field(F.from_json(key, _either(T.StructType([T.StructField(name, data_type)]))), name)
    wrapped = F.get_json_object(key, "$['payload']").isNotNull()
    return F.when(wrapped, F.get_json_object(key, f"$['payload']['{name}']")).otherwise(
        F.get_json_object(key, f"$['{name}']"))


def decode_change_events(records: DataFrame, layout: ChangeEventLayout, tables: bool = False) -> DataFrame:
    """Decode records into one typed row per change event, with ``_cdc_error`` per event.

    ``records``: ``partition, offset``, ``key`` (JSON text) and ``value`` parsed as ``value_type(layout)``
    (null where the value is not a JSON object), as ``io.spark.spark_records`` hands them over; with
    ``tables``, also ``table``: the records of several tables of one layout, each event keeping its
    table's index as ``_cdc_table``.
    """
    body = envelope_type(layout)
    carried = [F.col("table").alias(TABLE_COLUMN)] if tables else []
    events = records.select(
        *carried,
        F.col("partition").alias(PARTITION_COLUMN),
        F.col("offset").alias(OFFSET_COLUMN),
        "key",
        F.col("value").isNotNull().alias("_env_is_object"),
        *[_field(F.col("value"), f.name).alias(f"_env_{f.name}") for f in body.fields],
    )
    env = {f.name: F.col(f"_env_{f.name}") for f in body.fields}
    op = env["op"]
    # Named once, a projection of its own, like the envelope's fields and each row column's conversion
    # below: an expression is spelt out in the plan at every use, and a decimal's conversion names its
    # text dozens of times. A smaller plan is a shorter analysis and optimization of every batch's query.
    image = F.col("_env_image")
    converted: dict[str, Column] = {}
    if not layout.documents:
        events = events.withColumn("_env_image", F.when(op == "d", env["before"]).otherwise(env["after"]))
        conversions = {field.name: convert(image[field.name], layout.column_type(field.name))
                       for field in layout.row_type.fields}
        events = events.select("*", *[conversion.alias(f"_env_value_{index}")
                                      for index, conversion in enumerate(conversions.values())])
        converted = {name: F.col(f"_env_value_{index}") for index, name in enumerate(conversions)}

    columns: dict[str, Column] = {}
    typed_failures: list[Column] = []
    unavailable: list[Column] = []
    unavailable_tests = layout.unavailable_tests
    if layout.documents:
        columns[MONGODB_DOCUMENT_COLUMN] = F.when(op != "d", env["after"])
        # An oplog patch (Debezium 1.x), else change streams' update description: one update for the fold.
        patch = F.coalesce(env["patch"], description_patch(env["updateDescription"]))
        columns[PATCH_COLUMN] = F.when(op == "u", patch)
        unreadable = env["after"].isNotNull() & F.from_json(env["after"], DOCUMENT_TYPE).isNull()
        typed_failures.append(F.when(unreadable, F.lit("after is not a valid JSON document")))
        description = F.when(env["patch"].isNull(), env["updateDescription"])
        typed_failures.append(F.when((op == "u") & env["after"].isNull() & patch.isNotNull(),
                                     patch_problem(patch, description)))
    else:
        for field in layout.row_type.fields:
            text = image[field.name]
            value = converted[field.name]
            columns[field.name] = value
            test = unavailable_tests.get(field.name)
            unchanged: Column | None = None
            if test is not None:
                # The placeholder means "unchanged": never a value (the fold and the pipeline carry the real one).
                unchanged = F.coalesce(test(text), F.lit(False))
                columns[field.name] = F.when(~unchanged, value)
            if field.name in layout.ignored_nulls:
                # So does an update's null in a column whose update nulls are ignored (``core.columns``).
                null_update = (op == "u") & value.isNull()
                unchanged = null_update if unchanged is None else unchanged | null_update
            if unchanged is not None:
                unavailable.append(F.when(unchanged, F.lit(field.name)))
            if not is_nested(field.dataType):
                # A decimal refuses a value it would round; a declared string column keeps any value exactly.
                exactly = (" exactly (declare the column 'string' in the table's columns config to keep such "
                           "values as exact text)" if isinstance(field.dataType, T.DecimalType) else "")
                typed_failures.append(
                    F.when(text.isNotNull() & value.isNull(),
                           F.lit(f"column '{field.name}' value does not fit type {field.dataType.simpleString()}"
                                 f"{exactly}"))
                )
    key_fields = {field.name: field.dataType for field in _as_parsed(layout.key_type).fields}
    for name, data_type in key_fields.items():
        spec = layout.column_type(name)
        # Read lazily, inside coalesce: only events whose row image lacks a key column pay for it.
        from_key = convert(_key_field(F.col("key"), name, data_type), spec)
        # The key's columns are the row's own: the image has them unless the connector left it out.
        columns[name] = F.coalesce(converted[name], from_key) if name in converted else from_key

    missing_key = F.lit(False)
    for name in layout.key_columns:
        missing_key = missing_key | columns[name].isNull()
    # MongoDB updates may carry a patch or an update description instead of the after image.
    needs_after = op.isin("c", "u", "r") & env["after"].isNull()
    if layout.documents:
        needs_after = needs_after & ~((op == "u") & (env["patch"].isNotNull() | env["updateDescription"].isNotNull()))
    after_problem = F.concat(F.lit("op '"), op, F.lit("' has no after image"))
    error = (
        F.when(~F.col("_env_is_object"), F.lit("value is not a JSON object"))
        .when(op.isNull(), F.lit("envelope has no 'op' field"))
        .when(~op.isin(*KNOWN_OPS), F.concat(F.lit("unknown op '"), op, F.lit("'")))
        .when(missing_key & (op != TRUNCATE_OP), F.lit(f"cannot extract key column(s) {list(layout.key_columns)} "
                                 "from the record key or the row image"))
        .when(needs_after, after_problem)
        .otherwise(F.coalesce(*typed_failures) if typed_failures else F.lit(None).cast("string"))
    )
    source = env["source"]
    decoded = [
        *([F.col(TABLE_COLUMN)] if tables else []),
        F.col(PARTITION_COLUMN),
        F.col(OFFSET_COLUMN),
        *[column.alias(name) for name, column in columns.items()],
        op.alias(OP_COLUMN),
        event_position(source, layout.kind, F.col(PARTITION_COLUMN), F.col(OFFSET_COLUMN)).alias(POSITION_COLUMN),
        F.timestamp_millis(source["ts_ms"].try_cast("long")).alias(SOURCE_TS_COLUMN),
        F.lower(source["snapshot"]).alias(SNAPSHOT_COLUMN),
        env["transaction"]["id"].alias(TRANSACTION_COLUMN),
        *([F.array_compact(F.array(*unavailable)).alias(UNAVAILABLE_COLUMN)] if unavailable else []),
        error.alias(ERROR_COLUMN),
    ]
    # The decoded columns leave through a generator (one row per event): a filter on them (``_cdc_error``,
    # ``_cdc_op``, the transaction id) then stays above the decode. Through a projection, Spark pushes a
    # filter down by rewriting it in terms of the columns below, spelling out every expression it names
    # at each use: the error of a wide table names each column's conversion, which names its JSON text
    # several times, which names the envelope's fields, each a choice between the wrapped and the bare
    # value, which the exact hand-over parses with ``from_json``. For a table of 30 columns with decimals
    # the rewritten filter held tens of thousands of JSON parses of the whole envelope: minutes of the
    # server's optimizer and a full heap for one batch with a bad event. The generator stays in the decode's
    # generated code (``tests/core/test_envelope.py``); it builds one struct per event, and a query of a few
    # decoded columns now computes them all (the fold reads them all anyway).
    return events.select(F.inline(F.array(F.struct(*decoded))))
