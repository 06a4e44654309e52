"""The transaction log of a connector and its cross-table consistent watermark.

- ``ingest_transactions`` copies new BEGIN/END events of ``<topic.prefix>.transaction`` into the Delta
  table ``<delta root>/_cdc_assets/transactions/<topic.prefix>`` (exactly once: offsets and an app
  transaction in the same commit, as for data tables), each with its commit position: where the
  transaction stands in the connector's commit order (``core.transactions.commit_position``; the offset,
  for kinds whose ids carry no order, on a transaction topic of one partition).
- Every transaction-consistent batch commit of a table records, under ``transactions``, ``applied_end``
  (the commit position of the last transaction it applied) and ``horizon`` (the table is exact for every
  transaction whose commit position is at most this).
- ``update_watermark`` finds the greatest commit position W at which every transactional table of the
  connector has a version that is exact (``applied_end <= W <= horizon``) and records W, its
  transaction id and each table's version in ``<delta root>/_cdc_assets/watermarks``.

BEGIN and END pair by transaction (``core.transactions.transaction_key``) whatever partitions they are in.
Debezium is at-least-once: a restarted connector emits the markers of the transaction it resumed in
again, the END counting only the events it emitted after the restart (even none). ENDs of one
transaction at one commit position are one END whose count per table is the greatest any of them
announced; an END at a later position with the same key is a later transaction reusing the key
(PostgreSQL's txIDs wrap around).
- ``consistent_versions`` returns the latest watermark's versions: time-travel each table to its
  version for a read in which no transaction is half applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core.transaction_status import TransactionStatus
from cdc_assets.core.transactions import (
    TransactionEvent,
    TransactionEventError,
    collection_count,
    commit_position,
    ids_carry_commit_order,
    parse_transaction_event,
    transaction_key,
)
from cdc_assets.io.avro import SchemaRegistrySettings, record_decoder
from cdc_assets.io.delta import (
    NEW_TABLE_PROPERTIES,
    CommitRequest,
    DeltaRsWriter,
    DeltaTarget,
    DeltaWriterError,
    commit_properties,
    concurrent_commit_guard,
    open_table,
    recorded_commit,
)
from cdc_assets.io.kafka import KafkaSource, read_control
from cdc_assets.io.storage import delta_rs_options

LOG_SCHEMA = pa.schema([
    ("id", pa.string()), ("status", pa.string()), ("event_count", pa.int64()), ("collections", pa.string()),
    ("ts_ms", pa.int64()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.string()),
    ("position", pa.int64()),
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

    def commit_ordered(self, partitions: int) -> bool:
        """Whether the log orders transactions by the commit positions their ids carry (else by the offset, which
        orders them on one partition only). Raises ``TransactionLogError`` when neither orders the topic's
        ``partitions``: a connector kind whose ids carry no order, or a log created by a version that ordered
        by offset (it has no ``position`` column, and keeps its order so that positions of both kinds never
        mix)."""
        dataset = self._dataset()
        legacy = dataset is not None and "position" not in dataset.schema.names
        if (legacy or not ids_carry_commit_order(self.kind)) and partitions > 1:
            why = ("orders transactions by offset (it was created by an earlier version)" if legacy
                   else f"is of a {self.kind} connector, whose transaction ids carry no commit order")
            raise TransactionLogError(
                f"{self.topic} has {partitions} partitions, and its transaction log at {self.target.path} {why}: "
                "across partitions the transactions' order is lost. Give the transaction topic one partition "
                f"(Kafka Connect: a topic.creation group for '{self.topic}' with partitions 1)"
                + (", or move the log aside to start a new one" if legacy else ""))
        return not legacy and ids_carry_commit_order(self.kind)

    def _dataset(self) -> pds.Dataset | None:
        table = open_table(self.target)
        return None if table is None else table.to_pyarrow_dataset()

    def _ends(self, dataset: pds.Dataset, where: pds.Expression) -> list[dict]:
        """The END rows matching ``where``, each with its commit position (``position``; logs written before
        positions were recorded ordered by offset, on one partition), in commit order."""
        has_position = "position" in dataset.schema.names
        columns = ["id", "key", "offset", "collections", "ts_ms", *(["position"] if has_position else [])]
        rows = dataset.to_table(columns=columns, filter=(pds.field("status") == "END") & where).to_pylist()
        for row in rows:
            if row.get("position") is None:
                row["position"] = row["offset"]
        return sorted(rows, key=lambda row: row["position"])

    def _position(self, dataset: pds.Dataset) -> pds.Expression:
        """The commit-position column of ``dataset``, for a filter."""
        return pds.field("position") if "position" in dataset.schema.names else pds.field("offset")

    def ends(self, keys: Iterable[str]) -> dict[str, tuple[int, dict[str, int]]]:
        """Commit position and data collections of the given transactions (by ``transaction_key``), where
        known: a key's latest END, its counts the greatest its re-emitted copies announced."""
        dataset, wanted = self._dataset(), list(keys)
        if dataset is None or not wanted:
            return {}
        # Rows logged before the key column existed are SQL Server/Db2 ENDs, whose key is their id.
        known = pds.field("key").isin(wanted) | (pds.field("key").is_null() & pds.field("id").isin(wanted))
        found: dict[str, tuple[int, dict[str, int]]] = {}
        for row in self._ends(dataset, known):
            key, collections = row["key"] or row["id"], json.loads(row["collections"])
            if key in found and found[key][0] == row["position"]:  # the same END again: it never takes back
                merged = dict(found[key][1])
                for name, count in collections.items():
                    merged[name] = max(count, merged.get(name, 0))
                collections = merged
            found[key] = (row["position"], collections)
        return found

    def ends_after(self, position: int) -> list[tuple[int, str, dict[str, int]]]:
        """ENDs at a commit position above ``position``, in commit order."""
        dataset = self._dataset()
        if dataset is None:
            return []
        return [(row["position"], row["id"], json.loads(row["collections"]))
                for row in self._ends(dataset, self._position(dataset) > position)]

    def last_position(self) -> int:
        """The greatest commit position of an END in the log (-1 when none)."""
        dataset = self._dataset()
        if dataset is None:
            return -1
        column = "position" if "position" in dataset.schema.names else "offset"
        rows = dataset.to_table(columns=list(dict.fromkeys(["offset", column])), filter=pds.field("status") == "END")
        # Rows of a log written before positions were recorded hold none: their offset orders them.
        positions = pc.coalesce(rows[column], rows["offset"])
        return pc.max(positions).as_py() if len(positions) else -1

    def transaction_at(self, position: int) -> tuple[str, int | None] | None:
        """The END at or before commit position ``position`` that is latest: (id, ts_ms)."""
        dataset = self._dataset()
        if dataset is None:
            return None
        ends = self._ends(dataset, self._position(dataset) <= position)
        return (ends[-1]["id"], ends[-1]["ts_ms"]) if ends else None


def ingest_transactions(source: KafkaSource, log: TransactionLog, max_records: int = 100_000) -> int:
    """Copy new BEGIN/END events into the log, exactly once, up to the topic's end; returns how many were
    added. An unknown status, malformed data collections or an END whose commit position cannot be told
    stop it with the event's topic, partition and offset.

    The tables of one connector may run at once (in different pools), so ingests may race: each
    commits with the app-transaction check the tables use (``DeltaRsWriter``), and one that loses
    the commit race reads on from the winner's offsets."""
    added, attempt = 0, 1
    while True:
        try:
            more, caught_up = _ingest_once(source, log, max_records)
        except DeltaWriterError:
            if attempt == _INGEST_ATTEMPTS:
                raise
            attempt += 1
            continue
        added += more
        if caught_up:
            return added


def _ingest_once(source: KafkaSource, log: TransactionLog, max_records: int) -> tuple[int, bool]:
    """One ingest from the log's committed offsets: (events added, whether it read to the topic's end). A
    concurrent commit makes it fail, adding nothing."""
    writer = DeltaRsWriter()
    progress = writer.read_progress(log.target, log.app_id)
    read = read_control(source, log.topic, progress.offsets if progress else None, max_records, 256 * 1024 * 1024,
                        decode=record_decoder(log.schema_registry))
    raw = read.batch
    if raw.end_offsets == raw.start_offsets:
        return 0, True
    ordered = log.commit_ordered(len(raw.end_offsets))
    rows = []
    # A malformed event fails the ingest (no partition reads on past it): the log takes each event once, in order.
    for record, event in read.events(_event, TransactionEventError, fail_as=TransactionLogError):
        if event is None:
            continue
        position = commit_position(log.kind, event.id) if ordered else record.offset
        if position is None:
            raise TransactionLogError(
                f"{record.where}: {event.status} of transaction {event.id}: the id is not of the {log.kind} "
                f"connector's form, so its place in commit order cannot be told across the topic's "
                f"{len(raw.end_offsets)} partitions")
        rows.append({"id": event.id, "status": event.status, "event_count": event.event_count,
                     "collections": json.dumps(event.collections), "ts_ms": event.ts_ms,
                     "partition": record.partition, "offset": record.offset,
                     "key": transaction_key(log.kind, event.id), "position": position})
    commit = CommitRequest(log.app_id, sum(raw.end_offsets.values()), log.topic, raw.end_offsets)
    # mode="ignore": a concurrent ingest may create the log first.
    table = DeltaTable.create(log.target.path, schema=LOG_SCHEMA, mode="ignore",
                              configuration=NEW_TABLE_PROPERTIES,
                              storage_options=delta_rs_options(log.target.storage_options))
    if commit.applied_by(table.transaction_version(commit.app_id)):
        return 0, False
    added = pa.Table.from_pylist(rows, schema=LOG_SCHEMA)
    if "position" not in [f.name for f in table.schema().fields]:  # a log ordered by offset keeps its columns
        added = added.drop_columns(["position"])
    with concurrent_commit_guard(log.target, commit):
        write_deltalake(table, added, mode="append", commit_properties=commit_properties(commit))
    return len(rows), raw.caught_up


def _event(value: bytes | None) -> TransactionEvent | None:
    """The transaction event ``value`` holds (None: a tombstone, no event)."""
    return None if value is None else parse_transaction_event(value)


def table_horizon(log: TransactionLog, table: str, applied_end: int) -> int:
    """The greatest commit position for which a table that applied every one of its transactions up to
    ``applied_end`` is exact: just before the next END in the log that touches the table."""
    for position, _, collections in log.ends_after(applied_end):
        if collection_count(collections, table) is not None:
            return position - 1
    return max(log.last_position(), applied_end)


def _intervals(table: DeltaTable) -> list[tuple[int, int, int]]:
    """(applied_end, horizon, delta version) of each transaction-consistent commit, newest first."""
    intervals = []
    for entry in table.history(200):
        recorded = recorded_commit(entry) or {}
        extra = recorded.get("transactions")
        if extra:
            status = TransactionStatus.from_metadata(extra)
            intervals.append((status.applied_end, status.horizon, int(entry["version"])))
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

