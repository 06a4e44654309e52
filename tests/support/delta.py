"""The Delta writer suite's batches and commits, and its runs on each writer wherever the table lives."""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.delta import (
    CommitRequest,
    DeltaRsWriter,
    DeltaSparkWriter,
    DeltaTarget,
    DeltaWriter,
)
from cdc_assets.io.storage import delta_rs_options, spark_path

SCHEMA = pa.schema([
    ("My Id", pa.int64()),  # a key column that needs quoting
    ("name", pa.string()),
    ("_cdc_op", pa.string()),
    ("_cdc_position", pa.string()),
    ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
])


def batch(spark, *rows):
    """A batch of ``(key, name, op, position)`` rows in ``SCHEMA``."""
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, (k, n, op, pos, None), strict=True))
                                 for k, n, op, pos in rows], schema=SCHEMA)


def commit(version, offsets):
    """The commit request of txn ``version`` recording ``offsets`` for table ``t``."""
    return CommitRequest("cdc_assets:t", version, "t", offsets)


SCD1 = apply_mode("scd1")  # the writer suite's apply mode


def writer_named(name: str, spark: SparkSession) -> DeltaWriter:
    """The writer ``name`` (``delta-rs`` or ``delta-spark`` on ``spark``)."""
    return DeltaRsWriter() if name == "delta-rs" else DeltaSparkWriter(spark)


def latest_commit(spark: SparkSession, writer: DeltaWriter, target: DeltaTarget) -> dict:
    """The newest commit's info as each writer's reader gives it: what the batch committed."""
    if writer.name == "delta-rs":
        entry = DeltaTable(target.path, storage_options=delta_rs_options(target.storage_options)).history(1)[0]
    else:
        entry = spark.sql(f"DESCRIBE HISTORY delta.`{spark_path(target.path)}` LIMIT 1").first().asDict()
    return {"version": entry["version"], "operation": entry["operation"],
            "userMetadata": json.loads(entry["userMetadata"])}


def table_rows(spark: SparkSession, writer: DeltaWriter, target: DeltaTarget) -> list[tuple]:
    """The table's rows as ``SCHEMA`` tuples, sorted, read by the writer's own reader."""
    if writer.name == "delta-rs":
        rows = DeltaTable(target.path, storage_options=delta_rs_options(target.storage_options)).to_pyarrow_table()
        rows = rows.to_pylist()
    else:
        rows = [r.asDict() for r in spark.read.format("delta").load(spark_path(target.path)).collect()]
    return sorted(tuple(row[name] for name in SCHEMA.names) for row in rows)


def writer_run(spark: SparkSession, writer: DeltaWriter, target: DeltaTarget) -> list:
    """The writer suite's basic sequence (create, merge, repeat, offsets only): what each step committed, then
    the table's rows."""
    steps = [
        lambda: writer.merge(target, batch(spark, (1, "a", "c", "01"), (2, "b", "c", "02")), ["My Id"],
                             commit(10, {0: 7, 1: 3}), SCD1),
        lambda: writer.merge(target, batch(spark, (1, "a2", "u", "03"), (2, None, "d", "04"), (3, "c", "c", "05")),
                             ["My Id"], commit(12, {0: 9, 1: 3}), SCD1),
        lambda: writer.merge(target, batch(spark, (9, "z", "c", "09")), ["My Id"], commit(12, {0: 9, 1: 3}), SCD1),
        lambda: writer.commit_progress(target, commit(13, {0: 10, 1: 3})),
    ]
    seen = []
    for step in steps:
        outcome = step()
        progress = writer.read_progress(target, "cdc_assets:t")
        seen.append((outcome.inserted, outcome.updated, outcome.deleted, outcome.already_applied,
                     outcome.delta_version, progress.offsets, progress.txn_version, progress.delta_version,
                     latest_commit(spark, writer, target)))
    return [*seen, table_rows(spark, writer, target)]
