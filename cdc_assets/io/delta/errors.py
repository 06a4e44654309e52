"""The Delta layer's errors, and the typed recognition of the engines' own: a commit that lost to another one,
a table that is not there. Engines' errors are told apart by their error class (delta-rs's exception type,
Spark's error condition), never by their message text."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import CommitFailedError

from cdc_assets.io.delta.metadata import CommitRequest
from cdc_assets.io.delta.table import DeltaTarget


class DeltaWriterError(RuntimeError):
    """A Delta write cannot be done as asked; the message names the table path."""


class ConcurrentCommitError(DeltaWriterError):
    """Another commit reached the table while a batch was being merged: nothing of the batch was committed."""


class TableMissingError(DeltaWriterError):
    """An operation needs an existing Delta table and there is none at the path."""

    def __init__(self, path: str, needed_for: str):
        super().__init__(f"{path}: no Delta table {needed_for}")
        self.path = path


# delta-spark's error classes for a commit that lost to another one (Delta's conflict check): the
# DELTA_CONCURRENT_* family and these two.
_SPARK_CONFLICT_PREFIX = "DELTA_CONCURRENT_"
_SPARK_CONFLICTS = frozenset({"DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED"})
# Spark's and delta-spark's error classes for a path that holds no Delta table (yet).
_SPARK_MISSING_TABLE = frozenset({"DELTA_MISSING_DELTA_TABLE", "DELTA_NOT_A_DELTA_TABLE", "DELTA_PATH_DOES_NOT_EXIST",
                                  "DELTA_TABLE_NOT_FOUND", "DELTA_TABLE_ONLY_OPERATION", "PATH_NOT_FOUND"})


def spark_condition(exc: BaseException) -> str | None:
    """The Spark error condition (error class) of ``exc``, main class only; None for an error without one.

    Spark Connect's errors and classic PySpark's converted ones carry it; classic PySpark raises a JVM error it
    has no Python class for (Delta's conflict exceptions) as py4j's ``Py4JJavaError``, read here from the JVM."""
    from pyspark.errors import PySparkException

    condition = exc.getCondition() if isinstance(exc, PySparkException) else _jvm_condition(exc)
    return condition.split(".")[0] if condition else None


def _jvm_condition(exc: BaseException) -> str | None:
    """The error class of the JVM exception a ``Py4JJavaError`` carries (``SparkThrowable``'s, in Spark 3 and 4)."""
    try:
        from py4j.java_gateway import is_instance_of
        from py4j.protocol import Py4JJavaError
        from pyspark import SparkContext
    except ImportError:  # a Spark Connect-only client: its Spark errors are all PySparkExceptions
        return None
    gateway = SparkContext._gateway
    if not isinstance(exc, Py4JJavaError) or gateway is None:
        return None
    java = exc.java_exception
    return java.getErrorClass() if is_instance_of(gateway, java, "org.apache.spark.SparkThrowable") else None


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is either engine's refusal of a commit that another commit got ahead of."""
    if isinstance(exc, CommitFailedError):
        return True
    condition = spark_condition(exc)
    return condition is not None and (condition.startswith(_SPARK_CONFLICT_PREFIX) or condition in _SPARK_CONFLICTS)


def is_missing_table(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's error for a path with no Delta table."""
    return spark_condition(exc) in _SPARK_MISSING_TABLE


@contextmanager
def concurrent_commit_guard(target: DeltaTarget, commit: CommitRequest) -> Iterator[None]:
    """Turn either writer's commit conflicts, within the block, into a ``ConcurrentCommitError`` that says
    nothing of the batch was committed (every commit of a batch goes through it, the transaction log's too)."""
    try:
        yield
    except Exception as exc:
        if not is_commit_conflict(exc):
            raise
        raise ConcurrentCommitError(
            f"{target.path}: another commit reached the table while this batch (offsets "
            f"{dict(commit.offsets)}) was being merged ({next(iter(str(exc).splitlines()), '')}); nothing of this "
            "batch was committed and the next run resumes from the table's committed offsets. Use Dagster pools so "
            "one table is merged by one run at a time") from exc
