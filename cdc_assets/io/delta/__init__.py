"""The Delta sink: one seam, two writers that produce the same table contents and commit metadata.

- ``DeltaRsWriter`` (``rs.py``, the ``deltalake`` package): merges the folded rows with ``DeltaTable.merge``.
  The embedded default.
- ``DeltaSparkWriter`` (``spark.py``): Spark SQL ``MERGE INTO delta.`path```, for sessions that have Delta
  (clusters, Databricks).

Both take the folded batch as Arrow: it is bounded by the micro-batch (at most one row per key of
at most ``max_records`` events) and has already left Spark once, with the batch statistics. Both follow
the rules of ``base.py`` and implement the seams of ``protocol.py``: the merge path (``BatchWriter``) and
the table administration (``TableAdmin``).

Every commit that applies a batch carries, in the same atomic commit as the data:
- an app transaction ``(app_id, version)``; ``version`` grows with the offsets, so a batch that was
  already committed is recognised and skipped (delta-rs does not skip repeats by itself, so
  ``DeltaRsWriter`` checks ``transaction_version`` first; delta-spark skips them natively);
- ``commitInfo.userMetadata`` (``metadata.py``): ``{"cdc_assets": {"app_id", "version", "topic", "offsets",
  "key_columns"}}``: the offsets the next batch starts from, and the table's key columns.

The MERGE applies a folded row only when its ``_cdc_position`` is newer than the target row's, so
applying any batch twice changes nothing.
"""

from cdc_assets.io.delta.errors import (
    ConcurrentCommitError,
    DeltaWriterError,
    TableMissingError,
    concurrent_commit_guard,
)
from cdc_assets.io.delta.metadata import (
    METADATA_KEY,
    CommitRequest,
    TableProgress,
    commit_properties,
    progress_from_history,
    recorded_commit,
)
from cdc_assets.io.delta.outcomes import CompactionOutcome, KeyReport, MergeOutcome
from cdc_assets.io.delta.protocol import BatchWriter, DeltaWriter, TableAdmin
from cdc_assets.io.delta.rs import DeltaRsWriter
from cdc_assets.io.delta.selection import select_writer
from cdc_assets.io.delta.spark import DELETION_VECTORS, DeltaSparkWriter
from cdc_assets.io.delta.sql import quote_datafusion, quote_spark
from cdc_assets.io.delta.table import NEW_TABLE_PROPERTIES, DeltaTarget, open_table

__all__ = [
    "DELETION_VECTORS",
    "METADATA_KEY",
    "NEW_TABLE_PROPERTIES",
    "BatchWriter",
    "CommitRequest",
    "CompactionOutcome",
    "ConcurrentCommitError",
    "DeltaRsWriter",
    "DeltaSparkWriter",
    "DeltaTarget",
    "DeltaWriter",
    "DeltaWriterError",
    "KeyReport",
    "MergeOutcome",
    "TableAdmin",
    "TableMissingError",
    "TableProgress",
    "commit_properties",
    "concurrent_commit_guard",
    "open_table",
    "progress_from_history",
    "quote_datafusion",
    "quote_spark",
    "recorded_commit",
    "select_writer",
]
