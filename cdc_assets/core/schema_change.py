"""Debezium schema-change events (topic ``<topic.prefix>``): parsed defensively into table changes.

Column types follow the project's wide-type policy (see ``core.types``): every integer is bigint,
every floating type double, decimals decimal(38, scale). A later widening at the source
(int -> bigint, float -> double, decimal precision up, longer varchar) then needs no change in
Delta, which matters because delta-rs cannot read tables that use Delta's typeWidening feature and
rewriting a table to change a type is costly. A decimal *scale* change cannot be absorbed this way
and is refused with a clear error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from cdc_assets.core.envelope import json_payload

_JDBC_TYPES: dict[int, T.DataType] = {
    -7: T.BooleanType(), 16: T.BooleanType(),
    -6: T.LongType(), 5: T.LongType(), 4: T.LongType(), -5: T.LongType(),
    6: T.DoubleType(), 7: T.DoubleType(), 8: T.DoubleType(),
    91: T.DateType(), 93: T.TimestampNTZType(), 2014: T.TimestampType(),
    -2: T.BinaryType(), -3: T.BinaryType(), -4: T.BinaryType(), 2004: T.BinaryType(),
}
_DECIMAL_JDBC = (2, 3)
_RENAME = re.compile(r"RENAME\s+COLUMN\s+\"?(?P<old>[\w$]+)\"?\s+TO\s+\"?(?P<new>[\w$]+)\"?", re.IGNORECASE)


class SchemaChangeError(ValueError):
    """A schema-change event cannot be read."""


@dataclass(frozen=True)
class TableChange:
    """One entry of ``tableChanges``: a CREATE, ALTER or DROP of one table."""

    type: str
    name: str  # "<schema>.<table>"
    primary_keys: tuple[str, ...]
    columns: T.StructType
    renames: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SchemaChangeEvent:
    """A parsed schema-change event."""

    database: str | None
    ddl: str | None
    source_position: str
    changes: tuple[TableChange, ...]


def column_spark_type(column: Mapping[str, Any]) -> T.DataType:
    """The Delta type of an announced column (wide-type policy)."""
    jdbc = column.get("jdbcType")
    if jdbc in _DECIMAL_JDBC:
        scale = column.get("scale")
        return T.DecimalType(38, int(scale) if scale is not None else 0)
    return _JDBC_TYPES.get(jdbc, T.StringType()) if isinstance(jdbc, int) else T.StringType()


def _source_type(column: Mapping[str, Any]) -> str:
    """The column's type at the source, e.g. ``varchar(255)`` or ``decimal(10,2)``."""
    name = str(column.get("typeName") or column.get("jdbcType"))
    size = [str(v) for v in (column.get("length"), column.get("scale")) if v is not None]
    return f"{name}({','.join(size)})" if size else name


def source_type_changes(previous: T.StructType, announced: T.StructType) -> list[str]:
    """Columns whose source type changed (``ID: int identity(10,0) -> bigint(19,0)``)."""
    before = {f.name: f.metadata.get("source_type") for f in previous.fields}
    return [f"{f.name}: {before[f.name]} -> {f.metadata.get('source_type')}" for f in announced.fields
            if f.name in before and before[f.name] != f.metadata.get("source_type")]


def table_name_from_id(table_id: str) -> str:
    """``"DB2INST1"."CUSTOMERS"`` or ``"db"."dbo"."t"`` or ``public.t`` -> ``schema.table``."""
    parts = [quoted or plain for quoted, plain in re.findall(r'"((?:[^"]|"")*)"|([^".]+)', table_id)]
    parts = [part.replace('""', '"') for part in parts if part]
    if not parts:
        raise SchemaChangeError(f"table id '{table_id}' names no table")
    return ".".join(parts[-2:])


def parse_schema_change(value: bytes | None) -> SchemaChangeEvent:
    """Parse one schema-change record value (with or without the schema/payload wrapper)."""
    try:
        payload = json_payload(value)
    except ValueError as exc:
        raise SchemaChangeError(str(exc)) from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("tableChanges"), list):
        raise SchemaChangeError("value has no 'tableChanges' list: not a Debezium schema-change event")
    source = payload.get("source") or {}
    position = ":".join(str(source.get(k)) for k in ("commit_lsn", "change_lsn", "lsn", "ts_ms") if source.get(k))
    ddl = payload.get("ddl")
    renames = tuple((m.group("old"), m.group("new")) for m in _RENAME.finditer(ddl or ""))
    changes = []
    for index, change in enumerate(payload["tableChanges"]):
        if not isinstance(change, dict) or change.get("type") not in ("CREATE", "ALTER", "DROP"):
            raise SchemaChangeError(f"tableChanges[{index}] has no type CREATE, ALTER or DROP")
        if not isinstance(change.get("id"), str):
            raise SchemaChangeError(f"tableChanges[{index}] has no table id")
        table = change.get("table") or {}
        columns = table.get("columns") or []
        if change["type"] != "DROP" and not columns:
            raise SchemaChangeError(f"tableChanges[{index}] ({change['type']} {change['id']}) lists no columns")
        try:
            ordered = sorted(columns, key=lambda c: c.get("position") or 0)
            struct = T.StructType([
                T.StructField(c["name"], column_spark_type(c), bool(c.get("optional", True)),
                              {"source_type": _source_type(c)})
                for c in ordered])
        except (KeyError, TypeError) as exc:
            raise SchemaChangeError(f"tableChanges[{index}]: a column has no name ({exc})") from exc
        changes.append(TableChange(change["type"], table_name_from_id(change["id"]),
                                   tuple(table.get("primaryKeyColumnNames") or ()), struct, renames))
    return SchemaChangeEvent(payload.get("databaseName"), ddl, position, tuple(changes))


@dataclass(frozen=True)
class SchemaDiff:
    """How an announced schema differs from a Delta table's (hidden columns ignored)."""

    added: tuple[T.StructField, ...]
    dropped: tuple[str, ...]
    widened: tuple[str, ...]  # absorbed by the wide-type policy: nothing to do in Delta
    refused: tuple[str, ...]  # type changes the policy cannot absorb

    @property
    def changes_delta(self) -> bool:
        return bool(self.added)


def _absorbed(old: T.DataType, new: T.DataType) -> bool:
    """Whether the wide-type policy already holds ``new`` values in a column of type ``old``."""
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return old.scale == new.scale
    return isinstance(old, T.StringType) or type(old) is type(new)


def diff_schema(current: T.StructType, announced: T.StructType) -> SchemaDiff:
    """Compare a table's Delta schema with an announced one."""
    existing = {f.name: f.dataType for f in current.fields if not f.name.startswith("_cdc_")}
    added, widened, refused = [], [], []
    for field in announced.fields:
        if field.name not in existing:
            added.append(T.StructField(field.name, field.dataType, True))
        elif existing[field.name] != field.dataType:
            old, new = existing[field.name], field.dataType
            if _absorbed(old, new):
                widened.append(field.name)
            else:
                refused.append(f"{field.name}: {old.simpleString()} -> {new.simpleString()}")
    dropped = tuple(name for name in existing if name not in announced.fieldNames())
    return SchemaDiff(tuple(added), dropped, tuple(widened), tuple(refused))
