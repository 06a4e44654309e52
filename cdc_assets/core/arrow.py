"""A Spark frame's rows as Arrow, in one request to a Spark Connect server."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame
from pyspark.sql.pandas.types import to_arrow_schema


def to_arrow(frame: DataFrame) -> pa.Table:
    """``frame.toArrow()``. On Spark Connect, pyspark's own first asks the server for the frame's schema,
    a request that analyzes the plan once more before the execution analyzes it again: a fifth to a third
    of a small batch's query (W2, in performance.md's git log). The execution's reply carries the schema; it is used."""
    if not isinstance(frame, ConnectFrame):
        return frame.toArrow()
    table, schema = frame._to_table()
    arrow_schema = to_arrow_schema(schema if schema is not None else frame.schema,
                                   error_on_duplicated_field_names_in_struct=True, timezone="UTC")
    return table.cast(arrow_schema)
