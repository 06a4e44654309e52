"""Kafka Connect and Debezium logical types: the Spark type of each, and the column logic that turns
the JSON converter's text into it.

Every top-level row column is read from JSON as text and converted here, so numbers sent as strings
parse, and a value that does not fit its type becomes null (which the decoder reports as a bad event
instead of losing it). Nested structs, arrays and maps are parsed as their Spark types directly.

| Connect schema (``type`` / ``name``)                 | Spark / Delta type            |
|-----------------------------------------------------|-------------------------------|
| int8/16/32/64, float32/64, boolean, string           | bigint, double, boolean, string (wide-type policy) |
| bytes                                               | binary (base64 decoded)        |
| org.apache.kafka.connect.data.Decimal               | decimal(38, scale)             |
| io.debezium.data.VariableScaleDecimal               | decimal(38, 18)                |
| io.debezium.time.Date, connect Date                 | date                           |
| io.debezium.time.Timestamp / MicroTimestamp / NanoTimestamp, connect Timestamp | timestamp_ntz (wall clock) |
| io.debezium.time.ZonedTimestamp                     | timestamp (UTC instant)        |
| io.debezium.time.Time / MicroTime / NanoTime, connect Time | string ``HH:mm:ss.SSSSSS`` |
| io.debezium.time.ZonedTime, Json, Uuid, Enum, EnumSet, Xml, Ltree | string            |
| io.debezium.time.Year                               | bigint                         |
| io.debezium.data.Bits                               | binary                         |
| io.debezium.time.MicroDuration / NanoDuration        | long                           |
| any other logical name                              | refused: a clear error         |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

# The wide-type policy: integers are bigint, floating types double, decimals decimal(38, scale), so
# a type widened at the source (int -> bigint, float -> double, precision up) needs no change in
# Delta (delta-rs cannot read tables with Delta's typeWidening feature; see core.schema_change).
PRIMITIVES: dict[str, T.DataType] = {
    "int8": T.LongType(),
    "int16": T.LongType(),
    "int32": T.LongType(),
    "int64": T.LongType(),
    "float32": T.DoubleType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}

_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_STRING_LOGICAL = {
    "io.debezium.time.ZonedTime", "io.debezium.data.Json", "io.debezium.data.Uuid", "io.debezium.data.Enum",
    "io.debezium.data.EnumSet", "io.debezium.data.Xml", "io.debezium.data.Ltree",
}


class UnknownLogicalType(ValueError):
    """A Connect schema names a logical type this project does not map."""


@dataclass(frozen=True)
class ColumnType:
    """How one column is read: its Spark type and the conversion from its JSON text (None: cast)."""

    data_type: T.DataType
    logical: str | None = None
    scale: int = 0


def _signed_big_endian_to_decimal(raw: Column, precision: int, scale: int) -> Column:
    """Two's-complement big-endian bytes (up to 16) as ``decimal(precision, scale)``."""
    hexed = F.lower(F.hex(raw))
    negative = F.substring(hexed, 1, 1) >= F.lit("8")
    inverted = F.translate(hexed, "0123456789abcdef", "fedcba9876543210")
    magnitude_hex = F.lpad(F.when(negative, inverted).otherwise(hexed), 32, "0")
    high = F.conv(F.substring(magnitude_hex, 1, 16), 16, 10).cast("decimal(38,0)")
    low = F.conv(F.substring(magnitude_hex, 17, 16), 16, 10).cast("decimal(38,0)")
    magnitude = F.try_add(F.try_multiply(high, F.lit("18446744073709551616").cast("decimal(38,0)")), low)
    unscaled = F.when(negative, -F.try_add(magnitude, F.lit(1).cast("decimal(38,0)"))).otherwise(magnitude)
    return F.try_divide(unscaled, F.lit(str(10**scale)).cast("decimal(38,0)")).try_cast(T.DecimalType(precision, scale))


def _time_of_day(micros: Column) -> Column:
    return F.date_format(F.timestamp_micros(micros), "HH:mm:ss.SSSSSS")


def _converters() -> dict[str, Callable[[Column, ColumnType], Column]]:
    def ntz(column: Column) -> Column:
        return column.cast(T.TimestampNTZType())

    return {
        _DECIMAL: lambda text, spec: _signed_big_endian_to_decimal(
            F.unbase64(text), spec.data_type.precision, spec.scale),  # type: ignore[attr-defined]
        "io.debezium.time.Date": lambda text, _: F.date_add(F.lit("1970-01-01").cast("date"), text.try_cast("int")),
        "org.apache.kafka.connect.data.Date": lambda text, _: F.date_add(F.lit("1970-01-01").cast("date"),
                                                                          text.try_cast("int")),
        "io.debezium.time.Timestamp": lambda text, _: ntz(F.timestamp_millis(text.try_cast("long"))),
        "org.apache.kafka.connect.data.Timestamp": lambda text, _: ntz(F.timestamp_millis(text.try_cast("long"))),
        "io.debezium.time.MicroTimestamp": lambda text, _: ntz(F.timestamp_micros(text.try_cast("long"))),
        "io.debezium.time.NanoTimestamp": lambda text, _: ntz(F.timestamp_micros(
            F.floor(text.try_cast("decimal(38,0)") / 1000).cast("long"))),
        "io.debezium.time.ZonedTimestamp": lambda text, _: text.try_cast(T.TimestampType()),
        "io.debezium.time.Time": lambda text, _: _time_of_day(text.try_cast("long") * 1000),
        "org.apache.kafka.connect.data.Time": lambda text, _: _time_of_day(text.try_cast("long") * 1000),
        "io.debezium.time.MicroTime": lambda text, _: _time_of_day(text.try_cast("long")),
        "io.debezium.time.NanoTime": lambda text, _: _time_of_day(
            F.floor(text.try_cast("decimal(38,0)") / 1000).cast("long")),
        "io.debezium.data.Bits": lambda text, _: F.unbase64(text),
        "bytes": lambda text, _: F.unbase64(text),
    }


_CONVERTERS = _converters()


def column_type(schema: Mapping[str, Any]) -> ColumnType:
    """The Spark type (and conversion) of a Connect field schema; unknown logical types are refused."""
    name, connect_type = schema.get("name"), schema.get("type")
    parameters = schema.get("parameters") or {}
    if name == _DECIMAL:
        scale = int(parameters.get("scale", 0))
        return ColumnType(T.DecimalType(38, scale), _DECIMAL, scale)
    if name == _VARIABLE_DECIMAL:
        return ColumnType(T.DecimalType(38, 18), _VARIABLE_DECIMAL, 18)
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return ColumnType(T.DateType(), name)
    if name in ("io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp", "io.debezium.time.NanoTimestamp",
                "org.apache.kafka.connect.data.Timestamp"):
        return ColumnType(T.TimestampNTZType(), name)
    if name == "io.debezium.time.ZonedTimestamp":
        return ColumnType(T.TimestampType(), name)
    if name in ("io.debezium.time.Time", "io.debezium.time.MicroTime", "io.debezium.time.NanoTime",
                "org.apache.kafka.connect.data.Time"):
        return ColumnType(T.StringType(), name)
    if name in _STRING_LOGICAL:
        return ColumnType(T.StringType())
    if name == "io.debezium.time.Year":
        return ColumnType(T.LongType())
    if name in ("io.debezium.time.MicroDuration", "io.debezium.time.NanoDuration"):
        return ColumnType(T.LongType())
    if name == "io.debezium.data.Bits":
        return ColumnType(T.BinaryType(), name)
    if name is not None and connect_type != "struct":
        raise UnknownLogicalType(f"logical type '{name}' (field '{schema.get('field')}') is not supported")
    if connect_type == "struct":
        return ColumnType(T.StructType([T.StructField(f["field"], column_type(f).data_type)
                                        for f in schema.get("fields", [])]))
    if connect_type == "array":
        return ColumnType(T.ArrayType(column_type(schema.get("items", {"type": "string"})).data_type))
    if connect_type == "map":
        return ColumnType(T.MapType(column_type(schema.get("keys", {"type": "string"})).data_type,
                                    column_type(schema.get("values", {"type": "string"})).data_type))
    if connect_type == "bytes":
        return ColumnType(T.BinaryType(), "bytes")
    return ColumnType(PRIMITIVES.get(str(connect_type), T.StringType()))


def is_nested(data_type: T.DataType) -> bool:
    """Struct, array and map columns are parsed by ``from_json`` as themselves."""
    return isinstance(data_type, (T.StructType, T.ArrayType, T.MapType))


def convert(text: Column, spec: ColumnType) -> Column:
    """A column's value from its JSON text (nested columns are already parsed)."""
    if is_nested(spec.data_type):
        return text
    if spec.logical == _VARIABLE_DECIMAL:
        parsed = F.from_json(text, "scale int, value string")
        return F.try_divide(_signed_big_endian_to_decimal(F.unbase64(parsed["value"]), 38, 0),
                            F.pow(F.lit(10), parsed["scale"]).cast("decimal(38,0)")).try_cast(T.DecimalType(38, 18))
    converter = _CONVERTERS.get(spec.logical or "")
    if converter is None and isinstance(spec.data_type, T.BinaryType):
        converter = _CONVERTERS["bytes"]
    return converter(text, spec) if converter else text.try_cast(spec.data_type)
