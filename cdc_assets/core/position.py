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
| mysql      | binlog ``file``, ``pos``, ``row``                              |
| oracle     | ``commit_scn`` (else ``scn``), ``scn``                         |

LSNs such as ``00000027:00000758:0005`` are compared part by part as hexadecimal numbers, never
as strings of different widths: each part is lower-cased and left-padded to 16 digits.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

# The source fields each kind's position reads (``source_position``).
POSITION_FIELDS: dict[str, tuple[str, ...]] = {
    "postgresql": ("lsn", "sequence"),
    "sqlserver": ("commit_lsn", "change_lsn", "event_serial_no"),
    "db2": ("commit_lsn", "change_lsn"),
    "mongodb": ("ts_ms", "ord"),
    "mysql": ("file", "pos", "row"),
    "oracle": ("commit_scn", "scn"),
}

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


def source_position(source: Column, kind: str) -> Column:
    """The fixed-width source part of an event's position, for a connector ``kind``."""
    if kind == "postgresql":
        # Rows change under row locks, so per key the LSN orders changes; `sequence` ("[last commit
        # LSN, LSN]") only stands in when `lsn` is absent, keeping one width for every event.
        # get_json_object, not from_json: the latter has no generated code (see envelope._key_field).
        return _pg_lsn(F.coalesce(source["lsn"], F.get_json_object(source["sequence"], "$[1]")))
    if kind == "sqlserver":
        return F.concat(_lsn(source["commit_lsn"]), _lsn(source["change_lsn"]), _number(source["event_serial_no"]))
    if kind == "db2":
        commit = F.coalesce(source["commit_lsn"], source["change_lsn"])
        return F.concat(_lsn(commit), _lsn(source["change_lsn"]))
    if kind == "mongodb":
        return F.concat(_number(source["ts_ms"]), _number(source["ord"]))
    if kind == "mysql":
        return F.concat(F.lpad(F.coalesce(source["file"], F.lit("")), 64, " "), _number(source["pos"]),
                        _number(source["row"]))
    if kind == "oracle":
        return F.concat(_number(F.coalesce(source["commit_scn"], source["scn"]), 38), _number(source["scn"], 38))
    raise ValueError(f"unknown connector kind '{kind}'")


def event_position(source: Column, kind: str, partition: Column, offset: Column) -> Column:
    """The full ordering position: source part, then Kafka partition and offset (non-negative integer
    columns, so formatted without ``_number``'s decimal round trip)."""
    return F.concat(source_position(source, kind), F.lpad(partition.cast("string"), 10, "0"),
                    F.lpad(offset.cast("string"), _NUMBER_WIDTH, "0"))
