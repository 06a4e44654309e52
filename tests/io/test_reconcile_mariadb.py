"""rows_match_source's comparison on a real MariaDB: its SQL gives MariaDB's values the canonical texts Spark
gives the Delta values Debezium's MariaDB events land in; the position is the snapshot's binlog coordinates."""

from __future__ import annotations

import math
import random
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.reconcile import ComparedColumn, value_text
from cdc_assets.io.delta import CommitRequest, DeltaRsWriter, DeltaTarget
from cdc_assets.io.reconcile import DeltaSide, open_source, reconcile
from tests.support.reconcile import EDGE_DOUBLES, NOTHING_IN_FLIGHT

CREATE = """
CREATE TABLE {db}.items (
    id INT, code VARCHAR(10), name VARCHAR(50) NULL, amount DECIMAL(10, 2), units DECIMAL(12, 0),
    seen DATETIME(6), at TIMESTAMP(6) NULL, born DATE, data VARBINARY(8), clock TIME(6), price DOUBLE,
    PRIMARY KEY (id, code))
"""
DELTA_SCHEMA = pa.schema([
    ("id", pa.int64()), ("code", pa.string()), ("name", pa.string()), ("amount", pa.decimal128(38, 2)),
    ("units", pa.decimal128(38, 0)), ("seen", pa.timestamp("us")), ("at", pa.timestamp("us", tz="UTC")),
    ("born", pa.date32()), ("data", pa.binary()), ("clock", pa.string()), ("price", pa.float64()),
    ("_cdc_op", pa.string()), ("_cdc_position", pa.string()), ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
])


def row(i: int) -> dict[str, Any]:
    return {"id": i, "code": ["a", "b'c"][i % 2], "name": None if i % 5 == 0 else f"näme {i}",
            "amount": Decimal(i) / 4, "units": Decimal(i * 100), "seen": datetime(2024, 2, 29, 23, 59, i % 60, 7 * i),
            "at": datetime(2024, 3, 1, 1, 2, 3, 400000 + i, tzinfo=timezone.utc), "born": date(1999, 12, 1 + i % 28),
            "data": bytes([i, 0, 254]), "clock": f"{i:02d}:00:01.000250", "price": i / 7}


def test_mariadb_equal_tables_pass_and_drift_is_named(mariadb: Any, spark: SparkSession, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    db = f"recon_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(CREATE.format(db=db))
    rows = [row(i) for i in range(1, 61)]
    with mariadb.connect(db) as connection, connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+00:00'")
        cursor.executemany(f"INSERT INTO items ({', '.join(rows[0])}) VALUES ({', '.join(['%s'] * len(rows[0]))})",
                           [tuple(r.values()) for r in rows])
    target = DeltaTarget(str(tmp_path / "items"))
    delta_rows = [{**r, "_cdc_op": "r", "_cdc_position": "0" * 104, "_cdc_source_ts": None} for r in rows]
    DeltaRsWriter().merge(target, pa.Table.from_pylist(delta_rows, schema=DELTA_SCHEMA), ["id", "code"],
                          CommitRequest("cdc_assets:m", 1, "m", {0: 1}), apply_mode("scd1"))

    def check() -> Any:
        source = open_source("mariadb", f"mariadb://{mariadb.user}:{mariadb.password}@{mariadb.host}:"
                                        f"{mariadb.port}/{db}")
        delta = DeltaSide(spark, target.path, apply_mode("scd1"))
        try:
            return reconcile(source, delta, f"{db}.items", ["id", "code"], buckets=8, reached=NOTHING_IN_FLIGHT,
                             poll_s=0.2)
        finally:
            delta.close()
            source.close()

    result = check()
    assert result.left_out == [] and "price" in result.columns
    assert result.passed and result.source_rows == result.delta_rows == 60, result
    assert result.first_position.strip().startswith("mariadb-bin") or result.first_position.strip()
    DeltaTable(target.path).delete("id = 7")
    DeltaTable(target.path).update(updates={"units": "CAST(1 AS DECIMAL(38, 0))"}, predicate="id = 8")
    result = check()
    found = {(d.kind, d.display) for bucket in result.drifted for d in bucket.differences}
    assert found == {("missing", "7, b'c"), ("different", "8, a")}, result
    # The repair's WHERE (``DriftedRanges.condition``) in MariaDB's SQL selects exactly those keys, or their buckets.
    ranges = result.drifted_ranges()
    with mariadb.connect(db) as connection, connection.cursor() as cursor:
        for condition in (ranges.condition("mysql"), ranges.condition("mysql", fits=lambda c: "IN ((" not in c)):
            cursor.execute(f"SELECT id, code FROM items WHERE {condition}")
            selected = set(cursor.fetchall())
            assert selected >= {(7, "b'c"), (8, "a")} and (condition == ranges.condition("mysql")) == (
                selected == {(7, "b'c"), (8, "a")}), (condition, selected)


def test_a_double_reads_as_its_exact_binary_value_in_mariadb_as_in_spark(mariadb: Any, spark: SparkSession) -> None:
    """MariaDB has neither a double's bits nor a hexadecimal format: its SQL computes them, and must give every
    double (subnormals, the extremes, doubles of every magnitude) Spark's text of it."""
    rng = random.Random(59)
    finite = [v for v in EDGE_DOUBLES if v is None or math.isfinite(v)]  # MariaDB has no NaN nor infinities
    values = finite + [rng.uniform(-1e9, 1e9) for _ in range(300)] + \
        [rng.uniform(-1, 1) * 10.0 ** rng.randint(-307, 307) for _ in range(300)]
    db = f"doubles_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(f"CREATE TABLE {db}.d (id INT PRIMARY KEY, v DOUBLE)")
    column = ComparedColumn("v", "double", "double")
    with mariadb.connect(db) as connection, connection.cursor() as cursor:
        cursor.executemany("INSERT INTO d VALUES (%s, %s)", list(enumerate(values)))
        connection.commit()
        cursor.execute(f"SELECT id, {value_text(column, 'mysql')} FROM d")
        in_mariadb = dict(cursor.fetchall())
    frame = spark.createDataFrame(list(enumerate(values)), T.StructType([T.StructField("id", T.LongType()),
                                                                        T.StructField("v", T.DoubleType())]))
    in_spark: dict[int, str | None] = dict(frame.selectExpr("id", value_text(column, "spark")).collect())
    assert len(in_spark) == len(values) and in_mariadb.keys() == in_spark.keys()
    differing = [(i, values[i], in_mariadb[i], in_spark[i]) for i in in_spark if in_mariadb[i] != in_spark[i]]
    assert differing == [], f"{len(differing)} differ (id, value, MariaDB's text, Spark's): {differing[:10]}"
    assert in_mariadb[0] == "0x1.751c657cc6dfap31" and in_mariadb[finite.index(5e-324)] == "0x0.0000000000001p-1022"
