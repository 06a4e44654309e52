"""What a batch's merge hands back: its ``BatchReport``, or the error that halted it before anything of it was
committed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from cdc_assets.catalog import CapturedTable
from cdc_assets.core import BatchSummary
from cdc_assets.core.transaction_status import TransactionStatus
from cdc_assets.io.delta import MergeOutcome
from cdc_assets.io.kafka import RawBatch


class BadEventError(RuntimeError):
    """An event cannot be applied; nothing of its batch was committed."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str, table: str, bad_events: int = 1):
        self.topic, self.partition, self.offset, self.reason = topic, partition, offset, reason
        super().__init__(
            f"{topic} partition {partition} offset {offset}: {reason}. Halted: nothing of this batch was committed "
            f"to table '{table}' ({bad_events} bad event(s) in the batch). Fix the producer or the table's config "
            "and run again, or set the table's on_bad_event: dead_letter to apply the rest and keep bad events in "
            "the dead-letter table")


class TruncateError(RuntimeError):
    """A TRUNCATE reached a table whose ``on_truncate`` is halt; nothing of its batch was committed."""

    def __init__(self, topic: str, partition: int, offset: int, table: str):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic} partition {partition} offset {offset}: TRUNCATE of table '{table}' at the source. Halted "
            "(the table's on_truncate is halt): nothing of this batch was committed and the Delta table keeps its "
            "rows. Decide for the table: on_truncate: apply removes the rows from before it as the source did, "
            "ignore skips TRUNCATE events (counted); then run again")


class BatchTooSmallError(RuntimeError):
    """A transaction has more events for a table than one batch may hold."""


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch read, applied and committed."""

    table: CapturedTable
    writer: str
    raw: RawBatch
    tombstones: int
    summary: BatchSummary | None
    outcome: MergeOutcome | None
    timings: dict[str, float] = field(default_factory=dict)
    dead_lettered: int = 0
    transactions: TransactionStatus | None = None  # tables cut to whole transactions
    key_columns: tuple[str, ...] = ()  # the key its commit recorded

    @property
    def events_read(self) -> int:
        return self.raw.records_read

    @property
    def capture_lag_s(self) -> float | None:
        """Seconds from the newest applied change in the source database to now."""
        return _seconds_since(self.summary.max_source_ts if self.summary else None)

    @property
    def capture_lag_p50_s(self) -> float | None:
        """The median over the batch's keys of the seconds since each key's newest change."""
        return _seconds_since(self.summary.median_key_source_ts if self.summary else None)

    def offsets(self, since: Mapping[int, int] | None = None) -> dict[str, dict[str, int]]:
        """``{partition: {from, to, high_watermark}}``, from ``since`` (an earlier batch's start
        offsets) where it names the partition, else from this batch's start."""
        return offsets_metadata({**self.raw.start_offsets, **(since or {})}, self.raw.end_offsets,
                                self.raw.high_watermarks, self.raw.start_offsets)

    def offsets_json(self) -> str:
        """``offsets()`` as JSON."""
        return json.dumps(self.offsets())


def offsets_metadata(start: Mapping[int, int], end: Mapping[int, int], high: Mapping[int, int],
                     partitions: Iterable[int]) -> dict[str, dict[str, int]]:
    """A run's ``offsets`` metadata of a table, ``{partition: {from, to, high_watermark}}`` for ``partitions``
    (``topics.recorded_ends`` reads its ``to`` back)."""
    return {str(p): {"from": start[p], "to": end[p], "high_watermark": high[p]} for p in sorted(partitions)}


def _seconds_since(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - moment).total_seconds()
