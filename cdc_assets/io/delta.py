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
- ``commitInfo.userMetadata``: ``{"cdc_assets": {"app_id", "version", "topic", "offsets",
  "key_columns"}}``: the offsets the next batch starts from, and the table's key columns.

The MERGE applies a folded row only when its ``_cdc_position`` is newer than the target row's, so
applying any batch twice changes nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from cdc_assets.core.apply_modes import HELPER_PREFIX, ApplyMode, Clause, MergePlan
from cdc_assets.core.arrow import to_arrow
from cdc_assets.core.layout import CURRENT_COLUMN
from cdc_assets.core.truncation import Truncation
from cdc_assets.io.spark import has_delta, is_local
from cdc_assets.io.storage import delta_rs_options, spark_path

METADATA_KEY = "cdc_assets"
_HISTORY_WINDOW = 100
# The properties of every table delta-rs creates here. Each load of a table replays the JSON commits since its
# last checkpoint, and delta-rs checkpoints every 100 commits by default: a table merged every few minutes then
# cost 16 ms a load (3.6 ms at 10). 10 is delta-spark's own default (docs/tuning.md, "Delta tables").
NEW_TABLE_PROPERTIES: Mapping[str, str] = {"delta.checkpointInterval": "10"}


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
    key_columns: tuple[str, ...] = ()
    transactions: Mapping[str, object] | None = None  # transaction-consistent tables: see io.transactions
    truncated_at: str | None = None  # the table's truncation mark (``core.truncation``), carried from commit to commit

    def applied_by(self, recorded_version: int | None) -> bool:
        """Whether a table whose app transaction is at ``recorded_version`` already holds this commit:
        versions grow with the offsets, so a version not above the recorded one is a repeat."""
        return recorded_version is not None and recorded_version >= self.version

    def user_metadata(self) -> str:
        payload: dict[str, object] = {"app_id": self.app_id, "version": self.version, "topic": self.topic,
                                      "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                                      "key_columns": list(self.key_columns)}
        if self.transactions is not None:
            payload["transactions"] = dict(self.transactions)
        if self.truncated_at is not None:
            payload["truncated_at"] = self.truncated_at
        return json.dumps({METADATA_KEY: payload}, sort_keys=True)


@dataclass(frozen=True)
class TableProgress:
    """What the latest batch commit of a table recorded."""

    offsets: dict[int, int]
    txn_version: int
    delta_version: int
    key_columns: tuple[str, ...] = ()
    transactions: Mapping[str, object] | None = None
    truncated_at: str | None = None


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge did: rows changed and the table version after it."""

    delta_version: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    already_applied: bool = False


@dataclass(frozen=True)
class CompactionOutcome:
    """What a compaction did: data files before it, files removed and added, and the table version after."""

    files_before: int
    files_removed: int = 0
    files_added: int = 0
    delta_version: int = -1
    compacted: bool = False  # False: below the threshold, nothing committed


@dataclass(frozen=True)
class KeyReport:
    """What the key checks look at."""

    rows: int
    duplicate_keys: int
    null_keys: int


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
              commit: CommitRequest, mode: ApplyMode, truncation: Truncation | None = None) -> MergeOutcome:
        """Create the table if needed and MERGE the folded rows per the apply mode (``mode.merge_plan``),
        with ``commit`` in the same commit; with ``truncation``, the MERGE also removes the rows from before
        that TRUNCATE."""
        ...

    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        """Commit offsets with no data change (a batch of tombstones only) to an existing table."""
        ...

    def current_rows(self, target: DeltaTarget, keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        """``columns`` (the key columns among them) of the table's rows whose key (``keys``' columns) is
        in ``keys``; None if no table."""
        ...

    def ensure_columns(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> list[str]:
        """Create the table with ``schema`` if it is missing, else add the columns it lacks (nullable);
        set ``properties`` on it. Returns the names of the columns created or added."""
        ...

    def copy_renamed(self, target: DeltaTarget, renames: Sequence[tuple[str, str]], before_position: str,
                     changed_at: str) -> int:
        """For each ``(old, new)`` column rename, give the rows whose change (the hidden column ``changed_at``:
        the apply mode's ``changed_at_column``) came before ``before_position`` (the rename's source position)
        the old column's value in the new one. Returns the rows updated."""
        ...

    def copy_table(self, source: DeltaTarget, target: DeltaTarget) -> int:
        """Create ``target`` as a copy of ``source``'s rows, hidden columns and all (a renamed table's rows
        under its new name); returns the rows copied. ``target`` must not exist yet."""
        ...

    def empty_table(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> None:
        """Remove every row of the existing table and give it ``schema`` (no other column) and ``properties``,
        in one commit that keeps its history: the offsets its last batch commit recorded stay the ones its next
        batch starts from (a table created again after a DROP, ``jobs.schema_changes``)."""
        ...

    def key_report(self, target: DeltaTarget, key_columns: Sequence[str]) -> KeyReport | None:
        """Rows, duplicated keys and null keys of the table (for scd2, of its current versions)."""
        ...

    def compact(self, target: DeltaTarget, min_files: int) -> CompactionOutcome | None:
        """Bin-pack the table's small files into larger ones (OPTIMIZE) if it has at least ``min_files`` data
        files; None if no table. The commit records no offsets, so ``read_progress`` looks past it."""
        ...


def open_table(target: DeltaTarget) -> DeltaTable | None:
    """The Delta table at ``target`` (delta-rs), or None where there is none yet."""
    options = delta_rs_options(target.storage_options)
    if not DeltaTable.is_deltatable(target.path, storage_options=options):
        return None
    return DeltaTable(target.path, storage_options=options)


def progress_from_history(history: Sequence[Mapping[str, object]], app_id: str) -> TableProgress | None:
    """What the first batch commit of ``app_id`` in ``history`` (a Delta log's commit infos, newest first)
    recorded; None if none did."""
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
                key_columns=tuple(recorded.get("key_columns") or ()),
                transactions=recorded.get("transactions"),
                truncated_at=recorded.get("truncated_at"),
            )
    return None


def table_schema_of(rows: pa.Table) -> pa.Schema:
    """The target table's schema for a batch: its columns less the MERGE helpers."""
    return pa.schema([f for f in rows.schema if not f.name.startswith(HELPER_PREFIX)])


# delta-spark's error classes for a commit that lost to another one (Delta's conflict check).
_SPARK_COMMIT_CONFLICTS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


@contextmanager
def _concurrent_commit_guard(target: DeltaTarget, commit: CommitRequest) -> Iterator[None]:
    """Turn either writer's commit conflicts into a clear error: nothing of the batch was committed."""
    from deltalake.exceptions import CommitFailedError

    try:
        yield
    except Exception as exc:
        if not isinstance(exc, CommitFailedError) and not any(name in str(exc) for name in _SPARK_COMMIT_CONFLICTS):
            raise
        raise DeltaWriterError(
            f"{target.path}: another commit reached the table while this batch (offsets "
            f"{dict(commit.offsets)}) was being merged ({next(iter(str(exc).splitlines()), '')}); nothing of this "
            "batch was committed and the next run resumes from the table's committed offsets. Use Dagster pools so "
            "one table is merged by one run at a time") from exc


def _renamed_rows(before_position: str, changed_at: str, quote: Callable[[str], str]) -> str:
    """The rows a rename's copy updates: those whose change (``changed_at``: a row's position, or an scd2
    version's start) came before the rename (a position starts with its event's source position, which sorts
    as the DDL's does); rows changed since hold the new column's own value."""
    position = before_position.replace("'", "''")
    return f"{quote(changed_at)} < '{position}'"


def quote_datafusion(name: str) -> str:
    """Quote an identifier for delta-rs (DataFusion SQL)."""
    return '"' + name.replace('"', '""') + '"'


def quote_spark(name: str) -> str:
    """Quote an identifier (or a path inside ``delta.`...```) for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def commit_properties(commit: CommitRequest) -> CommitProperties:
    """delta-rs commit properties that record ``commit`` (app transaction and offsets) in the commit.
    No retries: a concurrent commit to the table (another run of it) makes this one fail instead of
    being rebased on top, so the same offsets are never committed twice."""
    return CommitProperties(custom_metadata={"userMetadata": commit.user_metadata()},
                            app_transactions=[Transaction(commit.app_id, commit.version)],
                            max_commit_retries=0)


class DeltaRsWriter:
    """Merges with delta-rs; the folded batch is taken from Spark as Arrow.

    A writer keeps each table it loaded and brings it up to date (the commits since) at every later use: a
    table's merge in a run reads its progress, schema and rows and merges through one load of its log. A
    writer serves one run's work (``merge_table`` makes one a table): a table deleted and created again at
    the same path while a writer holds it is not noticed."""

    name = "delta-rs"

    def __init__(self) -> None:
        self._loaded: dict[str, DeltaTable] = {}

    def _table(self, target: DeltaTarget) -> DeltaTable | None:
        """The table at ``target`` as of now (``open_table``), None where there is none yet."""
        table = self._loaded.get(target.path)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # gone, or unreadable: loaded again below, as a first use would
                del self._loaded[target.path]
        table = open_table(target)
        if table is not None:
            self._loaded[target.path] = table
        return table

    def _create(self, target: DeltaTarget, schema: pa.Schema, mode: Literal["error", "ignore"]) -> DeltaTable:
        """Create the table at ``target`` with ``NEW_TABLE_PROPERTIES`` (``mode`` as ``DeltaTable.create``'s)."""
        table = DeltaTable.create(target.path, schema=schema, mode=mode, configuration=NEW_TABLE_PROPERTIES,
                                  storage_options=delta_rs_options(target.storage_options))
        self._loaded[target.path] = table
        return table

    def table_schema(self, target: DeltaTarget) -> T.StructType | None:
        table = self._table(target)
        return None if table is None else from_arrow_schema(pa.schema(table.schema().to_arrow()))

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        table = self._table(target)
        if table is None:
            return None
        progress = progress_from_history(table.history(_HISTORY_WINDOW), app_id) or progress_from_history(
            table.history(), app_id)
        txn_version = table.transaction_version(app_id)
        if txn_version is not None and (progress is None or progress.txn_version != txn_version):
            raise DeltaWriterError(
                f"{target.path}: app transaction {app_id} is at version {txn_version} but no commit records "
                "its offsets (history cleaned up?): refusing to guess where to resume")
        return progress

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest, mode: ApplyMode, truncation: Truncation | None = None) -> MergeOutcome:
        table = self._table(target)
        if table is None:
            # mode="ignore": a concurrent run may create the table first.
            table = self._create(target, table_schema_of(rows), mode="ignore")
        if self._already_applied(table, commit):
            return MergeOutcome(delta_version=table.version(), already_applied=True)
        if not mode.evolves_schema and self.ensure_columns(target, table_schema_of(rows), {}):
            table = self._table(target)
            assert table is not None
        before = table.version()
        plan = mode.merge_plan(key_columns, rows.column_names, quote_datafusion, truncation)
        with _concurrent_commit_guard(target, commit):
            metrics = self._merge(table, rows, plan, mode.evolves_schema, commit)
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

    def _merge(self, table: DeltaTable, rows: pa.Table, plan: MergePlan, evolve_schema: bool,
               commit: CommitRequest) -> Mapping[str, int]:
        merger = table.merge(rows, plan.condition, source_alias="s", target_alias="t", merge_schema=evolve_schema,
                             commit_properties=commit_properties(commit))
        for clause in plan.matched:
            if clause.action == "delete":
                merger = merger.when_matched_delete(predicate=clause.predicate)
            elif clause.assignments is None:
                merger = merger.when_matched_update_all(predicate=clause.predicate)
            else:
                merger = merger.when_matched_update(dict(clause.assignments), predicate=clause.predicate)
        for clause in plan.not_matched:
            if clause.assignments is None:
                merger = merger.when_not_matched_insert_all(predicate=clause.predicate)
            else:
                merger = merger.when_not_matched_insert(dict(clause.assignments), predicate=clause.predicate)
        for clause in plan.not_matched_by_source:
            if clause.action == "delete":
                merger = merger.when_not_matched_by_source_delete(predicate=clause.predicate)
            else:
                assert clause.assignments is not None  # a target-only row has no source row to take every column from
                merger = merger.when_not_matched_by_source_update(dict(clause.assignments), predicate=clause.predicate)
        return merger.execute()

    def commit_progress(self, target: DeltaTarget, commit: CommitRequest) -> MergeOutcome:
        table = self._table(target)
        if table is None:
            raise DeltaWriterError(f"{target.path}: no Delta table to commit offsets to")
        if self._already_applied(table, commit):
            return MergeOutcome(delta_version=table.version(), already_applied=True)
        with _concurrent_commit_guard(target, commit):
            table.create_write_transaction([], mode="append", schema=table.schema(),
                                           commit_properties=commit_properties(commit))
        table.update_incremental()
        return MergeOutcome(delta_version=table.version())

    def current_rows(self, target: DeltaTarget, keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        table = self._table(target)
        if table is None:
            return None
        dataset = table.to_pyarrow_dataset()
        # Spark hands keys over as string_view while Parquet statistics are plain strings: compare as
        # plain strings on both sides.
        plain = pa.schema([pa.field(name, pa.string() if pa.types.is_string_view(keys[name].type) else keys[name].type)
                           for name in keys.column_names])
        wanted = keys.cast(plain)
        found = None
        for name in keys.column_names:
            match = pds.field(name).cast(plain.field(name).type).isin(wanted[name].combine_chunks())
            found = match if found is None else found & match
        rows = dataset.to_table(columns=list(columns), filter=found)
        if keys.num_columns == 1:
            return rows
        # Each key column's values among the wanted ones: a superset of the wanted keys, cut to them.
        return rows.join(wanted.cast(pa.schema([rows.schema.field(n) for n in keys.column_names])),
                         keys=keys.column_names, join_type="left semi")

    def ensure_columns(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> list[str]:
        from deltalake import Field

        table = self._table(target)
        if table is None:
            # ``properties`` set after: create's configuration refuses keys outside Delta's own (delta-rs 1.6).
            table = self._create(target, schema, mode="error")
            added = list(schema.names)
        else:
            present = set(pa.schema(table.schema().to_arrow()).names)
            missing = [field.with_nullable(True) for field in schema if field.name not in present]
            if missing:
                table.alter.add_columns([Field.from_arrow(field) for field in missing])
            added = [field.name for field in missing]
        if properties:
            table.alter.set_table_properties(dict(properties), raise_if_not_exists=False)
        return added

    def copy_renamed(self, target: DeltaTarget, renames: Sequence[tuple[str, str]], before_position: str,
                     changed_at: str) -> int:
        table = self._table(target)
        if table is None or not renames:
            return 0
        updates = {quote_datafusion(new): quote_datafusion(old) for old, new in renames}
        result = table.update(updates=updates, predicate=_renamed_rows(before_position, changed_at, quote_datafusion))
        return int(result.get("num_updated_rows", 0))

    def copy_table(self, source: DeltaTarget, target: DeltaTarget) -> int:
        table = self._table(source)
        if table is None:
            raise DeltaWriterError(f"{source.path}: no Delta table to copy")
        rows = table.to_pyarrow_table()
        write_deltalake(target.path, rows, mode="error", configuration=NEW_TABLE_PROPERTIES,
                        storage_options=delta_rs_options(target.storage_options))
        return rows.num_rows

    def empty_table(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> None:
        table = self._table(target)
        if table is None:
            raise DeltaWriterError(f"{target.path}: no Delta table to empty")
        write_deltalake(table, schema.empty_table(), mode="overwrite", schema_mode="overwrite")
        table.update_incremental()
        if properties:
            table.alter.set_table_properties(dict(properties), raise_if_not_exists=False)

    def key_report(self, target: DeltaTarget, key_columns: Sequence[str]) -> KeyReport | None:
        table = self._table(target)
        if table is None:
            return None
        dataset = table.to_pyarrow_dataset()
        current = CURRENT_COLUMN in dataset.schema.names
        keys = dataset.to_table(columns=list(key_columns),
                                filter=pds.field(CURRENT_COLUMN) if current else None)
        nulls = keys.num_rows - keys.drop_null().num_rows
        counts = keys.group_by(list(key_columns)).aggregate([([], "count_all")])
        duplicates = pc.sum(pc.greater(counts["count_all"], 1)).as_py() or 0
        return KeyReport(keys.num_rows, int(duplicates), nulls)

    def compact(self, target: DeltaTarget, min_files: int) -> CompactionOutcome | None:
        table = self._table(target)
        if table is None:
            return None
        files = len(table.file_uris())
        if files < min_files:
            return CompactionOutcome(files, delta_version=table.version())
        metrics = table.optimize.compact()
        table.update_incremental()
        return CompactionOutcome(files, int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0)),
                                 table.version(), compacted=True)

    @staticmethod
    def _already_applied(table: DeltaTable, commit: CommitRequest) -> bool:
        return commit.applied_by(table.transaction_version(commit.app_id))



class DeltaSparkWriter:
    """Merges with delta-spark: ``MERGE INTO delta.`path``` in the session that folded the batch."""

    name = "delta-spark"

    def __init__(self, spark: SparkSession, deletion_vectors: bool = False):
        if not has_delta(spark):
            raise DeltaWriterError(
                "the delta-spark writer needs a Spark session with Delta (set CDC_DELTA_SPARK_JARS to the Delta "
                "jars, or run on a cluster that has Delta); use writer 'delta-rs' or 'auto' otherwise")
        self._spark = spark
        self._deletion_vectors = deletion_vectors

    def _table_ref(self, target: DeltaTarget) -> str:
        return f"delta.{quote_spark(spark_path(target.path))}"

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
        return self._spark.read.format("delta").load(spark_path(target.path)).schema

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        history = self._history(target, _HISTORY_WINDOW)
        if history is None:
            return None
        return progress_from_history(history, app_id) or progress_from_history(
            self._history(target, None) or [], app_id)

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest, mode: ApplyMode, truncation: Truncation | None = None) -> MergeOutcome:
        # Spark infers no schema from an empty table (a first batch whose every event was dead-lettered).
        batch = self._spark.createDataFrame(rows) if rows.num_rows else self._spark.createDataFrame(
            [], from_arrow_schema(rows.schema))
        if self._history(target, 1) is None:
            self._create(target, table_schema_of(rows), {})
        elif _needs_column_mapping(rows.column_names):
            self._map_columns_by_name(target)
        if self._already_applied(target, commit):
            return MergeOutcome(delta_version=self._latest_version(target), already_applied=True)
        if not mode.evolves_schema:
            self.ensure_columns(target, table_schema_of(rows), {})
        before = self._latest_version(target)
        view = f"cdc_batch_{abs(hash((target.path, commit.version)))}"
        batch.createOrReplaceTempView(view)
        plan = mode.merge_plan(key_columns, rows.column_names, quote_spark, truncation)
        clauses = [self._render("WHEN MATCHED", clause) for clause in plan.matched]
        clauses += [self._render("WHEN NOT MATCHED", clause) for clause in plan.not_matched]
        clauses += [self._render("WHEN NOT MATCHED BY SOURCE", clause) for clause in plan.not_matched_by_source]
        try:
            with _concurrent_commit_guard(target, commit), self._committing(commit, mode.evolves_schema):
                result = self._spark.sql(
                    f"MERGE INTO {self._table_ref(target)} t USING {view} s ON {plan.condition} {' '.join(clauses)}"
                ).first()
        finally:
            self._spark.catalog.dropTempView(view)
        if result is None:
            # Delta skips (no result row) a MERGE whose txn version the table holds: another run committed it.
            return MergeOutcome(delta_version=self._latest_version(target), already_applied=True)
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
        with _concurrent_commit_guard(target, commit), self._committing(commit):
            self._spark.sql(f"INSERT INTO {table} SELECT * FROM {table} WHERE false")
        return MergeOutcome(delta_version=self._latest_version(target))

    def current_rows(self, target: DeltaTarget, keys: pa.Table, columns: Sequence[str]) -> pa.Table | None:
        if self._history(target, 1) is None:
            return None
        wanted = self._spark.createDataFrame(keys)
        stored = self._spark.read.format("delta").load(spark_path(target.path)).join(wanted, keys.column_names,
                                                                                     "left_semi")
        return to_arrow(stored.select(*[quote_spark(name) for name in columns]))

    def ensure_columns(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> list[str]:
        table = self._table_ref(target)
        if self._history(target, 1) is None:
            self._create(target, schema, properties)
            return list(schema.names)
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
        if not renames or self._history(target, 1) is None:
            return 0
        assignments = ", ".join(f"{quote_spark(new)} = {quote_spark(old)}" for old, new in renames)
        rows = self._spark.sql(f"UPDATE {self._table_ref(target)} SET {assignments} WHERE "
                               f"{_renamed_rows(before_position, changed_at, quote_spark)}").collect()
        return int(rows[0][0]) if rows else 0

    def copy_table(self, source: DeltaTarget, target: DeltaTarget) -> int:
        if self._history(source, 1) is None:
            raise DeltaWriterError(f"{source.path}: no Delta table to copy")
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
        if self._history(target, 1) is None:
            raise DeltaWriterError(f"{target.path}: no Delta table to empty")
        self._ddl(f"REPLACE TABLE {self._definition(target, schema, properties)}")

    def key_report(self, target: DeltaTarget, key_columns: Sequence[str]) -> KeyReport | None:
        from pyspark.sql import functions as F

        if self._history(target, 1) is None:
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
        if self._history(target, 1) is None:
            return None
        detail = self._spark.sql(f"DESCRIBE DETAIL {self._table_ref(target)}").first()
        files = int(detail["numFiles"]) if detail is not None else 0
        if files < min_files:
            return CompactionOutcome(files, delta_version=self._latest_version(target))
        result = self._ddl(f"OPTIMIZE {self._table_ref(target)}").first()
        metrics = result["metrics"].asDict() if result is not None and result["metrics"] is not None else {}
        return CompactionOutcome(files, int(metrics.get("numFilesRemoved") or 0),
                                 int(metrics.get("numFilesAdded") or 0), self._latest_version(target), compacted=True)

    def _map_columns_by_name(self, target: DeltaTarget) -> None:
        """Let the table take column names that delta-spark refuses without column mapping."""
        detail = self._spark.sql(f"DESCRIBE DETAIL {self._table_ref(target)}").first()
        properties = (detail["properties"] if detail is not None else None) or {}
        if properties.get(_COLUMN_MAPPING, "none") == "none":
            self._ddl(f"ALTER TABLE {self._table_ref(target)} SET TBLPROPERTIES ('{_COLUMN_MAPPING}' = 'name')")

    def _already_applied(self, target: DeltaTarget, commit: CommitRequest) -> bool:
        progress = self.read_progress(target, commit.app_id)
        return commit.applied_by(progress.txn_version if progress is not None else None)

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
    def _committing(self, commit: CommitRequest, schema_evolution: bool = True) -> Iterator[None]:
        """Session settings that put the txn and offsets into the next Delta commit, reset after."""
        settings = {
            "spark.databricks.delta.write.txnAppId": commit.app_id,
            "spark.databricks.delta.write.txnVersion": str(commit.version),
            "spark.databricks.delta.commitInfo.userMetadata": commit.user_metadata(),
            "spark.databricks.delta.schema.autoMerge.enabled": str(schema_evolution).lower(),
        }
        # Tables merged side by side share the session, whose settings would then name another table's commit.
        with _SESSION_SETTINGS:
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
