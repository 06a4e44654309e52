"""The delta-spark writer: Spark SQL ``MERGE INTO delta.`path``` in the session that folded the batch, for
sessions that have Delta (clusters, Databricks). The app transaction and the offsets go into the commit through
session settings, so delta-spark skips a repeated app transaction natively."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pyarrow as pa
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from cdc_assets.core.apply_modes import ApplyMode, Clause
from cdc_assets.core.arrow import to_arrow
from cdc_assets.core.layout import CURRENT_COLUMN
from cdc_assets.core.truncation import Truncation
from cdc_assets.io.delta.base import HISTORY_WINDOW, WriterBase, latest_progress, table_schema_of
from cdc_assets.io.delta.errors import DeltaWriterError, TableMissingError, concurrent_commit_guard, is_missing_table
from cdc_assets.io.delta.log_files import local_log_dir, logged_history
from cdc_assets.io.delta.metadata import CommitRequest, TableProgress
from cdc_assets.io.delta.outcomes import CompactionOutcome, KeyReport, MergeOutcome
from cdc_assets.io.delta.sql import quote_spark, renamed_rows
from cdc_assets.io.delta.table import DeltaTarget, open_table
from cdc_assets.io.spark import SMALL_BATCH_RECORDS, has_delta, is_local
from cdc_assets.io.spark_server import small_batch_session
from cdc_assets.io.storage import spark_path


class DeltaSparkWriter(WriterBase):
    """Merges with delta-spark: ``MERGE INTO delta.`path``` in the session that folded the batch."""

    name = "delta-spark"

    def __init__(self, spark: SparkSession, deletion_vectors: bool = False):
        if not has_delta(spark):
            raise DeltaWriterError(
                "the delta-spark writer needs a Spark session with Delta (set CDC_DELTA_SPARK_JARS to the Delta "
                "jars, or run on a cluster that has Delta); use writer 'delta-rs' or 'auto' otherwise")
        self._spark = spark
        self._shares_disk = is_local(spark)
        self._deletion_vectors = deletion_vectors
        # The recent history ``read_progress`` last read of each table, taken by the table's next ``merge``: a
        # batch reads its progress and then merges, and a look at the history may be a Spark query (~0.3 s).
        self._looked: dict[str, list[dict[str, object]]] = {}

    def _table_ref(self, target: DeltaTarget) -> str:
        return f"delta.{quote_spark(spark_path(target.path))}"

    def _history(self, target: DeltaTarget, limit: int | None) -> list[dict[str, object]] | None:
        """The newest ``limit`` commit infos of the table (all where None), newest first; None: no table. From
        the log's files where the server shares this process's disk, through delta-rs where the target names
        the store options Spark's settings come from (``storage.spark_settings``), else from a Spark query."""
        log_dir = local_log_dir(target.path)
        if log_dir is not None and self._shares_disk:
            return logged_history(log_dir, limit)
        if log_dir is None and target.storage_options:  # delta-rs on this disk would read another machine's path
            try:
                table = open_table(target)
            except DeltaError:  # a table delta-rs cannot open (a reader feature it lacks): Spark reads it
                table = None
            else:
                return None if table is None else table.history(limit)
        suffix = f" LIMIT {limit}" if limit else ""
        try:
            # A look at the history is a small query: planned and run like a small batch's (docs/tuning.md).
            rows = self._small_queries().sql(f"DESCRIBE HISTORY {self._table_ref(target)}{suffix}").collect()
        except Exception as exc:
            if is_missing_table(exc):
                return None
            raise
        return [row.asDict() for row in rows]

    def table_schema(self, target: DeltaTarget) -> T.StructType | None:
        # One look, not a look at the history first: each is a Spark query, and every batch asks.
        try:
            return self._spark.read.format("delta").load(spark_path(target.path)).schema
        except Exception as exc:
            if is_missing_table(exc):
                return None
            raise

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        history = self._history(target, HISTORY_WINDOW)
        if history is None:
            return None
        self._looked[target.path] = history
        return self._progress_in(target, history, app_id)

    def _progress_in(self, target: DeltaTarget, recent: list[dict[str, object]], app_id: str) -> TableProgress | None:
        return latest_progress(recent, app_id, lambda: self._history(target, None) or [])

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest, mode: ApplyMode, truncation: Truncation | None = None) -> MergeOutcome:
        commit = commit.applying(rows)
        session = self._merging_session(rows)
        # Spark infers no schema from an empty table (a first batch whose every event was dead-lettered).
        batch = session.createDataFrame(rows) if rows.num_rows else session.createDataFrame(
            [], from_arrow_schema(rows.schema))
        # One look at the recent history tells existence, version and progress: a look may be a Spark query. The
        # batch's own look (``read_progress``) serves: a commit that lands after it is one the MERGE's txn settings
        # see (Delta skips a txn version the table holds), and ``_merged`` sees the version move.
        recent = self._looked.pop(target.path, None) or self._history(target, HISTORY_WINDOW)
        changed = recent is None
        if recent is None:
            self._create(target, table_schema_of(rows), {})
        elif _needs_column_mapping(rows.column_names):
            changed = self._map_columns_by_name(target)
        progress = self._progress_in(target, recent, commit.app_id) if recent else None
        if commit.applied_by(progress.txn_version if progress is not None else None):
            return self._applied_before(target)
        if not mode.evolves_schema:
            changed = bool(self._add_columns(target, table_schema_of(rows), {})) or changed
        before = self._version(target) if changed or not recent else int(str(recent[0]["version"]))
        view = f"cdc_batch_{abs(hash((target.path, commit.version)))}"
        batch.createOrReplaceTempView(view)
        plan = mode.merge_plan(key_columns, rows.column_names, quote_spark, truncation)
        clauses = [self._render("WHEN MATCHED", clause) for clause in plan.matched]
        clauses += [self._render("WHEN NOT MATCHED", clause) for clause in plan.not_matched]
        clauses += [self._render("WHEN NOT MATCHED BY SOURCE", clause) for clause in plan.not_matched_by_source]
        try:
            with concurrent_commit_guard(target, commit), self._committing(commit, mode.evolves_schema, session,
                                                                           MERGE_SOURCE_SETTINGS):
                result = session.sql(
                    f"MERGE INTO {self._table_ref(target)} t USING {view} s ON {plan.condition} {' '.join(clauses)}"
                ).first()
        finally:
            session.catalog.dropTempView(view)
        if result is None:
            # Delta skips (no result row) a MERGE whose txn version the table holds: another run committed it.
            return self._applied_before(target)
        return self._merged(target, commit, before, result.asDict(),
                            ("num_inserted_rows", "num_updated_rows", "num_deleted_rows"))

    def _merging_session(self, rows: pa.Table) -> SparkSession:
        """The session that MERGEs ``rows``: the small-batch session for fewer than ``SMALL_BATCH_RECORDS`` rows
        (a small MERGE, like a small fold, costs more to plan and generate code for than to run: docs/tuning.md),
        the writer's own otherwise."""
        return self._small_queries() if rows.num_rows < SMALL_BATCH_RECORDS else self._spark

    def _small_queries(self) -> SparkSession:
        """The writer's session's small-batch session (``spark_server.small_batch_session``), the writer's own
        session where it has none (a session not from ``connect``)."""
        return small_batch_session(self._spark) or self._spark

    def current_rows(self, target: DeltaTarget, keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        from pyspark.sql import functions as F

        if not self._exists(target):
            return None
        wanted = self._spark.createDataFrame(keys)
        stored = self._spark.read.format("delta").load(spark_path(target.path)).join(wanted, keys.column_names,
                                                                                     "left_semi")
        # A column the table does not have yet (added by this batch) reads as null. (``columns`` asks the server.)
        present = set(stored.columns)
        return to_arrow(stored.select(*[F.col(quote_spark(name)) if name in present
                                        else F.lit(None).cast("string").alias(name) for name in columns]))

    def ensure_columns(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> list[str]:
        if not self._exists(target):
            self._create(target, schema, properties)
            return list(schema.names)
        return self._add_columns(target, schema, properties)

    def _add_columns(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> list[str]:
        """Add the columns of ``schema`` that the existing table lacks and set ``properties``: the names added."""
        table = self._table_ref(target)
        wanted = from_arrow_schema(schema)
        present = set(self._spark.read.format("delta").load(spark_path(target.path)).columns)
        missing = [field for field in wanted.fields if field.name not in present]
        if _needs_column_mapping(field.name for field in missing):
            self._map_columns_by_name(target)
        if missing:
            columns = ", ".join(f"{quote_spark(f.name)} {f.dataType.simpleString()}" for f in missing)
            self._ddl(f"ALTER TABLE {table} ADD COLUMNS ({columns})")
        if properties:
            self._ddl(f"ALTER TABLE {table} SET TBLPROPERTIES ({_properties_sql(properties)})")
        return [field.name for field in missing]

    def copy_renamed(self, target: DeltaTarget, renames: Sequence[tuple[str, str]], before_position: str,
                     changed_at: str) -> int:
        if not renames or not self._exists(target):
            return 0
        assignments = ", ".join(f"{quote_spark(new)} = {quote_spark(old)}" for old, new in renames)
        rows = self._spark.sql(f"UPDATE {self._table_ref(target)} SET {assignments} WHERE "
                               f"{renamed_rows(before_position, changed_at, quote_spark)}").collect()
        return int(rows[0][0]) if rows else 0

    def copy_table(self, source: DeltaTarget, target: DeltaTarget) -> int:
        if not self._exists(source):
            raise TableMissingError(source.path, "to copy")
        rows = self._spark.read.format("delta").load(spark_path(source.path))
        self._create(target, to_arrow_schema(rows.schema, timezone="UTC"), {})
        self._spark.sql(f"INSERT INTO {self._table_ref(target)} SELECT * FROM {self._table_ref(source)}").collect()
        return int(self._spark.read.format("delta").load(spark_path(target.path)).count())

    def _create(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> None:
        """Create the table with ``schema`` and ``properties`` unless it exists. In SQL: the Python
        ``DeltaTable`` builder needs Delta's Spark Connect plugin on a Connect server."""
        self._ddl(f"CREATE TABLE IF NOT EXISTS {self._definition(target, schema, properties)}")

    def _definition(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> str:
        """``delta.`path` (columns) USING delta TBLPROPERTIES (...)`` of a table with ``schema`` and ``properties``
        (and the properties its columns and this writer's settings need)."""
        columns = ", ".join(f"{quote_spark(f.name)} {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                            for f in from_arrow_schema(schema).fields)
        if _needs_column_mapping(schema.names):
            properties = {_COLUMN_MAPPING: "name", **properties}
        if self._deletion_vectors:
            # A MERGE then marks the changed rows of a file deleted instead of rewriting the file.
            properties = {DELETION_VECTORS: "true", **properties}
        settings = f" TBLPROPERTIES ({_properties_sql(properties)})" if properties else ""
        return f"{self._table_ref(target)} ({columns}) USING delta{settings}"

    def empty_table(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> None:
        if not self._exists(target):
            raise TableMissingError(target.path, "to empty")
        self._ddl(f"REPLACE TABLE {self._definition(target, schema, properties)}")

    def key_report(self, target: DeltaTarget, key_columns: Sequence[str]) -> KeyReport | None:
        from pyspark.sql import functions as F

        if not self._exists(target):
            return None
        rows = self._spark.read.format("delta").load(spark_path(target.path))
        if CURRENT_COLUMN in rows.columns:
            rows = rows.where(F.col(CURRENT_COLUMN))
        keys = [F.col(quote_spark(name)) for name in key_columns]
        nulls = F.lit(False)
        for key in keys:
            nulls = nulls | key.isNull()
        counts = rows.agg(F.count(F.lit(1)), F.count_if(nulls)).first()
        total, null_keys = (counts[0], counts[1]) if counts is not None else (0, 0)
        duplicates = rows.groupBy(*keys).count().where("count > 1").count()
        return KeyReport(int(total), int(duplicates), int(null_keys))

    def compact(self, target: DeltaTarget, min_files: int) -> CompactionOutcome | None:
        if not self._exists(target):
            return None
        detail = self._spark.sql(f"DESCRIBE DETAIL {self._table_ref(target)}").first()
        files = int(detail["numFiles"]) if detail is not None else 0
        if files < min_files:
            return CompactionOutcome(files, delta_version=self._version(target))
        result = self._ddl(f"OPTIMIZE {self._table_ref(target)}").first()
        metrics = result["metrics"].asDict() if result is not None and result["metrics"] is not None else {}
        return CompactionOutcome(files, int(metrics.get("numFilesRemoved") or 0),
                                 int(metrics.get("numFilesAdded") or 0), self._version(target), compacted=True)

    def _map_columns_by_name(self, target: DeltaTarget) -> bool:
        """Let the table take column names that delta-spark refuses without column mapping: whether that
        took a commit (a table that maps them already takes none)."""
        detail = self._spark.sql(f"DESCRIBE DETAIL {self._table_ref(target)}").first()
        properties = (detail["properties"] if detail is not None else None) or {}
        if properties.get(_COLUMN_MAPPING, "none") != "none":
            return False
        self._ddl(f"ALTER TABLE {self._table_ref(target)} SET TBLPROPERTIES ('{_COLUMN_MAPPING}' = 'name')")
        return True

    @staticmethod
    def _render(when: str, clause: Clause) -> str:
        condition = f" AND {clause.predicate}" if clause.predicate else ""
        if clause.action == "delete":
            return f"{when}{condition} THEN DELETE"
        if clause.action == "update":
            sets = "*" if clause.assignments is None else ", ".join(
                f"t.{column} = {value}" for column, value in clause.assignments.items())
            return f"{when}{condition} THEN UPDATE SET {sets}"
        if clause.assignments is None:
            return f"{when}{condition} THEN INSERT *"
        return (f"{when}{condition} THEN INSERT ({', '.join(clause.assignments)}) "
                f"VALUES ({', '.join(clause.assignments.values())})")

    def _ddl(self, statement: str) -> DataFrame:
        """Run a statement that commits to a table but carries no batch (create, add columns, set
        properties, optimize): never while another table's batch settings are on the session."""
        with _SESSION_SETTINGS:
            return self._spark.sql(statement)

    @contextmanager
    def _committing(self, commit: CommitRequest, schema_evolution: bool = True,
                    session: SparkSession | None = None, more: Mapping[str, str] | None = None) -> Iterator[None]:
        """Settings of ``session`` (the writer's own unless given) that put the txn and offsets into its next Delta
        commit, and ``more`` for that statement, reset after."""
        spark = session or self._spark
        settings = {
            "spark.databricks.delta.write.txnAppId": commit.app_id,
            "spark.databricks.delta.write.txnVersion": str(commit.version),
            "spark.databricks.delta.commitInfo.userMetadata": commit.user_metadata(),
            "spark.databricks.delta.schema.autoMerge.enabled": str(schema_evolution).lower(),
            **(more or {}),
        }
        # Tables merged side by side share the session, whose settings would then name another table's commit.
        with _SESSION_SETTINGS:
            for key, value in settings.items():
                spark.conf.set(key, value)
            try:
                yield
            finally:
                for key in settings:
                    spark.conf.unset(key)

    def _exists(self, target: DeltaTarget) -> bool:
        return self._history(target, 1) is not None

    def _version(self, target: DeltaTarget) -> int:
        history = self._history(target, 1)
        return int(str(history[0]["version"])) if history else -1

    def _recorded_txn_version(self, target: DeltaTarget, app_id: str) -> int | None:
        # The txn version the latest batch commit recorded in its metadata (``read_progress``).
        progress = self.read_progress(target, app_id)
        return progress.txn_version if progress is not None else None

    def _commit_without_data(self, target: DeltaTarget, commit: CommitRequest) -> None:
        # A small query: on the small-batch session, 0.68x the server CPU it costs the run's (docs/tuning.md).
        table, session = self._table_ref(target), self._small_queries()
        with self._committing(commit, session=session):
            session.sql(f"INSERT INTO {table} SELECT * FROM {table} WHERE false")


# A MERGE's source is the batch's rows, held in the plan (a local relation): it cannot change between the MERGE's
# passes, so Delta need not copy it first, as it does for any source that is not a Delta scan (a Spark job a batch;
# 0.96x the server CPU of a small MERGE: docs/tuning.md).
MERGE_SOURCE_SETTINGS = {"spark.databricks.delta.merge.materializeSource": "none"}

# One delta-spark commit at a time in a process: a batch's commit sets the session's txn settings.
_SESSION_SETTINGS = threading.Lock()

# delta-spark refuses these characters in column names unless the table maps columns by name (delta-rs takes them).
_UNMAPPED_NAME_REFUSES = frozenset(" ,;{}()\n\t=")
_COLUMN_MAPPING = "delta.columnMapping.mode"
DELETION_VECTORS = "delta.enableDeletionVectors"


def _needs_column_mapping(names: Iterable[str]) -> bool:
    return any(_UNMAPPED_NAME_REFUSES.intersection(name) for name in names)


def _properties_sql(properties: Mapping[str, str]) -> str:
    """Table properties as a Spark SQL ``TBLPROPERTIES`` list."""
    return ", ".join(f"'{k}' = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in properties.items())
