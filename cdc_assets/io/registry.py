"""The table registry: what schema-change events announced for each captured table.

A Delta table of the pipeline (``<delta root>/_cdc_assets/schema_registry``), one row per applied
table change, written with delta-rs. The code location reads it when it loads: tables created at the
source (and matched by a connector's include patterns) become assets without code changes, and
dropped tables stay as retired assets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import types as T

from cdc_assets.core.schema_evolution import RegistryEntry, change_order
from cdc_assets.io.delta import NEW_TABLE_PROPERTIES, DeltaTarget, open_table
from cdc_assets.io.storage import delta_rs_options

REGISTRY_SCHEMA = pa.schema([
    ("connector", pa.string()),
    ("table", pa.string()),
    ("change", pa.string()),
    ("status", pa.string()),
    ("primary_keys", pa.string()),
    ("columns", pa.string()),
    ("source_position", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("applied_at", pa.timestamp("us", tz="UTC")),
    ("run_id", pa.string()),
])


def change_row(*, connector: str, table: str, change: str, primary_keys: tuple[str, ...], columns: T.StructType,
               source_position: str, topic: str, partition: int, offset: int, run_id: str) -> dict[str, Any]:
    """One applied table change as a registry row (what ``record_change`` appends)."""
    return {"connector": connector, "table": table, "change": change,
            "status": "retired" if change == "DROP" else "active", "primary_keys": json.dumps(list(primary_keys)),
            "columns": columns.json(), "source_position": source_position, "topic": topic, "partition": partition,
            "offset": offset, "applied_at": datetime.now(timezone.utc), "run_id": run_id}


def record_change(path: str, storage_options: Mapping[str, str], *, connector: str, table: str, change: str,
                  primary_keys: tuple[str, ...], columns: T.StructType, source_position: str, topic: str,
                  partition: int, offset: int, run_id: str) -> None:
    """Append one applied table change to the registry."""
    append_change(path, storage_options, change_row(
        connector=connector, table=table, change=change, primary_keys=primary_keys, columns=columns,
        source_position=source_position, topic=topic, partition=partition, offset=offset, run_id=run_id))


def append_change(path: str, storage_options: Mapping[str, str], row: Mapping[str, Any]) -> None:
    """Append one applied table change (a ``change_row``) to the registry."""
    write_deltalake(path, pa.Table.from_pylist([row], schema=REGISTRY_SCHEMA), mode="append",
                    configuration=NEW_TABLE_PROPERTIES, storage_options=delta_rs_options(storage_options))


def read_history(path: str, storage_options: Mapping[str, str], pending: Mapping[str, Any] | None = None
                 ) -> dict[tuple[str, str], list[RegistryEntry]]:
    """Every registered change per (connector, table), in source order (``change_order``), with ``pending``
    (a ``change_row`` not recorded yet) among them; a DROP carries the columns and keys of the change before
    it. Empty when nothing was registered yet."""
    table = open_table(DeltaTarget(path, dict(storage_options)))
    rows = table.to_pyarrow_table().to_pylist() if table is not None else []
    history: dict[tuple[str, str], list[RegistryEntry]] = {}
    for row in sorted([*rows, *([pending] if pending is not None else [])], key=change_order):
        changes = history.setdefault((row["connector"], row["table"]), [])
        columns = T.StructType.fromJson(json.loads(row["columns"]))
        keys = tuple(json.loads(row["primary_keys"]))
        if row["change"] == "DROP" and changes:
            columns, keys = changes[-1].columns, changes[-1].primary_keys
        changes.append(RegistryEntry(row["connector"], row["table"], row["status"], keys, columns, row["change"],
                                     row["source_position"] or "", row["topic"] or "", row["partition"],
                                     row["offset"]))
    return history


def read_registry(path: str, storage_options: Mapping[str, str]) -> dict[tuple[str, str], RegistryEntry]:
    """The latest entry per (connector, table) in source order; empty when nothing was registered yet."""
    return {key: changes[-1] for key, changes in read_history(path, storage_options).items()}
