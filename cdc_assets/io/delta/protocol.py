"""The seams every Delta writer implements: the merge path a table's micro-batches take (``BatchWriter``), and
the administration of a table outside it (``TableAdmin``: schema changes, key reports, compaction).
``DeltaWriter`` is both, as each writer is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import pyarrow as pa
from pyspark.sql import types as T

from cdc_assets.core.apply_modes import ApplyMode
from cdc_assets.core.truncation import Truncation
from cdc_assets.io.delta.metadata import CommitRequest, TableProgress
from cdc_assets.io.delta.outcomes import CompactionOutcome, KeyReport, MergeOutcome
from cdc_assets.io.delta.table import DeltaTarget


class BatchWriter(Protocol):
    """What the merge of a table's micro-batches needs of a writer."""

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
        in ``keys`` (a column the table does not have reads as null); None if no table."""
        ...


class TableAdmin(Protocol):
    """What schema changes, the key checks and compaction need of a writer."""

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


class DeltaWriter(BatchWriter, TableAdmin, Protocol):
    """A whole writer: the merge path and the table administration (``DeltaRsWriter``, ``DeltaSparkWriter``)."""
