"""What happened to one row: the changes applied to one key of a captured table, oldest first.

An scd2 table keeps its history as versions (``_cdc_valid_from`` .. ``_cdc_valid_to``), so a key's
history is its versions. Other tables keep only the latest row; there the key's history is read
from the Delta log: every table version whose commit changed the key's row, with the Kafka offsets
that commit recorded. Delta's log retention bounds how far back that reaches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

import pyarrow.dataset as pds
from deltalake import DeltaTable

from cdc_assets.core.layout import VALID_FROM_COLUMN
from cdc_assets.io.delta import DeltaTarget, recorded_commit
from cdc_assets.io.storage import delta_rs_options

if TYPE_CHECKING:  # not imported at run time: the API module brings pyspark along
    from cdc_assets.api import TableSpec

TableRef = Union[str, "os.PathLike[str]", DeltaTarget, "TableSpec"]


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
    # One thread: pyarrow's scanner threads left alive abort the interpreter at exit now and then
    # ("terminate called without an active exception", apache/arrow#34314), and a key's rows are few.
    return table.to_pyarrow_dataset().to_table(filter=_key_filter(key), use_threads=False).to_pylist()


def _commit_offsets(entry: Mapping[str, Any]) -> dict[str, int] | None:
    recorded = recorded_commit(entry)
    return dict(recorded["offsets"]) if recorded is not None and "offsets" in recorded else None


def _target(table: TableRef, storage_options: Mapping[str, str] | None) -> DeltaTarget:
    """The Delta table that ``table`` names: a path (with ``storage_options``), a ``DeltaTarget`` or a
    ``TableSpec``."""
    if isinstance(table, DeltaTarget):
        return table
    if isinstance(table, (str, os.PathLike)):
        return DeltaTarget(os.fspath(table), dict(storage_options or {}))
    return DeltaTarget(table.target, dict(table.storage_options))


def is_scd2(table: DeltaTable) -> bool:
    """Whether ``table`` keeps versions (apply mode scd2): its schema has ``_cdc_valid_from``."""
    return VALID_FROM_COLUMN in table.schema().to_arrow().names


def row_history(table: TableRef, key: Mapping[str, Any], scd2: bool | None = None, since_version: int = 0,
                storage_options: Mapping[str, str] | None = None) -> list[RowChange]:
    """The changes applied to the row of ``key`` (``{column: value}``) in ``table`` (a path, with
    ``storage_options`` for object stores; a ``DeltaTarget``; or a ``TableSpec``), oldest first.

    An scd2 table (found out from its columns, unless ``scd2`` says) gives the key's versions, ordered by
    ``_cdc_valid_from``; another walks the Delta versions from ``since_version`` and keeps those that
    changed the key's row.
    """
    target = _target(table, storage_options)
    options = delta_rs_options(target.storage_options)
    latest = DeltaTable(target.path, storage_options=options)
    if scd2 is None:
        scd2 = is_scd2(latest)
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
