"""A prepared batch committed to its Delta table: its rows and offsets in one commit, or its offsets alone; or,
before anything is committed, its bad events halting it or put in the dead-letter table, and a TRUNCATE
halting a table whose ``on_truncate`` is halt."""

from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.catalog import CapturedTable
from cdc_assets.core.envelope import explain_bad_value
from cdc_assets.core.truncation import truncation_mark
from cdc_assets.io.dead_letter import dead_letter_rows, write_dead_letters
from cdc_assets.io.delta import BatchWriter
from cdc_assets.merge.faults import checkpoint
from cdc_assets.merge.prepare import Prepared, batch_truncation
from cdc_assets.merge.report import BadEventError, BatchReport, TruncateError


def _value_at(events: pa.Table, partition: int, offset: int) -> bytes | None:
    """The raw value of the event at (partition, offset)."""
    mask = pc.and_(pc.equal(events["partition"], partition), pc.equal(events["offset"], offset))
    values = events.filter(mask)["value"].to_pylist()
    return values[0] if values else None


def apply_batch(writer: BatchWriter, table: CapturedTable, prepared: Prepared) -> BatchReport:
    """Commit a prepared batch: its rows and offsets, or its offsets alone; or halt on bad events
    (or put them in the dead-letter table, as the table is configured) before anything is committed."""
    raw, timings = prepared.raw, prepared.timings
    report = BatchReport(table, writer.name, raw, prepared.tombstones, prepared.summary, None, timings,
                         transactions=prepared.transactions,
                         key_columns=prepared.commit.key_columns if prepared.commit is not None else ())
    if prepared.commit is None:
        return report
    if prepared.rows is None:
        mark = time.perf_counter()
        outcome = writer.commit_progress(table.target, prepared.commit)
        timings["merge_commit_s"] = time.perf_counter() - mark
        return replace(report, outcome=outcome)
    assert prepared.summary is not None and prepared.layout is not None
    dead_lettered = 0
    if prepared.summary.bad_events:
        bad, events = prepared.summary.bad_events, prepared.events
        assert events is not None
        if table.merge.on_bad_event != "dead_letter" or table.merge.dead_letter is None:
            first = bad[0]
            reason = explain_bad_value(_value_at(events, first.partition, first.offset), first.reason)
            raise BadEventError(table.topic, first.partition, first.offset, reason, table.name, len(bad))
        mark = time.perf_counter()
        write_dead_letters(table.merge.dead_letter, dead_letter_rows(table.topic, table.name, events, bad))
        dead_lettered = len(bad)
        timings["dead_letter_s"] = time.perf_counter() - mark
    if prepared.summary.truncates and table.merge.on_truncate == "halt":
        truncate = prepared.summary.truncates[0]
        raise TruncateError(table.topic, truncate.partition, truncate.offset, table.name)
    truncation = batch_truncation(table, prepared.summary)
    commit = replace(prepared.commit, truncated_at=truncation_mark(prepared.commit.truncated_at, truncation))
    checkpoint("folded")
    mark = time.perf_counter()
    if prepared.rows.num_rows == 0 and prepared.existing is not None and truncation is None:
        # Nothing to change (every event older than the table's rows, or dead-lettered): the offsets alone.
        outcome = writer.commit_progress(table.target, commit)
    else:
        outcome = writer.merge(table.target, prepared.rows, prepared.layout.key_columns, commit, table.mode,
                               truncation)
    timings["merge_commit_s"] = time.perf_counter() - mark
    checkpoint("committed")
    return replace(report, outcome=outcome, dead_lettered=dead_lettered)
