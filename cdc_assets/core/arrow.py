"""A Spark frame's rows as Arrow, in one request to a Spark Connect server."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

if TYPE_CHECKING:
    from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame


def is_spark_connect(value: object, module: str, name: str) -> bool:
    """Whether ``value`` is an instance of Spark Connect's class ``name`` of ``module``
    (``pyspark.sql.connect...``), without importing Spark Connect's client (with pyspark.testing: 0.2 CPU s of
    each load of the code location, by every code server, the daemon's included, and every ``dg`` command; 2.8 s
    against 3.0 s on 2026-11-30): a value can be one only once its module is loaded."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))


def to_arrow(frame: DataFrame) -> pa.Table:
    """``frame.toArrow()``. On Spark Connect, pyspark's own first asks the server for the frame's schema,
    a request that analyzes the plan once more before the execution analyzes it again: a fifth to a third
    of a small batch's query (W2, in performance.md's git log). The execution's reply carries the schema; it is used."""
    if not is_spark_connect(frame, "pyspark.sql.connect.dataframe", "DataFrame"):
        return frame.toArrow()
    table, schema = cast("ConnectFrame", frame)._to_table()
    arrow_schema = to_arrow_schema(schema if schema is not None else frame.schema,
                                   error_on_duplicated_field_names_in_struct=True, timezone="UTC")
    return table.cast(arrow_schema)
