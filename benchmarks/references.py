"""Reference implementations of the merge path, run beside the project's merge job by the throughput benchmark.

Each reads every partition of a topic of Debezium PostgreSQL change events (JSON without schema wrapper,
key ``{"id": ...}``, a tombstone after each delete) from offset 0 to the high watermarks seen at the start,
in micro-batches of at most ``batch`` records, folds each batch to the latest event per key (greatest
``source.lsn``) and MERGEs it into a Delta table:

- ``run_no_spark``: confluent-kafka, pyarrow JSON parse and a pyarrow sort-based fold, delta-rs MERGE; no Spark.
- ``run_spark_fold``: confluent-kafka, Spark ``from_json`` and ``row_number()`` over a window, delta-rs MERGE.
- ``run_plain_spark``: what a Spark user writes: Structured Streaming's Kafka source (``maxOffsetsPerTrigger``,
  ``Trigger.AvailableNow``), ``foreachBatch`` with ``from_json``, ``row_number()`` over a window and a
  delta-spark ``MERGE``; no confluent-kafka, no delta-rs.
- ``run_declarative_pipeline``: Spark Declarative Pipelines (``pyspark.pipelines``): a streaming view over the
  Kafka source and ``create_auto_cdc_flow`` (SCD1, keys ``id``, ``sequence_by`` the LSN, deletes by op) into a
  Delta streaming table, run by ``spark-pipelines run``.

Each returns the seconds per stage summed over the batches, ``total_s`` (first poll to the last committed
Delta version, table creation included) and ``batches``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from confluent_kafka import Consumer, KafkaException, TopicPartition
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

ROW = pa.struct([("id", pa.int64()), ("balance", pa.int64()), ("owner", pa.string()), ("status", pa.string()),
                 ("seq", pa.int64())])
TABLE_SCHEMA = pa.schema(list(ROW))
# Only the fields the fold needs; the reader skips the rest of the envelope.
ENVELOPE = pa.schema([("after", ROW), ("source", pa.struct([("lsn", pa.int64())])), ("op", pa.string())])
KEY = pa.schema([("id", pa.int64())])

SPARK_ROW = "STRUCT<id: BIGINT, balance: BIGINT, owner: STRING, status: STRING, seq: BIGINT>"
SPARK_ENVELOPE = (
    f"before {SPARK_ROW}, after {SPARK_ROW}, "
    "source STRUCT<version: STRING, connector: STRING, name: STRING, ts_ms: BIGINT, snapshot: STRING, db: STRING, "
    "schema: STRING, table: STRING, txId: BIGINT, lsn: BIGINT, xmin: BIGINT>, "
    "op STRING, ts_ms BIGINT, transaction STRUCT<id: STRING, total_order: BIGINT, data_collection_order: BIGINT>"
)

Fold = Callable[[pa.Table, dict[str, float]], pa.Table]


def run_no_spark(bootstrap: str, topic: str, batch: int, target: str,
                 storage_options: Mapping[str, str] | None = None) -> dict[str, float]:
    """No Spark at all: confluent-kafka consume, pyarrow JSON parse, pyarrow fold, delta-rs MERGE
    (``storage_options``: delta-rs's, for a ``target`` on object storage).

    Stages: ``consume_s``, ``parse_fold_s``, ``merge_commit_s``.
    """
    return _run(bootstrap, topic, batch, target, _fold_arrow, storage_options)


def run_spark_fold(spark: SparkSession, bootstrap: str, topic: str, batch: int, target: str,
                   storage_options: Mapping[str, str] | None = None) -> dict[str, float]:
    """Spark parse + fold written plainly (default settings): createDataFrame from the Arrow raw records,
    from_json with the full envelope schema, row_number() over a window partitioned by key ordered by
    source.lsn desc, keep rn == 1, toArrow, delta-rs MERGE.

    Stages: ``consume_s``, ``to_spark_s``, ``parse_fold_to_arrow_s`` (Spark is lazy: the parse and fold run
    inside ``toArrow``, as in the project's job), ``merge_commit_s``.
    """

    def fold(raw: pa.Table, stages: dict[str, float]) -> pa.Table:
        with _timed(stages, "to_spark_s"):
            records = spark.createDataFrame(raw)
        with _timed(stages, "parse_fold_to_arrow_s"):
            events = records.where(F.col("value").isNotNull()).select(
                F.from_json(F.col("key").cast("string"), "id BIGINT")["id"].alias("id"),
                F.from_json(F.col("value").cast("string"), SPARK_ENVELOPE).alias("e"))
            newest_first = Window.partitionBy("id").orderBy(F.col("e.source.lsn").desc())
            return (events.withColumn("rn", F.row_number().over(newest_first))
                    .where(F.col("rn") == 1)
                    .select("id", "e.after.balance", "e.after.owner", "e.after.status", "e.after.seq", "e.op")
                    .toArrow())

    return _run(bootstrap, topic, batch, target, fold, storage_options)


COLUMNS = ("balance", "owner", "status", "seq")


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka connector and its dependencies, as ``scripts/setup`` fetched them on request."""
    from cdc_assets.io.spark import extra_jars_dir, fetch_command

    directory = extra_jars_dir("spark-kafka")
    jars = sorted(str(jar) for jar in directory.glob("*.jar"))
    if not jars:
        raise SystemExit(f"no Spark Kafka connector in {directory}: run `{fetch_command('spark-kafka')}`")
    return jars


def run_plain_spark(spark: SparkSession, bootstrap: str, topic: str, batch: int, target: str,
                    checkpoint: str) -> dict[str, float]:
    """The canonical Spark pattern: a Kafka stream (``maxOffsetsPerTrigger`` = ``batch``, ``availableNow``),
    ``foreachBatch``: ``from_json``, the newest event per key by ``row_number()`` over a window, and a
    delta-spark MERGE (delete on ``d``, else update or insert). Spark's default settings otherwise.

    Stages: ``create_table_s``, ``stream_s`` (the stream's start to its end: read, parse, fold and MERGE
    overlap inside Spark), of which ``merge_commit_s`` (inside ``foreachBatch``).
    """
    from delta.tables import DeltaTable as SparkDeltaTable

    stages: dict[str, float] = {}
    batches = 0
    started = time.perf_counter()
    with _timed(stages, "create_table_s"):
        (SparkDeltaTable.createIfNotExists(spark).location(target)
         .addColumns(T.StructType([T.StructField("id", T.LongType()), T.StructField("balance", T.LongType()),
                                   T.StructField("owner", T.StringType()), T.StructField("status", T.StringType()),
                                   T.StructField("seq", T.LongType())])).execute())
    target_table = SparkDeltaTable.forPath(spark, target)

    def merge(frame: DataFrame, batch_id: int) -> None:
        nonlocal batches
        with _timed(stages, "merge_commit_s"):
            events = frame.where(F.col("value").isNotNull()).select(
                F.from_json(F.col("key").cast("string"), "id BIGINT")["id"].alias("id"),
                F.from_json(F.col("value").cast("string"), SPARK_ENVELOPE).alias("e"))
            newest_first = Window.partitionBy("id").orderBy(F.col("e.source.lsn").desc())
            newest = (events.withColumn("rn", F.row_number().over(newest_first)).where(F.col("rn") == 1)
                      .select("id", "e.after.balance", "e.after.owner", "e.after.status", "e.after.seq", "e.op"))
            values = {"id": "s.id", **{c: f"s.{c}" for c in COLUMNS}}
            (target_table.alias("t").merge(newest.alias("s"), "t.id = s.id")
             .whenMatchedDelete("s.op = 'd'")
             .whenMatchedUpdate("s.op != 'd'", set={c: f"s.{c}" for c in COLUMNS})
             .whenNotMatchedInsert("s.op != 'd'", values=values)
             .execute())
        batches += 1

    with _timed(stages, "stream_s"):
        query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", str(batch)).load()
                 .writeStream.foreachBatch(merge).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    stages["total_s"] = time.perf_counter() - started
    stages["batches"] = batches
    return stages


PIPELINE_SPEC = """\
name: w1_auto_cdc
storage: {storage}
configuration:
{configuration}
libraries:
  - glob:
      include: transformations/**
"""

PIPELINE_DEFINITIONS = """\
from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()


@dp.temporary_view()
def w1_events():
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", {bootstrap!r})
            .option("subscribe", {topic!r}).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", {batch!r}).load()
            .where(F.col("value").isNotNull())
            .select(F.from_json(F.col("key").cast("string"), "id BIGINT")["id"].alias("id"),
                    F.from_json(F.col("value").cast("string"), {envelope!r}).alias("e"))
            .select("id", "e.after.balance", "e.after.owner", "e.after.status", "e.after.seq", "e.op",
                    F.col("e.source.lsn").alias("lsn")))


dp.create_streaming_table("accounts", format="delta")
dp.create_auto_cdc_flow(target="accounts", source="w1_events", keys=["id"], sequence_by="lsn",
                        apply_as_deletes="op = 'd'", except_column_list=["op", "lsn"], stored_as_scd_type=1)
"""


def run_declarative_pipeline(bootstrap: str, topic: str, batch: int, work: Path) -> tuple[dict[str, float], str]:
    """Spark Declarative Pipelines: ``spark-pipelines run`` of a spec whose one Python file defines a
    streaming view over the Kafka topic and ``create_auto_cdc_flow`` (SCD1, keys ``id``, ``sequence_by``
    the LSN, ``apply_as_deletes`` op ``d``) into a Delta streaming table. Its stages and the table's path.
    A run that fails raises ``SystemExit`` with the CLI's output (the error is the finding).
    """
    from cdc_assets.io.spark import delta_jars

    pipeline = work / "pipeline"
    (pipeline / "transformations").mkdir(parents=True)
    warehouse = work / "warehouse"
    configuration = {"spark.sql.warehouse.dir": str(warehouse), "spark.sql.session.timeZone": "UTC",
                     "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                     "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
    (pipeline / "spark-pipeline.yml").write_text(PIPELINE_SPEC.format(
        storage=(work / "pipeline-storage").as_uri(),
        configuration="".join(f"  {key}: {value}\n" for key, value in configuration.items())))
    (pipeline / "transformations" / "w1.py").write_text(PIPELINE_DEFINITIONS.format(
        bootstrap=bootstrap, topic=topic, batch=str(batch), envelope=SPARK_ENVELOPE))
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    jars = ",".join([*delta_jars().split(","), *spark_kafka_jars()])
    # On the driver's class path: ``--jars`` alone leaves Delta's catalog out of reach of the
    # Spark Connect server that ``spark-pipelines`` starts (``Cannot find catalog plugin class``).
    command = [str(spark_home / "bin" / "spark-pipelines"), "--jars", jars,
               "--driver-class-path", jars.replace(",", os.pathsep),
               "--conf", "spark.ui.enabled=false", "--conf", f"spark.sql.warehouse.dir={warehouse}",
               "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
               "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
               "run", "--spec", str(pipeline / "spark-pipeline.yml")]
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=pipeline, env=env)
    elapsed = time.perf_counter() - started
    (work / "spark-pipelines.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"spark-pipelines run failed ({done.returncode}):\n"
                         f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return {"total_s": elapsed}, str(warehouse / "accounts")


@contextmanager
def _timed(stages: dict[str, float], stage: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - started


def _run(bootstrap: str, topic: str, batch: int, target: str, fold: Fold,
         storage_options: Mapping[str, str] | None = None) -> dict[str, float]:
    """Consume, fold and merge batch after batch until the topic's high watermarks; the stage seconds."""
    stages: dict[str, float] = {}
    batches = 0
    with _TopicReader(bootstrap, topic) as reader:
        started = time.perf_counter()
        with _timed(stages, "merge_commit_s"):
            table = DeltaTable.create(target, schema=TABLE_SCHEMA, storage_options=dict(storage_options or {}))
        while not reader.caught_up():
            with _timed(stages, "consume_s"):
                raw = reader.read(batch)
            rows = fold(raw, stages)
            with _timed(stages, "merge_commit_s"):
                _merge(table, rows)
            batches += 1
        stages["total_s"] = time.perf_counter() - started
    stages["batches"] = batches
    return stages


class _TopicReader:
    """One consumer assigned to every partition of ``topic`` from offset 0, up to the high watermarks at start."""

    def __init__(self, bootstrap: str, topic: str):
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-reference",
                                   "enable.auto.commit": False})
        partitions = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._high = {p: self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                      for p in partitions}
        self._next = dict.fromkeys(self._high, 0)
        self._consumer.assign([TopicPartition(topic, p, 0) for p in self._high])

    def caught_up(self) -> bool:
        return all(self._next[p] >= high for p, high in self._high.items())

    def read(self, batch: int) -> pa.Table:
        """The next at most ``batch`` records (tombstones included) as a table of binary ``key`` and ``value``."""
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        while len(keys) < batch and not self.caught_up():
            # Never ask for more than the batch has room for, so no record is held over to the next batch.
            for message in self._consumer.consume(min(10_000, batch - len(keys)), timeout=1.0):
                if message.error() is not None:
                    raise KafkaException(message.error())
                keys.append(message.key())
                values.append(message.value())
                self._next[message.partition()] = message.offset() + 1
        return pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())})

    def __enter__(self) -> _TopicReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._consumer.close()


def _fold_arrow(raw: pa.Table, stages: dict[str, float]) -> pa.Table:
    """The newest event per key (greatest ``source.lsn``): the row's columns, id from the key, and ``op``."""
    with _timed(stages, "parse_fold_s"):
        events = raw.filter(pc.is_valid(raw["value"]))
        keys = _read_json(events["key"], KEY)
        envelopes = _read_json(events["value"], ENVELOPE)
        parsed = pa.table({"id": keys["id"], "lsn": pc.struct_field(envelopes["source"], "lsn"),
                           "op": envelopes["op"], "after": envelopes["after"]})
        ordered = parsed.sort_by([("id", "ascending"), ("lsn", "ascending")])
        # The last event of each run of equal ids is that key's newest.
        last_of_key = pc.fill_null(pc.not_equal(pc.pairwise_diff(ordered["id"].combine_chunks(), period=-1), 0), True)
        newest = ordered.filter(last_of_key)
        # A delete has no ``after``, so the id comes from the key.
        return (pa.Table.from_struct_array(newest["after"]).set_column(0, "id", newest["id"])
                .append_column("op", newest["op"]))


def _read_json(values: pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """Parse JSON values (no nulls) with ``schema``, ignoring fields it does not name."""
    values = values.combine_chunks()
    if len(values) == 0:  # read_json refuses empty input
        return schema.empty_table()
    lines = pc.binary_join(pa.ListArray.from_arrays([0, len(values)], values), b"\n")[0].as_buffer()
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(pa.BufferReader(lines), parse_options=options)


def _merge(table: DeltaTable, rows: pa.Table) -> None:
    """Apply the folded rows: a delete removes the key's row, any other op upserts it."""
    if rows.num_rows == 0:
        return
    (table.merge(source=rows, predicate="t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate="s.op = 'd'")
     .when_matched_update_all(predicate="s.op != 'd'", except_cols=["op"])
     .when_not_matched_insert_all(predicate="s.op != 'd'", except_cols=["op"])
     .execute())
