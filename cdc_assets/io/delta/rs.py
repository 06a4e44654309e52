"""The delta-rs writer (the ``deltalake`` package): merges the folded rows with ``DeltaTable.merge``; the
embedded default. delta-rs does not skip a repeated app transaction by itself, so the writer checks
``transaction_version`` before each commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_assets.core.apply_modes import ApplyMode, MergePlan
from cdc_assets.core.layout import CURRENT_COLUMN
from cdc_assets.core.truncation import Truncation
from cdc_assets.io.delta.base import HISTORY_WINDOW, WriterBase, latest_progress, table_schema_of
from cdc_assets.io.delta.errors import DeltaWriterError, TableMissingError, concurrent_commit_guard
from cdc_assets.io.delta.metadata import CommitRequest, TableProgress, commit_properties, progress_from_history
from cdc_assets.io.delta.outcomes import CompactionOutcome, KeyReport, MergeOutcome
from cdc_assets.io.delta.sql import quote_datafusion, renamed_rows
from cdc_assets.io.delta.table import NEW_TABLE_PROPERTIES, DeltaTarget, open_table
from cdc_assets.io.storage import delta_rs_options


class DeltaRsWriter(WriterBase):
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
        return None if table is None else _schema(table)

    def read_progress(self, target: DeltaTarget, app_id: str) -> TableProgress | None:
        table = self._table(target)
        return None if table is None else self._progress(table, target, app_id)

    def read_current(self, target: DeltaTarget, app_id: str) -> tuple[TableProgress | None, T.StructType | None]:
        """``read_progress`` and ``table_schema`` from one look at the table's log (each alone looks again)."""
        table = self._table(target)
        return (None, None) if table is None else (self._progress(table, target, app_id), _schema(table))

    def _progress(self, table: DeltaTable, target: DeltaTarget, app_id: str) -> TableProgress | None:
        # The newest commit first: most often the latest batch's (one commit file read, not HISTORY_WINDOW).
        progress = progress_from_history(table.history(1), app_id) or \
            latest_progress(table.history(HISTORY_WINDOW), app_id, table.history)
        txn_version = table.transaction_version(app_id)
        if txn_version is not None and (progress is None or progress.txn_version != txn_version):
            raise DeltaWriterError(
                f"{target.path}: app transaction {app_id} is at version {txn_version} but no commit records "
                "its offsets (history cleaned up?): refusing to guess where to resume")
        return progress

    def merge(self, target: DeltaTarget, rows: pa.Table, key_columns: Sequence[str],
              commit: CommitRequest, mode: ApplyMode, truncation: Truncation | None = None) -> MergeOutcome:
        commit = commit.applying(rows)
        table = self._table(target)
        if table is None:
            # mode="ignore": a concurrent run may create the table first.
            table = self._create(target, table_schema_of(rows), mode="ignore")
        applied = self._if_applied(target, commit)
        if applied is not None:
            return applied
        if not mode.evolves_schema and self.ensure_columns(target, table_schema_of(rows), {}):
            table = self._table(target)
            assert table is not None
        before = table.version()
        plan = mode.merge_plan(key_columns, rows.column_names, quote_datafusion, truncation)
        with concurrent_commit_guard(target, commit):
            metrics = self._merge(table, rows, plan, mode.evolves_schema, commit)
        table.update_incremental()
        return self._merged(target, commit, before, metrics,
                            ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted"))

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

    def _exists(self, target: DeltaTarget) -> bool:
        return self._table(target) is not None

    def _version(self, target: DeltaTarget) -> int:
        # As ``_table`` or this writer's last commit brought it up to date: the log is not listed again.
        return self._loaded[target.path].version()

    def _recorded_txn_version(self, target: DeltaTarget, app_id: str) -> int | None:
        return self._loaded[target.path].transaction_version(app_id)

    def _commit_without_data(self, target: DeltaTarget, commit: CommitRequest) -> None:
        table = self._loaded[target.path]
        table.create_write_transaction([], mode="append", schema=table.schema(),
                                       commit_properties=commit_properties(commit))
        table.update_incremental()

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
        present = [name for name in columns if name in dataset.schema.names]
        rows = dataset.to_table(columns=present, filter=found)
        # A column the table does not have yet (added by this batch) reads as null.
        rows = pa.table({name: rows[name] if name in present else pa.nulls(rows.num_rows, pa.string())
                         for name in columns})
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
        result = table.update(updates=updates, predicate=renamed_rows(before_position, changed_at, quote_datafusion))
        return int(result.get("num_updated_rows", 0))

    def copy_table(self, source: DeltaTarget, target: DeltaTarget) -> int:
        table = self._table(source)
        if table is None:
            raise TableMissingError(source.path, "to copy")
        rows = table.to_pyarrow_table()
        write_deltalake(target.path, rows, mode="error", configuration=NEW_TABLE_PROPERTIES,
                        storage_options=delta_rs_options(target.storage_options))
        return rows.num_rows

    def empty_table(self, target: DeltaTarget, schema: pa.Schema, properties: Mapping[str, str]) -> None:
        table = self._table(target)
        if table is None:
            raise TableMissingError(target.path, "to empty")
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


def _schema(table: DeltaTable) -> T.StructType:
    """The schema of a loaded table as Spark types."""
    return from_arrow_schema(pa.schema(table.schema().to_arrow()))
