"""The Spark session settings and the hand-over of Kafka records to Spark."""

import os
import subprocess
import sys

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.io.spark import (
    CLASS_ARCHIVE_ENV_VAR,
    parsed_from_files,
    parsed_in_spark,
    spark_config,
    spark_records,
    without_schemas,
)
from cdc_assets.io.spark_server import jvm_environ

VALUE_TYPE = T.StructType([T.StructField("payload", T.StructType([T.StructField("op", T.StringType())])),
                           T.StructField("op", T.StringType()),
                           T.StructField("after", T.StructType([T.StructField("name", T.StringType())]))])
# (key, value): values the JSON reader must take as Debezium sends them or flag, keys of any bytes.
AWKWARD = [
    (b'{"id": 1}', b'{"op": "c", "after": {"name": "plain"}}'),
    (b'{"id": "say \\"hi\\" \\\\ there"}', b'{"schema": {}, "payload": {"op": "u"}}'),
    (None, b'{\n  "op": "r",\r\n  "after": {"name": "pretty-printed"}\n}'),
    (b"not json \x01 \x1e key", b'{"op": "c", "after": {"name": "caf\xc3\xa9 \xff"}}'),
    (b'{"id": 5}', b"not json"),
    (b'{"id": 6}', b""),
    (b'{"id": 7}', b"[1, 2]"),
    (b'{"id": 8}', b"null"),
    (b'{"id": 9}', b'{"op": "c", "after": "a string, not a row"}'),
    (b'{"id": 10}', b'{"op": "c", "after": {"name": "sep\x1einside"}}'),
    (b'{"id": 11}', b'{"op": "d"}'),
    (b'{"id": 12}', b"{}"),
    (b'{"id": 13}', b'{"op": "c"} trailing'),
]


def records_table(pairs, partitions=3):
    return pa.table({"partition": pa.array([i % partitions for i in range(len(pairs))], pa.int32()),
                     "offset": pa.array(range(100, 100 + len(pairs)), pa.int64()),
                     "key": pa.array([k for k, _ in pairs], pa.binary()),
                     "value": pa.array([v for _, v in pairs], pa.binary())})


def test_local_files_and_from_json_hand_over_the_same_records(spark, tmp_path):
    records = records_table(AWKWARD)
    from_files = parsed_from_files(spark, records, VALUE_TYPE, tmp_path).toArrow().sort_by("offset")
    in_spark = parsed_in_spark(spark, records, VALUE_TYPE).toArrow().sort_by("offset")
    assert from_files.to_pylist() == in_spark.to_pylist()
    rows = {row["offset"] - 100: row for row in from_files.to_pylist()}
    assert [rows[i]["partition"] for i in range(len(AWKWARD))] == [i % 3 for i in range(len(AWKWARD))]
    assert [rows[i]["key"] for i in range(len(AWKWARD))] == [
        None if k is None else k.decode("utf-8", "replace") for k, _ in AWKWARD]
    assert rows[0]["value"] == {"payload": None, "op": "c", "after": {"name": "plain"}}
    assert rows[1]["value"]["payload"] == {"op": "u"}
    assert rows[2]["value"]["after"] == {"name": "pretty-printed"}
    assert rows[3]["value"]["after"] == {"name": "caf\u00e9 \ufffd"}
    assert [rows[i]["value"] for i in (4, 5, 6, 7)] == [None] * 4  # not a JSON object
    assert rows[9]["value"] is None  # a raw control character: not JSON
    assert rows[10]["value"] == {"payload": None, "op": "d", "after": None}
    assert rows[11]["value"] == {"payload": None, "op": None, "after": None}  # an object, with no envelope field
    assert rows[12]["value"]["op"] == "c"  # as from_json reads it: the object, other text after it ignored


def test_records_in_many_chunks_hand_over_as_in_one(spark, tmp_path):
    """The Kafka source builds a batch of one chunk per consume call: its lines are written from
    each chunk in place, split across the per-core files without joining the chunks first."""
    records = records_table(AWKWARD)
    # Each record a chunk of its own (own buffers), as consume calls make them.
    chunked = pa.concat_tables([pa.Table.from_pylist(records.slice(i, 1).to_pylist(), schema=records.schema)
                                for i in range(records.num_rows)])
    assert chunked["value"].num_chunks == len(AWKWARD)
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one = parsed_from_files(spark, records, VALUE_TYPE, tmp_path / "one").toArrow().sort_by("offset")
    many = parsed_from_files(spark, chunked, VALUE_TYPE, tmp_path / "many").toArrow().sort_by("offset")
    assert many.to_pylist() == one.to_pylist()
    assert sorted(p.read_bytes() for p in (tmp_path / "many").iterdir()) == sorted(
        p.read_bytes() for p in (tmp_path / "one").iterdir())


def test_the_inexact_hand_over_differs_only_in_lines_the_reader_cannot_read(spark, tmp_path):
    records = records_table(AWKWARD)
    (tmp_path / "exact").mkdir()
    (tmp_path / "fast").mkdir()
    exact = parsed_from_files(spark, records, VALUE_TYPE, tmp_path / "exact").toArrow().sort_by("offset")
    fast = parsed_from_files(spark, records, VALUE_TYPE, tmp_path / "fast", exact=False).toArrow().sort_by("offset")
    assert fast["partition"] == exact["partition"] and fast["offset"] == exact["offset"]
    unread = [i for i, value in enumerate(fast["value"].to_pylist()) if value is None]
    assert unread == [4, 5, 6, 7, 9, 12]  # not objects, a raw control character, an object with text after it
    assert exact["value"][12].as_py()["op"] == "c"
    assert [row for i, row in enumerate(fast.to_pylist()) if i not in unread] == [
        row for i, row in enumerate(exact.to_pylist()) if i not in unread]


# JSON-converter values (schemas.enable=true): the schema is most of their bytes, and the reader never reads it.
SCHEMA_A = b'{"type": "struct", "name": "a,\\"payload\\":", "fields": [{"field": "payload", "type": "string"}]}'
SCHEMA_B = b'{"type":"struct","name":"b","fields":[{"field":"op","type":"string"},{"field":"x","type":"int32"}]}'
WITH_SCHEMAS = [
    (b'{"id": 1}', b'{"schema": ' + SCHEMA_A + b', "payload": {"op": "c", "after": {"name": "a"}}}'),
    (b'{"id": 2}', b' {\n "schema" : ' + SCHEMA_A + b' ,\n "payload" : {"op": "u"}}'),  # another spelling: kept
    (b'{"id": 3}', b'{"op": "r", "after": {"name": "no schema"}}'),
    (b'{"id": 4}', b'{"schema": ' + SCHEMA_A + b', "payload": {"op": "c", "after": {"name": 5'),  # cut short: bad
    (b'{"id": 5}', b'{"schema": {"type": "struct"}, "payload": {"op": "d"}}'),  # a third schema: kept
    (b'{"id": 6}', b'{"schema":' + SCHEMA_B + b',"payload":{"op":"u","after":{"name":"b"}}}'),
]


def test_without_schemas_drops_the_schemas_of_the_first_and_last_values():
    values = records_table(WITH_SCHEMAS)["value"]
    assert without_schemas(values).to_pylist() == [
        b'{"payload": {"op": "c", "after": {"name": "a"}}}',
        WITH_SCHEMAS[1][1],
        WITH_SCHEMAS[2][1],
        b'{"payload": {"op": "c", "after": {"name": 5',
        WITH_SCHEMAS[4][1],
        b'{"payload":{"op":"u","after":{"name":"b"}}}',
    ]
    plain = records_table(AWKWARD)["value"]  # neither its first nor its last value has a schema: nothing changes
    assert without_schemas(plain).to_pylist() == plain.to_pylist()


def test_values_are_handed_over_without_their_schemas(spark, tmp_path):
    records = records_table(WITH_SCHEMAS)
    from_files = parsed_from_files(spark, records, VALUE_TYPE, tmp_path).toArrow().sort_by("offset").to_pylist()
    handed_over = b"".join(path.read_bytes() for path in tmp_path.iterdir())
    assert SCHEMA_A not in handed_over.replace(WITH_SCHEMAS[1][1], b"") and SCHEMA_B not in handed_over
    assert from_files == parsed_in_spark(spark, records, VALUE_TYPE).toArrow().sort_by("offset").to_pylist()
    assert [row["value"] and row["value"]["payload"] for row in from_files] == [
        {"op": "c"}, {"op": "u"}, None, None, {"op": "d"}, {"op": "u"}]
    assert from_files[2]["value"]["after"] == {"name": "no schema"}


def test_spark_records_splits_a_batch_across_the_cores(spark):
    pairs = [(b'{"id": %d}' % i, b'{"op": "c", "after": {"name": "%s"}}' % (b"x" * 10_000)) for i in range(1000)]
    with spark_records(spark, records_table(pairs), VALUE_TYPE) as frame:
        assert frame.select(F.spark_partition_id()).distinct().count() == os.cpu_count()
        assert frame.where(F.col("value.after.name").isNotNull()).count() == 1000


def test_a_small_batch_is_one_partition_that_folds_without_a_shuffle(spark, capsys):
    # A small table's batch: one file and one task; a split and a shuffle would cost more than its parse.
    pairs = [(b'{"id": %d}' % i, b'{"op": "c", "after": {"name": "n%d"}}' % i) for i in range(1000)]
    with spark_records(spark, records_table(pairs), VALUE_TYPE) as frame:
        assert frame.select(F.spark_partition_id()).distinct().count() == 1
        frame.groupBy("key").agg(F.max("offset")).explain()
        assert "Exchange" not in capsys.readouterr().out
        assert frame.where(F.col("value.after.name").isNotNull()).count() == 1000


def test_class_archive_is_mapped_by_local_jvms_only(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(CLASS_ARCHIVE_ENV_VAR, str(archive))

    def maps_archive(settings):
        return "-XX:SharedArchiveFile=" in settings.get("spark.driver.extraJavaOptions", "")

    assert not maps_archive(spark_config(use_class_archive=True))  # no archive built yet
    archive.write_bytes(b"")
    assert maps_archive(spark_config(use_class_archive=True))
    local = spark_config(conf={"spark.driver.extraJavaOptions": "-Dmine=1"}, use_class_archive=True)
    assert local["spark.driver.extraJavaOptions"].startswith("-Dmine=1 -XX:SharedArchiveFile=" + str(archive))
    assert not maps_archive(spark_config(remote="sc://spark:15002", use_class_archive=True))
    assert not maps_archive(spark_config("spark://cluster:7077", use_class_archive=True))
    assert not maps_archive(spark_config(use_class_archive=False))
    assert not maps_archive(spark_config())  # the local Spark server's: it does not map it


def test_a_local_driver_heap_starts_at_512_mb_or_at_its_maximum_if_less():
    def heap_start(settings):
        return [option for option in settings.get("spark.driver.extraJavaOptions", "").split()
                if option.startswith("-Xms")]

    assert heap_start(spark_config()) == ["-Xms512m"]
    assert heap_start(spark_config("spark://cluster:7077", conf={"spark.driver.memory": "4g"})) == ["-Xms512m"]
    small = spark_config(conf={"spark.driver.memory": "256mb"})
    assert heap_start(small) == ["-Xms256m"]
    assert heap_start(spark_config(conf={"spark.driver.extraJavaOptions": "-Xms1g -Dmine=1"})) == ["-Xms1g"]
    assert heap_start(spark_config(remote="sc://spark:15002")) == []
    # The JVM starts with the options a small driver gets (a start above its maximum would stop it).
    java = subprocess.run(["java", "-Xmx256m", *small["spark.driver.extraJavaOptions"].split(), "-version"],
                          capture_output=True, text=True)
    assert java.returncode == 0, java.stderr


# A local JVM session (a process is a Spark Connect client or runs Spark itself: not this one) runs
# more queries than the status store may keep and reports how many it keeps.
_RETAINED_PROBE = """
import time
from pyspark.sql import SparkSession
from cdc_assets.io.spark import spark_config
spark = SparkSession.builder.config(map=spark_config()).getOrCreate()
for n in range(25):
    spark.range(n + 1).selectExpr("sum(id)").collect()
store = spark._jsparkSession.sharedState().statusStore()
deadline = time.monotonic() + 30
while store.executionsCount() > 10 and time.monotonic() < deadline:
    time.sleep(0.2)  # the store drops old executions in the background
print("RETAINED", store.executionsCount(), flush=True)
"""


def test_the_status_store_keeps_only_the_last_few_queries():
    """A long-lived local server must not keep every query's plan for a UI that is off: its live heap
    grew with them until every collection was a full one."""
    probe = subprocess.run([sys.executable, "-c", _RETAINED_PROBE], capture_output=True, text=True, timeout=300,
                           env=jvm_environ())
    retained = [line for line in probe.stdout.splitlines() if line.startswith("RETAINED")]
    assert retained, probe.stderr[-2000:]
    assert int(retained[0].split()[1]) <= 10
