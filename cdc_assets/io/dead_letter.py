"""The pipeline's dead-letter table: events that could not be applied, with their coordinates.

One Delta table per pipeline (``<delta root>/_cdc_assets/dead_letter``), written with delta-rs
whatever the table writer, MERGEd on (topic, partition, offset) so that retrying a batch never
lands an event twice.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core.envelope import explain_bad_value, record_as_read
from cdc_assets.core.fold import BadEvent
from cdc_assets.io.delta import NEW_TABLE_PROPERTIES, DeltaTarget
from cdc_assets.io.storage import delta_rs_options

DEAD_LETTER_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("error", pa.string()),
    ("table", pa.string()),
    ("dead_lettered_at", pa.timestamp("us", tz="UTC")),
])


def _coordinates(partition: pa.Array | pa.ChunkedArray, offset: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.add(pc.multiply(pc.cast(partition, pa.int64()), 1 << 40), offset)


def dead_letter_rows(topic: str, table: str, events: pa.Table, bad: Sequence[BadEvent]) -> pa.Table:
    """The dead-letter rows of ``bad`` events, with their key and value as they were in Kafka and the
    reason sharpened by looking at the value."""
    reasons = {(event.partition << 40) + event.offset: event.reason for event in bad}
    wanted = events.filter(pc.is_in(_coordinates(events["partition"], events["offset"]),
                                    value_set=pa.array(list(reasons), pa.int64())))
    codes = _coordinates(wanted["partition"], wanted["offset"]).to_pylist()
    keys, values = wanted["key"].to_pylist(), wanted["value"].to_pylist()
    as_read = [record_as_read(key, value) for key, value in zip(keys, values, strict=True)]
    now = datetime.now(timezone.utc)
    return pa.table({
        "topic": pa.array([topic] * wanted.num_rows, pa.string()),
        "partition": wanted["partition"],
        "offset": wanted["offset"],
        "key": pa.array([key for key, _ in as_read], pa.binary()),
        "value": pa.array([value for _, value in as_read], pa.binary()),
        "error": pa.array([explain_bad_value(value, reasons[code])
                           for value, code in zip(values, codes, strict=True)], pa.string()),
        "table": pa.array([table] * wanted.num_rows, pa.string()),
        "dead_lettered_at": pa.array([now] * wanted.num_rows, pa.timestamp("us", tz="UTC")),
    }, schema=DEAD_LETTER_SCHEMA)


# A run merges tables side by side, and they share the dead-letter table: two MERGEs of it at once
# would conflict, so a process writes it one batch at a time.
_WRITING = threading.Lock()


def write_dead_letters(target: DeltaTarget, rows: pa.Table) -> None:
    """Add ``rows`` to the dead-letter table (created on first use); rows already there are kept."""
    options = delta_rs_options(target.storage_options)
    with _WRITING:
        if not DeltaTable.is_deltatable(target.path, storage_options=options):
            write_deltalake(target.path, rows.slice(0, 0), configuration=NEW_TABLE_PROPERTIES, storage_options=options)
        (
            DeltaTable(target.path, storage_options=options)
            .merge(rows, 't.topic = s.topic AND t."partition" = s."partition" AND t."offset" = s."offset"',
                   source_alias="s", target_alias="t")
            .when_not_matched_insert_all()
            .execute()
        )
