"""A frame's rows as Arrow in one Spark Connect request (``core.arrow.to_arrow``)."""

from pyspark.sql import functions as F

from cdc_assets.core.arrow import to_arrow


def test_to_arrow_gives_toArrows_table_without_asking_for_the_schema(spark, monkeypatch):
    def frame():
        return spark.range(3).select(
            "id", F.col("id").cast("decimal(10,2)").alias("amount"), F.lit(None).cast("timestamp").alias("at"),
            F.struct(F.col("id").cast("string").alias("name")).alias("row"))

    asked: list[str] = []
    analyze = spark.client._analyze
    monkeypatch.setattr(spark.client, "_analyze", lambda method, **kw: asked.append(method) or analyze(method, **kw))
    ours = to_arrow(frame())
    assert asked == []
    theirs = frame().toArrow()
    assert asked == ["schema"]  # pyspark's own asks first: the count above saw every request
    assert ours.schema == theirs.schema and ours.equals(theirs)
