"""Connect and Debezium logical-type fields and values, wrapped in the envelopes the decode reads."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal


def unscaled_bytes(value: int) -> str:
    """A Connect Decimal's unscaled value as its JSON converter writes it: big-endian two's complement, base64."""
    length = max(1, (value.bit_length() + 8) // 8)
    return base64.b64encode(value.to_bytes(length, "big", signed=True)).decode()


FIELDS = [
    ({"type": "int32", "field": "id"}, 1, 1),
    ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "field": "price",
      "parameters": {"scale": "2", "connect.decimal.precision": "10"}}, unscaled_bytes(-12345), Decimal("-123.45")),
    ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "field": "big",
      "parameters": {"scale": "4", "connect.decimal.precision": "38"}},
     unscaled_bytes(12345678901234567890123456789), Decimal("1234567890123456789012345.6789")),
    ({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "field": "vsd",
      "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]},
     {"scale": 3, "value": unscaled_bytes(1500)}, Decimal("1.5")),
    ({"type": "int32", "name": "io.debezium.time.Date", "field": "d"}, 19723, dt.date(2024, 1, 1)),
    ({"type": "int64", "name": "io.debezium.time.Timestamp", "field": "ts"}, 1704110400123,
     dt.datetime(2024, 1, 1, 12, 0, 0, 123000)),
    ({"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "mts"}, 1704110400123456,
     dt.datetime(2024, 1, 1, 12, 0, 0, 123456)),
    ({"type": "int64", "name": "io.debezium.time.NanoTimestamp", "field": "nts"}, "1704110400123456789",
     dt.datetime(2024, 1, 1, 12, 0, 0, 123456)),
    ({"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "zts"}, "2024-01-01T14:00:00+02:00",
     dt.datetime(2024, 1, 1, 12, 0, 0)),
    ({"type": "int64", "name": "io.debezium.time.MicroTime", "field": "t"}, 45296000001, "12:34:56.000001"),
    ({"type": "string", "name": "io.debezium.data.Json", "field": "j"}, '{"a": [1]}', '{"a": [1]}'),
    ({"type": "string", "name": "io.debezium.data.Uuid", "field": "u"}, "6f0c2c1e-7c1d-4b8e-9c3a-1d2e3f4a5b6c",
     "6f0c2c1e-7c1d-4b8e-9c3a-1d2e3f4a5b6c"),
    ({"type": "string", "name": "io.debezium.data.Enum", "field": "e"}, "RED", "RED"),
    ({"type": "bytes", "name": "io.debezium.data.Bits", "field": "bits"}, base64.b64encode(b"\x05").decode(),
     b"\x05"),
    ({"type": "bytes", "field": "blob"}, base64.b64encode(b"\x00\xff").decode(), b"\x00\xff"),
    ({"type": "array", "items": {"type": "int32"}, "field": "tags"}, [1, 2], [1, 2]),
    ({"type": "struct", "field": "addr", "fields": [{"type": "string", "field": "city"}]}, {"city": "Oslo"},
     {"city": "Oslo"}),
]


def wrapped(fields, values, op="c"):
    """A PostgreSQL event with schema of ``fields``: ``values`` as its after image, ``op`` its operation."""
    row_schema = {"type": "struct", "fields": fields, "name": "s.t.Value", "optional": True}
    schema = {"type": "struct", "fields": [{**row_schema, "field": "before"}, {**row_schema, "field": "after"}]}
    payload = {"op": op, "after": values, "source": {"lsn": 1, "ts_ms": 1}}
    return json.dumps({"schema": schema, "payload": payload}).encode()
