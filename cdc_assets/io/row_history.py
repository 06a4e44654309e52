"""What happened to one row: the changes applied to one key of a captured table, oldest first.

An scd2 table keeps its history as versions (``_cdc_valid_from`` .. ``_cdc_valid_to``), so a key's
history is its versions. Other tables keep only the latest row; there the key's history is read
from the Delta log: every table version whose commit changed the key's row, with the Kafka offsets
that commit recorded. Delta's log retention bounds how far back that reaches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow.dataset as pds
from deltalake import DeltaTable

from cdc_assets.core.layout import VALID_FROM_COLUMN
from cdc_assets.io.delta import METADATA_KEY, DeltaTarget


@dataclass(frozen=True)
class RowChange:
    """One change of a key's row: the row after it (None: the key was deleted, or absent)."""

    delta_version: int | None  # the commit that made this change (None for scd2 versions)
    committed_at: datetime | None
    offsets: dict[str, int] | None  # Kafka next offsets per partition the commit recorded
    row: dict[str, Any] | None


def _key_filter(key: Mapping[str, Any]) -> pds.Expression:
    if not key:
        raise ValueError("a key needs at least one column")
    expression = None
    for column, value in key.items():
        term = pds.field(column) == value
        expression = term if expression is None else expression & term
    assert expression is not None
    return expression


def _rows(table: DeltaTable, key: Mapping[str, Any]) -> list[dict[str, Any]]:
    return table.to_pyarrow_dataset().to_table(filter=_key_filter(key)).to_pylist()


def _commit_offsets(entry: Mapping[str, Any]) -> dict[str, int] | None:
    try:
        recorded = json.loads(str(entry.get("userMetadata") or "{}")).get(METADATA_KEY)
    except ValueError:
        return None
    return dict(recorded["offsets"]) if isinstance(recorded, dict) and "offsets" in recorded else None


def row_history(target: DeltaTarget, key: Mapping[str, Any], scd2: bool = False,
                since_version: int = 0) -> list[RowChange]:
    """The changes applied to the row of ``key`` (``{column: value}``), oldest first.

    ``scd2``: read the table's versions of the key (ordered by ``_cdc_valid_from``); otherwise walk
    the Delta versions from ``since_version`` and keep those that changed the key's row.
    """
    options = dict(target.storage_options)
    latest = DeltaTable(target.path, storage_options=options)
    if scd2:
        versions = sorted(_rows(latest, key), key=lambda row: row[VALID_FROM_COLUMN])
        return [RowChange(None, None, None, row) for row in versions]
    commits = {int(entry["version"]): entry for entry in latest.history()}
    changes: list[RowChange] = []
    previous: list[dict[str, Any]] = []
    for version in range(max(since_version, min(commits, default=0)), latest.version() + 1):
        rows = _rows(DeltaTable(target.path, version=version, storage_options=options), key)
        if rows != previous:
            entry = commits.get(version, {})
            millis = entry.get("timestamp")
            changes.append(RowChange(
                version, datetime.fromtimestamp(int(millis) / 1000, timezone.utc) if millis else None,
                _commit_offsets(entry), rows[0] if rows else None))
        previous = rows
    return changes

