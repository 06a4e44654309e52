"""Debezium transaction metadata: BEGIN/END events of ``<topic.prefix>.transaction``, parsed
defensively, and the rule that decides which of a batch's transactions may be applied.

A transaction may be applied to a table once its END is known and every one of its events for that
table (END's per-collection ``event_count``) is in the batch. The batch is cut, per partition, before
the first event of any other transaction, so events of incomplete transactions wait for a later batch
and no offset is committed past them.

A batch stopped by its limits may hold later transactions' events in some partitions before the rest
of the first one in others: ``read_on`` says where a batch that reads that transaction whole stops.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_assets.core.envelope import OFFSET_COLUMN, PARTITION_COLUMN, json_payload
from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN
from cdc_assets.core.position import position_source_part


def transaction_key(kind: str, transaction_id: str) -> str:
    """What identifies a transaction of a connector ``kind``, given an id one of its events carries.

    PostgreSQL ids are ``txID:LSN`` with the LSN of the event carrying the id, so one transaction's
    BEGIN, data events and END carry different ids with the same txID part (seed 001: BEGIN
    ``571:53195829``, END ``571:53195832``): the txID is the transaction. SQL Server and Db2 ids are the
    commit LSN, the same on every event of the transaction (and made of colon-separated parts
    themselves): the whole id is the transaction. The one rule every consumer of transaction ids uses.
    """
    if kind == "postgresql":
        return transaction_id.split(":", 1)[0]
    return transaction_id


def commit_position(kind: str, transaction_id: str) -> int | None:
    """Where an END with this id stands in its connector's commit order, read from the id; None where the
    connector's ids carry no order (SQL Server's and Db2's commit LSNs do not fit 64 bits; Oracle's and
    MongoDB's ids are not ordered), or the id is not of its kind's form.

    Transactions are emitted in commit order, but a transaction topic of several partitions loses that
    order between partitions (BEGIN and END of one PostgreSQL transaction even hash to different ones):
    this rule gives it back. PostgreSQL: the LSN of ``txID:LSN``, which on an END is the commit's, and
    commits stream in LSN order. MySQL and MariaDB: the GTID's sequence number (``uuid:N``,
    ``domain-server-N``), which grows with each commit of one source (a multi-source topology with several
    GTID domains has no single order: give its transaction topic one partition)."""
    pattern = _COMMIT_POSITION.get(kind)
    found = pattern.fullmatch(transaction_id) if pattern is not None else None
    return int(found.group(1)) if found else None


def ids_carry_commit_order(kind: str) -> bool:
    """Whether the transaction ids of a connector ``kind`` carry a commit position (``commit_position``)."""
    return kind in _COMMIT_POSITION


# The part of an END id that orders commits, per connector kind (``commit_position``).
_COMMIT_POSITION = {
    "postgresql": re.compile(r"\d+(?::\d+)*:(\d+)"),  # txID:LSN
    "mysql": re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}:(\d+)"),  # server uuid:N
    "mariadb": re.compile(r"\d+-\d+-(\d+)"),  # domain-server-N
}


class TransactionEventError(ValueError):
    """A transaction-metadata event cannot be read."""


@dataclass(frozen=True)
class TransactionEvent:
    """One BEGIN or END."""

    status: str
    id: str
    event_count: int | None
    collections: dict[str, int]  # data collection -> events (END only)
    ts_ms: int | None


def parse_transaction_event(value: bytes | None) -> TransactionEvent:
    """Parse one transaction-topic value (with or without the schema/payload wrapper)."""
    try:
        payload = json_payload(value)
    except ValueError as exc:
        raise TransactionEventError(str(exc)) from exc
    if not isinstance(payload, dict):
        raise TransactionEventError("value is not a JSON object")
    status, tx_id = payload.get("status"), payload.get("id")
    if status not in ("BEGIN", "END"):
        raise TransactionEventError(f"unknown transaction status {status!r} (expected BEGIN or END)")
    if not isinstance(tx_id, str) or not tx_id:
        raise TransactionEventError("transaction event has no id")
    collections: dict[str, int] = {}
    if status == "END":
        entries = payload.get("data_collections")
        if not isinstance(entries, list):
            raise TransactionEventError(f"END of {tx_id}: data_collections is not a list")
        for entry in entries:
            try:
                collections[str(entry["data_collection"])] = int(entry["event_count"])
            except (KeyError, TypeError, ValueError) as exc:
                raise TransactionEventError(f"END of {tx_id}: malformed data_collections entry {entry!r}") from exc
    count = payload.get("event_count")
    return TransactionEvent(status, tx_id, int(count) if count is not None else None, collections,
                            payload.get("ts_ms"))


def event_identity(key_columns: Sequence[str]) -> Column:
    """What tells one change event of a transaction from another whatever offset it was delivered at, so
    that an event delivered again (Debezium is at-least-once) counts once toward its END: its source
    position (without the Kafka partition and offset ``event_position`` ends with), op and key (a
    primary-key change's delete and create share a position; op and key tell them
    apart). An event without a position is only itself: its partition and offset."""
    position = F.col(POSITION_COLUMN)
    return (F.when(position.isNotNull(), F.to_json(F.struct(position_source_part(position).alias("at"),
                                                            F.col(OP_COLUMN), *(F.col(c) for c in key_columns))))
            .otherwise(F.format_string("@%d:%d", F.col(PARTITION_COLUMN), F.col(OFFSET_COLUMN))))


def collection_count(collections: Mapping[str, int], table: str) -> int | None:
    """Events an END announces for ``table`` (``schema.table``); data collections may carry a
    database prefix (``db.schema.table``). None: the transaction does not touch the table."""
    for name, count in collections.items():
        if name == table or name.endswith("." + table):
            return count
    return None


def touched_tables(ends: Sequence[Mapping[str, int]], tables: Iterable[str]) -> set[str]:
    """The tables (``schema.table``) any of these ENDs' data collections touched (``collection_count``)."""
    return {table for table in tables for collections in ends if collection_count(collections, table) is not None}


@dataclass(frozen=True)
class TransactionCut:
    """Where a batch must end so that it holds only whole transactions of the table."""

    end_offsets: dict[int, int]
    applied: tuple[str, ...]  # transaction ids applied whole by the cut batch
    waiting: dict[str, tuple[int, int | None]]  # incomplete: id -> (events seen, events announced)
    again: tuple[str, ...] = ()  # transactions applied before, some of whose events the batch holds again


def cut_batch(table: str, start: Mapping[int, int], end: Mapping[int, int],
              seen: Mapping[str, tuple[int, Mapping[int, int]]], ends: Mapping[str, tuple[int, Mapping[str, int]]],
              applied_in: Mapping[int, int]) -> TransactionCut:
    """The batch end per partition: before the first event of any transaction that is not whole, and
    of any whole one that such a cut leaves part of out (its events in another partition come after
    the cut there): a batch applies all of a transaction's events or none.

    ``seen``: per transaction id in the batch, (events of this table, first offset per partition).
    ``ends``: per known END, its commit position and data collections.
    ``applied_in``: per partition, the greatest commit position of a transaction the table applied with events
    there (``applied_positions``).

    A connector restarted mid-transaction emits its BEGIN again and an END counting only the events emitted
    after the restart (Debezium is at-least-once); when it was stopped before the first END was written, that
    END does not name the tables whose events all came before the restart. Those events are applied as the
    batch holds them: no END will ever announce them.

    A restarted connector also emits again every event after its last stored offset, however far back: a
    transaction whose events come again after the table applied it (``again``) is not waited for, whatever
    part of it comes again, and its events are applied as they are (a row keeps its newer version). A
    transaction is known applied once a partition holding its events has applied one committed no earlier:
    in each partition a connector writes a transaction's events before those of every later one, and the
    table commits no offset past an event of a transaction it has not applied.
    """
    cut = dict(end)
    waiting: dict[str, tuple[int, int | None]] = {}
    again = {tx for tx, (_, firsts) in seen.items()
             if tx in ends and any(ends[tx][0] <= applied_in.get(p, -1) for p in firsts)}
    for tx_id, (count, _) in seen.items():
        if tx_id in again:
            continue
        if tx_id not in ends:
            waiting[tx_id] = (count, None)
            continue
        # An END that does not name a table holding its events is a restarted connector's: it counts only what
        # was emitted after the restart, and the END that counted the rest was never written. What the batch
        # holds is all there is to wait for.
        expected = collection_count(ends[tx_id][1], table)
        if expected is not None and count < expected:
            waiting[tx_id] = (count, expected)
    held = set(waiting)  # transactions the batch applies nothing of
    while held:
        for tx_id in held:
            for partition, offset in seen[tx_id][1].items():
                cut[partition] = min(cut[partition], offset)
        split = {tx for tx, (_, firsts) in seen.items()
                 if tx not in held and tx not in again and any(o >= cut[p] for p, o in firsts.items())}
        if not split:
            break
        held |= split
    applied = tuple(sorted(tx for tx in seen if tx not in held and tx not in again))
    for partition in cut:
        cut[partition] = max(cut[partition], start.get(partition, 0))
    return TransactionCut(cut, applied, waiting, tuple(sorted(again)))


def exact_horizon(applied_end: int, horizon: int, cut: TransactionCut,
                  ends: Mapping[str, tuple[int, Mapping[str, int]]]) -> int:
    """The greatest commit position at which a table that applied up to ``applied_end`` is exact: ``horizon``
    (``io.transactions.table_horizon``), unless a transaction committed before ``applied_end`` still waits. A cut
    holds back only the partitions a waiting transaction is in, so a later one may be applied in another: the
    table then holds a later transaction without an earlier one and is exact nowhere (a horizon below
    ``applied_end``), and the cross-table watermark keeps to its earlier versions."""
    earliest = min((ends[tx][0] for tx in cut.waiting if tx in ends), default=None)
    if earliest is not None and earliest < applied_end:
        return min(horizon, earliest - 1)
    return horizon


def applied_positions(applied_in: Mapping[int, int], cut: TransactionCut,
                      seen: Mapping[str, tuple[int, Mapping[int, int]]],
                      ends: Mapping[str, tuple[int, Mapping[str, int]]]) -> dict[int, int]:
    """``applied_in`` (``cut_batch``) once the batch ``cut`` is applied: per partition, the greatest commit
    position of a transaction applied with events there."""
    positions = dict(applied_in)
    for tx_id in (*cut.applied, *cut.again):
        for partition in seen[tx_id][1]:
            positions[partition] = max(positions.get(partition, -1), ends[tx_id][0])
    return positions


@dataclass(frozen=True)
class ReadOn:
    """The first transaction waiting in a batch that can apply nothing, and how to read it whole."""

    transaction: str
    seen: int  # its events for the table in the batch
    expected: int  # its events for the table, as its END announces
    until: dict[int, int]  # per partition, the offset a batch that reads the transaction stops before
    open: tuple[int, ...]  # partitions that may hold more of its events: not read up to ``until``
    helps: bool  # whether a batch stopped at ``until`` leaves out records this one read


def read_on(cut: TransactionCut, start: Mapping[int, int], end: Mapping[int, int],
            stop: Mapping[int, int], seen: Mapping[str, tuple[int, Mapping[int, int]]],
            ends: Mapping[str, tuple[int, Mapping[str, int]]]) -> ReadOn | None:
    """For a batch whose ``cut`` applies nothing (every partition it read starts with a waiting
    transaction): the first of those transactions to commit, and the offsets a batch reading it whole
    stops before. None while one of them has no known END (it waits for it).

    A connector writes a transaction's events after those of every transaction committed before it,
    in every partition: the transaction with the smallest commit position among the partitions' first ones
    has no events behind another transaction's in any partition. So a batch needs nothing of a
    partition that starts with another transaction, nor of a partition past the first event of
    another transaction, nor past where this batch was to stop (``stop``: the high watermarks, or an
    earlier ``until``: each read again stops no later, so reads again end); the partitions not read up to
    there are ``open``: the rest of it is there.

    ``ends``: per known END, its commit position (``TransactionLog.ends``) and data collections.
    """
    firsts_in: dict[int, tuple[int, str]] = {}  # per partition, the waiting transaction read first there
    for tx_id in cut.waiting:
        for partition, offset in seen[tx_id][1].items():
            if partition not in firsts_in or offset < firsts_in[partition][0]:
                firsts_in[partition] = (offset, tx_id)
    heads = {partition: tx_id for partition, (_, tx_id) in firsts_in.items()}
    if not heads or any(tx not in ends for tx in heads.values()):
        return None
    first = min(set(heads.values()), key=lambda tx: ends[tx][0])
    # The count the cut compared with: a waiting transaction whose END is known always names the table there.
    expected = cut.waiting[first][1]
    assert expected is not None
    until: dict[int, int] = {}
    for partition in start:
        # Events of a transaction applied before are not a later one's: they are read with it, as they are.
        later = [firsts[partition] for tx, (_, firsts) in seen.items()
                 if tx != first and tx not in cut.again and partition in firsts]
        if partition in heads and heads[partition] != first:
            until[partition] = start[partition]
        else:
            until[partition] = min([*later, stop[partition]])
    open_partitions = tuple(sorted(p for p in start if end[p] < until[p]))
    helps = bool(open_partitions) and any(end[p] > until[p] for p in start)
    return ReadOn(first, seen[first][0], expected, until, open_partitions, helps)
