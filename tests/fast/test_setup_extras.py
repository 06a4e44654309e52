"""What scripts/setup fetches beyond its base: only the extras asked for ($CDC_SETUP_EXTRAS) and the object-store
connector of a config whose tables delta-spark writes, or rows_match_source reads, on S3 or ADLS
(cdc_assets.setup_extras)."""

import pytest

from cdc_assets.config import load_config, parse_config
from cdc_assets.io.spark import spark_writes_delta
from cdc_assets.setup_extras import SetupExtrasError, setup_extras

CONFIG = """
kafka: {{bootstrap_servers: "b:9092"}}
spark: {spark}
delta: {{root: "{root}", writer: {writer}{options}}}
connectors:
  - {{name: c, kind: postgresql, topic.prefix: c, tables: [{{name: s.t}}]{check}}}
"""
S3 = ", storage_options: {endpoint: 'http://127.0.0.1:9000'}"
ADLS = ", storage_options: {account_key_env: K}"


def config(root: str, writer: str, spark: str = "{}", options: str = "", check: str = ""):
    return parse_config(CONFIG.format(root=root, writer=writer, spark=spark, options=options, check=check))


def test_the_demo_and_local_tables_fetch_no_extra():
    assert setup_extras("", load_config()) == []  # the bundled demo config (the default)
    assert setup_extras("", config("/lake", "delta-spark")) == []
    assert setup_extras("", None) == []  # a config that does not load adds nothing


def test_extras_are_fetched_as_named():
    assert setup_extras("s3", None) == ["s3"]
    assert setup_extras("spark-kafka,azure", None) == ["azure", "spark-kafka"]
    assert setup_extras(" azure  s3 ", None) == ["s3", "azure"]
    assert setup_extras("all", None) == ["s3", "azure", "spark-kafka"]
    with pytest.raises(SetupExtrasError, match=r"unknown extra kafka-connector .*s3, azure, spark-kafka"):
        setup_extras("s3,kafka-connector", None)


def test_an_object_store_root_fetches_its_connector_only_when_spark_writes_it():
    assert setup_extras("", config("s3://bucket/cdc", "delta-spark", options=S3)) == ["s3"]
    assert setup_extras("", config("abfss://c@acct.dfs.core.windows.net/cdc", "delta-spark", options=ADLS)) == [
        "azure"]
    # delta-rs writes, and so does auto on local Spark: Spark never opens the store.
    assert setup_extras("", config("s3://bucket/cdc", "delta-rs", options=S3)) == []
    assert setup_extras("", config("s3://bucket/cdc", "auto", options=S3)) == []
    # auto on a cluster master is delta-spark, with the jars handed to the cluster by this installation.
    assert setup_extras("", config("s3://bucket/cdc", "auto", "{master: 'spark://h:7077'}", S3)) == ["s3"]
    # A Spark Connect server brings its own connector; GCS has none fetched here (a cluster brings its own).
    assert setup_extras("", config("s3://bucket/cdc", "delta-spark", "{remote: 'sc://h:15002'}", S3)) == []
    assert setup_extras("", config("gs://bucket/cdc", "delta-spark")) == []
    assert setup_extras("spark-kafka", config("s3://bucket/cdc", "delta-spark", options=S3)) == ["s3", "spark-kafka"]


def test_rows_match_source_reads_an_object_stores_tables_in_spark_whatever_writes_them():
    check = ", rows_match_source: {dsn_env: DSN}"
    assert setup_extras("", config("s3://bucket/cdc", "delta-rs", options=S3, check=check)) == ["s3"]
    assert setup_extras("", config("/lake", "delta-rs", check=check)) == []
    assert setup_extras("", config("s3://bucket/cdc", "delta-rs", "{remote: 'sc://h:15002'}", S3, check)) == []


def test_spark_writes_delta_as_select_writer_chooses():
    assert spark_writes_delta("delta-spark") and not spark_writes_delta("delta-rs")
    assert not spark_writes_delta("auto", "local[*]") and spark_writes_delta("auto", "spark://h:7077")
    assert not spark_writes_delta("auto", "local[*]", "sc://h:15002")
