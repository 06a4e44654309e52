"""Random change histories through the real pipeline (broker, Spark, Delta), compared with a
plain-Python reference fold, for every relational connector and apply mode.

Histories hold creates, updates, deletes (with tombstones), re-creates, primary-key changes, initial
snapshot reads and late incremental-snapshot reads carrying an older position, spread over 1-3
partitions (one partition per key, as Kafka keys them) and applied in random micro-batches.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cdc_assets.demo.events import db2_source, envelope, postgres_source, sqlserver_source
from tests.conftest import captured_table, new_topic, read_rows, run_batch

EXAMPLES = int(os.environ.get("CDC_HYPOTHESIS_EXAMPLES", "5"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class Event:
    seq: int  # the source position, as a counter
    op: str
    key: int
    row: dict | None  # after image (c/u/r) or before image (d)


def _lsn_text(counter: int, rng: random.Random) -> str:
    """An LSN for a counter, sometimes written with fewer digits (widths vary across versions)."""
    parts = [counter >> 20, (counter >> 4) & 0xFFFF, counter & 0xF]
    widths = (8, 8, 4) if rng.random() < 0.5 else (1, 1, 1)
    return ":".join(f"{part:0{width}x}" for part, width in zip(parts, widths, strict=True))


def history(rng: random.Random, length: int, keys: int = 5, late_reads: bool = True) -> list[Event]:
    """A valid change history in topic order. Late incremental-snapshot reads carry an older position
    than changes already in the topic for a key that still exists (a read of a since-deleted row is
    never emitted: the snapshot reads the live table)."""
    state: dict[int, dict] = {}
    snapshots: list[tuple[int, int, dict]] = []
    events: list[Event] = []
    seq = 10
    for key in range(rng.randrange(keys)):  # initial snapshot
        state[key] = {"id": key, "v": f"snap{key}", "n": 0}
        events.append(Event(seq, "r", key, dict(state[key])))
    for _ in range(length):
        seq += rng.randrange(1, 4) * 16
        key = rng.randrange(keys)
        draw = rng.random()
        if key not in state:
            state[key] = {"id": key, "v": f"c{seq}", "n": seq}
            events.append(Event(seq, "c", key, dict(state[key])))
        elif draw < 0.45:
            state[key] = {**state[key], "v": f"u{seq}", "n": seq}
            events.append(Event(seq, "u", key, dict(state[key])))
            snapshots.append((seq, key, dict(state[key])))
        elif draw < 0.65:
            events.append(Event(seq, "d", key, state.pop(key)))
        elif draw < 0.8:
            free = [k for k in range(keys, keys * 2) if k not in state]
            if free:  # primary-key change: delete the old key, create the new one, same source position
                new_key = rng.choice(free)
                old = state.pop(key)
                state[new_key] = {**old, "id": new_key}
                events.append(Event(seq, "d", key, old))
                events.append(Event(seq + 1, "c", new_key, dict(state[new_key])))
        elif late_reads:  # an incremental-snapshot read that reaches the topic after newer changes
            candidates = [(s, k, r) for s, k, r in snapshots if k in state]
            if candidates:
                old_seq, old_key, old_row = rng.choice(candidates)
                events.append(Event(old_seq, "r", old_key, old_row))
    return events


def reference(events: list[Event]) -> dict[tuple, dict]:
    """SCD1 reference: per key, the event with the greatest position wins; a delete removes it."""
    latest: dict[int, Event] = {}
    for event in events:
        if event.key not in latest or event.seq > latest[event.key].seq:
            latest[event.key] = event
    return {(k,): e.row for k, e in latest.items() if e.op != "d"}


def records(events: list[Event], kind: str, rng: random.Random) -> list[tuple[bytes, bytes | None]]:
    """Kafka records as each connector writes them (a delete is followed by its tombstone)."""
    out = []
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
        out.append((key, envelope(event.op, before, after, source, ts)))
        if event.op == "d":
            out.append((key, None))
    return out


def produce_spread(broker, topic, recs, partitions, rng):
    from confluent_kafka import Producer

    partition_of: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for key, value in recs:
        partition = partition_of.setdefault(key, rng.randrange(partitions))
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def apply_all(spark, broker, writer, table, max_records):
    for _ in range(200):
        if run_batch(spark, broker, writer, table, max_records=max_records).raw.caught_up:
            return
    raise AssertionError("did not catch up")


def check_history(spark, broker, writer, tmp_path, kind, seed, length, partitions, max_records, mode="scd1"):
    rng = random.Random(seed)
    events = history(rng, length, late_reads=mode != "scd2")
    topic = new_topic(broker, f"{kind}.s.t", partitions=partitions)
    produce_spread(broker, topic, records(events, kind, rng), partitions, rng)
    table = replace(captured_table(topic, tmp_path / f"{seed}-{mode}", kind=kind,
                                   columns={"id": "bigint", "v": "string", "n": "bigint"}), apply_mode=mode)
    apply_all(spark, broker, writer, table, max_records)
    return events, table


@SETTINGS
@given(kind=st.sampled_from(["postgresql", "sqlserver", "db2"]), seed=st.integers(0, 2**31),
       length=st.integers(1, 30), partitions=st.integers(1, 3), max_records=st.integers(1, 12))
@example(kind="sqlserver", seed=1, length=25, partitions=2, max_records=1)  # PK changes split across batches
@example(kind="db2", seed=7, length=30, partitions=3, max_records=3)
def test_random_histories_end_as_the_reference(spark, broker, writer, tmp_path, kind, seed, length, partitions,
                                               max_records):
    events, table = check_history(spark, broker, writer, tmp_path, kind, seed, length, partitions, max_records)
    assert read_rows(spark, writer, table) == reference(events)


@SETTINGS
@given(seed=st.integers(0, 2**31), length=st.integers(1, 30), max_records=st.integers(1, 12))
def test_soft_delete_keeps_deleted_rows_flagged(spark, broker, writer, tmp_path, seed, length, max_records):
    events, table = check_history(spark, broker, writer, tmp_path, "postgresql", seed, length, 2, max_records,
                                  mode="soft_delete")
    rows = read_rows(spark, writer, table, visible_only=False)
    live = {k: {c: row[c] for c in ("id", "v", "n")} for k, row in rows.items() if not row["_cdc_deleted"]}
    assert live == reference(events)
    deleted = {k for k, row in rows.items() if row["_cdc_deleted"]}
    touched = {(e.key,) for e in events}
    assert deleted == touched - set(reference(events))
    assert all(rows[k]["_cdc_op"] == "d" for k in deleted)


@SETTINGS
@given(seed=st.integers(0, 2**31), length=st.integers(1, 30), max_records=st.integers(1, 12))
def test_scd2_keeps_every_version(spark, broker, writer, tmp_path, seed, length, max_records):
    events, table = check_history(spark, broker, writer, tmp_path, "postgresql", seed, length, 2, max_records,
                                  mode="scd2")
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        versions = DeltaTable(table.target.path).to_pyarrow_table().to_pylist()
    else:
        versions = [r.asDict() for r in spark.read.format("delta").load(table.target.path).collect()]
    by_key: dict[int, list[dict]] = {}
    for version in versions:
        by_key.setdefault(version["id"], []).append(version)
    expected: dict[int, list[tuple]] = {}  # per key: (v, n) of each non-delete event in position order
    ordered: dict[int, list[Event]] = {}
    for event in sorted(events, key=lambda e: e.seq):
        ordered.setdefault(event.key, []).append(event)
    for key, key_events in ordered.items():
        expected[key] = [(e.row["v"], e.row["n"]) for e in key_events if e.op != "d"]
    assert {k: [(v["v"], v["n"]) for v in sorted(vs, key=lambda v: v["_cdc_valid_from"])]
            for k, vs in by_key.items()} == {k: v for k, v in expected.items() if v}
    for key, key_versions in by_key.items():
        key_versions.sort(key=lambda v: v["_cdc_valid_from"])
        last = ordered[key][-1] if key in ordered else None
        currents = [v for v in key_versions if v["_cdc_current"]]
        assert len(currents) == (0 if last is None or max(ordered[key], key=lambda e: e.seq).op == "d" else 1)
        for earlier, later in itertools.pairwise(key_versions):
            assert earlier["_cdc_valid_to"] is not None and earlier["_cdc_valid_to"] <= later["_cdc_valid_from"]
    assert set(by_key) <= {e.key for e in events}


def mongo_history(rng: random.Random, length: int, docs: int = 4) -> tuple[list[tuple[int, str, dict]], dict]:
    """Random MongoDB events (doc, op, payload fields) and the reference documents after them."""
    state: dict[int, dict] = {}
    events = []
    for step in range(length):
        doc = rng.randrange(docs)
        draw = rng.random()
        if doc not in state:
            state[doc] = {"_id": {"$numberLong": str(doc)}, "a": step, "b": f"s{step}"}
            events.append((doc, "c" if draw < 0.7 else "r", {"after": json.dumps(state[doc])}))
        elif draw < 0.35:
            field, value = rng.choice(["a", "b", "c", "nested"]), {"k": [step, "x"]} if draw < 0.1 else step
            state[doc] = {**state[doc], field: value}
            events.append((doc, "u", {"patch": json.dumps({"$set": {field: value}})}))
        elif draw < 0.5 and len(state[doc]) > 1:
            field = rng.choice([f for f in state[doc] if f != "_id"])
            state[doc] = {k: v for k, v in state[doc].items() if k != field}
            events.append((doc, "u", {"patch": json.dumps({"$unset": {field: True}})}))
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
@given(seed=st.integers(0, 2**31), length=st.integers(1, 30), partitions=st.integers(1, 3),
       max_records=st.integers(1, 12))
@example(seed=0, length=8, partitions=1, max_records=2)  # found the string_view base lookup bug
def test_random_mongodb_histories_end_as_the_reference(spark, broker, writer, tmp_path, seed, length, partitions,
                                                       max_records):
    rng = random.Random(seed)
    events, expected = mongo_history(rng, length)
    recs = []
    for ord_, (doc, op, fields) in enumerate(events):
        doc_id = json.dumps({"$numberLong": str(doc)})
        source = {"connector": "mongodb", "ts_ms": 1_700_000_000_000, "ord": ord_, "snapshot": op == "r"}
        key = json.dumps({"id": doc_id}).encode()
        recs.append((key, json.dumps({"op": op, "source": source, "ts_ms": 1, **fields}).encode()))
        if op == "d":
            recs.append((key, None))
    topic = new_topic(broker, "mongo.db.docs", partitions=partitions)
    produce_spread(broker, topic, recs, partitions, rng)
    table = captured_table(topic, tmp_path / str(seed), kind="mongodb")
    apply_all(spark, broker, writer, table, max_records)
    rows = read_rows(spark, writer, table)
    assert {json.loads(k[0])["$numberLong"]: json.loads(row["document"]) for k, row in rows.items()} == {
        str(doc): document for doc, document in expected.items()}
