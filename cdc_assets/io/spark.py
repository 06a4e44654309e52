"""The Spark session factory: local JVM Spark by default, a cluster master or Spark Connect by config."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyspark.sql import SparkSession

DELTA_JARS_ENV_VAR = "CDC_DELTA_SPARK_JARS"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Settings for a small machine and short batches; any of them can be overridden in config.
EMBEDDED_DEFAULTS: dict[str, str] = {
    "spark.app.name": "cdc-assets",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
}


def spark_config(master: str = "local[*]", remote: str | None = None,
                 conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full Spark config for a session: embedded defaults, Delta jars if named, then ``conf``.

    ``remote`` (a Spark Connect URL) replaces ``master``. The env var ``CDC_DELTA_SPARK_JARS``
    names Delta jar files (comma-separated) to put on the classpath, enabling the delta-spark writer.
    """
    settings = dict(EMBEDDED_DEFAULTS)
    if remote:
        settings = {"spark.remote": remote, "spark.sql.session.timeZone": "UTC"}
    else:
        settings["spark.master"] = master
        jars = os.environ.get(DELTA_JARS_ENV_VAR, "").strip()
        if jars:
            settings["spark.jars"] = jars
            settings["spark.sql.extensions"] = DELTA_EXTENSION
            settings["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    settings.update(conf or {})
    return settings


def has_delta(spark: SparkSession) -> bool:
    """Whether the session can run Delta SQL (Delta extension configured, or a Databricks cluster)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    databricks = spark.conf.get("spark.databricks.clusterUsageTags.clusterId", "") or ""
    return DELTA_EXTENSION in extensions or bool(databricks)
