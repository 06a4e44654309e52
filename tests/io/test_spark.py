"""The Spark session settings and the Arrow -> Spark hand-over."""

import os

import pyarrow as pa
from pyspark.sql import functions as F

from cdc_assets.io.spark import CLASS_ARCHIVE_ENV_VAR, spark_config, spark_frame


def test_spark_frame_hands_over_every_record_split_across_the_cores(spark):
    # 10 MB: Spark packs files under 4 MB per core into one split, whatever their row groups.
    records = pa.table({"partition": pa.array([0, 1, 2, 0] * 250, pa.int32()),
                        "offset": pa.array(range(1000), pa.int64()),
                        "key": pa.array([b'{"id": %d}' % i for i in range(1000)], pa.binary()),
                        "value": pa.array([None if i % 7 == 0 else b"v%d" % i + b" " * 10_000 for i in range(1000)],
                                          pa.binary())})
    with spark_frame(spark, records) as frame:
        assert frame.select(F.spark_partition_id()).distinct().count() == os.cpu_count()
        back = frame.toArrow().sort_by("offset")
    assert back.column_names == records.column_names
    for name in records.column_names:
        assert back[name].to_pylist() == records[name].to_pylist()


def test_class_archive_is_mapped_by_local_jvms_only(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(CLASS_ARCHIVE_ENV_VAR, str(archive))

    def maps_archive(settings):
        return "-XX:SharedArchiveFile=" in settings.get("spark.driver.extraJavaOptions", "")

    assert not maps_archive(spark_config())  # no archive built yet
    archive.write_bytes(b"")
    assert maps_archive(spark_config())
    local = spark_config(conf={"spark.driver.extraJavaOptions": "-Dmine=1"})
    assert local["spark.driver.extraJavaOptions"].startswith("-Dmine=1 -XX:SharedArchiveFile=" + str(archive))
    assert not maps_archive(spark_config(remote="sc://spark:15002"))
    assert not maps_archive(spark_config("spark://cluster:7077"))
    assert not maps_archive(spark_config(use_class_archive=False))
