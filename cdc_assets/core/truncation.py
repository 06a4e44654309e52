"""The TRUNCATE rule (``on_truncate: apply``): a TRUNCATE at source position P removes every row the
table held from before P, and nothing after it.

A TRUNCATE event has no key: it reaches one partition of the table's topic, while the table's row
events from before it may sit in other partitions, read in this batch or a later one. So:

- the table's rows whose ``_cdc_position`` precedes P are removed by the MERGE of the batch that reads
  the TRUNCATE (each apply mode says how: ``ApplyMode.merge_plan``'s ``truncation``);
- the batch's events before P are dropped before the fold (``after_truncation``): their effect was
  wiped at the source;
- P is the table's truncation mark, recorded in every later commit, so that an event from before it
  read in a later batch (another partition's) is dropped too and never resurrects a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_assets.core.envelope import ERROR_COLUMN
from cdc_assets.core.fold import BatchSummary, TruncateEvent
from cdc_assets.core.layout import POSITION_COLUMN


@dataclass(frozen=True)
class Truncation:
    """The latest TRUNCATE a batch applies: its source position and time (the end of the rows it removes)."""

    position: str
    source_ts: datetime | None = None


def latest_truncation(truncates: Sequence[TruncateEvent]) -> Truncation | None:
    """The batch's TRUNCATE with the latest source position, or None."""
    if not truncates:
        return None
    latest = max(truncates, key=lambda event: event.position)
    return Truncation(latest.position, latest.source_ts)


def truncation_mark(recorded: str | None, batch: Truncation | None) -> str | None:
    """The table's truncation mark after a batch: the later of the one its commits recorded and the batch's."""
    marks = [mark for mark in (recorded, batch.position if batch else None) if mark is not None]
    return max(marks) if marks else None


def wiped_by(summary: BatchSummary, mark: str | None) -> bool:
    """Whether some good event of the batch precedes the truncation ``mark`` (and must be dropped)."""
    return mark is not None and summary.first_position is not None and summary.first_position <= mark


def after_truncation(decoded: DataFrame, mark: str) -> DataFrame:
    """Decoded events less the good ones at or before the truncation ``mark`` (the TRUNCATE events among them):
    bad events stay, to be halted on or dead-lettered as ever."""
    return decoded.where(F.col(ERROR_COLUMN).isNotNull() | (F.col(POSITION_COLUMN) > F.lit(mark)))
