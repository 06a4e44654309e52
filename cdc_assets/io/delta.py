"""The Delta sink: one seam, two writers that produce the same table contents and commit metadata.

- ``DeltaRsWriter`` (the ``deltalake`` package): merges the folded rows with ``DeltaTable.merge``.
  The embedded default.
- ``DeltaSparkWriter``: Spark SQL ``MERGE INTO delta.`path```, for sessions that have Delta
  (clusters, Databricks).

Both take the folded batch as Arrow: it is bounded by the micro-batch (at most one row per key of
at most ``max_records`` events) and has already left Spark once, with the batch statistics.

Every commit that applies a batch carries, in the same atomic commit as the data:
- an app transaction ``(app_id, version)``; ``version`` grows with the offsets, so a batch that was
  already committed is recognised and skipped (delta-rs does not skip repeats by itself, so
  ``DeltaRsWriter`` checks ``transaction_version`` first; delta-spark skips them natively);
- ``commitInfo.userMetadata``: ``{"cdc_assets": {"app_id", "version", "topic", "offsets"}}``,
  the offsets the next batch starts from.

The MERGE applies a folded row only when its ``_cdc_position`` is newer than the target row's, so
applying any batch twice changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN
from cdc_assets.io.spark import has_delta

METADATA_KEY = "cdc_assets"
_HISTORY_WINDOW = 100


class DeltaWriterError(RuntimeError):
    """A Delta write cannot be done as asked; the message names the table path."""


@dataclass(frozen=True)
class DeltaTarget:
    """Where one table lives."""

    path: str
    storage_options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitRequest:
    """What a batch commit records besides the data: app transaction and source offsets."""

    app_id: str
    version: int
    topic: str
    offsets: Mapping[int, int]

    def user_metadata(self) -> str:
        payload = {"app_id": self.app_id, "version": self.version, "topic": self.topic,
                   "offsets": {str(p): o for p, o in sorted(self.offsets.items())}}
        return json.dumps({METADATA_KEY: payload}, sort_keys=True)


@dataclass(frozen=True)
class TableProgress:
    """What the latest batch commit of a table recorded."""

    offsets: dict[int, int]
    txn_version: int
    delta_version: int


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge did: rows changed and the table version after it."""

    delta_version: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    already_applied: bool = False


class DeltaWriter(Protocol):
    """The seam every Delta writer implements."""

    name: str

    def table_schema(self, target: DeltaTarget) -> T.StructType | None:
        """The table's schema as Spark types, or None if there is no table yet."""
        ...

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        """Offsets and txn version of the latest batch commit, or None if none was made."""
        ...

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest) -> MergeOutcome:
        """Create the table if needed and MERGE the folded rows, with ``commit`` in the same commit."""
        ...

    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        """Commit offsets with no data change (a batch of tombstones only) to an existing table."""
        ...


def _progress_from_history(history: Sequence[Mapping[str, object]], app_id: str) -> TableProgress | None:
    for entry in history:
        raw = entry.get("userMetadata")
        if not raw:
            continue
        try:
            recorded = json.loads(str(raw)).get(METADATA_KEY)
        except (ValueError, AttributeError):
            continue
        if isinstance(recorded, dict) and recorded.get("app_id") == app_id:
            return TableProgress(
                offsets={int(p): int(o) for p, o in recorded["offsets"].items()},
                txn_version=int(recorded["version"]),
                delta_version=int(str(entry["version"])),
            )
    return None


def _merge_condition(key_columns: Sequence[str], quote) -> str:
    return " AND ".join(f"t.{quote(name)} = s.{quote(name)}" for name in key_columns)


_NEWER = f"s.{POSITION_COLUMN} > t.{POSITION_COLUMN}"
_DELETE_WHEN = f"s.{OP_COLUMN} = 'd' AND {_NEWER}"
_INSERT_WHEN = f"s.{OP_COLUMN} <> 'd'"


def quote_datafusion(name: str) -> str:
    """Quote an identifier for delta-rs (DataFusion SQL)."""
    return '"' + name.replace('"', '""') + '"'


def quote_spark(name: str) -> str:
    """Quote an identifier (or a path inside ``delta.`...```) for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


class DeltaRsWriter:
    """Merges with delta-rs; the folded batch is taken from Spark as Arrow."""

    name = "delta-rs"

    def _table(self, target: DeltaTarget) -> DeltaTable | None:
        options = dict(target.storage_options)
        if not DeltaTable.is_deltatable(target.path, storage_options=options):
            return None
        return DeltaTable(target.path, storage_options=options)

    def table_schema(self, target: DeltaTarget) -> T.StructType | None:
        table = self._table(target)
        return None if table is None else from_arrow_schema(pa.schema(table.schema().to_arrow()))

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        table = self._table(target)
        if table is None:
            return None
        progress = _progress_from_history(table.history(_HISTORY_WINDOW), app_id) or _progress_from_history(
            table.history(), app_id)
        txn_version = table.transaction_version(app_id)
        if txn_version is not None and (progress is None or progress.txn_version != txn_version):
            raise DeltaWriterError(
                f"{target.path}: app transaction {app_id} is at version {txn_version} but no commit records "
                "its offsets (history cleaned up?): refusing to guess where to resume")
        return progress

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest) -> MergeOutcome:
        table = self._table(target)
        if table is None:
            table = DeltaTable.create(target.path, schema=rows.schema, storage_options=dict(target.storage_options))
        if self._already_applied(table, commit):
            return MergeOutcome(delta_version=table.version(), already_applied=True)
        before = table.version()
        metrics = (
            table.merge(rows, _merge_condition(key_columns, quote_datafusion), source_alias="s",
                        target_alias="t", merge_schema=True, commit_properties=self._properties(commit))
            .when_matched_delete(predicate=_DELETE_WHEN)
            .when_matched_update_all(predicate=_NEWER)
            .when_not_matched_insert_all(predicate=_INSERT_WHEN)
            .execute()
        )
        table.update_incremental()
        if table.version() == before:
            # No row changed (a replay of applied events): delta-rs made no commit, so commit the offsets.
            return self.commit_progress(target, commit)
        return MergeOutcome(
            delta_version=table.version(),
            inserted=int(metrics.get("num_target_rows_inserted", 0)),
            updated=int(metrics.get("num_target_rows_updated", 0)),
            deleted=int(metrics.get("num_target_rows_deleted", 0)),
        )


    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        table = self._table(target)
        if table is None:
            raise DeltaWriterError(f"{target.path}: no Delta table to commit offsets to")
        if self._already_applied(table, commit):
            return MergeOutcome(delta_version=table.version(), already_applied=True)
        table.create_write_transaction([], mode="append", schema=table.schema(),
                                       commit_properties=self._properties(commit))
        table.update_incremental()
        return MergeOutcome(delta_version=table.version())

    @staticmethod
    def _already_applied(table: DeltaTable, commit: CommitRequest) -> bool:
        applied = table.transaction_version(commit.app_id)
        return applied is not None and applied >= commit.version

    @staticmethod
    def _properties(commit: CommitRequest) -> CommitProperties:
        return CommitProperties(custom_metadata={"userMetadata": commit.user_metadata()},
                                app_transactions=[Transaction(commit.app_id, commit.version)])


class DeltaSparkWriter:
    """Merges with delta-spark: ``MERGE INTO delta.`path``` in the session that folded the batch."""

    name = "delta-spark"

    def __init__(self, spark: SparkSession):
        if not has_delta(spark):
            raise DeltaWriterError(
                "the delta-spark writer needs a Spark session with Delta (set CDC_DELTA_SPARK_JARS to the Delta "
                "jars, or run on a cluster that has Delta); use writer 'delta-rs' or 'auto' otherwise")
        self._spark = spark

    def _table_ref(self, target: DeltaTarget) -> str:
        return f"delta.{quote_spark(target.path)}"

    def _history(self, target: DeltaTarget, limit: int | None) -> list[dict[str, object]] | None:
        suffix = f" LIMIT {limit}" if limit else ""
        try:
            rows = self._spark.sql(f"DESCRIBE HISTORY {self._table_ref(target)}{suffix}").collect()
        except Exception as exc:
            if "not a Delta table" in str(exc) or "DELTA_MISSING_DELTA_TABLE" in str(exc) or \
                    "PATH_NOT_FOUND" in str(exc):
                return None
            raise
        return [row.asDict() for row in rows]

    def table_schema(self, target: DeltaTarget) -> T.StructType | None:
        if self._history(target, 1) is None:
            return None
        return self._spark.read.format("delta").load(target.path).schema

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        history = self._history(target, _HISTORY_WINDOW)
        if history is None:
            return None
        return _progress_from_history(history, app_id) or _progress_from_history(
            self._history(target, None) or [], app_id)

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest) -> MergeOutcome:
        from delta.tables import DeltaTable as SparkDeltaTable

        batch = self._spark.createDataFrame(rows)
        if self._history(target, 1) is None:
            SparkDeltaTable.createIfNotExists(self._spark).location(target.path).addColumns(batch.schema).execute()
        before = self._latest_version(target)
        if self._already_applied(target, commit):
            return MergeOutcome(delta_version=before, already_applied=True)
        view = f"cdc_batch_{abs(hash((target.path, commit.version)))}"
        batch.createOrReplaceTempView(view)
        try:
            with self._committing(commit):
                result = self._spark.sql(
                    f"MERGE INTO {self._table_ref(target)} t USING {view} s "
                    f"ON {_merge_condition(key_columns, quote_spark)} "
                    f"WHEN MATCHED AND {_DELETE_WHEN} THEN DELETE "
                    f"WHEN MATCHED AND {_NEWER} THEN UPDATE SET * "
                    f"WHEN NOT MATCHED AND {_INSERT_WHEN} THEN INSERT *"
                ).first()
        finally:
            self._spark.catalog.dropTempView(view)
        if self._latest_version(target) == before:
            # No row changed (a replay of applied events): commit the offsets alone.
            return self.commit_progress(target, commit)
        metrics = result.asDict() if result is not None else {}
        return MergeOutcome(
            delta_version=self._latest_version(target),
            inserted=int(metrics.get("num_inserted_rows", 0) or 0),
            updated=int(metrics.get("num_updated_rows", 0) or 0),
            deleted=int(metrics.get("num_deleted_rows", 0) or 0),
        )

    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        if self._history(target, 1) is None:
            raise DeltaWriterError(f"{target.path}: no Delta table to commit offsets to")
        if self._already_applied(target, commit):
            return MergeOutcome(delta_version=self._latest_version(target), already_applied=True)
        table = self._table_ref(target)
        with self._committing(commit):
            self._spark.sql(f"INSERT INTO {table} SELECT * FROM {table} WHERE false")
        return MergeOutcome(delta_version=self._latest_version(target))

    def _already_applied(self, target: DeltaTarget, commit: CommitRequest) -> bool:
        progress = self.read_progress(target, commit.app_id)
        return progress is not None and progress.txn_version >= commit.version

    @contextmanager
    def _committing(self, commit: CommitRequest) -> Iterator[None]:
        """Session settings that put the txn and offsets into the next Delta commit, reset after."""
        settings = {
            "spark.databricks.delta.write.txnAppId": commit.app_id,
            "spark.databricks.delta.write.txnVersion": str(commit.version),
            "spark.databricks.delta.commitInfo.userMetadata": commit.user_metadata(),
            "spark.databricks.delta.schema.autoMerge.enabled": "true",
        }
        for key, value in settings.items():
            self._spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                self._spark.conf.unset(key)

    def _latest_version(self, target: DeltaTarget) -> int:
        history = self._history(target, 1)
        return int(str(history[0]["version"])) if history else -1


def select_writer(name: str, spark: SparkSession) -> DeltaWriter:
    """The writer for a config value: ``delta-rs``, ``delta-spark`` or ``auto`` (delta-spark when the
    session has Delta, else delta-rs)."""
    if name == "delta-rs":
        return DeltaRsWriter()
    if name == "delta-spark" or (name == "auto" and has_delta(spark)):
        return DeltaSparkWriter(spark)
    if name == "auto":
        return DeltaRsWriter()
    raise DeltaWriterError(f"unknown Delta writer '{name}' (expected auto, delta-rs or delta-spark)")
