"""Spark session settings and the hand-over of Kafka records: local Spark by default, a cluster master or Spark
Connect by config."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyspark
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_assets.core.arrow import is_spark_connect
from cdc_assets.core.layout import schema_prefix
from cdc_assets.io.spark_server import small_batch_session
from cdc_assets.io.storage import StorageConfigError, spark_settings, store_of

DELTA_JARS_ENV_VAR = "CDC_DELTA_SPARK_JARS"
CLASS_ARCHIVE_ENV_VAR = "CDC_SPARK_CLASS_ARCHIVE"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")

# Settings for a small machine and short batches; any of them can be overridden in config.
EMBEDDED_DEFAULTS: dict[str, str] = {
    "spark.app.name": "cdc-assets",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # One shuffle partition per core: a 100k-record batch folds fastest without idle splits.
    "spark.sql.shuffle.partitions": str(os.cpu_count() or 2),
    # Delta rebuilds a table's file list after each commit in 50 partitions unless told: for the tables of
    # short batches that is 50 tasks of nothing each, 4x the server CPU of a small MERGE (docs/tuning.md).
    "spark.databricks.delta.snapshotPartitions": str(os.cpu_count() or 2),
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # A 100k-record batch needs far less than Spark's 1g (figures: docs/tuning.md).
    "spark.driver.memory": "768m",
    # Batches make short-lived garbage: a large young generation collected by 2 threads, with fixed
    # survivor spaces so that a batch in flight at a collection is not promoted (docs/tuning.md). The heap's
    # start is set too (``_with_heap_start``).
    JAVA_OPTIONS: "-XX:+UseParallelGC -XX:ParallelGCThreads=2 -Xmn200m -XX:-UseAdaptiveSizePolicy -XX:SurvivorRatio=6",
    # The UI is off, yet Spark's status store keeps the last 1,000 SQL executions (plans included),
    # which fills the long-lived local server's old generation (docs/tuning.md).
    "spark.sql.ui.retainedExecutions": "10",
    "spark.ui.retainedJobs": "10",
    "spark.ui.retainedStages": "10",
    "spark.ui.retainedTasks": "100",
    # PySpark records the Python call site of every column expression it builds, for error messages:
    # thousands of stack walks per batch.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


def spark_config(master: str = "local[*]", remote: str | None = None,
                 conf: Mapping[str, str] | None = None, use_class_archive: bool = False,
                 delta_root: str = "", storage_options: Mapping[str, str] | None = None,
                 writer: str = "delta-spark") -> dict[str, str]:
    """The full Spark config for a session: embedded defaults, Delta jars if named, the file-system
    settings of the store ``delta_root`` is on (``storage.spark_settings``), then ``conf``.

    ``remote`` (a Spark Connect URL) replaces ``master``. Any other session gets Delta: the jars of
    ``delta_jars`` on its classpath, with Delta's SQL extension and catalog, and the store's connector
    jars (``object_store_jars``) when the tables are on object storage and Spark writes them (``writer``,
    the config's ``delta.writer``: see ``spark_writes_delta``).
    ``use_class_archive``: a local JVM started in this process maps the class archive
    (``cdc_assets.io.class_archive``) when there is one. The local Spark server does not: it starts
    once and serves many runs, while the archive, relocated in memory, would hold its memory for as
    long as it lives.
    """
    settings = dict(EMBEDDED_DEFAULTS)
    if remote:
        settings = {"spark.remote": remote, "spark.sql.session.timeZone": "UTC"}
    else:
        settings["spark.master"] = master
        jars = delta_jars()
        if jars:
            store_jars = object_store_jars(delta_root) if spark_writes_delta(writer, master, remote) else ""
            settings.update(jar_settings(master, ",".join(filter(None, [jars, store_jars]))))
            settings["spark.sql.extensions"] = DELTA_EXTENSION
            settings["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    settings.update(spark_settings(delta_root, storage_options or {}, session_level=bool(remote)))
    settings.update(conf or {})
    archive = class_archive_path()
    if not remote and use_class_archive and runs_on_this_machine(master) and archive.exists():
        options = settings.get(JAVA_OPTIONS, "")
        # -Xshare:auto: a JVM that no longer matches the archive ignores it (and says nothing: cds=off).
        settings[JAVA_OPTIONS] = f"{options} -XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off".strip()
    return settings if remote else _with_heap_start(settings)


HEAP_START_MB = 512
_MEMORY_UNITS_MB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _with_heap_start(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with the driver JVM's heap starting at ``HEAP_START_MB``, or at ``spark.driver.memory`` when
    that is less (a start above the maximum stops the JVM), unless its Java options set a start. With the sizes
    of the generations fixed the collector did not grow the heap, and the JVM's own start, 1/64 of the machine's
    memory, left too small an old generation (docs/tuning.md)."""
    out = dict(settings)
    options = out.get(JAVA_OPTIONS, "")
    size = re.fullmatch(r"(\d+)([kmgt])?b?", out.get("spark.driver.memory", "768m").strip().lower())
    if size is None or re.search(r"(^|\s)-Xms", options):
        return out
    start = min(HEAP_START_MB, int(int(size[1]) * _MEMORY_UNITS_MB[size[2] or "m"]))
    if start >= 1:
        out[JAVA_OPTIONS] = f"{options} -Xms{start}m".strip()
    return out


def new_session(settings: Mapping[str, str]) -> SparkSession:
    """A Spark session for ``settings`` (``spark_config``'s): a Spark Connect session when they name
    ``spark.remote``, else one in this process's own JVM, started if none runs."""
    remote = settings.get("spark.remote")
    if remote:
        return SparkSession.builder.remote(remote).config(
            map={k: v for k, v in settings.items() if k != "spark.remote"}).create()
    return SparkSession.builder.config(map=dict(settings)).getOrCreate()


def jar_settings(master: str, jars: str) -> dict[str, str]:
    """The settings that give a session of ``master`` the comma-separated ``jars``. A local master's executors run
    in the driver's JVM, so the jars go on its classpath (``spark.driver.extraClassPath``): Spark copies each jar
    of ``spark.jars`` into the JVM's temporary directory, 672 MB with the AWS SDK bundle, and a killed JVM leaves
    the copy behind. A cluster's executors get them through ``spark.jars``."""
    if not jars:
        return {}
    if master.split("[", 1)[0] == "local":  # not local-cluster[...], whose executors are JVMs of their own
        return {"spark.driver.extraClassPath": os.pathsep.join(jars.split(","))}
    return {"spark.jars": jars}


def delta_jars() -> str:
    """The Delta jar files for Spark's classpath, comma-separated: ``$CDC_DELTA_SPARK_JARS`` if it is
    set (empty: no Delta), else those ``scripts/setup`` fetched into this installation (none: no Delta)."""
    if DELTA_JARS_ENV_VAR in os.environ:
        return os.environ[DELTA_JARS_ENV_VAR].strip()
    return ",".join(str(jar) for jar in sorted(delta_jars_dir().glob("*.jar")))


def delta_jars_dir() -> Path:
    """Where ``scripts/setup`` puts this installation's Delta jars."""
    return _share_dir() / "delta-jars"


def spark_writes_delta(writer: str, master: str = "local[*]", remote: str | None = None) -> bool:
    """Whether a session of ``master`` (or ``remote``) writes the Delta tables itself with ``writer`` (the
    config's ``delta.writer``), as ``delta.select_writer`` chooses: ``delta-spark``, or ``auto`` on a cluster
    master. A local session under ``auto`` leaves them to delta-rs, so it needs no object-store connector."""
    return writer == "delta-spark" or (writer == "auto" and not remote and not runs_on_this_machine(master))


def object_store_jars(delta_root: str) -> str:
    """The jar files of Hadoop's connector for the store ``delta_root`` is on, comma-separated: for S3,
    hadoop-aws and its AWS SDK bundle, for ADLS hadoop-azure, as ``scripts/setup`` fetched them on request
    (``fetch_command``; empty for other stores: a cluster brings its own). Only sessions that need them get
    them: the SDK bundle is a large jar."""
    store = store_of(delta_root) if delta_root else "local"
    if store not in ("s3", "azure"):
        return ""
    directory = extra_jars_dir(store)
    jars = sorted(directory.glob("*.jar"))
    if not jars:
        raise StorageConfigError(f"delta.root '{delta_root}' is on {store}, where Spark opens the Delta tables "
                                 f"(delta.writer delta-spark, or rows_match_source's reads), and Spark needs Hadoop's "
                                 f"connector for it: no jars in {directory} (run `{fetch_command(store)}`)")
    return ",".join(str(jar) for jar in jars)


# What ``scripts/setup`` fetches only on request ($CDC_SETUP_EXTRAS) or for a config that needs it, and where.
SETUP_EXTRAS_ENV_VAR = "CDC_SETUP_EXTRAS"
EXTRA_JARS = {"s3": "hadoop-aws-jars", "azure": "hadoop-azure-jars", "spark-kafka": "spark-kafka-jars"}


def extra_jars_dir(extra: str) -> Path:
    """Where ``scripts/setup`` puts the jars of ``extra`` (a key of ``EXTRA_JARS``): hadoop-aws with the AWS SDK
    bundle, hadoop-azure (both at the Hadoop version pyspark ships), or Spark's Kafka connector."""
    return _share_dir() / EXTRA_JARS[extra]


def fetch_command(extra: str) -> str:
    """The command that fetches ``extra``'s jars into this installation."""
    return f"{SETUP_EXTRAS_ENV_VAR}={extra} scripts/setup"


def _share_dir() -> Path:
    return Path(sys.prefix) / "share" / "cdc-assets"


def class_archive_path() -> Path:
    """Where this installation's JVM class archive lives (``$CDC_SPARK_CLASS_ARCHIVE`` overrides)."""
    default = _share_dir() / f"spark-{pyspark.__version__}-classes.jsa"
    return Path(os.environ.get(CLASS_ARCHIVE_ENV_VAR) or default)


def has_delta(spark: SparkSession) -> bool:
    """Whether the session can run Delta SQL (Delta extension configured, or a Databricks cluster)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    databricks = spark.conf.get("spark.databricks.clusterUsageTags.clusterId", "") or ""
    return DELTA_EXTENSION in extensions or bool(databricks)


def is_local(spark: SparkSession) -> bool:
    """Whether the session's JVM runs on this machine, sharing its file system: a ``local[...]``
    master, or a Spark Connect server on the loopback interface (the local Spark server)."""
    if is_spark_connect(spark, "pyspark.sql.connect.session", "SparkSession"):
        return spark.client.host in LOOPBACK
    return runs_on_this_machine(spark.sparkContext.master or "")


def runs_on_this_machine(master: str) -> bool:
    """Whether a Spark ``master`` runs on this machine: ``local``, ``local[...]`` or ``local-cluster[...]``."""
    return master.startswith("local")


def _cores(spark: SparkSession) -> int:
    """The local session's cores (a local Spark server runs on this machine's cores)."""
    if is_spark_connect(spark, "pyspark.sql.connect.session", "SparkSession"):
        return os.cpu_count() or 2
    return spark.sparkContext.defaultParallelism


# ASCII RS separates the records handed to a local JVM: a control character that valid JSON never
# holds raw, so no valid value can contain it (and a value that does is bad either way).
RECORD_SEPARATOR = "\x1e"
_CORRUPT_COLUMN = "_corrupt_record"
_SEPARATOR_BYTE, _BACKSLASH_BYTE, _QUOTE_BYTE = ord(RECORD_SEPARATOR), ord("\\"), ord('"')
# Fewer records than this make a small batch (``spark_server.SMALL_BATCH_SETTINGS``): measured where the two
# settings cost the same server CPU on W2's events (docs/tuning.md).
SMALL_BATCH_RECORDS = 1_000
# A batch smaller than this is handed over as one file and folded in one task: parsing it on every
# core saves less than a task per core and a shuffle cost (most of a small table's Spark time, W2).
_SPLIT_BYTES = 4 << 20
# A line as ``_json_lines`` writes it (separator aside), for Java's regex: partition, offset, key literal, value.
# A shared plan's line also names its table (``"t":..``, after the offset).
_LINE_PATTERN = r'(?s)^\{"p":(\d+),"o":(\d+),(?:"t":(\d+),)?"k":("(?:[^"\\]|\\.)*"|null),"v":(.*)\}$'


@contextlib.contextmanager
def spark_records(spark: SparkSession, records: pa.Table, value_type: T.StructType,
                  exact: bool = True) -> Iterator[DataFrame]:
    """Kafka ``records`` (``partition, offset, key, value``; key and value bytes) as a Spark frame of
    ``partition, offset``, ``key`` as text and ``value`` parsed as JSON of ``value_type`` by Spark's
    JSON reader (null where the value is not a JSON object), readable until the ``with`` block ends.
    Records with a ``table`` column (int32: several tables' records in one shared plan) keep it.

    A local JVM reads the records as JSON text files written to a scratch directory, one per core:
    Spark's JSON file reader parses UTF-8 bytes directly, about twice as fast as ``from_json``,
    which decodes every value to characters first. A cluster or Spark Connect session, which cannot
    see this machine's files, gets ``createDataFrame`` and ``from_json``. Both parse with the same
    reader and options, so a value parses the same either way.

    ``exact=False`` lets the local hand-over skip its fallback for lines the reader cannot read (see
    ``parsed_from_files``): their value is null, so they decode as bad events, whatever ``from_json``
    would make of their value. The caller reads a batch with bad events again, exactly. Other
    sessions always hand over exactly.

    A batch of fewer than ``SMALL_BATCH_RECORDS`` records is read, decoded and folded by the session's
    small-batch session where it has one (``spark_server.SMALL_BATCH_SETTINGS``): the frame's queries run there.
    """
    if records.num_rows < SMALL_BATCH_RECORDS:
        spark = small_batch_session(spark) or spark
    if not is_local(spark):
        yield parsed_in_spark(spark, records, value_type)
        return
    with tempfile.TemporaryDirectory(prefix="cdc-batch-") as scratch:
        yield parsed_from_files(spark, records, value_type, Path(scratch), exact)


def parsed_in_spark(spark: SparkSession, records: pa.Table, value_type: T.StructType) -> DataFrame:
    """``spark_records`` for any session: ``createDataFrame`` of the records, then ``from_json``."""
    records = records.set_column(records.schema.get_field_index("value"), "value", without_schemas(records["value"]))
    table = ["table"] if "table" in records.column_names else []
    frame = spark.createDataFrame(records).select(
        *table, "partition", "offset", F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias(_TEXT))
    return _parsed(frame, value_type).select(*table, "partition", "offset", "key", F.col(_PARSED).alias("value"))


# Each parse is a column of its own that later columns refer to by name: spelt out at every use, as a
# Column expression is, the plan would repeat it (docs/tuning.md).
_TEXT = "_cdc_text"
_PARSED = "_cdc_parsed"


def _parsed(frame: DataFrame, value_type: T.StructType) -> DataFrame:
    """``frame`` with ``_PARSED``: its ``_TEXT`` parsed as ``value_type``; null where that is not a
    JSON object (``from_json`` alone gives a struct of nulls there). Only texts with no field at all
    pay for the second look."""
    frame = frame.withColumn(_PARSED, F.from_json(_TEXT, value_type))
    no_field = functools.reduce(lambda a, b: a & b, [F.col(_PARSED)[f.name].isNull() for f in value_type.fields])
    is_object = ~no_field | F.from_json(_TEXT, "map<string,string>").isNotNull()
    return frame.withColumn(_PARSED, F.when(is_object, F.col(_PARSED)))


def parsed_from_files(spark: SparkSession, records: pa.Table, value_type: T.StructType, scratch: Path,
                      exact: bool = True) -> DataFrame:
    """``spark_records`` for a session on this machine: the records as JSON text files in ``scratch``
    (which must outlive the frame), one ``{"p":..,"o":..,"k":"key","v":value}`` per record (with
    ``"t":..`` after the offset where the records have a ``table`` column).

    ``exact=False``: no ``from_json`` fallback for lines the reader cannot read, which keep their
    partition and offset but get a null value (and may lose their key). ``from_json`` has no
    generated code, so any use of it keeps the projections that carry the parsed value out of Spark's
    whole-stage code generation: each then copies every row (docs/tuning.md)."""
    lines = _json_lines(records)
    parts = _cores(spark) if lines.nbytes > _SPLIT_BYTES else 1
    _write_parts(lines, scratch, parts)
    tables = "table" in records.column_names
    line_type = T.StructType([T.StructField("p", T.IntegerType()), T.StructField("o", T.LongType()),
                              *([T.StructField("t", T.IntegerType())] if tables else []),
                              T.StructField("k", T.StringType()), T.StructField("v", value_type),
                              T.StructField(_CORRUPT_COLUMN, T.StringType())])
    frame = (spark.read.schema(line_type)
             .options(lineSep=RECORD_SEPARATOR, mode="PERMISSIVE", columnNameOfCorruptRecord=_CORRUPT_COLUMN)
             .json(str(scratch)))
    if parts == 1:
        # One partition that Spark knows to be one: the fold's aggregation then needs no shuffle.
        frame = frame.coalesce(1)

    # A line whose value is not a JSON object at all has no fields: they are read back from the line
    # as ``_json_lines`` wrote it, and its value gets ``from_json``'s verdict (which, for one, takes
    # an object followed by other text). Only such lines pay for it: the others have no text here.
    def part(group: int) -> Column:
        return F.regexp_extract(F.col(_CORRUPT_COLUMN), _LINE_PATTERN, group)

    located = (*([F.coalesce("t", part(3).cast("int")).alias("table")] if tables else []),
               F.coalesce("p", part(1).cast("int")).alias("partition"),
               F.coalesce("o", part(2).cast("long")).alias("offset"))
    if not exact:
        return frame.select(*located, F.col("k").alias("key"), F.col("v").alias("value"))
    key_literal = F.from_json(F.concat(F.lit('{"k":'), part(4), F.lit("}")), "k string")["k"]
    frame = frame.select(*located, F.coalesce("k", key_literal).alias("key"), "v",
                         F.when(F.col("v").isNull(), part(5)).alias(_TEXT))
    return _parsed(frame, value_type).select(*(["table"] if tables else []), "partition", "offset", "key",
                                             F.coalesce("v", _PARSED).alias("value"))


def _text(literal: str) -> pa.Scalar:
    return pa.scalar(literal, pa.large_string())


def _utf8(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Bytes as UTF-8 text; invalid sequences replaced by U+FFFD, as ``from_json``'s reader does."""
    try:
        return column.cast(pa.large_string())
    except pa.ArrowInvalid:
        return pa.chunked_array([pa.array([None if v is None else v.decode("utf-8", "replace") for v in
                                           column.to_pylist()], pa.large_string())])


def _has_byte(text: pa.ChunkedArray, matches: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether a byte of ``text``'s data buffers ``matches``: a scan of the buffers in place, without a
    copy, so that a replacement is paid for only by a batch that needs it."""
    return any(data is not None and bool(matches(np.frombuffer(data, np.uint8)).any())
               for data in (chunk.buffers()[2] for chunk in text.chunks))


def _json_string(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Each value as a JSON string literal (null as ``null``)."""
    text = _utf8(column)
    if _has_byte(text, lambda data: data == _BACKSLASH_BYTE):
        text = pc.replace_substring(text, "\\", "\\\\")  # first: the quotes' escapes add backslashes
    if _has_byte(text, lambda data: data == _QUOTE_BYTE):
        text = pc.replace_substring(text, '"', '\\"')
    if _has_byte(text, lambda data: data < 0x20):
        for code in range(0x20):
            text = pc.replace_substring(text, chr(code), f"\\u{code:04x}")
    quoted = pc.binary_join_element_wise(_text('"'), text, _text('"'), _text(""))
    return pc.if_else(pc.is_null(column), _text("null"), quoted) if column.null_count else quoted


# A value less its schema (``without_schemas``) opens so.
_PAYLOAD_OPENING = b'{"payload":'


def without_schemas(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """``values`` with the Kafka Connect schema of every JSON-converter value dropped: ``{"schema": S,
    "payload": P}`` becomes ``{"payload": P}``. The reader's type (``core.envelope.value_type``) never
    reads the schema, which is most of a value's bytes (five sixths of W2's), and every byte handed
    over is written, read and tokenized. Values that start with the first or the last value's schema
    lose it (a batch holds one or two schemas: a schema change falls between them); others pass as
    they are."""
    ends = [values[i].as_py() for i in (0, len(values) - 1)] if len(values) else []
    prefixes = {prefix for value in ends if value and (prefix := schema_prefix(value))}
    longest = pc.max(pc.binary_length(values)).as_py() if prefixes else 0
    for prefix in prefixes:
        # An explicit end: pyarrow's binary_slice sizes its output from it (and fails on a huge one).
        payloads = pc.binary_join_element_wise(_PAYLOAD_OPENING, pc.binary_slice(values, len(prefix), longest), b"")
        values = pc.if_else(pc.starts_with(values, prefix), payloads, values)
    return values


def _json_lines(records: pa.Table) -> pa.ChunkedArray:
    """One line per record, ``{"p":..,"o":..,"k":"key","v":value}`` (``"t":..`` after the offset where the
    records have a ``table`` column), each ending in the separator: in
    the records' chunks, which ``_write_parts`` writes as they are (no copy of the batch into one)."""
    value = _utf8(without_schemas(records["value"]))
    if _has_byte(value, lambda data: data == _SEPARATOR_BYTE):
        value = pc.replace_substring(value, RECORD_SEPARATOR, "\x1f")  # still a raw control character: still bad
    value = pc.fill_null(value, _text("null"))
    number = pa.large_string()
    return pc.binary_join_element_wise(
        _text('{"p":'), records["partition"].cast(number), _text(',"o":'), records["offset"].cast(number),
        *([_text(',"t":'), records["table"].cast(number)] if "table" in records.column_names else []),
        _text(',"k":'), _json_string(records["key"]), _text(',"v":'), value, _text("}" + RECORD_SEPARATOR), _text(""),
    )


def _write_parts(lines: pa.ChunkedArray, directory: Path, parts: int) -> None:
    """Write ``lines`` to ``parts`` files of about equal line counts, so that every core parses; from
    the chunks' buffers in place."""
    per_part = max(1, -(-len(lines) // parts))
    for index, first in enumerate(range(0, max(1, len(lines)), per_part)):
        with open(directory / f"part-{index}.json", "wb") as part:
            for chunk in (c for c in lines.slice(first, per_part).chunks if len(c)):  # slices: no copy
                offsets = memoryview(chunk.buffers()[1]).cast("q")  # large_string: 64-bit offsets
                data = memoryview(chunk.buffers()[2] or b"")
                part.write(data[offsets[chunk.offset]:offsets[chunk.offset + len(chunk)]])
