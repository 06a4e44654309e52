"""What a batch commit records besides its data, in ``commitInfo.userMetadata``, and the one parser of it.

Every commit that applies a batch carries ``{"cdc_assets": {"app_id", "version", "topic", "offsets",
"key_columns"}}`` (and ``transactions`` / ``truncated_at`` / ``source_position`` where the table has them): the
offsets the next batch starts from, the table's key columns, and the greatest source position of a change the
table has applied (``CommitRequest.applying``: what rows_match_source waits for, read without scanning the
table). Every reader of that record (the writers' progress, the transaction watermark, a row's history, the
benchmarks) goes through ``recorded_commit``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, Transaction

from cdc_assets.core.history import CLOSE_AT_COLUMN
from cdc_assets.core.layout import POSITION_COLUMN, VALID_FROM_COLUMN, VALID_TO_COLUMN

METADATA_KEY = "cdc_assets"
# The columns of a batch's MERGE rows that hold the source position of a change it applies, in every apply mode:
# scd1 and soft_delete rows their own position, scd2 versions where they start and end, and its close markers
# the first change of their key (a key's delete alone in a batch is only there).
_POSITION_COLUMNS = (POSITION_COLUMN, VALID_FROM_COLUMN, VALID_TO_COLUMN, CLOSE_AT_COLUMN)


@dataclass(frozen=True)
class CommitRequest:
    """What a batch commit records besides the data: app transaction and source offsets."""

    app_id: str
    version: int
    topic: str
    offsets: Mapping[int, int]
    key_columns: tuple[str, ...] = ()
    transactions: Mapping[str, object] | None = None  # transaction-consistent tables: see io.transactions
    truncated_at: str | None = None  # the table's truncation mark (``core.truncation``), carried from commit to commit
    # The greatest source position of a change the table has applied, carried from commit to commit.
    source_position: str | None = None

    def applying(self, rows: pa.Table) -> CommitRequest:
        """This request for a commit that MERGEs ``rows``: its ``source_position`` moved to the greatest
        position the rows hold, if greater (positions are fixed-width strings, ``core.position``)."""
        positions = [pc.max(rows[name]).as_py() for name in _POSITION_COLUMNS if name in rows.column_names]
        newest = max([p for p in positions if p is not None] + ([self.source_position] if self.source_position
                                                                 else []), default=None)
        return replace(self, source_position=newest)

    def applied_by(self, recorded_version: int | None) -> bool:
        """Whether a table whose app transaction is at ``recorded_version`` already holds this commit:
        versions grow with the offsets, so a version not above the recorded one is a repeat."""
        return recorded_version is not None and recorded_version >= self.version

    def user_metadata(self) -> str:
        """The commit's ``userMetadata``: this request as JSON under ``METADATA_KEY``."""
        payload: dict[str, object] = {"app_id": self.app_id, "version": self.version, "topic": self.topic,
                                      "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                                      "key_columns": list(self.key_columns)}
        if self.transactions is not None:
            payload["transactions"] = dict(self.transactions)
        if self.truncated_at is not None:
            payload["truncated_at"] = self.truncated_at
        if self.source_position is not None:
            payload["source_position"] = self.source_position
        return json.dumps({METADATA_KEY: payload}, sort_keys=True)


@dataclass(frozen=True)
class TableProgress:
    """What the latest batch commit of a table recorded."""

    offsets: dict[int, int]
    txn_version: int
    delta_version: int
    key_columns: tuple[str, ...] = ()
    transactions: Mapping[str, object] | None = None
    truncated_at: str | None = None
    source_position: str | None = None  # None: a commit written before the position was recorded


def commit_properties(commit: CommitRequest) -> CommitProperties:
    """delta-rs commit properties that record ``commit`` (app transaction and offsets) in the commit.
    No retries: a concurrent commit to the table (another run of it) makes this one fail instead of
    being rebased on top, so the same offsets are never committed twice."""
    return CommitProperties(custom_metadata={"userMetadata": commit.user_metadata()},
                            app_transactions=[Transaction(commit.app_id, commit.version)],
                            max_commit_retries=0)


def recorded_commit(entry: Mapping[str, object]) -> dict[str, Any] | None:
    """What a commit (one commit info of a Delta log's history) recorded under ``METADATA_KEY``; None for a
    commit that recorded nothing of ours (no or foreign ``userMetadata``: a compaction, a schema change, another
    tool's write)."""
    raw = entry.get("userMetadata")
    if not raw:
        return None
    try:
        recorded = json.loads(str(raw)).get(METADATA_KEY)
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        return None
    return recorded if isinstance(recorded, dict) else None


def progress_from_history(history: Sequence[Mapping[str, object]], app_id: str) -> TableProgress | None:
    """What the first batch commit of ``app_id`` in ``history`` (a Delta log's commit infos, newest first)
    recorded; None if none did."""
    for entry in history:
        recorded = recorded_commit(entry)
        if recorded is not None and recorded.get("app_id") == app_id:
            return TableProgress(
                offsets={int(p): int(o) for p, o in recorded["offsets"].items()},
                txn_version=int(recorded["version"]),
                delta_version=int(str(entry["version"])),
                key_columns=tuple(recorded.get("key_columns") or ()),
                transactions=recorded.get("transactions"),
                truncated_at=recorded.get("truncated_at"),
                source_position=recorded.get("source_position"),
            )
    return None
