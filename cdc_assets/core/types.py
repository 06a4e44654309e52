"""Kafka Connect and Debezium logical types: the Spark type of each, and the column logic that turns
the JSON converter's text into it.

Every top-level row column is read from JSON as text and converted here, so numbers sent as strings
parse, and a value that does not fit its type becomes null (which the decoder reports as a bad event
instead of losing it). Nested structs, arrays and maps are parsed as their Spark types directly.

| Connect schema (``type`` / ``name``)                 | Spark / Delta type            |
|-----------------------------------------------------|-------------------------------|
| int8/16/32/64, float, double, boolean, string        | bigint, double, boolean, string (wide-type policy) |
| bytes                                               | binary (base64 decoded)        |
| org.apache.kafka.connect.data.Decimal, precision <= 38 (or absent: ``money``) | decimal(38, scale) |
| org.apache.kafka.connect.data.Decimal, precision > 38 or scale outside 0..38 | string: the exact decimal text |
| io.debezium.data.VariableScaleDecimal               | decimal(38, 18); a value it cannot hold exactly is a bad event |
| io.debezium.time.Date, connect Date                 | date                           |
| io.debezium.time.Timestamp / MicroTimestamp / NanoTimestamp, connect Timestamp | timestamp_ntz (wall clock) |
| io.debezium.time.ZonedTimestamp                     | timestamp (UTC instant)        |
| io.debezium.time.Time / MicroTime / NanoTime, connect Time | string ``[-]HH:mm:ss.SSSSSS`` (hours past 24 kept) |
| io.debezium.time.ZonedTime, Json, Uuid, Enum, EnumSet, Xml, Ltree | string            |
| io.debezium.time.Year                               | bigint                         |
| io.debezium.data.Bits                               | binary, big-endian (as the database returns it) |
| io.debezium.time.MicroDuration / NanoDuration        | long                           |
| any other logical name or type name                 | refused: a clear error         |

The JSON converter names the 32- and 64-bit floating types ``float`` and ``double`` (``float32`` and
``float64`` are the Java enum names, never written). Both become double: a ``real`` arrives as the
shortest decimal text of its 32-bit value (``0.1``), and read as a double that text is the value
PostgreSQL prints and a client reads (storing the 32-bit float would read back as
``0.10000000149011612``). ``NaN``/``Infinity`` (double mode of ``decimal.handling.mode``) are kept.

Decimals are exact or refused, never rounded: the unscaled value's digits are placed around the
decimal point as text and cast at the column's own scale. Delta holds at most 38 digits, so a
``numeric(p, s)`` with ``p > 38`` (or a scale Delta cannot hold) is stored as its exact decimal text.
An unconstrained ``numeric`` (``VariableScaleDecimal``) is decimal(38, 18); a value with more than
20 integer or 18 fractional digits is a bad event naming the column, never a rounded number. The
table's ``columns`` config may set such a decimal column to ``string`` (exact text, any value) or to
another ``decimal(p, s)``. ``decimal.handling.mode=string`` sends plain strings (``NAN`` and
``POSITIVE_INFINITY``/``NEGATIVE_INFINITY`` for the special values) and ``double`` sends doubles;
both are kept as sent. ``money`` is a Decimal of scale 2 (``money.fraction.digits``) with no
precision: decimal(38, 2).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

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
    "float": T.DoubleType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}

DECIMAL_NAME = "org.apache.kafka.connect.data.Decimal"
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


_MAX_DIGITS = 38  # the most digits a Delta (and Spark) decimal holds
_VARIABLE_SCALE = 18  # decimal(38, 18) for unconstrained numeric: 20 integer and 18 fractional digits
_TWO_TO_64 = "18446744073709551616"


_HEX_DIGITS = "0123456789abcdef"


def _negative(raw: Column) -> Column:
    """Whether two's-complement big-endian bytes are negative: the first byte's high bit (Spark orders
    bytes unsigned)."""
    return F.substring(raw, 1, 1) >= F.lit(bytes([0x80]))


def _magnitude_hex(raw: Column, negative: Column) -> Column:
    """The bytes' hex digits, one's-complemented where ``negative`` (a negative value's magnitude is
    that plus one): one translation whose target depends on the sign, so the digits are named once."""
    target = F.when(negative, F.lit(_HEX_DIGITS[::-1])).otherwise(F.lit(_HEX_DIGITS))
    return F.call_function("translate", F.lower(F.hex(raw)), F.lit(_HEX_DIGITS), target)


def _unscaled_digits(raw: Column) -> Column:
    """Two's-complement big-endian bytes of up to 16 (every unscaled value of at most 38 digits) as
    signed decimal digits; null for longer values, which cannot be held by a decimal(38, s).

    Every batch's query analyzes and optimizes this once per decimal column, and each name of a part in
    it is that part's whole expression again: the bytes are tested and hexed where needed, not hexed
    and then tested."""
    negative = _negative(raw)
    magnitude_hex = F.lpad(_magnitude_hex(raw, negative), 32, "0")
    high = F.conv(F.substring(magnitude_hex, 1, 16), 16, 10).cast("decimal(38,0)")
    low = F.conv(F.substring(magnitude_hex, 17, 16), 16, 10).cast("decimal(38,0)")
    one = negative.cast("int").cast("decimal(38,0)")
    magnitude = F.try_add(F.try_add(F.try_multiply(high, F.lit(_TWO_TO_64).cast("decimal(38,0)")), low), one)
    # The sign as text: Spark's decimal negation rounds to 34 digits.
    sign = F.when(negative, F.lit("-")).otherwise(F.lit(""))
    return F.when(F.octet_length(raw) <= 16, F.concat(sign, magnitude.cast("string")))


_LIMB = 10**9  # base of the limbs (little-endian) of the long-hand conversion below
_CHUNK_HEX = 4  # hex digits folded in per step: limb * 16^4 + carry stays below 2^53, exact as a double


def _add_into_limbs(limbs: Column, factor: int, addend: Column) -> Column:
    """``limbs * factor + addend`` in base ``_LIMB`` (little-endian), long-hand."""
    def carried(acc: Column, limb: Column) -> Column:
        total = limb * factor + acc["carry"]
        rest = total % _LIMB
        # Column division is a double's: exact here, as ``total - rest`` is a multiple below 2^53.
        return F.struct(F.concat(acc["out"], F.array(rest)).alias("out"),
                        ((total - rest) / _LIMB).cast("bigint").alias("carry"))

    step = F.aggregate(
        limbs, F.struct(F.array().cast("array<bigint>").alias("out"), addend.cast("bigint").alias("carry")), carried)
    # Bound once: spelt out at each of its three uses, every nesting of this step would triple the expression.
    return _let(step, lambda s: F.when(s["carry"] > 0, F.concat(s["out"], F.array(s["carry"]))).otherwise(s["out"]))


def _unscaled_digits_any_length(raw: Column) -> Column:
    """Two's-complement big-endian bytes of any length as signed decimal digits, converted long-hand
    with higher-order functions: only for columns wider than 38 digits, whose values need it."""
    negative = _negative(raw)
    magnitude_hex = _magnitude_hex(raw, negative)
    chunks = F.ceil(F.length(magnitude_hex) / _CHUNK_HEX).cast("int")
    padded = F.lpad(magnitude_hex, chunks * _CHUNK_HEX, "0")
    values = F.transform(F.sequence(F.lit(0), chunks - 1),
                         lambda i: F.conv(F.substring(padded, i * _CHUNK_HEX + 1, _CHUNK_HEX), 16, 10).cast("bigint"))
    limbs = F.aggregate(values, F.array(F.lit(0).cast("bigint")),
                        lambda acc, chunk: _add_into_limbs(acc, 16**_CHUNK_HEX, chunk))
    limbs = _let(limbs, lambda magnitude: F.when(negative, _add_into_limbs(magnitude, 1, F.lit(1)))
                 .otherwise(magnitude))
    text = F.array_join(F.transform(F.reverse(limbs), lambda limb: F.lpad(limb.cast("string"), 9, "0")), "")
    digits = F.regexp_replace(text, r"^0+(?=\d)", "")
    return F.when(F.octet_length(raw) > 0, F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), digits))


def _let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body`` of ``value`` computed once however often ``body`` uses it (a one-element ``transform``)."""
    return F.get(F.transform(F.array(value), body), 0)


def _plain_decimal_text(digits: Column, scale: Column | int) -> Column:
    """Signed unscaled ``digits`` with the decimal point placed ``scale`` digits from the right
    (a negative scale appends zeros): the exact value as plain text, for values of any width."""
    scale = F.lit(scale) if isinstance(scale, int) else scale

    def placed(signed: Column) -> Column:
        magnitude = F.ltrim(signed, F.lit("-"))
        padded = F.lpad(magnitude, F.greatest(F.length(magnitude), scale + 1), "0")
        point = F.length(padded) - scale
        number = (F.when(scale > 0, F.concat(F.substring(padded, F.lit(1), point), F.lit("."),
                                             F.substring(padded, point + 1, scale)))
                  .when(scale < 0, F.concat(magnitude, F.repeat(F.lit("0"), -scale)))
                  .otherwise(magnitude))
        return F.concat(F.when(F.startswith(signed, F.lit("-")), F.lit("-")).otherwise(F.lit("")), number)

    return _let(digits, placed)


def _as_decimal(digits: Column, scale: Column | int, data_type: T.DecimalType) -> Column:
    """Signed unscaled ``digits`` at ``scale`` as ``data_type``: exact, or null where the type would
    round (fractional digits beyond its scale that are not zeros) or overflow; never a rounded value."""
    if isinstance(scale, int) and scale <= data_type.scale:
        # A fixed scale the type holds: no digit can be dropped, and ``digits`` is named once.
        return F.concat(digits, F.lit(f"E{-scale}")).try_cast(data_type)
    scale = F.lit(scale) if isinstance(scale, int) else scale
    # "<digits>E<-scale>" casts exactly; no division, whose result Spark rounds to 6 decimal places.
    value = F.concat(digits, F.lit("E"), (-scale).cast("string")).try_cast(data_type)
    dropped = scale - data_type.scale
    exact = (dropped <= 0) | F.endswith(digits, F.repeat(F.lit("0"), dropped)) | (digits == F.lit("0"))
    return F.when(exact, value)


def _fixed_decimal(text: Column, spec: ColumnType) -> Column:
    """A Connect Decimal's base64 text as its column's type: the decimal, or the exact decimal text for
    a column wider than Delta's decimals."""
    raw = F.unbase64(text)
    if isinstance(spec.data_type, T.DecimalType):
        return _as_decimal(_unscaled_digits(raw), spec.scale, spec.data_type)
    return _plain_decimal_text(_unscaled_digits_any_length(raw), spec.scale)


def _variable_scale_decimal(text: Column, spec: ColumnType) -> Column:
    """A VariableScaleDecimal (``{"scale": s, "value": base64}``) as its column's type, exactly or null."""
    def converted(parsed: Column) -> Column:
        raw = F.unbase64(parsed["value"])
        if isinstance(spec.data_type, T.DecimalType):
            return _as_decimal(_unscaled_digits(raw), parsed["scale"], spec.data_type)
        return _plain_decimal_text(_unscaled_digits_any_length(raw), parsed["scale"])

    # Parsed once: the conversion names the value's bytes about 30 times, and spelt out at each use every
    # one was a JSON parse (from_json has no generated code, so nothing shares them).
    return _let(F.from_json(text, "scale int, value string"), converted)


_MICROS_PER_HOUR, _MICROS_PER_MINUTE, _MICROS_PER_SECOND = 3_600_000_000, 60_000_000, 1_000_000


def _whole(micros: Column, unit: int) -> Column:
    """How many whole ``unit`` fit in non-negative ``micros``: exact, as the quotient is a whole number below 2^53."""
    return ((micros - micros % unit) / unit).cast("long")


def _time_of_day(micros: Column) -> Column:
    """A Debezium time, microseconds since midnight, as ``[-]HH:mm:ss.SSSSSS`` with the hours never wrapped at 24:
    MySQL's and MariaDB's TIME is a duration (-838:59:59 to 838:59:59) and PostgreSQL's time reaches 24:00:00.
    Arithmetic, not a timestamp format, which would wrap them (and read the session's time zone)."""
    magnitude = F.abs(micros)
    hours = _whole(magnitude, _MICROS_PER_HOUR).cast("string")
    return F.concat(
        F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
        F.lpad(hours, F.greatest(F.length(hours), F.lit(2)), "0"), F.lit(":"),
        F.lpad(_whole(magnitude % _MICROS_PER_HOUR, _MICROS_PER_MINUTE).cast("string"), 2, "0"), F.lit(":"),
        F.lpad(_whole(magnitude % _MICROS_PER_MINUTE, _MICROS_PER_SECOND).cast("string"), 2, "0"), F.lit("."),
        F.lpad((magnitude % _MICROS_PER_SECOND).cast("string"), 6, "0"))


def _bits(text: Column) -> Column:
    """Debezium's Bits (base64 of little-endian bytes, as every connector sends them) as big-endian bytes: the value
    the database returns for a ``BIT(n)`` (MySQL's b'000000000101' is 0x0005, sent as 05 00)."""
    pairs = F.regexp_extract_all(F.hex(F.unbase64(text)), F.lit("(..)"), 1)
    return F.unhex(F.array_join(F.reverse(pairs), ""))


def _converters() -> dict[str, Callable[[Column, ColumnType], Column]]:
    def ntz(column: Column) -> Column:
        return column.cast(T.TimestampNTZType())

    return {
        DECIMAL_NAME: _fixed_decimal,
        _VARIABLE_DECIMAL: _variable_scale_decimal,
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
        "io.debezium.data.Bits": lambda text, _: _bits(text),
        "bytes": lambda text, _: F.unbase64(text),
    }


_CONVERTERS = _converters()


def column_type(schema: Mapping[str, Any]) -> ColumnType:
    """The Spark type (and conversion) of a Connect field schema; unknown logical types are refused."""
    name, connect_type = schema.get("name"), schema.get("type")
    parameters = schema.get("parameters") or {}
    if name == DECIMAL_NAME:
        scale = int(parameters.get("scale", 0))
        precision = parameters.get("connect.decimal.precision")
        digits = int(precision) if precision is not None else _MAX_DIGITS  # absent: money, sized by its scale
        fits = (0 <= scale <= _MAX_DIGITS and digits <= _MAX_DIGITS) or (scale < 0 and digits - scale <= _MAX_DIGITS)
        return ColumnType(T.DecimalType(_MAX_DIGITS, max(scale, 0)) if fits else T.StringType(), DECIMAL_NAME, scale)
    if name == _VARIABLE_DECIMAL:
        return ColumnType(T.DecimalType(_MAX_DIGITS, _VARIABLE_SCALE), _VARIABLE_DECIMAL)
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
    if connect_type not in PRIMITIVES:
        raise UnknownLogicalType(f"type '{connect_type}' (field '{schema.get('field')}') is not a Kafka Connect type")
    return ColumnType(PRIMITIVES[str(connect_type)])


def declared(spec: ColumnType, data_type: T.DataType) -> ColumnType | None:
    """A decimal column (Connect Decimal or VariableScaleDecimal) read as the type a table's ``columns``
    config declares for it, ``string`` (exact text) or a decimal; None: the declaration does not apply."""
    if spec.logical in (DECIMAL_NAME, _VARIABLE_DECIMAL) and isinstance(data_type, (T.StringType, T.DecimalType)):
        return replace(spec, data_type=data_type)
    return None


def unavailable_test(data_type: T.DataType, placeholder: str) -> Callable[[Column], Column] | None:
    """The test that a column's value (its JSON text, or its parsed value for nested types) is the
    connector's ``unavailable.value.placeholder`` for it, as Debezium's PostgreSQL connector writes it
    (``UnchangedToastedPlaceholder``): the text (text, json, jsonb, xml; bytea in the base64/hex binary
    modes), its bytes (bytea), a one-element array of it (text/json/bytea/uuid arrays), its bytes as
    integers (integer arrays), a one-entry map of it (hstore). None: the type never carries it."""
    raw = placeholder.encode()
    if isinstance(data_type, T.StringType):
        forms = [placeholder, base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(), raw.hex(),
                 json.dumps({placeholder: placeholder})]
        return lambda value: value.isin(*forms)
    if isinstance(data_type, T.BinaryType):
        return lambda text: text == F.lit(base64.b64encode(raw).decode())
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.StringType):
        uuid = str(UUID(bytes=hashlib.md5(raw).digest(), version=3))  # Java's UUID.nameUUIDFromBytes
        return lambda value: (F.size(value) == 1) & F.get(value, 0).isin(placeholder, uuid)
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.BinaryType):
        return lambda value: (F.size(value) == 1) & (F.get(value, 0) == F.lit(raw))
    if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, T.LongType):
        return lambda value: value == F.array(*[F.lit(b).cast("bigint") for b in raw])
    if isinstance(data_type, T.MapType) and isinstance(data_type.valueType, T.StringType):
        return lambda value: (F.size(value) == 1) & (value[F.lit(placeholder)] == F.lit(placeholder))
    return None


def placeholder_needles(placeholder: str) -> list[bytes] | None:
    """Byte strings of which the JSON text of every value ``unavailable_test`` recognises contains one,
    so that a batch whose raw values hold none of them carries no placeholder and needs no test. None:
    the placeholder has characters JSON may escape, and a search of the raw text cannot rule it out."""
    if not placeholder.isascii() or any(char in placeholder for char in '"\\') or \
            any(ord(char) < 0x20 for char in placeholder):
        return None
    raw = placeholder.encode()
    uuid = str(UUID(bytes=hashlib.md5(raw).digest(), version=3))
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw), raw.hex().encode(), uuid.encode(),
            ",".join(str(b) for b in raw).encode(), ", ".join(str(b) for b in raw).encode()]


def is_nested(data_type: T.DataType) -> bool:
    """Struct, array and map columns are parsed by ``from_json`` as themselves."""
    return isinstance(data_type, (T.StructType, T.ArrayType, T.MapType))


def convert(text: Column, spec: ColumnType) -> Column:
    """A column's value from its JSON text (nested columns are already parsed)."""
    if is_nested(spec.data_type):
        return text
    converter = _CONVERTERS.get(spec.logical or "")
    if converter is None and isinstance(spec.data_type, T.BinaryType):
        converter = _CONVERTERS["bytes"]
    if converter is None and isinstance(spec.data_type, T.DateType):
        return _date(text)
    return converter(text, spec) if converter else text.try_cast(spec.data_type)


def _date(text: Column) -> Column:
    """A date column without a schema (the ``columns`` config): a whole number is Debezium's encoding,
    days since the epoch (a cast would read ``19782`` as the year 19782); other text is cast (ISO dates)."""
    days = F.when(text.rlike(r"^-?[0-9]+$"), text.try_cast("int"))
    return F.when(days.isNotNull(), F.date_add(F.lit("1970-01-01").cast("date"), days)).otherwise(
        F.when(~text.rlike(r"^-?[0-9]+$"), text.try_cast(T.DateType())))
