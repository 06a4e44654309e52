"""What a batch commit records besides its data, in ``commitInfo.userMetadata``, and the one parser of it.

Every commit that applies a batch carries ``{"cdc_assets": {"app_id", "version", "topic", "offsets",
"key_columns"}}`` (and ``transactions`` / ``truncated_at`` where the table has them): the offsets the next
batch starts from, and the table's key columns. Every reader of that record (the writers' progress, the
transaction watermark, a row's history, the benchmarks) goes through ``recorded_commit``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltalake import CommitProperties, Transaction

METADATA_KEY = "cdc_assets"


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
            )
    return None
