"""A table's change events merged into its Delta table, one micro-batch (one commit) at a time; no Dagster.

- ``read``: a batch read from the table's topic, and the layout of its events;
- ``transactions``: a transaction-consistent table's batch cut to whole transactions, and its status;
- ``prepare``: a batch read, decoded and folded, ready to commit;
- ``apply``: a prepared batch committed (or halted on bad events or a TRUNCATE);
- ``batches``: a table's micro-batches one after another, the next prepared while one commits;
- ``shared``: a run's first batches of many tables read before their merges, those of one layout folded in
  one Spark query (a shared plan);
- ``quiet``: the tables with nothing new (their latest commit recorded their topic's end), told apart first;
- ``concurrent``: several tables' merges side by side in a thread pool;
- ``report``: each batch's ``BatchReport``, and the errors that halt a batch;
- ``faults``: the fault-injection hook of tests and crash trials.
"""

from cdc_assets.merge.batches import merge_micro_batch, merge_micro_batches
from cdc_assets.merge.concurrent import MergeFailed, TableMerge, merge_concurrently
from cdc_assets.merge.report import BadEventError, BatchReport, BatchTooSmallError, TruncateError
from cdc_assets.merge.shared import FirstBatch

__all__ = [
    "BadEventError",
    "BatchReport",
    "BatchTooSmallError",
    "FirstBatch",
    "MergeFailed",
    "TableMerge",
    "TruncateError",
    "merge_concurrently",
    "merge_micro_batch",
    "merge_micro_batches",
]
