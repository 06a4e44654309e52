"""The shape of one captured table's change events: key columns, row type, connector kind.

A layout is derived once per micro-batch from what the events say about themselves (the Kafka
Connect schema when the JSON converter sends ``schemas.enable=true``), else from the configured
columns, else from the Delta table and a sample of the events. Everything here is plain Python
plus Spark *types*; no session is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column
from pyspark.sql import types as T

from cdc_assets.core.types import ColumnType, UnknownLogicalType, column_type, declared, unavailable_test

# Hidden columns every target row carries (documented in the README).
OP_COLUMN = "_cdc_op"
POSITION_COLUMN = "_cdc_position"
SOURCE_TS_COLUMN = "_cdc_source_ts"
DELETED_COLUMN = "_cdc_deleted"  # soft_delete mode only
HIDDEN_PREFIX = "_cdc_"
# scd2 mode only
VALID_FROM_COLUMN = "_cdc_valid_from"
VALID_FROM_TS_COLUMN = "_cdc_valid_from_ts"
VALID_TO_COLUMN = "_cdc_valid_to"
VALID_TO_TS_COLUMN = "_cdc_valid_to_ts"
CURRENT_COLUMN = "_cdc_current"
HIDDEN_COLUMNS: tuple[str, ...] = (OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN)
# Decoded events and folded rows (never a table): the columns whose value an event left unavailable.
UNAVAILABLE_COLUMN = "_cdc_unavailable"
# Connector kinds that send unavailable.value.placeholder (PostgreSQL TOAST, Oracle LOBs).
PLACEHOLDER_KINDS = ("postgresql", "oracle")
# Connector kinds whose rows are whole documents, not columns (``core.mongodb``).
DOCUMENT_KINDS = ("mongodb",)
# The hidden columns of a folded row, which scd1 and soft_delete tables keep (``core.apply_modes``).
HIDDEN_FIELDS: tuple[T.StructField, ...] = (
    T.StructField(OP_COLUMN, T.StringType()),
    T.StructField(POSITION_COLUMN, T.StringType()),
    T.StructField(SOURCE_TS_COLUMN, T.TimestampType()),
)

# MongoDB rows: the document id (canonical extended JSON of `_id`, from the record key) and the
# whole document as extended JSON.
MONGODB_ID_COLUMN = "id"
MONGODB_DOCUMENT_COLUMN = "document"


# The member of a value a record format's decoder (``io.avro``) put in place of a record it could not read,
# naming why: an object with no ``op``, so a bad event, whose reason is this text (``core.envelope``).
UNDECODABLE_MEMBER = "__cdc_assets_undecodable"


class LayoutError(ValueError):
    """The events of a table do not say enough to build its layout."""


@dataclass(frozen=True)
class ChangeEventLayout:
    """How to read one table's events: connector kind, key columns, row type and, for columns with
    a Debezium/Connect logical type, how to convert them."""

    kind: str
    key_columns: tuple[str, ...]
    row_type: T.StructType
    logical_types: Mapping[str, ColumnType] = field(default_factory=dict)
    placeholder: str | None = None  # the connector's unavailable.value.placeholder, for kinds that send it
    # Row columns whose null in an update means "unchanged", as the placeholder does (``core.columns``).
    ignored_nulls: tuple[str, ...] = ()
    # scd2: row columns whose change alone updates the current version in place (``core.columns``).
    untracked: tuple[str, ...] = ()

    @property
    def documents(self) -> bool:
        """Whether rows are documents (a key and one extended-JSON ``document`` column), not columns."""
        return self.kind in DOCUMENT_KINDS

    @property
    def document_fields(self) -> T.StructType:
        """A collection's declared top-level fields (config ``document_fields``), typed columns beside the
        document; none for tables of columns."""
        if not self.documents:
            return T.StructType([])
        return T.StructType([f for f in self.row_type.fields
                             if f.name not in (*self.key_columns, MONGODB_DOCUMENT_COLUMN)])

    @property
    def unavailable_tests(self) -> dict[str, Callable[[Column], Column]]:
        """Per row column that can carry the unavailable-value placeholder, its test (``core.types``)."""
        if self.placeholder is None:
            return {}
        tests = {f.name: unavailable_test(f.dataType, self.placeholder) for f in self.row_type.fields
                 if f.name not in self.key_columns}
        return {name: test for name, test in tests.items() if test is not None}

    @property
    def unchanged_columns(self) -> list[str]:
        """The row columns an event can leave unchanged: those that can carry the placeholder, and those whose
        update nulls are ignored. The decode lists them in ``_cdc_unavailable`` where an event does."""
        return list(dict.fromkeys([*self.unavailable_tests, *self.ignored_nulls]))

    def column_type(self, name: str) -> ColumnType:
        """How column ``name`` is read (its logical type, else a plain cast to its Spark type)."""
        if name in self.logical_types:
            return self.logical_types[name]
        by_name = {f.name: f.dataType for f in self.key_type.fields}
        by_name.update({f.name: f.dataType for f in self.row_type.fields})
        return ColumnType(by_name.get(name, T.StringType()))

    @property
    def key_type(self) -> T.StructType:
        by_name = {field.name: field for field in self.row_type.fields}
        return T.StructType([by_name.get(name, T.StructField(name, T.StringType())) for name in self.key_columns])

    @property
    def target_type(self) -> T.StructType:
        """The Delta table's schema: row columns (keys included) then the hidden columns."""
        missing_keys = [T.StructField(name, T.StringType()) for name in self.key_columns
                        if name not in self.row_type.fieldNames()]
        return T.StructType([*missing_keys, *self.row_type.fields, *HIDDEN_FIELDS])


def row_type_from_envelope_schema(envelope_schema: Mapping[str, Any]) -> tuple[T.StructType, dict[str, ColumnType]]:
    """The row type of ``after``/``before`` in a value's Connect schema, and its logical columns."""
    for image in envelope_schema.get("fields", []):
        if image.get("field") in ("after", "before") and image.get("type") == "struct":
            columns = {}
            for field_schema in image.get("fields", []):
                try:
                    columns[field_schema["field"]] = column_type(field_schema)
                except UnknownLogicalType as exc:
                    raise LayoutError(str(exc)) from exc
            row_type = T.StructType([T.StructField(name, spec.data_type) for name, spec in columns.items()])
            return row_type, {name: spec for name, spec in columns.items() if spec.logical}
    return T.StructType([]), {}


def shown_columns(sample_values: Sequence[bytes]) -> tuple[str, ...] | None:
    """The columns of the newest sampled value that shows the table's columns (its value schema's row, or
    its after image), None where none does (a delete's before image may hold the key only, a TRUNCATE has
    none). The newest: a column renamed or dropped at the source is gone from it, though the Delta table and
    older events still have it."""
    for value in reversed(parse_values(sample_values)):
        schema, envelope = unwrap(value)
        if schema is not None and (names := row_type_from_envelope_schema(schema)[0].fieldNames()):
            return tuple(names)
        if isinstance(envelope, Mapping) and isinstance(after := envelope.get("after"), Mapping):
            return tuple(after)
    return None


def unwrap(body: object) -> tuple[Mapping[str, Any] | None, object]:
    """A JSON-converter record (key or value) without its wrapper: ``(schema, payload)`` of
    ``{"schema": ..., "payload": ...}`` (``schemas.enable=true``), else ``(None, body)``."""
    if isinstance(body, Mapping) and body.keys() == {"schema", "payload"}:
        schema = body["schema"]
        return (schema if isinstance(schema, Mapping) else None), body["payload"]
    return None, body


# A JSON-converter value with ``schemas.enable=true`` up to its schema: ``{"schema":`` (JSON's whitespace allowed).
_SCHEMA_OPENING = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"schema"[ \t\n\r]*:[ \t\n\r]*')
# What follows the schema in such a value: ``, "payload":``.
_PAYLOAD_MEMBER = re.compile(rb'[ \t\n\r]*,[ \t\n\r]*"payload"[ \t\n\r]*:')


def schema_prefix(value: bytes) -> bytes | None:
    """The bytes of a JSON-converter value before its payload, ``{"schema": <schema>, "payload":``, or
    None if ``value`` does not start so."""
    opening = _SCHEMA_OPENING.match(value)
    if opening is None:
        return None
    try:  # Latin-1 maps byte i to character i: the schema's end in characters is its end in bytes.
        _, end = json.JSONDecoder().raw_decode(value.decode("latin-1"), opening.end())
    except ValueError:
        return None
    member = _PAYLOAD_MEMBER.match(value, end)
    return value[:member.end()] if member else None


def parse_values(raw_values: Iterable[bytes | None]) -> list[Any]:
    """JSON-converter values parsed (None where one is not JSON), each distinct schema once: a value that
    starts with the schema of one parsed before has only its payload parsed, and shares that schema's
    object. A batch's values carry one or two schemas, most of their bytes (five sixths of W2's)."""
    schemas: dict[bytes, Any] = {}  # prefix (``schema_prefix``) -> the parsed schema it holds
    return [_parse_value(raw, schemas) for raw in raw_values]


def _parse_value(raw: bytes | None, schemas: dict[bytes, Any]) -> Any:
    if raw is None:
        return None
    for prefix, schema in schemas.items():
        if raw.startswith(prefix) and raw.endswith(b"}"):
            try:  # one JSON value between the prefix and the closing brace; anything else is parsed whole
                return {"schema": schema, "payload": json.loads(raw[len(prefix):-1])}
            except ValueError:
                break
    value = _loads(raw)
    if isinstance(value, Mapping) and value.keys() == {"schema", "payload"} and (opening := schema_prefix(raw)):
        schemas[opening] = value["schema"]
    return value


def key_columns_from_key(key: Mapping[str, Any]) -> tuple[str, ...]:
    """Key column names from one record key, with or without the schema/payload wrapper."""
    schema, payload = unwrap(key)
    names = [field["field"] for field in (schema or {}).get("fields", [])]
    if names:
        return tuple(names)
    return tuple(payload) if isinstance(payload, Mapping) else ()


def infer_row_type(rows: Iterable[Mapping[str, Any]], known: Collection[str] = ()) -> T.StructType:
    """Infer a row type from sample row images (JSON objects), widening where samples disagree; the
    columns named in ``known`` (already typed) are left out."""
    inferred: dict[str, T.DataType] = {}
    for row in rows:
        for name, value in row.items():
            if name in known:
                continue
            value_type = _json_value_type(value)
            if value_type is None:
                inferred.setdefault(name, T.NullType())
                continue
            inferred[name] = _widen(inferred.get(name, T.NullType()), value_type)
    return T.StructType(
        [T.StructField(name, T.StringType() if isinstance(dt, T.NullType) else dt) for name, dt in inferred.items()]
    )


# A ``columns`` entry may name a Debezium or Connect logical type instead of a Spark type: events
# without schemas do not say what their numbers encode (a timestamp's unit), and a Spark type cannot.
LOGICAL_TYPE_PREFIXES = ("io.debezium.", "org.apache.kafka.connect.")


def parse_column_types(columns: Mapping[str, str]) -> tuple[T.StructType, dict[str, ColumnType]]:
    """Configured ``column -> Spark SQL type or logical type name`` pairs: their struct type, and the
    columns read by a logical type's conversion (e.g. ``io.debezium.time.MicroTimestamp``)."""
    fields, logical = [], {}
    for name, type_text in columns.items():
        if type_text.startswith(LOGICAL_TYPE_PREFIXES):
            if type_text == "org.apache.kafka.connect.data.Decimal":
                raise LayoutError(f"column '{name}': a Connect Decimal needs its scale: declare decimal(p,s), or "
                                  "string with decimal.handling.mode=string")
            try:
                spec = column_type({"name": type_text, "field": name})
            except UnknownLogicalType as exc:
                raise LayoutError(f"column '{name}': {exc}") from exc
            fields.append(T.StructField(name, spec.data_type))
            if spec.logical:
                logical[name] = spec
            continue
        try:
            data_type = T._parse_datatype_string(type_text)
        except Exception as exc:
            raise LayoutError(f"column '{name}': '{type_text}' is neither a Spark SQL type nor a Debezium "
                              "logical type name") from exc
        fields.append(T.StructField(name, data_type))
    return T.StructType(fields), logical


# The types a MongoDB document field can be read as (``core.mongodb.field_value``), by their Spark SQL names.
_DOCUMENT_FIELD_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(), "boolean": T.BooleanType(), "tinyint": T.ByteType(), "smallint": T.ShortType(),
    "int": T.IntegerType(), "integer": T.IntegerType(), "bigint": T.LongType(), "float": T.FloatType(),
    "double": T.DoubleType(), "date": T.DateType(), "timestamp": T.TimestampType()}
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")


def document_field_type(text: str) -> T.DataType:
    """The Spark type of a declared document field (``document_fields``), from its Spark SQL name; a
    ``ValueError`` names the types a field can take."""
    name = text.strip().lower()
    if name in _DOCUMENT_FIELD_TYPES:
        return _DOCUMENT_FIELD_TYPES[name]
    decimal = _DECIMAL.match(name)
    if decimal and 0 < int(decimal[1]) <= 38 and int(decimal[2]) <= int(decimal[1]):
        return T.DecimalType(int(decimal[1]), int(decimal[2]))
    raise ValueError(f"type '{text}' is not one a document field can take: {', '.join(_DOCUMENT_FIELD_TYPES)} or "
                     "decimal(p,s)")


def merge_row_types(base: T.StructType, extra: T.StructType) -> T.StructType:
    """``base`` with the columns of ``extra`` it lacks appended (base types win)."""
    names = set(base.fieldNames())
    return T.StructType([*base.fields, *(field for field in extra.fields if field.name not in names)])


def derive_layout(
    kind: str,
    sample_keys: Sequence[bytes],
    sample_values: Sequence[bytes],
    configured_keys: Sequence[str] | None = None,
    configured_columns: Mapping[str, str] | None = None,
    existing_row_type: T.StructType | None = None,
    placeholder: str | None = None,
    previous_keys: Sequence[str] = (),
    document_fields: Mapping[str, str] | None = None,
) -> ChangeEventLayout:
    """Build a table's layout from sample records (newest last) plus config and the Delta schema.

    Priority for the row type: the newest value's Connect schema, then configured columns, then
    the existing Delta table, each extended by what the sampled row images show. ``placeholder``:
    the connector's unavailable.value.placeholder (kept for the kinds that send it); ``previous_keys``:
    the key columns the table's last commit recorded, for a sample with no record key (TRUNCATE);
    ``document_fields``: a collection's top-level fields kept as typed columns (``core.mongodb``).
    """
    values = parse_values(sample_values)
    key_columns = tuple(configured_keys or ())
    if not key_columns:
        # The newest key that is a JSON object names the key columns: parsed newest first, as far as needed.
        for key in map(_loads, reversed(sample_keys)):
            if isinstance(key, Mapping):
                key_columns = key_columns_from_key(key)
                break
    key_columns = key_columns or tuple(previous_keys)  # keyless events only (TRUNCATE): the table's keys
    if not key_columns:
        raise LayoutError("record keys are absent or not JSON objects: set key_columns for this table")
    if kind in DOCUMENT_KINDS:
        row_type = T.StructType(
            [T.StructField(name, T.StringType()) for name in key_columns]
            + [T.StructField(MONGODB_DOCUMENT_COLUMN, T.StringType())]
            + [T.StructField(name, document_field_type(text)) for name, text in (document_fields or {}).items()]
        )
        return ChangeEventLayout(kind, key_columns, row_type)

    # Every distinct value schema in the sample, newest first: a column added or dropped within the
    # batch is kept either way.
    row_type, logical_types = T.StructType([]), dict[str, ColumnType]()
    # Compared as parsed (a deep comparison in C): a batch's sample holds one or two distinct schemas,
    # and serializing each value's schema to compare it cost more than parsing the values.
    seen: list[Mapping[str, Any]] = []
    for value in reversed(values):
        schema, _ = unwrap(value)
        if schema is not None:
            if schema in seen:
                continue
            seen.append(schema)
            sample_type, sample_logical = row_type_from_envelope_schema(schema)
            row_type = merge_row_types(row_type, sample_type)
            logical_types = {**sample_logical, **logical_types}
    if configured_columns:
        configured, configured_logical = parse_column_types(configured_columns)
        # A configured type overrides what a decimal's schema implies (e.g. string: exact text of any width).
        overrides = {f.name: spec for f in configured.fields if f.name in logical_types
                     and (spec := declared(logical_types[f.name], f.dataType)) is not None}
        # A configured logical type stands in where the events carry no schema for the column.
        logical_types = {**configured_logical, **logical_types, **overrides}
        row_type = T.StructType([T.StructField(f.name, overrides[f.name].data_type) if f.name in overrides else f
                                 for f in row_type.fields])
        row_type = merge_row_types(row_type, configured)
    if existing_row_type is not None:
        row_type = merge_row_types(row_type, existing_row_type)
    images: list[Mapping[str, Any]] = []
    for value in values:
        envelope = unwrap(value)[1]
        if isinstance(envelope, Mapping):
            images.extend(image for image in (envelope.get("after"), envelope.get("before"))
                          if isinstance(image, Mapping))
    row_type = merge_row_types(row_type, infer_row_type(images, set(row_type.fieldNames())))
    if not row_type.fields:
        raise LayoutError("no event names any column: set columns for this table")
    return ChangeEventLayout(kind, key_columns, row_type, logical_types,
                             placeholder if kind in PLACEHOLDER_KINDS else None)


def _loads(raw: bytes | None) -> Any:
    """A record key or value parsed; None where it is not JSON or stands for one that could not be read."""
    if raw is None:
        return None
    try:
        key = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return None if isinstance(key, Mapping) and UNDECODABLE_MEMBER in key else key


def _json_value_type(value: Any) -> T.DataType | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return T.BooleanType()
    if isinstance(value, int):
        return T.LongType()
    if isinstance(value, float):
        return T.DoubleType()
    return T.StringType()


def _widen(current: T.DataType, new: T.DataType) -> T.DataType:
    if isinstance(current, T.NullType) or current == new:
        return new
    numeric = (T.LongType(), T.DoubleType())
    if current in numeric and new in numeric:
        return T.DoubleType()
    return T.StringType()
