"""A batch read from a table's topic, and the layout of its change events, before anything is decoded.

``read_batch`` reads from Kafka (its tombstones counted apart); ``derive_batch_layout`` derives the layout
(``core.layout``) from sampled keys and values (``sample_values``); ``key_change_cut_for`` tells the source where
a batch may end without separating a primary-key change's two events.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from cdc_assets.catalog import CapturedTable
from cdc_assets.config import BatchLimits
from cdc_assets.core import derive_layout
from cdc_assets.core.envelope import explain_bad_value
from cdc_assets.core.key_changes import key_change_cut, unfinished_partitions
from cdc_assets.core.layout import HIDDEN_PREFIX, PLACEHOLDER_KINDS, ChangeEventLayout, LayoutError, shown_columns
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.kafka import Cut, KafkaSource, RawBatch
from cdc_assets.merge.faults import checkpoint

_SAMPLE = 100


def sample_values(column: pa.ChunkedArray) -> list[bytes]:
    """The first and last few non-null values (newest last), for layout derivation."""
    if column.null_count:  # their positions, not a filtered copy of the whole column
        present = pc.indices_nonzero(pc.is_valid(column))
        if len(present) > 2 * _SAMPLE:
            present = pa.concat_arrays([present.slice(0, _SAMPLE), present.slice(len(present) - _SAMPLE)])
        return column.take(present).to_pylist()
    if len(column) <= 2 * _SAMPLE:
        return column.to_pylist()
    return column.slice(0, _SAMPLE).to_pylist() + column.slice(len(column) - _SAMPLE).to_pylist()


def derive_batch_layout(table: CapturedTable, raw: RawBatch, samples: tuple[list[bytes], list[bytes]],
                        existing: StructType | None, key_columns: tuple[str, ...] = ()) -> ChangeEventLayout:
    """The layout of the batch's sampled keys and values (``core.layout``), given the table's Delta schema
    and the key columns its last commit recorded (for a batch of keyless events: TRUNCATE)."""
    existing_rows = None
    if existing is not None:
        existing_rows = StructType([f for f in existing.fields if not f.name.startswith(HIDDEN_PREFIX)])
    try:
        layout = derive_layout(table.kind, *samples, table.merge.key_columns, table.merge.columns, existing_rows,
                               table.merge.unavailable_placeholder, key_columns, dict(table.merge.document_fields))
        choices = table.merge.column_choices
        # A column the choices name is unknown where the batch's newest event shows the columns without it.
        return choices.applied_to(layout, shown_columns(samples[1]) if choices.named else None)
    except LayoutError as exc:
        offsets = {p: f"{raw.start_offsets[p]}..{raw.end_offsets[p]}" for p in sorted(raw.start_offsets)}
        # Sampled events that cannot be read are the cause an operator must see, not the layout they left empty.
        unreadable = [reason for value in samples[1] if (reason := explain_bad_value(value, ""))]
        cause = f" (sampled events cannot be read, e.g. {unreadable[-1]})" if unreadable else ""
        raise LayoutError(f"table '{table.name}', topic {table.topic}, batch offsets by partition {offsets}: "
                          f"{exc}{cause}. Nothing was committed") from exc


def read_batch(source: KafkaSource, table: CapturedTable, limits: BatchLimits, offsets: Mapping[int, int] | None,
               until: Mapping[int, int] | None = None, cut: Cut | None = None) -> tuple[RawBatch, int, pa.Table]:
    """The batch of ``table``'s topic that starts at ``offsets`` (and stops before ``until``, where it
    names a partition, or where ``cut`` ends it), its tombstones and its other records."""
    # Read the next batch while this one is applied; not for tables cut to whole transactions, whose
    # batches also read the transaction topic with the same consumer.
    raw = source.read_batch(table.topic, offsets, limits.max_records, limits.max_bytes, limits.poll_timeout_s,
                            read_ahead=table.transactions is None, until=until, cut=cut,
                            decode=record_decoder(table.merge.schema_registry))
    checkpoint("consumed")
    is_tombstone = pc.is_null(raw.records["value"])
    tombstones = pc.sum(is_tombstone).as_py() or 0
    return raw, tombstones, raw.records.filter(pc.invert(is_tombstone)) if tombstones else raw.records


def key_change_cut_for(table: CapturedTable, existing: StructType | None,
                       key_columns: tuple[str, ...]) -> Cut | None:
    """Where a batch of ``table`` can end without separating a primary-key change's delete and create
    (``core.key_changes``), for the source to cut it before it reads the next batch ahead: only where
    values can carry the unavailable-value placeholder (None: never cut; batches cut to whole transactions
    keep a key change's two events together already)."""
    if table.kind not in PLACEHOLDER_KINDS or table.transactions is not None:
        return None

    def cut(raw: RawBatch) -> dict[int, int] | None:
        values = raw.records["value"]
        # Asked before the layout, which costs a parse of the sampled values (most batches of small tables).
        if values.null_count == len(values) or not (raw.key_change_halves or unfinished_partitions(
                raw.end_offsets, raw.high_watermarks)):
            return None
        samples = (sample_values(raw.records["key"]), sample_values(values))
        layout = derive_batch_layout(table, raw, samples, existing, key_columns)
        if not layout.unavailable_tests:
            return None
        return key_change_cut(raw.records, raw.end_offsets, raw.high_watermarks, table.kind, layout.placeholder,
                              raw.key_change_halves)

    return cut
