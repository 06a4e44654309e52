"""Random change histories through the real pipeline (broker, Spark, Delta), compared with a
plain-Python reference fold, for every relational connector and apply mode.

Histories hold creates, updates, deletes (with tombstones), re-creates, primary-key changes, initial
snapshot reads and late incremental-snapshot reads carrying an older position (in every apply mode),
a column that appears mid-stream (in row images, and in value schemas when the history has them) and
a head of tombstones only (a compacted topic after mass deletes), spread over 1-3 partitions (one
partition per key, as Kafka keys them) and applied in random micro-batches. Transactional histories
group changes into transactions whose BEGIN/END events lie on a transaction topic of 1-3 partitions.

Each example interleaves ``GROUP`` histories, each on keys of its own, in one topic read into one
table, so the random batch limits cut across all of them. ``CDC_HYPOTHESIS_EXAMPLES`` counts
histories: 200 of them cost 20 pipeline runs per test and writer, not 200.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cdc_assets.demo.events import db2_source, envelope, postgres_source, sqlserver_source
from cdc_assets.io.delta import DeltaRsWriter
from tests.support.document_diffs import document_diff, is_document
from tests.support.key_changes import (
    TOAST_COLUMNS,
    UNAVAILABLE,
    current_values,
    pg_change,
    pk_change,
    produce_spread,
    scd2_versions,
)
from tests.support.merges import captured_table, read_rows, run_batch, with_merge
from tests.support.topics import new_topic, produce

GROUP = 10  # histories per example
HISTORIES = int(os.environ.get("CDC_HYPOTHESIS_EXAMPLES", "5"))  # per property test and writer
SETTINGS = settings(max_examples=-(-HISTORIES // GROUP), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class Event:
    seq: int  # the source position, as a counter
    op: str
    key: int
    row: dict | None  # after image (c/u/r) or before image (d)
    tx: str | None = None  # the id of the transaction it belongs to, if any


T = TypeVar("T")
RELATIONAL = st.sampled_from(["postgresql", "sqlserver", "db2"])  # each position rule
LENGTHS = st.lists(st.integers(1, 30), min_size=GROUP, max_size=GROUP)  # of each example's histories


def _lsn_text(counter: int, rng: random.Random) -> str:
    """An LSN for a counter, sometimes written with fewer digits (widths vary across versions)."""
    parts = [counter >> 20, (counter >> 4) & 0xFFFF, counter & 0xF]
    widths = (8, 8, 4) if rng.random() < 0.5 else (1, 1, 1)
    return ":".join(f"{part:0{width}x}" for part, width in zip(parts, widths, strict=True))


def history(rng: random.Random, length: int, keys: int = 5, first_key: int = 0) -> list[Event]:
    """A valid change history in topic order, on keys from ``first_key``. Late incremental-snapshot
    reads carry an older position than changes already in the topic for a key that still exists (a
    read of a since-deleted row is never emitted: the snapshot reads the live table). In half the
    histories a column ``x`` appears at a random step: rows written from then on carry it."""
    state: dict[int, dict] = {}
    snapshots: list[tuple[int, int, dict]] = []
    events: list[Event] = []
    seq = 10
    new_column_at = rng.randrange(length + 1) if rng.random() < 0.5 else None
    for key in range(first_key, first_key + rng.randrange(keys)):  # initial snapshot
        state[key] = {"id": key, "v": f"snap{key}", "n": 0}
        events.append(Event(seq, "r", key, dict(state[key])))
    for step in range(length):
        seq += rng.randrange(1, 4) * 16
        # ALTER TABLE ... ADD COLUMN x: rows written from then on carry it.
        added = {"x": seq} if new_column_at is not None and step >= new_column_at else {}
        key = first_key + rng.randrange(keys)
        draw = rng.random()
        if key not in state:
            state[key] = {"id": key, "v": f"c{seq}", "n": seq, **added}
            events.append(Event(seq, "c", key, dict(state[key])))
        elif draw < 0.45:
            state[key] = {**state[key], "v": f"u{seq}", "n": seq, **added}
            events.append(Event(seq, "u", key, dict(state[key])))
            snapshots.append((seq, key, dict(state[key])))
        elif draw < 0.65:
            events.append(Event(seq, "d", key, state.pop(key)))
        elif draw < 0.8:
            free = [k for k in range(first_key + keys, first_key + keys * 2) if k not in state]
            if free:  # primary-key change: delete the old key, create the new one, same source position
                new_key = rng.choice(free)
                old = state.pop(key)
                state[new_key] = {**old, "id": new_key}
                events.append(Event(seq, "d", key, old))
                events.append(Event(seq + 1, "c", new_key, dict(state[new_key])))
        else:  # an incremental-snapshot read that reaches the topic after newer changes
            candidates = [(s, k, r) for s, k, r in snapshots if k in state]
            if candidates:
                old_seq, old_key, old_row = rng.choice(candidates)
                events.append(Event(old_seq, "r", old_key, old_row))
    return events


def reference(events: list[Event]) -> dict[tuple, dict]:
    """SCD1 reference: per key, the event with the greatest position wins; a delete removes it. Rows
    read null for a column that appeared after they were written."""
    latest: dict[int, Event] = {}
    for event in events:
        if event.key not in latest or event.seq > latest[event.key].seq:
            latest[event.key] = event
    extra = {"x": None} if any("x" in (e.row or {}) for e in events) else {}
    return {(k,): {**extra, **e.row} for k, e in latest.items() if e.op != "d"}


def reference_versions(events: list[Event]) -> dict[int, list[Event]]:
    """SCD2 reference: per key, the events that were newer than every event of the key before them in
    the topic (one partition per key: topic order is list order), in order. An event not newer than
    the key's latest position changes nothing, whichever batch it arrives in."""
    kept: dict[int, list[Event]] = {}
    for event in events:
        chain = kept.setdefault(event.key, [])
        # Positions are (source position, partition, offset): an equal source position later in the
        # partition is newer.
        if not chain or event.seq >= chain[-1].seq:
            chain.append(event)
    return kept


def transactions_of(events: list[Event], rng: random.Random, first_id: int = 600) -> list[Event]:
    """The events, each with the id of the transaction it belongs to (None: snapshot reads, outside
    any): runs of 1-3 consecutive changes, PostgreSQL-style ``txID:LSN`` ids with txIDs from
    ``first_id``. A primary-key change's delete and create are one transaction."""
    ids: list[str | None] = []
    current, left = None, 0
    for index, event in enumerate(events):
        if event.op == "r":
            ids.append(None)
            current, left = None, 0
            continue
        previous = events[index - 1] if index else None
        pk_create = previous is not None and (previous.op, event.op, previous.seq + 1) == ("d", "c", event.seq)
        if left == 0 and not pk_create:
            current, left = f"{first_id + index}:{event.seq}", rng.randrange(1, 4)
        ids.append(current)
        left = max(left - 1, 0)
    return [replace(event, tx=tx_id) for event, tx_id in zip(events, ids, strict=True)]


def units(events: list[Event]) -> list[list[Event]]:
    """The events in the units a topic keeps together: a transaction's changes, or one event."""
    out: list[list[Event]] = []
    for event in events:
        if out and event.tx is not None and out[-1][-1].tx == event.tx:
            out[-1].append(event)
        else:
            out.append([event])
    return out


def merge_at_random(sequences: Sequence[Sequence[T]], rng: random.Random) -> list[tuple[int, T]]:
    """The items of several sequences interleaved at random, each sequence's in its own order, with the
    index of the sequence each came from."""
    pending = [list(reversed(sequence)) for sequence in sequences]
    out: list[tuple[int, T]] = []
    while any(pending):
        index = rng.choice([i for i, left in enumerate(pending) for _ in left])  # uniform over items left
        out.append((index, pending[index].pop()))
    return out


def interleave(histories: list[list[list[Event]]], rng: random.Random) -> list[Event]:
    """One topic's events from several histories' units, interleaved at random, with positions moved
    onto one clock in topic order: each history's steps (``seq // 16``) map to the shared clock's in the
    order they first appear, so late reads keep an older position and a PK change's delete and create
    keep their shared step."""
    steps: list[dict[int, int]] = [{} for _ in histories]
    out: list[Event] = []
    for index, unit in merge_at_random(histories, rng):
        for event in unit:
            step = steps[index].setdefault(event.seq // 16, len(out) + 1)
            out.append(replace(event, seq=step * 16 + event.seq % 16))
    return out


def packed_history(seed: int, lengths: list[int], transactional: bool = False) -> tuple[random.Random, list[Event]]:
    """``len(lengths)`` histories (keys 100 apart; transactions' txIDs 1,000 apart) interleaved in one
    topic, and the random generator the rest of the example draws from. With one history, its events
    are the single-history test's, positions renumbered but in the same order."""
    rng = random.Random(seed)
    histories = []
    for index, length in enumerate(lengths):
        own = rng if index == 0 else random.Random(f"{seed}/{index}")
        events = history(own, length, first_key=100 * index)
        if transactional:
            events = transactions_of(events, own, first_id=600 + 1000 * index)
        histories.append(units(events))
    return rng, interleave(histories, random.Random(f"{seed}/order"))


def transaction_event(status: str, tx_id: str, events: int = 0) -> tuple[bytes, bytes]:
    """A BEGIN or END (of ``events`` changes of table s.t) with the id the transaction's changes carry,
    keyed by it as Debezium keys them (so BEGIN and END share a partition)."""
    body = {"status": status, "id": tx_id, "ts_ms": 1_700_000_000_000, "event_count": None, "data_collections": None}
    if status == "END":
        body.update(event_count=events, data_collections=[{"data_collection": "s.t", "event_count": events}])
    return json.dumps({"id": tx_id}).encode(), json.dumps(body).encode()


def records(events: list[Event], kind: str, rng: random.Random, tombstone_head: int = 0,
            schemas: bool = False) -> list[tuple[bytes, bytes | None]]:
    """Kafka records as each connector writes them (a delete is followed by its tombstone), after
    ``tombstone_head`` tombstones of keys that were deleted and compacted away; values wrapped in
    their Connect schema with ``schemas``."""
    out: list[tuple[bytes, bytes | None]] = [(json.dumps({"id": 1_000_000 + n}).encode(), None)
                                             for n in range(tombstone_head)]
    orders: dict[str, int] = {}
    for event in events:
        ts = 1_700_000_000_000 + event.seq
        if kind == "postgresql":
            source = postgres_source(event.seq, ts, "s", "t", snapshot="incremental" if event.op == "r" else "false")
        elif kind == "sqlserver":
            # A PK change shares both LSNs; event_serial_no 1 (delete) and 2 (insert) order it.
            base = event.seq - (event.seq % 16)
            source = sqlserver_source(_lsn_text(base, rng), _lsn_text(base, rng), 1 + event.seq % 16, ts, "dbo", "t")
        else:
            source = db2_source(_lsn_text(event.seq, rng), _lsn_text(event.seq, rng), ts, "S", "T")
        after = None if event.op == "d" else event.row
        before = event.row if event.op == "d" else None
        key = json.dumps({"id": event.key}).encode()
        transaction = None
        if event.tx is not None:
            orders[event.tx] = orders.get(event.tx, 0) + 1
            transaction = {"id": event.tx, "total_order": orders[event.tx],
                           "data_collection_order": orders[event.tx]}
        out.append((key, envelope(event.op, before, after, source, ts, transaction, with_schema=schemas,
                                  row_name="t.s.t.Value")))
        if event.op == "d":
            out.append((key, None))
    return out


def apply_all(spark, broker, writer, table, max_records):
    for _ in range(200):
        if run_batch(spark, broker, writer, table, max_records=max_records).raw.caught_up:
            return
    raise AssertionError("did not catch up")


def check_history(spark, broker, writer, tmp_path, kind, seed, lengths, partitions, max_records, mode="scd1"):
    """Packed histories through the pipeline; the head of tombstones and the batch limit grow with the
    number of histories, so small batches and tombstone-only heads stay as likely as with one."""
    rng, events = packed_history(seed, lengths)
    topic = new_topic(broker, f"{kind}.s.t", partitions=partitions)
    head = rng.randrange(1, 6) * len(lengths) if rng.random() < 0.3 else 0
    produce_spread(broker, topic, records(events, kind, rng, head, schemas=rng.random() < 0.5), partitions, rng)
    table = with_merge(captured_table(topic, tmp_path / f"{seed}-{mode}", kind=kind,
                                      columns={"id": "bigint", "v": "string", "n": "bigint"}), apply_mode=mode)
    apply_all(spark, broker, writer, table, max_records * len(lengths))
    return events, table


@SETTINGS
@given(kind=RELATIONAL, seed=st.integers(0, 2**31),
       lengths=LENGTHS, partitions=st.integers(1, 3), max_records=st.integers(1, 12))
@example(kind="sqlserver", seed=1, lengths=[25], partitions=2, max_records=1)  # PK changes split across batches
@example(kind="db2", seed=7, lengths=[30], partitions=3, max_records=3)
def test_random_histories_end_as_the_reference(spark, broker, writer, tmp_path, kind, seed, lengths, partitions,
                                               max_records):
    events, table = check_history(spark, broker, writer, tmp_path, kind, seed, lengths, partitions, max_records)
    assert read_rows(spark, writer, table) == reference(events)


@SETTINGS
@given(kind=RELATIONAL, seed=st.integers(0, 2**31), lengths=LENGTHS, max_records=st.integers(1, 12))
def test_soft_delete_keeps_deleted_rows_flagged(spark, broker, writer, tmp_path, kind, seed, lengths, max_records):
    events, table = check_history(spark, broker, writer, tmp_path, kind, seed, lengths, 2, max_records,
                                  mode="soft_delete")
    rows = read_rows(spark, writer, table, visible_only=False)
    live = {k: {c: v for c, v in row.items() if not c.startswith("_cdc_")} for k, row in rows.items()
            if not row["_cdc_deleted"]}
    assert live == reference(events)
    deleted = {k for k, row in rows.items() if row["_cdc_deleted"]}
    touched = {(e.key,) for e in events}
    assert deleted == touched - set(reference(events))
    assert all(rows[k]["_cdc_op"] == "d" for k in deleted)


@SETTINGS
@given(kind=RELATIONAL, seed=st.integers(0, 2**31),
       lengths=LENGTHS, tx_partitions=st.integers(1, 3), max_records=st.integers(8, 14))
def test_random_transactional_histories_end_as_the_reference(spark, broker, writer, tmp_path, kind, seed, lengths,
                                                             tx_partitions, max_records):
    """Changes grouped into transactions whose BEGIN/END lie on a transaction topic of 1-3 partitions (one for
    the kinds whose ids carry no commit order):
    batches cut to whole transactions end as the reference, and the transaction sensor requests runs
    for every transaction once, whichever partition its END is on."""
    from dagster import DagsterInstance, build_sensor_context

    from cdc_assets.catalog import TransactionRules
    from cdc_assets.config import parse_config
    from cdc_assets.core.transactions import ids_carry_commit_order
    from cdc_assets.definitions import build_definitions
    from cdc_assets.io.delta import DeltaTarget
    from cdc_assets.io.transactions import TransactionLog
    from tests.support.topics import new_topic_named

    rng, events = packed_history(seed, lengths, transactional=True)
    if not ids_carry_commit_order(kind):
        tx_partitions = 1  # their transaction ids carry no commit order: the log refuses more partitions
    prefix = new_topic(broker, "txsem").replace(".", "_")
    topic, tx_topic = new_topic_named(broker, f"{prefix}.s.t"), f"{prefix}.transaction"
    new_topic_named(broker, tx_topic, partitions=tx_partitions)
    head = rng.randrange(1, 6) * len(lengths) if rng.random() < 0.3 else 0
    produce_spread(broker, topic, records(events, kind, rng, head, rng.random() < 0.5), 1, rng)
    ids = [event.tx for event in events]
    transactions = list(dict.fromkeys(tx_id for tx_id in ids if tx_id is not None))
    produce_spread(broker, tx_topic, [event for tx_id in transactions for event in (
        transaction_event("BEGIN", tx_id), transaction_event("END", tx_id, ids.count(tx_id)))], tx_partitions, rng)

    # Paths of this example's own (examples share tmp_path, and may share a seed): a log holding another
    # example's ENDs would announce other event counts for the same txIDs.
    log = TransactionLog(tx_topic, DeltaTarget(str(tmp_path / f"{prefix}-log")), kind)
    table = replace(captured_table(topic, tmp_path / f"{prefix}-tx", kind=kind, columns=COLUMNS),
                    transactions=TransactionRules(log, DeltaTarget(str(tmp_path / f"{prefix}-watermarks"))))
    apply_all(spark, broker, writer, table, max_records * len(lengths))
    assert read_rows(spark, writer, table) == reference(events)

    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path / f'{prefix}-defs'}"}}
connectors:
  - {{name: txdb, kind: {kind}, topic.prefix: {prefix}, transaction_metadata: true, tables: [{{name: s.t}}]}}
"""
    defs = build_definitions(parse_config(config))
    sensor = defs.resolve_sensor_def("txdb_transaction_sensor")
    completed, cursor = 0, None
    with DagsterInstance.ephemeral() as instance:
        for _ in range(3):  # one tick reads everything; the next ones request nothing more
            tick = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
            completed += sum(int(r.tags["cdc_assets/transactions"]) for r in tick.run_requests)
            cursor = tick.cursor
    assert completed == len(transactions)
    if transactions:  # every BEGIN and END read
        assert sum(json.loads(cursor)["offsets"].values()) == 2 * len(transactions)


def assert_versions_are_the_reference(by_key: dict[int, list[dict]], events: list[Event]) -> None:
    """Every kept event (``reference_versions``) but a delete is a version, in position order; each
    version is valid until the key's next kept event; one current version per live key, none else."""
    kept = reference_versions(events)
    expected = {k: [(e.row["v"], e.row["n"], e.row.get("x")) for e in chain if e.op != "d"]
                for k, chain in kept.items()}
    assert {k: [(v["v"], v["n"], v.get("x")) for v in vs] for k, vs in by_key.items()} == {
        k: v for k, v in expected.items() if v}
    for key, key_versions in by_key.items():
        currents = [v for v in key_versions if v["_cdc_current"]]
        assert len(currents) == (0 if kept[key][-1].op == "d" else 1)
        assert all((v["_cdc_valid_to"] is None) == v["_cdc_current"] for v in key_versions)
        for earlier, later in itertools.pairwise(key_versions):
            assert earlier["_cdc_valid_to"] is not None and earlier["_cdc_valid_to"] <= later["_cdc_valid_from"]


@SETTINGS
@given(kind=RELATIONAL, seed=st.integers(0, 2**31), lengths=LENGTHS, max_records=st.integers(1, 12))
def test_scd2_keeps_every_version(spark, broker, writer, tmp_path, kind, seed, lengths, max_records):
    events, table = check_history(spark, broker, writer, tmp_path, kind, seed, lengths, 2, max_records,
                                  mode="scd2")
    assert_versions_are_the_reference(scd2_versions(spark, writer, table), events)


COLUMNS = {"id": "bigint", "v": "string", "n": "bigint"}


def test_scd2_an_event_not_newer_than_the_key_s_latest_changes_nothing(spark, broker, writer, tmp_path):
    """Late reads (older positions) in later batches, and in the same batch after a newer change,
    add no version: never a second current version, the history keeps its order."""
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path, columns=COLUMNS), apply_mode="scd2")
    rng = random.Random(0)

    def row(key, v, n):
        return {"id": key, "v": v, "n": n}

    batches = [
        [Event(100, "c", 1, row(1, "a", 100)), Event(200, "u", 1, row(1, "b", 200)),
         Event(100, "c", 2, row(2, "a", 100)), Event(300, "d", 2, row(2, "a", 100))],
        [Event(150, "r", 1, row(1, "a", 100)), Event(150, "r", 2, row(2, "a", 100))],  # older than 200 and 300
        [Event(400, "u", 1, row(1, "c", 400)), Event(250, "r", 1, row(1, "b", 200))],  # the read after 400
    ]
    for batch in batches:
        produce(broker, topic, records(batch, "postgresql", rng))
        run_batch(spark, broker, writer, table)
    by_key = scd2_versions(spark, writer, table)
    assert [(v["v"], v["_cdc_current"]) for v in by_key[1]] == [("a", False), ("b", False), ("c", True)]
    assert [(v["v"], v["_cdc_current"]) for v in by_key[2]] == [("a", False)]
    assert_versions_are_the_reference(by_key, [e for batch in batches for e in batch])
    assert writer.key_report(table.target, ("id",)).duplicate_keys == 0


def test_a_topic_whose_head_is_only_tombstones_starts_the_table(spark, broker, writer, tmp_path):
    """Batches of tombstones only before the table exists: their offsets are carried into the first
    commit that has rows, so the table starts (a compacted topic after mass deletes)."""
    topic = new_topic(broker, "dbserver1.s.t")
    table = captured_table(topic, tmp_path, columns=COLUMNS)
    produce(broker, topic, records([Event(10, "c", 1, {"id": 1, "v": "a", "n": 10})], "postgresql",
                                   random.Random(0), tombstone_head=5))
    report = run_batch(spark, broker, writer, table, max_records=2)
    assert read_rows(spark, writer, table) == {(1,): {"id": 1, "v": "a", "n": 10}}
    assert writer.read_progress(table.target, table.app_id).offsets == {0: 6}
    assert report.tombstones == 5 and report.raw.start_offsets == {0: 0} and report.raw.end_offsets == {0: 6}


@pytest.mark.parametrize("mode", ["scd1", "soft_delete", "scd2"])
def test_a_column_in_value_schemas_before_the_schema_change_job_is_added_by_the_merge(spark, broker, writer,
                                                                                     tmp_path, mode):
    topic = new_topic(broker, "dbserver1.s.t")
    table = with_merge(captured_table(topic, tmp_path), apply_mode=mode)
    rng = random.Random(0)
    produce(broker, topic, records([Event(10, "c", 1, {"id": 1, "v": "a"})], "postgresql", rng, schemas=True))
    run_batch(spark, broker, writer, table)
    produce(broker, topic, records([Event(20, "c", 2, {"id": 2, "v": "b", "x": 7}),
                                    Event(30, "u", 1, {"id": 1, "v": "c", "x": 8})], "postgresql", rng, schemas=True))
    run_batch(spark, broker, writer, table)
    if mode == "scd2":
        versions = scd2_versions(spark, writer, table)
        assert {k: [(v["v"], v["x"], v["_cdc_current"]) for v in vs] for k, vs in versions.items()} == {
            1: [("a", None, False), ("c", 8, True)], 2: [("b", 7, True)]}
    else:
        rows = read_rows(spark, writer, table)
        assert {k[0]: (r["v"], r["x"]) for k, r in rows.items()} == {1: ("c", 8), 2: ("b", 7)}


# A reference of MongoDB's update rules on Python values, written apart from ``core.document_updates``: each
# operation returns a new value (copied along its path) instead of changing one in place.
def ref_set(node, parts, value):
    """$set: a missing parent becomes an embedded document; an array grows with nulls to an index set past it."""
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        index = int(head)
        grown = list(node) + [None] * max(0, index + 1 - len(node))
        grown[index] = ref_set(grown[index] if index < len(node) else {}, rest, value) if rest else value
        return grown
    copy = dict(node)
    copy[head] = ref_set(copy.get(head, {}), rest, value) if rest else value
    return copy


def ref_unset(node, parts):
    """$unset: a field removed, an array element nulled, a path that reaches nothing ignored."""
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        if not head.isdigit() or int(head) >= len(node):
            return node
        index = int(head)
        return [(ref_unset(item, rest) if rest else None) if i == index else item for i, item in enumerate(node)]
    if not isinstance(node, dict) or head not in node:
        return node
    if not rest:
        return {k: v for k, v in node.items() if k != head}
    return {**node, head: ref_unset(node[head], rest)}


def ref_truncate(node, parts, size):
    if not parts:
        return node[:size]
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        return [ref_truncate(item, rest, size) if i == int(head) else item for i, item in enumerate(node)]
    return {**node, head: ref_truncate(node[head], rest, size)}


def _containers(node, path=()):
    """The paths of a document's embedded documents and arrays (the root's included), where a path can go on."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for name, value in items:
        if isinstance(value, list) or is_document(value):
            yield from _containers(value, (*path, str(name)))


def _random_value(rng, step):
    return rng.choice([step, f"s{step}", None, True, {"$numberLong": str(step)}, {"k": step, "l": [step]},
                       [step, {"m": step}]])


def _nested_update(rng, document, step):
    """One to three changes (``(kind, path parts, value)``) of distinct top-level fields of ``document``: sets of
    fields that exist or not (a missing parent, an index past an array's end), unsets (of missing paths too),
    array truncations."""
    changes, used = [], set()
    for _ in range(rng.randint(1, 3)):
        path, node = rng.choice([c for c in _containers(document) if not c[0] or c[0][0] not in used])
        draw = rng.random()
        if isinstance(node, list):
            if draw < 0.2 and node:
                changes.append(("truncate", path, rng.randrange(len(node))))
            elif draw < 0.45:
                changes.append(("unset", (*path, str(rng.randrange(len(node) + 2))), None))
            else:
                tail = (str(rng.randrange(len(node) + 3)),) + (("new",) if rng.random() < 0.3 else ())
                if len(tail) == 2 and int(tail[0]) < len(node) and not is_document(node[int(tail[0])]):
                    tail = tail[:1]  # a field inside a value that is not a document: MongoDB refuses it
                changes.append(("set", (*path, *tail), _random_value(rng, step)))
        else:
            names = [name for name in node if name != "_id"]
            if draw < 0.3 and names:
                changes.append(("unset", (*path, rng.choice(names)), None))
            elif draw < 0.4:
                changes.append(("unset", (*path, "absent", "deeper"), None))
            elif draw < 0.7 and names:
                changes.append(("set", (*path, rng.choice(names)), _random_value(rng, step)))
            else:
                changes.append(("set", (*path, f"f{step}", *(("g", "h") if rng.random() < 0.3 else ())),
                                _random_value(rng, step)))
        top = changes[-1][1][0]
        if top in used or top == "_id":
            changes.pop()
        else:
            used.add(top)
    return changes


def _as_event(rng, changes, before, after):
    """Changes of document ``before`` (to ``after``) as Debezium sends them: an oplog patch, $set/$unset
    (Debezium 1.x, MongoDB before 5.0) or at random a diff (``$v: 2``, MongoDB 5.0 and later, computed from the
    two documents), or, where they include a truncation or at random, change streams' updateDescription
    (Debezium 2.x and later)."""
    sets = {".".join(path): value for kind, path, value in changes if kind == "set"}
    unsets = [".".join(path) for kind, path, _ in changes if kind == "unset"]
    truncations = [{"field": ".".join(path), "size": size} for kind, path, size in changes if kind == "truncate"]
    diff = document_diff(before, after, rng) if rng.random() < 0.35 else None
    if diff is not None:
        return {"patch": json.dumps({"$v": 2, "diff": diff})}
    if truncations or not (sets or unsets) or rng.random() < 0.5:
        return {"updateDescription": {"updatedFields": json.dumps(sets) if sets else None,
                                      "removedFields": unsets or None, "truncatedArrays": truncations or None}}
    operators = {**({"$set": sets} if sets else {}), **({"$unset": dict.fromkeys(unsets, True)} if unsets else {})}
    return {"patch": json.dumps(operators)}


def mongo_history(rng: random.Random, length: int, docs: int = 4,
                  first_doc: int = 0) -> tuple[list[tuple[int, str, dict]], dict]:
    """Random MongoDB events (doc, op, payload fields) on documents from ``first_doc``, and the
    reference documents after them (``ref_*``)."""
    state: dict[int, dict] = {}
    events = []
    for step in range(length):
        doc = first_doc + rng.randrange(docs)
        draw = rng.random()
        if doc not in state:
            state[doc] = {"_id": {"$numberLong": str(doc)}, "a": step, "b": f"s{step}",
                          "n": {"x": step, "arr": [1, {"q": step}, [2, 3]]}}
            events.append((doc, "c" if draw < 0.7 else "r", {"after": json.dumps(state[doc])}))
        elif draw < 0.55:
            changes, before = _nested_update(rng, state[doc], step), state[doc]
            for kind, path, value in changes:
                if kind == "set":
                    state[doc] = ref_set(state[doc], path, value)
                elif kind == "unset":
                    state[doc] = ref_unset(state[doc], path)
                else:
                    state[doc] = ref_truncate(state[doc], path, value)
            events.append((doc, "u", _as_event(rng, changes, before, state[doc])))
        elif draw < 0.65:
            state[doc] = {"_id": state[doc]["_id"], "replaced": step}
            events.append((doc, "u", {"patch": json.dumps(state[doc])}))
        elif draw < 0.75:
            state[doc] = {**state[doc], "full": step}
            events.append((doc, "u", {"after": json.dumps(state[doc])}))
        else:
            del state[doc]
            events.append((doc, "d", {}))
    return events, state


@SETTINGS
@given(seed=st.integers(0, 2**31), lengths=LENGTHS, partitions=st.integers(1, 3), max_records=st.integers(1, 12))
@example(seed=0, lengths=[8], partitions=1, max_records=2)  # found the string_view base lookup bug
def test_random_mongodb_histories_end_as_the_reference(spark, broker, writer, tmp_path, seed, lengths, partitions,
                                                       max_records):
    """Packed like the relational histories: documents 100 apart, events interleaved in one topic; nested
    $set/$unset, oplog diffs and update descriptions against the reference (``ref_*``), in scd1, in soft_delete
    (the live rows; every other document seen is marked deleted) and in scd2 (the current versions), each field
    in MongoDB's order."""
    rng = random.Random(seed)
    histories, expected = [], {}
    for index, length in enumerate(lengths):
        events, documents = mongo_history(rng if index == 0 else random.Random(f"{seed}/{index}"), length,
                                          first_doc=100 * index)
        histories.append(events)
        expected.update(documents)
    recs = []
    for ord_, (_, (doc, op, fields)) in enumerate(merge_at_random(histories, random.Random(f"{seed}/order"))):
        doc_id = json.dumps({"$numberLong": str(doc)})
        source = {"connector": "mongodb", "ts_ms": 1_700_000_000_000, "ord": ord_, "snapshot": op == "r"}
        key = json.dumps({"id": doc_id}).encode()
        recs.append((key, json.dumps({"op": op, "source": source, "ts_ms": 1, **fields}).encode()))
        if op == "d":
            recs.append((key, None))
    want = {str(doc): json.dumps(document) for doc, document in expected.items()}
    seen = {str(doc) for history in histories for doc, _, _ in history}
    for mode in ("scd1", "soft_delete", "scd2"):
        topic = new_topic(broker, "mongo.db.docs", partitions=partitions)
        produce_spread(broker, topic, recs, partitions, random.Random(f"{seed}/partitions"))
        table = with_merge(captured_table(topic, tmp_path / f"{seed}-{mode}", kind="mongodb"), apply_mode=mode)
        apply_all(spark, broker, writer, table, max_records * len(lengths))
        if mode == "scd1":
            rows = read_rows(spark, writer, table)
            got = {json.loads(k[0])["$numberLong"]: row["document"] for k, row in rows.items()}
        elif mode == "soft_delete":
            rows = {json.loads(k[0])["$numberLong"]: row
                    for k, row in read_rows(spark, writer, table, visible_only=False).items()}
            assert {doc for doc, row in rows.items() if row["_cdc_deleted"]} == seen - set(want), mode
            got = {doc: row["document"] for doc, row in rows.items() if not row["_cdc_deleted"]}
        else:
            got = {json.loads(key)["$numberLong"]: version["document"]
                   for key, versions in scd2_versions(spark, writer, table).items() for version in versions
                   if version["_cdc_current"]}
        assert {doc: json.dumps(json.loads(text)) for doc, text in got.items()} == want, mode


# --- primary-key changes of rows with unchanged TOASTed values (REPLICA IDENTITY DEFAULT) ---


@pytest.mark.parametrize("mode", ["scd1", "soft_delete", "scd2"])
def test_a_primary_key_change_carries_the_old_key_s_unchanged_values(spark, broker, writer, tmp_path, mode):
    """A key change's create carrying the placeholder takes the old key's value: the one the table holds
    (read before the MERGE deletes it), or the old key's latest in the batch; through chains of key
    changes in one batch, a key deleted and re-created by a key change, and later placeholder updates."""
    topic = new_topic(broker, "dbserver1.s.t", partitions=3)
    table = with_merge(captured_table(topic, tmp_path, columns=TOAST_COLUMNS), apply_mode=mode)
    rng = random.Random(5)
    first = [*pg_change("c", 1, 10, "one"), *pg_change("c", 2, 11, "two"), *pg_change("c", 3, 12, "three")]
    produce_spread(broker, topic, first, 3, rng)
    apply_all(spark, broker, writer, table, 1000)
    second = [
        *pk_change(1, 11, 100),  # the table holds 1's value
        *pg_change("c", 4, 110, "four"), *pk_change(4, 14, 120),  # the batch holds 4's value
        *pk_change(2, 12, 130), *pk_change(12, 22, 140),  # a chain: 22 <- 12 <- 2 (in the table)
        *pg_change("u", 3, 150, n=7), *pk_change(3, 13, 160, n=7),  # 3's last event left big unavailable too
        *pg_change("c", 5, 170, "five"), *pg_change("d", 5, 180), *pk_change(14, 5, 190),  # 5 again: 4's value
        *pg_change("u", 11, 200, n=2),  # a placeholder update after the key change
    ]
    produce_spread(broker, topic, second, 3, rng)
    apply_all(spark, broker, writer, table, 1000)
    assert current_values(spark, writer, table) == {11: ("one", 2), 22: ("two", 0), 13: ("three", 7),
                                                    5: ("four", 0)}


def test_a_batch_cut_never_separates_a_primary_key_change(spark, broker, tmp_path):
    """Key changes whose delete and create lie on different partitions, read in batches of a few records:
    a batch stopped at its limits leaves for the next one what was emitted after the earliest last event
    it read on a partition it did not finish, so every create finds its delete (and the old key's value).
    The cut is the pipeline's, before any writer: one writer checks it."""
    writer = DeltaRsWriter()
    topic = new_topic(broker, "dbserver1.s.t", partitions=3)
    table = captured_table(topic, tmp_path, columns=TOAST_COLUMNS)
    rng = random.Random(11)
    keys = range(1, 13)
    produce_spread(broker, topic, [r for k in keys for r in pg_change("c", k, k, f"text {k}")], 3, rng)
    apply_all(spark, broker, writer, table, 1000)
    changes, lsn = [], 100
    for k in keys:
        changes += pk_change(k, 100 + k, lsn, n=k)
        changes += pg_change("u", 100 + rng.choice([j for j in keys if j <= k]), lsn + 1, n=-1) if k % 3 == 0 \
            else []
        lsn += 10
    produce_spread(broker, topic, changes, 3, rng)
    reports = []
    for _ in range(200):
        reports.append(run_batch(spark, broker, writer, table, max_records=5))
        if reports[-1].raw.caught_up:
            break
    assert {k: v[0] for k, v in current_values(spark, writer, table).items()} == {100 + k: f"text {k}"
                                                                                for k in keys}
    assert sum(r.summary.unavailable_never_seen for r in reports if r.summary) == 0


def _raw(partitions: dict[int, list[tuple[bytes, bytes | None]]]):
    """Raw records of partitions, each from offset 0."""
    import pyarrow as pa

    rows = [(p, offset, value) for p, records in partitions.items() for offset, (_, value) in enumerate(records)]
    return pa.table({"partition": pa.array([r[0] for r in rows], pa.int32()),
                     "offset": pa.array([r[1] for r in rows], pa.int64()),
                     "value": pa.array([r[2] for r in rows], pa.binary())})


def test_the_cut_follows_postgresql_s_emission_order_not_the_lsn():
    """Transactions are emitted in commit order while their changes interleave in the WAL: T2 (LSN 150)
    committed before T1 (its key change at LSN 100). Partition 0 was read up to T2's change, so T1's create
    on it may be unread: T1's delete (a lower LSN) must wait with everything emitted after T2."""
    from cdc_assets.core.key_changes import emission_order, key_change_cut

    t2 = pg_change("u", 7, 150, n=1, commit=90)
    t1 = [*pg_change("d", 1, 100, commit=160), *pg_change("c", 101, 100, commit=160)]
    t3 = pg_change("u", 5, 210, n=1, commit=200)
    assert emission_order(t2[0][1], "postgresql") < emission_order(t1[0][1], "postgresql") \
        < emission_order(t3[0][1], "postgresql")
    partitions = {0: [*t2, t1[2]], 1: [*t1[:2], *t3]}
    read = {0: 1, 1: 3}  # partition 0 stopped before T1's create
    cut = key_change_cut(_raw({0: partitions[0][:1], 1: partitions[1]}), read, {0: 2, 1: 3}, "postgresql",
                         UNAVAILABLE)
    assert cut == {0: 1, 1: 0}
    # Read whole, nothing is left out; a key change whose two events were read stays whole.
    assert key_change_cut(_raw(partitions), {0: 2, 1: 3}, {0: 2, 1: 3}, "postgresql", UNAVAILABLE) is None
    assert key_change_cut(_raw({0: [t1[2]], 1: t1[:2]}), {0: 1, 1: 2}, {0: 5, 1: 5}, "postgresql",
                          UNAVAILABLE) is None


NEW_KEY, OLD_KEY = "__debezium.newkey", "__debezium.oldkey"


def test_a_key_change_half_read_up_to_a_high_watermark_ends_the_batch_before_it():
    """The watermarks are read one partition at a time: a key change written between two of those reads has
    its delete below its partition's watermark and its create above its own. With every partition read to
    its watermark, a half whose other half the batch does not hold (Debezium's key-change headers name
    both) still ends the batch before it, and before what was emitted after it."""
    from cdc_assets.core.key_changes import key_change_cut

    before = pg_change("u", 7, 90, n=1)
    delete, tombstone, create = pk_change(1, 101, 100)
    after = pg_change("u", 8, 110, n=1)
    read = _raw({0: before, 1: [delete, tombstone, *after]})
    halves = {(1, 0), (1, 1)}  # the delete and its tombstone carry the new key
    assert key_change_cut(read, {0: 1, 1: 3}, {0: 1, 1: 3}, "postgresql", UNAVAILABLE) is None  # no header read
    assert key_change_cut(read, {0: 1, 1: 3}, {0: 1, 1: 3}, "postgresql", UNAVAILABLE, halves) == {0: 1, 1: 0}
    # The create read without its delete waits for it the same way; both halves read, the batch is whole.
    assert key_change_cut(_raw({0: [*before, create]}), {0: 2}, {0: 2}, "postgresql", UNAVAILABLE, {(0, 1)}) \
        == {0: 1}
    both = _raw({0: [*before, create], 1: [delete, tombstone, *after]})
    assert key_change_cut(both, {0: 2, 1: 3}, {0: 2, 1: 3}, "postgresql", UNAVAILABLE, {(0, 1), *halves}) is None


def test_a_key_change_written_between_two_watermark_reads_is_applied_whole(spark, broker, tmp_path, monkeypatch):
    """A key change as Debezium writes it (delete, tombstone and create with their key-change headers), its delete
    written after the batch read partition 0's watermark and before it read partition 1's, its create a
    moment later: the delete is not applied without its create, which keeps the old key's unchanged TOASTed
    value."""
    import threading

    from confluent_kafka import Producer

    from cdc_assets.demo.broker import PRODUCER_SETTINGS
    from cdc_assets.io.kafka import KafkaSource

    writer = DeltaRsWriter()
    topic = new_topic(broker, "dbserver1.s.t", partitions=2)
    table = captured_table(topic, tmp_path, columns=TOAST_COLUMNS)
    produce(broker, topic, pg_change("c", 1, 10, "one"), partition=1)
    run_batch(spark, broker, writer, table)
    (old_key, delete), (_, tombstone), (new_key, create) = pk_change(1, 2, 20)

    def write(*records):
        producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
        for key, value, partition, header in records:
            producer.produce(topic, key=key, value=value, partition=partition, headers=[(header, key)])
        assert producer.flush(30) == 0

    later = threading.Timer(1.0, write, [(new_key, create, 0, OLD_KEY)])
    metadata = KafkaSource._metadata

    class Between:
        """The watermark client, writing the delete once partition 0's watermark is read (the create later)."""

        def __init__(self, lookup):
            self._lookup = lookup

        def get_watermark_offsets(self, partition, **options):
            watermarks = self._lookup.get_watermark_offsets(partition, **options)
            if partition.topic == topic and partition.partition == 0 and later.ident is None:  # once
                write((old_key, delete, 1, NEW_KEY), (old_key, tombstone, 1, NEW_KEY))
                later.start()
            return watermarks

        def __getattr__(self, name):
            return getattr(self._lookup, name)

    monkeypatch.setattr(KafkaSource, "_metadata", lambda source: Between(metadata(source)))
    reports = [run_batch(spark, broker, writer, table)]
    later.join()
    reports.append(run_batch(spark, broker, writer, table))  # what the first one's watermarks left out
    assert reports[-1].raw.caught_up
    assert current_values(spark, writer, table) == {2: ("one", 0)}
    assert sum(r.summary.unavailable_never_seen for r in reports if r.summary) == 0
