"""The transaction log of a connector and its cross-table consistent watermark.

- ``ingest_transactions`` copies new BEGIN/END events of ``<topic.prefix>.transaction`` into the Delta
  table ``<delta root>/_cdc_assets/transactions/<topic.prefix>`` (exactly once: offsets and an app
  transaction in the same commit, as for data tables).
- Every transaction-consistent batch commit of a table records ``tx_applied_end`` (the END offset of
  the last transaction it applied) and ``tx_horizon`` (the table is exact for every transaction
  whose END offset is at most this).
- ``update_watermark`` finds the greatest END offset W at which every transactional table of the
  connector has a version that is exact (``tx_applied_end <= W <= tx_horizon``) and records W, its
  transaction id and each table's version in ``<delta root>/_cdc_assets/watermarks``.
- ``consistent_versions`` returns the latest watermark's versions: time-travel each table to its
  version for a read in which no transaction is half applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core.transactions import (
    TransactionEventError,
    collection_count,
    parse_transaction_event,
    transaction_key,
)
from cdc_assets.io.avro import SchemaRegistrySettings, record_decoder
from cdc_assets.io.delta import (
    METADATA_KEY,
    NEW_TABLE_PROPERTIES,
    CommitRequest,
    DeltaRsWriter,
    DeltaTarget,
    DeltaWriterError,
    _concurrent_commit_guard,
    commit_properties,
    open_table,
)
from cdc_assets.io.kafka_source import KafkaSource
from cdc_assets.io.storage import delta_rs_options

LOG_SCHEMA = pa.schema([
    ("id", pa.string()), ("status", pa.string()), ("event_count", pa.int64()), ("collections", pa.string()),
    ("ts_ms", pa.int64()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.string()),
])
WATERMARK_SCHEMA = pa.schema([
    ("connector", pa.string()), ("end_offset", pa.int64()), ("transaction_id", pa.string()),
    ("transaction_ts", pa.timestamp("ms", tz="UTC")), ("versions", pa.string()),
    ("recorded_at", pa.timestamp("us", tz="UTC")),
])


_INGEST_ATTEMPTS = 5  # ingests racing one another: each lost race still moves the log on


class TransactionLogError(RuntimeError):
    """The transaction topic holds something the log cannot take; names topic, partition, offset."""


@dataclass(frozen=True)
class TransactionLog:
    """Where one connector's transaction log lives, and the connector's kind (what identifies its
    transactions: ``core.transactions.transaction_key``)."""

    topic: str
    target: DeltaTarget
    kind: str
    schema_registry: SchemaRegistrySettings | None = None  # the connector's format is avro: its schemas

    @property
    def app_id(self) -> str:
        return f"cdc_assets:{self.topic}"

    def _dataset(self) -> pds.Dataset | None:
        table = open_table(self.target)
        return None if table is None else table.to_pyarrow_dataset()

    def ends(self, keys: Iterable[str]) -> dict[str, tuple[int, dict[str, int]]]:
        """END offset and data collections of the given transactions (by ``transaction_key``), where known."""
        dataset, wanted = self._dataset(), list(keys)
        if dataset is None or not wanted:
            return {}
        # Rows logged before the key column existed are SQL Server/Db2 ENDs, whose key is their id.
        known = pds.field("key").isin(wanted) | (pds.field("key").is_null() & pds.field("id").isin(wanted))
        rows = dataset.to_table(columns=["id", "key", "offset", "collections"],
                                filter=(pds.field("status") == "END") & known).to_pylist()
        # Offset order: a key reused (PostgreSQL txIDs wrap around) means its latest END.
        return {row["key"] or row["id"]: (row["offset"], json.loads(row["collections"]))
                for row in sorted(rows, key=lambda row: row["offset"])}

    def ends_after(self, offset: int) -> list[tuple[int, str, dict[str, int]]]:
        """ENDs with an offset above ``offset``, in offset order."""
        dataset = self._dataset()
        if dataset is None:
            return []
        rows = dataset.to_table(columns=["id", "offset", "collections"],
                                filter=(pds.field("status") == "END") & (pds.field("offset") > offset)).to_pylist()
        return sorted((row["offset"], row["id"], json.loads(row["collections"])) for row in rows)

    def end_offset(self) -> int:
        """One past the greatest offset in the log (0 when empty)."""
        dataset = self._dataset()
        if dataset is None:
            return 0
        offsets = dataset.to_table(columns=["offset"])["offset"]
        return (pc.max(offsets).as_py() + 1) if len(offsets) else 0

    def transaction_at(self, offset: int) -> tuple[str, int | None] | None:
        """The END at or before ``offset`` with the greatest offset: (id, ts_ms)."""
        dataset = self._dataset()
        if dataset is None:
            return None
        rows = dataset.to_table(columns=["id", "ts_ms", "offset"],
                                filter=(pds.field("status") == "END") & (pds.field("offset") <= offset)).to_pylist()
        if not rows:
            return None
        last = max(rows, key=lambda row: row["offset"])
        return last["id"], last["ts_ms"]


def ingest_transactions(source: KafkaSource, log: TransactionLog, max_records: int = 100_000) -> int:
    """Copy new BEGIN/END events into the log, exactly once; returns how many were added. An END whose
    BEGIN was never seen, an unknown status or malformed data collections stop it with the event's offset.

    The tables of one connector may run at once (in different pools), so ingests may race: each
    commits with the app-transaction check the tables use (``DeltaRsWriter``), and one that loses
    the commit race reads on from the winner's offsets."""
    attempt = 1
    while True:
        try:
            return _ingest_once(source, log, max_records)
        except DeltaWriterError:
            if attempt == _INGEST_ATTEMPTS:
                raise
            attempt += 1


def _ingest_once(source: KafkaSource, log: TransactionLog, max_records: int) -> int:
    """One ingest from the log's committed offsets; a concurrent commit makes it fail, adding nothing."""
    writer = DeltaRsWriter()
    progress = writer.read_progress(log.target, log.app_id)
    raw = source.read_batch(log.topic, progress.offsets if progress else None, max_records, 256 * 1024 * 1024, 10,
                            decode=record_decoder(log.schema_registry))
    if raw.end_offsets == raw.start_offsets:
        return 0
    records = sorted(raw.records.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    begun = _begun(log)
    rows = []
    for record in records:
        where = f"{log.topic} partition {record['partition']} offset {record['offset']}"
        if record["value"] is None:
            continue
        try:
            event = parse_transaction_event(record["value"])
        except TransactionEventError as exc:
            raise TransactionLogError(f"{where}: {exc}") from exc
        key = transaction_key(log.kind, event.id)
        if event.status == "BEGIN":
            begun.add(key)
        elif key not in begun:
            raise TransactionLogError(f"{where}: END of transaction {event.id} without a BEGIN before it")
        rows.append({"id": event.id, "status": event.status, "event_count": event.event_count,
                     "collections": json.dumps(event.collections), "ts_ms": event.ts_ms,
                     "partition": record["partition"], "offset": record["offset"], "key": key})
    commit = CommitRequest(log.app_id, sum(raw.end_offsets.values()), log.topic, raw.end_offsets)
    # mode="ignore": a concurrent ingest may create the log first.
    table = DeltaTable.create(log.target.path, schema=LOG_SCHEMA, mode="ignore",
                              configuration=NEW_TABLE_PROPERTIES,
                              storage_options=delta_rs_options(log.target.storage_options))
    if commit.applied_by(table.transaction_version(commit.app_id)):
        return 0
    with _concurrent_commit_guard(log.target, commit):
        write_deltalake(table, pa.Table.from_pylist(rows, schema=LOG_SCHEMA), mode="append",
                        commit_properties=commit_properties(commit))
    return len(rows)


def _begun(log: TransactionLog) -> set[str]:
    """The keys of every transaction whose BEGIN the log holds."""
    dataset = log._dataset()
    if dataset is None:
        return set()
    names = dataset.schema.names
    rows = dataset.to_table(columns=[name for name in ("id", "key") if name in names],
                            filter=pds.field("status") == "BEGIN").to_pylist()
    return {row.get("key") or transaction_key(log.kind, row["id"]) for row in rows}


def table_horizon(log: TransactionLog, table: str, applied_end: int) -> int:
    """The greatest END offset for which a table that applied every one of its transactions up to
    ``applied_end`` is exact: just before the next END in the log that touches the table."""
    for offset, _, collections in log.ends_after(applied_end):
        if collection_count(collections, table) is not None:
            return offset - 1
    return log.end_offset() - 1


def _intervals(table: DeltaTable) -> list[tuple[int, int, int]]:
    """(tx_applied_end, tx_horizon, delta version) of each transaction-consistent commit, newest first."""
    intervals = []
    for entry in table.history(200):
        try:
            recorded = json.loads(entry.get("userMetadata") or "{}").get(METADATA_KEY) or {}
        except ValueError:
            continue
        extra = recorded.get("transactions")
        if extra:
            intervals.append((int(extra["applied_end"]), int(extra["horizon"]), int(entry["version"])))
    return intervals


def update_watermark(connector: str, log: TransactionLog, tables: Mapping[str, DeltaTarget],
                     watermarks: DeltaTarget) -> dict | None:
    """Record the connector's consistent watermark (see the module docstring); None if no table
    has a transaction-consistent commit yet."""
    opened = {name: open_table(target) for name, target in tables.items()}
    intervals = {name: _intervals(table) for name, table in opened.items() if table is not None}
    intervals = {name: found for name, found in intervals.items() if found}
    if not intervals:
        return None
    watermark = min(found[0][1] for found in intervals.values())
    versions: dict[str, int] = {}
    while watermark >= -1:
        versions = {}
        lowered = watermark
        for name, found in intervals.items():
            match = next((version for end, horizon, version in found if end <= watermark <= horizon), None)
            if match is None:
                # No exact version at this watermark: step down to this table's nearest exact one.
                lowered = min(lowered, max((horizon for end, horizon, _ in found if horizon < watermark),
                                           default=-2))
            else:
                versions[name] = match
        if lowered == watermark:
            break
        watermark = lowered
    if watermark < -1 or len(versions) != len(intervals):
        return None
    transaction = log.transaction_at(watermark)
    row = {"connector": connector, "end_offset": watermark, "transaction_id": transaction[0] if transaction else None,
           "transaction_ts": datetime.fromtimestamp(transaction[1] / 1000, timezone.utc)
           if transaction and transaction[1] else None,
           "versions": json.dumps(versions, sort_keys=True), "recorded_at": datetime.now(timezone.utc)}
    write_deltalake(watermarks.path, pa.Table.from_pylist([row], schema=WATERMARK_SCHEMA), mode="append",
                    configuration=NEW_TABLE_PROPERTIES, storage_options=delta_rs_options(watermarks.storage_options))
    return row


def latest_watermark(watermarks: DeltaTarget, connector: str) -> dict | None:
    """The latest recorded watermark row of ``connector``."""
    table = open_table(watermarks)
    if table is None:
        return None
    rows = table.to_pyarrow_dataset().to_table(filter=pds.field("connector") == connector).to_pylist()
    return max(rows, key=lambda row: row["recorded_at"]) if rows else None


def consistent_versions(watermarks: DeltaTarget, connector: str) -> tuple[str | None, dict[str, int]] | None:
    """The latest consistent watermark of ``connector``: (transaction id, {table: Delta version}).

    Read each table at its version (``DeltaTable(path, version=v)``, ``VERSION AS OF v``) for a
    multi-table read in which every transaction is either whole or absent."""
    latest = latest_watermark(watermarks, connector)
    return None if latest is None else (latest["transaction_id"], json.loads(latest["versions"]))


def touched_tables(ends: Sequence[Mapping[str, int]], tables: Iterable[str]) -> set[str]:
    """The tables (``schema.table``) any of these ENDs touched."""
    return {table for table in tables for collections in ends if collection_count(collections, table) is not None}
