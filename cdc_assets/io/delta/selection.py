"""Which writer a config value names."""

from __future__ import annotations

from pyspark.sql import SparkSession

from cdc_assets.io.delta.errors import DeltaWriterError
from cdc_assets.io.delta.protocol import DeltaWriter
from cdc_assets.io.delta.rs import DeltaRsWriter
from cdc_assets.io.delta.spark import DeltaSparkWriter
from cdc_assets.io.spark import has_delta, is_local


def select_writer(name: str, spark: SparkSession, deletion_vectors: bool = False) -> DeltaWriter:
    """The writer for a config value: ``delta-rs``, ``delta-spark`` or ``auto``: delta-spark for a session
    with Delta whose JVM runs elsewhere (a cluster, a remote Spark Connect server), else delta-rs. Local
    Spark has Delta too (``spark.delta_jars``), yet keeps delta-rs, which merges without a Spark job.
    ``deletion_vectors``: delta-spark creates tables with deletion vectors (which delta-rs cannot read)."""
    if name == "delta-rs":
        return DeltaRsWriter()
    if name == "delta-spark" or (name == "auto" and has_delta(spark) and not is_local(spark)):
        return DeltaSparkWriter(spark, deletion_vectors)
    if name == "auto":
        return DeltaRsWriter()
    raise DeltaWriterError(f"unknown Delta writer '{name}' (expected auto, delta-rs or delta-spark)")
