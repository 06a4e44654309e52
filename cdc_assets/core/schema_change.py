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
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import types as T

from cdc_assets.core.envelope import json_payload
from cdc_assets.core.position import source_position_of
from cdc_assets.core.types import DECIMAL_NAME, column_type

_JDBC_TYPES: dict[int, T.DataType] = {
    -7: T.BooleanType(), 16: T.BooleanType(),
    -6: T.LongType(), 5: T.LongType(), 4: T.LongType(), -5: T.LongType(),
    6: T.DoubleType(), 7: T.DoubleType(), 8: T.DoubleType(),
    91: T.DateType(), 93: T.TimestampNTZType(), 2014: T.TimestampType(),
    -2: T.BinaryType(), -3: T.BinaryType(), -4: T.BinaryType(), 2004: T.BinaryType(),
}
_DECIMAL_JDBC = (2, 3)
_BIT_JDBC = -7
# RENAME COLUMN a TO b (quoted "a" or `a`), and MySQL's and MariaDB's CHANGE [COLUMN] a b <type>.
_RENAMES = (
    re.compile(r"\bRENAME\s+COLUMN\s+[\"`]?(?P<old>[\w$]+)[\"`]?\s+TO\s+[\"`]?(?P<new>[\w$]+)[\"`]?", re.IGNORECASE),
    re.compile(r"\bCHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?`?(?P<old>[\w$]+)`?\s+`?(?P<new>[\w$]+)`?\s+\w",
               re.IGNORECASE),
)

_RENAME_TABLE = re.compile(r"\s*RENAME\s+TABLES?\s+(?P<pairs>.+)", re.IGNORECASE | re.DOTALL)
_ALTER_RENAME_TABLE = re.compile(r"\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?(?P<old>\S+)\s+.*?"
                                 r"\bRENAME\s+(?:TO\s+|AS\s+)?(?!COLUMN\b|INDEX\b|KEY\b|CONSTRAINT\b)(?P<new>[^\s,;]+)",
                                 re.IGNORECASE | re.DOTALL)


class SchemaChangeError(ValueError):
    """A schema-change event cannot be read."""


@dataclass(frozen=True)
class TableChange:
    """One entry of ``tableChanges``: a CREATE, ALTER or DROP of one table."""

    type: str
    name: str  # "<schema>.<table>"
    primary_keys: tuple[str, ...]
    columns: T.StructType
    renames: tuple[tuple[str, str], ...] = ()  # columns renamed (old, new) by the DDL
    renamed_from: str | None = None  # the table's name before a RENAME TABLE


@dataclass(frozen=True)
class SchemaChangeEvent:
    """A parsed schema-change event."""

    database: str | None
    ddl: str | None
    source_position: str  # the connector kind's fixed-width source position: compares as source order
    changes: tuple[TableChange, ...]
    snapshot: bool = False  # emitted by a snapshot (source.snapshot not "false")

    @property
    def acted_on(self) -> tuple[TableChange, ...]:
        """The changes that change a table. A snapshot's DROP (MariaDB's and MySQL's snapshots emit
        ``DROP TABLE IF EXISTS`` before each ``CREATE TABLE``) rebuilds the connector's schema history:
        no table was dropped at the source, and acting on it would retire a live table."""
        return tuple(change for change in self.changes if not (self.snapshot and change.type == "DROP"))


def column_spark_type(column: Mapping[str, Any]) -> T.DataType:
    """The Delta type of an announced column (wide-type policy), the type its change events decode to."""
    jdbc = column.get("jdbcType")
    type_name = str(column.get("typeName") or "").upper()
    if jdbc in _DECIMAL_JDBC:
        # The type its events' Decimal gets (core.types.column_type): decimal(38, scale), or the exact text
        # past 38 digits (MySQL's DECIMAL(65, 30)).
        scale, precision = column.get("scale"), column.get("length")
        return column_type({"name": DECIMAL_NAME, "parameters": {
            "scale": int(scale) if scale is not None else 0,
            **({"connect.decimal.precision": int(precision)} if precision is not None else {})}}).data_type
    if type_name == "BIGINT UNSIGNED":
        # An unsigned 64-bit value can exceed bigint: decimal(38, 0) holds both what
        # bigint.unsigned.handling.mode=precise sends (a Decimal) and =long's int64.
        return T.DecimalType(38, 0)
    if jdbc == _BIT_JDBC and type_name == "BIT" and (column.get("length") or 1) > 1:
        return T.BinaryType()  # BIT(n > 1) arrives as io.debezium.data.Bits bytes; BIT(1) as a boolean
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


def table_renames(ddl: str | None, database: str | None) -> list[tuple[str, str]]:
    """The ``(old, new)`` tables a ``RENAME TABLE a TO b[, c TO d]`` or ``ALTER TABLE a RENAME [TO|AS] b``
    renames, as ``schema.table`` (an unqualified name is in ``database``)."""
    if not ddl:
        return []
    pairs: list[tuple[str, str]] = []
    if renamed := _RENAME_TABLE.match(ddl):
        for pair in renamed.group("pairs").split(","):
            if words := re.fullmatch(r"\s*(\S+)\s+TO\s+(\S+?)\s*;?\s*", pair, re.IGNORECASE):
                pairs.append((words.group(1), words.group(2)))
    elif altered := _ALTER_RENAME_TABLE.match(ddl):
        pairs.append((altered.group("old"), altered.group("new")))

    def qualified(name: str) -> str:
        parts = [part.strip("`\"") for part in name.split(".")]
        return ".".join(parts[-2:]) if len(parts) > 1 or not database else f"{database}.{parts[0]}"

    return [(qualified(old), qualified(new)) for old, new in pairs]


def parse_schema_change(value: bytes | None, kind: str) -> SchemaChangeEvent:
    """Parse one schema-change record value (with or without the schema/payload wrapper) of a connector
    of ``kind``; its position is the kind's source position (``core.position.source_position_of``)."""
    try:
        payload = json_payload(value)
    except ValueError as exc:
        raise SchemaChangeError(str(exc)) from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("tableChanges"), list):
        raise SchemaChangeError("value has no 'tableChanges' list: not a Debezium schema-change event")
    source = payload.get("source") or {}
    if not isinstance(source, dict):
        raise SchemaChangeError("value's 'source' is not an object")
    ddl = payload.get("ddl")
    renames = tuple((m.group("old"), m.group("new")) for pattern in _RENAMES for m in pattern.finditer(ddl or "")
                    if m.group("old") != m.group("new"))
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
    # A renamed table arrives as an ALTER of its new name alone: the old name's table ends there, as at a DROP,
    # and its rows go on under the new name.
    moves = table_renames(ddl, payload.get("databaseName"))
    origin = {new: old for old, new in moves}
    changes = [replace(change, renamed_from=origin.get(change.name)) for change in changes]
    changes[:0] = [TableChange("DROP", old, (), T.StructType([])) for old, _ in moves]
    # Any snapshot marker but "false" (true, first, last, incremental...): the connector describing the
    # schema it found, not a change made at the source.
    snapshot = str(source.get("snapshot") or "false").lower() != "false"
    return SchemaChangeEvent(payload.get("databaseName"), ddl, source_position_of(source, kind), tuple(changes),
                             snapshot)


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
