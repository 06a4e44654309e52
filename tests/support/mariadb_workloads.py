"""The private MariaDB's captured database: its tables, edge rows, and how each type reads in the source and
in Delta."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
from confluent_kafka import Consumer

from tests.support import harness as h
from tests.support.connect import ConnectWorker
from tests.support.mariadb import MariaDBServer

UTC = dt.timezone.utc


SCHEMA = [
    "CREATE TABLE cdc_marker (id INT PRIMARY KEY)",
    """CREATE TABLE alltypes (
      id INT PRIMARY KEY,
      c_bool TINYINT(1), c_tinyint TINYINT, c_tinyint_u TINYINT UNSIGNED, c_smallint SMALLINT,
      c_smallint_u SMALLINT UNSIGNED, c_mediumint MEDIUMINT, c_mediumint_u MEDIUMINT UNSIGNED, c_int INT,
      c_int_u INT UNSIGNED, c_bigint BIGINT, c_bigint_u BIGINT UNSIGNED,
      c_bit1 BIT(1), c_bit12 BIT(12), c_bit64 BIT(64), c_year YEAR,
      c_dec DECIMAL(10,2), c_dec0 DECIMAL(18,0), c_dec_wide DECIMAL(38,10), c_dec65 DECIMAL(65,30),
      c_float FLOAT, c_double DOUBLE,
      c_char CHAR(10), c_varchar VARCHAR(100), c_text TEXT, c_blob BLOB, c_varbinary VARBINARY(32), c_binary BINARY(4),
      c_date DATE, c_time TIME, c_time6 TIME(6), c_dt DATETIME, c_dt3 DATETIME(3), c_dt6 DATETIME(6),
      c_ts6 TIMESTAMP(6) NULL DEFAULT NULL,
      c_json JSON, c_enum ENUM('sad', 'ok', 'happy'), c_set SET('a', 'b', 'c'))""",
    # No primary key: the connector keys its events by `code` (message.key.columns).
    "CREATE TABLE nokey (code VARCHAR(20) NOT NULL, v INT, note TEXT)",
    # workloads.rnd_changes' table; its `at` (timestamptz there) is a TIMESTAMP, an instant.
    """CREATE TABLE rnd (id INT PRIMARY KEY, grp INT, name VARCHAR(64), amount DECIMAL(12,4), score DOUBLE,
      at TIMESTAMP(6) NULL DEFAULT NULL)""",
]


EDGE_ROWS: list[dict[str, Any]] = [
    {"id": 1, "c_bool": 1, "c_tinyint": 127, "c_tinyint_u": 255, "c_smallint": 32767, "c_smallint_u": 65535,
     "c_mediumint": 8388607, "c_mediumint_u": 16777215, "c_int": 2147483647, "c_int_u": 4294967295,
     "c_bigint": 9223372036854775807, "c_bigint_u": 18446744073709551615, "c_bit1": 1, "c_bit12": 4095,
     "c_bit64": 2**63 + 1, "c_year": 2155, "c_dec": "99999999.99", "c_dec0": "999999999999999999",
     "c_dec_wide": "9999999999999999999999999999.9999999999",
     "c_dec65": "-12345678901234567890123456789012345.123456789012345678901234567891",
     "c_float": 1.2345678, "c_double": 1.7976931348623157e308, "c_char": "héllo ☃",
     "c_varchar": 'line1\nline2 "q" \\ tab\t ☃ 𝄞 \'', "c_text": "ünïcödé 𝄞 " * 50, "c_blob": b"\x00\xff\x10",
     "c_varbinary": b"\xff\x00", "c_binary": b"ab", "c_date": "9999-12-31", "c_time": "838:59:59",
     "c_time6": "-838:59:59.999999", "c_dt": "9999-12-31 23:59:59", "c_dt3": "1000-01-01 00:00:00.001",
     "c_dt6": "2024-02-29 12:34:56.789012", "c_ts6": "2038-01-19 03:14:07.999999",
     "c_json": '{"a": [1, 2.50, null], "u": "☃"}', "c_enum": "happy", "c_set": "a,b,c"},
    {"id": 2},  # NULL in every column
    {"id": 3, "c_bool": 0, "c_tinyint": -128, "c_tinyint_u": 0, "c_smallint": -32768, "c_smallint_u": 0,
     "c_mediumint": -8388608, "c_mediumint_u": 0, "c_int": -2147483648, "c_int_u": 0, "c_bigint": -2**63,
     "c_bigint_u": 2**63, "c_bit1": 0, "c_bit12": 0, "c_bit64": 0, "c_year": 1901, "c_dec": "-99999999.99",
     "c_dec0": "-999999999999999999", "c_dec_wide": "-0.0000000001", "c_dec65": "0.000000000000000000000000000001",
     "c_float": -3.40282e38, "c_double": 2.2250738585072014e-308, "c_char": "", "c_varchar": "", "c_text": "",
     "c_blob": b"", "c_varbinary": b"", "c_binary": b"", "c_date": "1000-01-01", "c_time": "00:00:00",
     "c_time6": "-00:00:00.000001", "c_dt": "1000-01-01 00:00:00", "c_dt3": "1969-12-31 23:59:59.999",
     "c_dt6": "1970-01-01 00:00:00.000000", "c_ts6": "1970-01-01 00:00:01.000000", "c_json": "[]", "c_enum": "sad",
     "c_set": ""},
    {"id": 4, "c_bool": 5, "c_time": "25:00:00", "c_time6": "24:00:00.000001", "c_float": 0.1, "c_double": 0.1,
     "c_dec": "0.01", "c_bigint_u": 9567973520996537333, "c_set": "b"},
]


class PsycopgLike:
    """A pymysql connection behind the two calls of psycopg's API that ``workloads``' generators make (``execute``,
    ``transaction``), so PostgreSQL's random workloads run on MariaDB unchanged."""

    def __init__(self, connection: pymysql.connections.Connection) -> None:
        self.connection = connection

    def execute(self, sql: str, params: list[Any] | None = None) -> None:
        """Run one statement; an aware datetime is sent as UTC wall-clock time (the session's time zone)."""
        values = [p.astimezone(UTC).replace(tzinfo=None) if isinstance(p, dt.datetime) and p.tzinfo else p
                  for p in params or []]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, values or None)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around the block (committed, or rolled back on an error)."""
        self.connection.begin()
        try:
            yield
        except BaseException:
            self.connection.rollback()
            raise
        self.connection.commit()


@dataclass
class CapturedDatabase:
    """A MariaDB database captured by a connector of the Connect worker, and where its tables go; its marker
    rows (table ``cdc_marker``) tell when the connector has produced everything written before them."""

    mariadb: MariaDBServer
    worker: ConnectWorker
    database: str
    prefix: str
    bootstrap_servers: str
    root: Path
    marker: int = 0
    consumers: dict[str, Consumer] = field(default_factory=dict)
    # Other connectors of the same database: their topic prefix -> their record keys read as the JSON converter's.
    more_prefixes: dict[str, Callable[[bytes], bytes]] = field(default_factory=dict)

    def consumer(self, topic: str) -> Consumer:
        """A consumer of ``topic`` from its beginning (one per topic, kept open until ``close``)."""
        if topic not in self.consumers:
            consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": f"{topic}-{uuid.uuid4()}",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                 # The topic may not exist yet: look again soon, not after librdkafka's 5 minutes.
                                 "topic.metadata.refresh.interval.ms": 1000})
            consumer.subscribe([topic])
            self.consumers[topic] = consumer
        return self.consumers[topic]

    def close(self) -> None:
        """Close the consumers."""
        for consumer in self.consumers.values():
            consumer.close()

    def markers_seen(self, timeout_s: float) -> int:
        """The highest marker every connector (``prefix`` and ``more_prefixes``) has produced within ``timeout_s``
        (0: none)."""
        readers: dict[str, Callable[[bytes], bytes]] = {self.prefix: bytes, **self.more_prefixes}
        seen = dict.fromkeys(readers, 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and min(seen.values()) < self.marker:
            for prefix, read in readers.items():
                if seen[prefix] >= self.marker:
                    continue
                message = self.consumer(f"{prefix}.{self.database}.cdc_marker").poll(0.5 / len(readers))
                if message is not None and message.error() is None and (key := message.key()) is not None:
                    seen[prefix] = max(seen[prefix], json.loads(read(key))["payload"]["id"])
        return min(seen.values())

    def wait_for_snapshots(self, table: str, timeout_s: float = 180) -> None:
        """Wait until every connector has produced a record of ``table`` (which has rows before the snapshot): a
        connector fixes its snapshot's binlog position before it reads any row, so what is written after this is
        streamed to every connector, never read by one connector's snapshot and streamed to another's."""
        deadline = time.monotonic() + timeout_s
        for prefix in (self.prefix, *self.more_prefixes):
            topic = f"{prefix}.{self.database}.{table}"
            while (message := self.consumer(topic).poll(0.5)) is None or message.error() is not None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no record on {topic} in {timeout_s}s: {self.worker.status(prefix)}\n"
                                         f"{self.worker.log_tail()}")

    def wait_for_marker(self, sql: PsycopgLike, timeout_s: float = 180) -> None:
        """Write the next marker row and wait until the connector has produced it (and so all before it); with
        ``snapshot.mode=no_data`` only rows written once it streams come through, so the first wait writes markers
        until one does."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.marker += 1
            sql.execute("INSERT INTO cdc_marker VALUES (%s)", [self.marker])
            if self.markers_seen(3) >= self.marker:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"marker {self.marker} not produced in {timeout_s}s: "
                                     f"{[self.worker.status(p) for p in (self.prefix, *self.more_prefixes)]}\n"
                                     f"{self.worker.log_tail()}")


def _float32(value: Any) -> float:
    """A FLOAT as MariaDB prints it: its 32-bit value to 6 significant digits (FLT_DIG). MariaDB's SELECT, and so
    Debezium's snapshot (read over JDBC), give those 6 digits; the binlog gives the whole 32-bit value."""
    if not isinstance(value, float):
        raise TypeError("expected a double")
    return float(f"{struct.unpack('f', struct.pack('f', value))[0]:.6g}")


def _duration_text(value: dt.timedelta) -> str:
    """A TIME (pymysql's timedelta) as the project's ``[-]HH:mm:ss.SSSSSS``."""
    micros = abs(value) // dt.timedelta(microseconds=1)
    sign = "-" if value < dt.timedelta(0) else ""
    return (f"{sign}{micros // 3600_000000:02d}:{micros // 60_000000 % 60:02d}:{micros // 1_000000 % 60:02d}"
            f".{micros % 1_000000:06d}")


def utc_datetime(value: dt.datetime) -> dt.datetime:
    """A TIMESTAMP read in the session's time zone (UTC) as an instant."""
    return value.replace(tzinfo=UTC)


ALLTYPES_EXPECTED: dict[str, h.Normaliser] = {
    "c_bigint_u": Decimal, "c_bit1": lambda v: v != b"\x00", "c_float": _float32, "c_time": _duration_text,
    "c_time6": _duration_text, "c_ts6": utc_datetime,
}


_INTEGERS = ("id", "c_bool", "c_tinyint", "c_tinyint_u", "c_smallint", "c_smallint_u", "c_mediumint", "c_mediumint_u",
             "c_int", "c_int_u", "c_bigint", "c_year")


ALLTYPES_ACTUAL: dict[str, h.Normaliser] = {
    **{c: h.typed(int) for c in _INTEGERS},
    "c_bigint_u": h.decimal_value, "c_bit1": h.typed(bool), "c_bit12": h.typed(bytes), "c_bit64": h.typed(bytes),
    "c_dec": h.decimal_value, "c_dec0": h.decimal_value, "c_dec_wide": h.decimal_value, "c_dec65": h.decimal_text,
    "c_float": _float32, "c_double": h.as_float,
    **{c: h.typed(str) for c in ("c_char", "c_varchar", "c_text", "c_json", "c_enum", "c_set", "c_time", "c_time6")},
    **{c: h.typed(bytes) for c in ("c_blob", "c_varbinary", "c_binary")},
    "c_date": h.typed(dt.date), "c_dt": h.naive_timestamp, "c_dt3": h.naive_timestamp, "c_dt6": h.naive_timestamp,
    "c_ts6": h.instant,
}
