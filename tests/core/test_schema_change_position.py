"""The position rule read in Python (``source_position_of``, for schema-change events) equals the Spark rule
(``source_position``, for change events) on the sources of every connector kind."""

import json

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.core.position import source_position, source_position_of

SOURCE = T.StructType([T.StructField(name, kind) for name, kind in [
    ("lsn", T.LongType()), ("sequence", T.StringType()), ("commit_lsn", T.StringType()),
    ("change_lsn", T.StringType()), ("event_serial_no", T.LongType()), ("ts_ms", T.LongType()),
    ("ord", T.LongType()), ("file", T.StringType()), ("pos", T.LongType()), ("row", T.LongType()),
    ("commit_scn", T.StringType()), ("scn", T.StringType())]])

SOURCES = [
    ("postgresql", {"lsn": 24023128}),
    ("postgresql", {"sequence": '["24023000","24023128"]'}),
    ("postgresql", {}),
    ("sqlserver", {"commit_lsn": "00000027:00000758:0005", "change_lsn": "00000027:00000758:0003",
                   "event_serial_no": 2}),
    ("sqlserver", {"commit_lsn": "0005", "change_lsn": None}),
    ("db2", {"commit_lsn": "00000025:00000d98:00a2", "change_lsn": None}),
    ("db2", {"change_lsn": "00000026:00000001:0001"}),
    ("mongodb", {"ts_ms": 1558965508000, "ord": 3}),
    ("mysql", {"file": "mysql-bin.000003", "pos": 154, "row": 0}),
    ("mariadb", {"file": "mariadb-bin.000012", "pos": 98765, "row": 2}),
    ("mysql", {}),
    ("oracle", {"commit_scn": "12345678901234567890123", "scn": "12345678901234567890001"}),
    ("oracle", {"scn": "289"}),
]


@pytest.mark.parametrize(("kind", "source"), SOURCES)
def test_python_position_equals_the_spark_rule(spark, kind, source):
    frame = spark.createDataFrame([(json.dumps(source),)], "source string").select(
        F.from_json("source", SOURCE).alias("source"))
    [row] = frame.select(source_position(F.col("source"), kind).alias("position")).collect()
    assert source_position_of(source, kind) == row["position"]


def test_python_positions_order_as_the_source():
    first = source_position_of({"file": "mariadb-bin.000009", "pos": 98765}, "mariadb")
    later_pos = source_position_of({"file": "mariadb-bin.000009", "pos": 100000}, "mariadb")
    later_file = source_position_of({"file": "mariadb-bin.000010", "pos": 4}, "mariadb")
    assert first < later_pos < later_file
