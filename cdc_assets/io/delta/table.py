"""Where a Delta table lives, how to open it with delta-rs, and the properties every table created here gets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdc_assets.io.storage import delta_rs_options

# The properties of every table delta-rs creates here. Each load of a table replays the JSON commits since its
# last checkpoint, and delta-rs checkpoints every 100 commits by default: a table merged every few minutes then
# cost 16 ms a load (3.6 ms at 10). 10 is delta-spark's own default (docs/tuning.md, "Delta tables").
NEW_TABLE_PROPERTIES: Mapping[str, str] = {"delta.checkpointInterval": "10"}


@dataclass(frozen=True)
class DeltaTarget:
    """Where one table lives."""

    path: str
    storage_options: Mapping[str, str] = field(default_factory=dict)


def open_table(target: DeltaTarget) -> DeltaTable | None:
    """The Delta table at ``target`` (delta-rs), or None where there is none yet."""
    try:  # one look at the log: asking ``is_deltatable`` first read it twice
        return DeltaTable(target.path, storage_options=delta_rs_options(target.storage_options))
    except TableNotFoundError:
        return None
