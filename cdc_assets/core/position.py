"""Ordering positions: one fixed-width string per event that sorts the way the source committed.

A position is the connector's source coordinates, each normalised to a fixed width so that plain
string comparison orders them (in Spark and in any Delta writer's MERGE condition), followed by
the Kafka partition and offset, which break ties deterministically:

| kind       | source part                                                    |
|------------|----------------------------------------------------------------|
| postgresql | ``lsn`` (16 hex digits; the LSN in ``sequence`` when ``lsn`` is absent) |
| sqlserver  | ``commit_lsn``, ``change_lsn`` (LSNs), ``event_serial_no``      |
| db2        | ``commit_lsn`` (``change_lsn`` during snapshots), ``change_lsn`` |
| mongodb    | ``ts_ms``, ``ord``                                             |
| mysql, mariadb | binlog ``file``, ``pos``, ``row`` (the MySQL family: one rule) |
| oracle     | ``commit_scn`` (else ``scn``), ``scn``                         |

A connector kind is one entry of ``POSITION_RULES``; kinds of one family (MariaDB's connector reads
MySQL's binlog format) share their family's rule object.

LSNs such as ``00000027:00000758:0005`` are compared part by part as hexadecimal numbers, never
as strings of different widths: each part is lower-cased and left-padded to 16 digits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

_LSN_PARTS = 3
_LSN_PART_WIDTH = 16
_NUMBER_WIDTH = 20


def _number(value: Column, width: int = _NUMBER_WIDTH) -> Column:
    """A non-negative integer (JSON number or numeric string) as fixed-width decimal digits."""
    return F.lpad(F.coalesce(value.cast("decimal(38,0)").cast("string"), F.lit("0")), width, "0")


def _lsn(value: Column) -> Column:
    """An LSN of colon-separated hex parts as fixed-width hex (absent: all zeros)."""
    # Parts by index, not F.transform: higher-order functions have no generated code (see
    # envelope._key_field). Parts past the third are cut, as the final lpad cut them before.
    parts = F.split(F.lower(F.trim(value)), ":")
    padded = [F.lpad(F.get(parts, index), _LSN_PART_WIDTH, "0") for index in range(_LSN_PARTS)]
    width = _LSN_PARTS * _LSN_PART_WIDTH
    return F.coalesce(F.lpad(F.concat_ws("", *padded), width, "0"), F.lit("0" * width))


def _pg_lsn(value: Column) -> Column:
    """A PostgreSQL LSN, sent as a number, as 16 hex digits."""
    return F.lpad(F.coalesce(F.lower(F.hex(value.cast("long"))), F.lit("0")), _LSN_PART_WIDTH, "0")


def _number_text(value: object, width: int = _NUMBER_WIDTH) -> str:
    """``_number`` of one value in Python."""
    try:
        digits = str(Decimal(str(value).strip()).quantize(Decimal(1), ROUND_HALF_UP)) if value is not None else "0"
    except ArithmeticError:
        digits = "0"  # not a number: as Spark's cast to decimal gives null
    return digits.rjust(width, "0")[:width]


def _lsn_text(value: object) -> str:
    """``_lsn`` of one value in Python."""
    width = _LSN_PARTS * _LSN_PART_WIDTH
    if value is None:
        return "0" * width
    parts = str(value).strip().lower().split(":")[:_LSN_PARTS]
    return "".join(part.rjust(_LSN_PART_WIDTH, "0")[:_LSN_PART_WIDTH] for part in parts).rjust(width, "0")[:width]


@dataclass(frozen=True)
class PositionRule:
    """How a connector family orders its events: the ``source`` fields read, and their fixed-width form as
    Spark column logic (change events) and in Python for one ``source`` object (the schema-change sensor
    orders DDL by it, where no Spark runs; tests/core/test_schema_change_position.py holds the two equal)."""

    fields: tuple[str, ...]
    source_part: Callable[[Column], Column]
    source_text: Callable[[Mapping[str, Any]], str]


def _postgresql(source: Column) -> Column:
    # Rows change under row locks, so per key the LSN orders changes; `sequence` ("[last commit
    # LSN, LSN]") only stands in when `lsn` is absent, keeping one width for every event.
    # get_json_object, not from_json: the latter has no generated code (see envelope._key_field).
    return _pg_lsn(F.coalesce(source["lsn"], F.get_json_object(source["sequence"], "$[1]")))


def _postgresql_text(source: Mapping[str, Any]) -> str:
    lsn = source.get("lsn")
    if lsn is None and isinstance(source.get("sequence"), str):
        sequence = json.loads(source["sequence"])
        lsn = sequence[1] if isinstance(sequence, list) and len(sequence) > 1 else None
    return format(int(lsn), "x").rjust(_LSN_PART_WIDTH, "0") if lsn is not None else "0" * _LSN_PART_WIDTH


def _sqlserver(source: Column) -> Column:
    return F.concat(_lsn(source["commit_lsn"]), _lsn(source["change_lsn"]), _number(source["event_serial_no"]))


def _sqlserver_text(source: Mapping[str, Any]) -> str:
    return _lsn_text(source.get("commit_lsn")) + _lsn_text(source.get("change_lsn")) + _number_text(
        source.get("event_serial_no"))


def _db2(source: Column) -> Column:
    commit = F.coalesce(source["commit_lsn"], source["change_lsn"])
    return F.concat(_lsn(commit), _lsn(source["change_lsn"]))


def _db2_text(source: Mapping[str, Any]) -> str:
    commit = source.get("commit_lsn") if source.get("commit_lsn") is not None else source.get("change_lsn")
    return _lsn_text(commit) + _lsn_text(source.get("change_lsn"))


def _mongodb(source: Column) -> Column:
    return F.concat(_number(source["ts_ms"]), _number(source["ord"]))


def _mongodb_text(source: Mapping[str, Any]) -> str:
    return _number_text(source.get("ts_ms")) + _number_text(source.get("ord"))


_BINLOG_FILE_WIDTH = 64


def _binlog(source: Column) -> Column:
    # File names of one server share their prefix and grow in length only past 999999: left-padded, they sort.
    return F.concat(F.lpad(F.coalesce(source["file"], F.lit("")), _BINLOG_FILE_WIDTH, " "), _number(source["pos"]),
                    _number(source["row"]))


def _binlog_text(source: Mapping[str, Any]) -> str:
    return (str(source.get("file") or "").rjust(_BINLOG_FILE_WIDTH, " ")[:_BINLOG_FILE_WIDTH]
            + _number_text(source.get("pos")) + _number_text(source.get("row")))


def _oracle(source: Column) -> Column:
    return F.concat(_number(F.coalesce(source["commit_scn"], source["scn"]), 38), _number(source["scn"], 38))


def _oracle_text(source: Mapping[str, Any]) -> str:
    commit = source.get("commit_scn") if source.get("commit_scn") is not None else source.get("scn")
    return _number_text(commit, 38) + _number_text(source.get("scn"), 38)


_MYSQL_FAMILY = PositionRule(("file", "pos", "row"), _binlog, _binlog_text)

# Each connector kind's ordering rule.
POSITION_RULES: dict[str, PositionRule] = {
    "postgresql": PositionRule(("lsn", "sequence"), _postgresql, _postgresql_text),
    "sqlserver": PositionRule(("commit_lsn", "change_lsn", "event_serial_no"), _sqlserver, _sqlserver_text),
    "db2": PositionRule(("commit_lsn", "change_lsn"), _db2, _db2_text),
    "mongodb": PositionRule(("ts_ms", "ord"), _mongodb, _mongodb_text),
    "mysql": _MYSQL_FAMILY,
    "mariadb": _MYSQL_FAMILY,
    "oracle": PositionRule(("commit_scn", "scn"), _oracle, _oracle_text),
}
# The source fields each kind's position reads (``source_position``).
POSITION_FIELDS: dict[str, tuple[str, ...]] = {kind: rule.fields for kind, rule in POSITION_RULES.items()}


def position_rule(kind: str) -> PositionRule:
    """The ordering rule of a connector ``kind``; an unknown kind is a clear error."""
    rule = POSITION_RULES.get(kind)
    if rule is None:
        raise ValueError(f"unknown connector kind '{kind}'")
    return rule


def source_position(source: Column, kind: str) -> Column:
    """The fixed-width source part of an event's position, for a connector ``kind``."""
    return position_rule(kind).source_part(source)


def source_position_of(source: Mapping[str, Any], kind: str) -> str:
    """``source_position`` of one event's ``source`` object, computed in Python."""
    return position_rule(kind).source_text(source)


def event_position(source: Column, kind: str, partition: Column, offset: Column) -> Column:
    """The full ordering position: source part, then Kafka partition and offset (non-negative integer
    columns, so formatted without ``_number``'s decimal round trip)."""
    return F.concat(source_position(source, kind), F.lpad(partition.cast("string"), _PARTITION_WIDTH, "0"),
                    F.lpad(offset.cast("string"), _NUMBER_WIDTH, "0"))


_PARTITION_WIDTH = 10


def position_source_part(position: Column) -> Column:
    """The source part of an ``event_position`` (its Kafka partition and offset cut off): the events of
    one source change share it, such as the delete and the create of a primary-key change."""
    return position.substr(F.lit(1), F.length(position) - (_PARTITION_WIDTH + _NUMBER_WIDTH))
