"""One micro-batch end to end: real broker, Spark, Delta on disk; real captures and the seeds."""

import base64
import datetime as dt
import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from cdc_assets.config import BatchLimits
from cdc_assets.demo.events import db2_source, encode_key, envelope, postgres_source
from cdc_assets.io.delta import DeltaRsWriter
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge import BadEventError, faults, merge_micro_batches
from tests.support.merges import captured_table, read_rows, run_batch, with_merge
from tests.support.topics import new_topic, produce

# Copies of ../shared/data/debezium-captures (real Debezium events, Apache License 2.0; see their README).
CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "debezium-captures"


def capture_records(name):
    """A real capture's values, keyed as the PostgreSQL connector keys them (``{"id": N}``)."""
    records = []
    for line in (CAPTURES / name).read_text().splitlines():
        event = json.loads(line)
        image = event["after"] or event["before"]
        key = image["id"] if image else 111  # the REPLICA IDENTITY DEFAULT delete names no row: id 111
        records.append((encode_key({"id": key}), line.encode()))
        if event["op"] == "d":
            records.append((encode_key({"id": key}), None))
    return records


EXPECTED_PRODUCTS = {101, 102, 103, 104, 105, 106, 107, 108, 109, 110}


@pytest.mark.parametrize("capture", ["postgres-products-schema-exclude.jsonl",
                                     "postgres-products-replica-identity-default.jsonl"])
def test_real_captures_end_as_the_source_table(spark, broker, writer, tmp_path, capture):
    topic = new_topic(broker, "fullfillment.inventory.products")
    produce(broker, topic, capture_records(capture))
    table = captured_table(topic, tmp_path)
    report = run_batch(spark, broker, writer, table)
    rows = read_rows(spark, writer, table)
    assert set(k[0] for k in rows) == EXPECTED_PRODUCTS
    assert rows[(106,)]["description"] == "18oz carpenter hammer"
    assert rows[(107,)]["weight"] == 5.1
    assert (rows[(110,)]["description"], rows[(110,)]["weight"]) == ("new water resistent white wind breaker", 0.5)
    assert report.tombstones == 1 and report.summary.deletes == 1 and report.summary.snapshot_reads == 9
    assert report.outcome.inserted == 10 and report.outcome.deleted == 0


def test_restart_reads_only_new_events_and_replay_changes_nothing(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "dbserver1.inventory.items", partitions=2)
    source = lambda lsn: postgres_source(lsn, 1_700_000_000_000 + lsn, "inventory", "items")  # noqa: E731
    produce(broker, topic, [(encode_key({"id": i}), envelope("c", None, {"id": i, "v": i}, source(i), 1))
                            for i in range(20)])
    table = captured_table(topic, tmp_path)
    first = run_batch(spark, broker, writer, table)
    assert first.events_read == 20 and first.outcome.inserted == 20
    assert first.raw.records.num_rows == 0  # a run keeps each batch's report, never its records

    produce(broker, topic, [(encode_key({"id": i}), envelope("u", None, {"id": i, "v": -i}, source(100 + i), 1))
                            for i in range(5)])
    second = run_batch(spark, broker, writer, table)
    assert second.events_read == 5
    assert second.raw.start_offsets == first.raw.end_offsets
    assert (second.outcome.updated, second.outcome.inserted) == (5, 0)
    before = read_rows(spark, writer, table, visible_only=False)

    # Replay: rewind the consumer group to the beginning, as an operator would. The applied offsets
    # live in the Delta commit, so nothing is read twice and nothing changes.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    consumer.commit(offsets=[TopicPartition(topic, p, 0) for p in range(2)], asynchronous=False)
    consumer.close()
    third = run_batch(spark, broker, writer, table)
    assert third.events_read == 0 and third.outcome is None
    assert read_rows(spark, writer, table, visible_only=False) == before


def keyed_history(events: int, keys: int, delete_every: int) -> list[tuple[bytes, bytes | None]]:
    """PostgreSQL events of ``keys`` keys in turn: creates, then updates, every ``delete_every``-th
    event a delete followed by its tombstone."""
    records = []
    for i in range(events):
        key = i % keys
        op = "d" if i % delete_every == delete_every - 1 else ("c" if i < keys else "u")
        after = None if op == "d" else {"id": key, "v": i}
        records.append((encode_key({"id": key}), envelope(op, None, after, postgres_source(i + 1, i, "s", "t"), i)))
        if op == "d":
            records.append((encode_key({"id": key}), None))
    return records


def test_small_batches_apply_the_same_as_one(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "dbserver1.inventory.small", partitions=3)
    records = keyed_history(60, 7, 11)
    produce(broker, topic, records)
    whole, pieces = captured_table(topic, tmp_path / "whole"), captured_table(topic, tmp_path / "pieces")
    run_batch(spark, broker, writer, whole)
    for _ in range(30):
        if run_batch(spark, broker, writer, pieces, max_records=4).raw.caught_up:
            break
    assert read_rows(spark, writer, pieces) == read_rows(spark, writer, whole)
    # the reference: the last event per key
    expected = {}
    for _, value in records:
        if value:
            event = json.loads(value)
            key = (event["after"] or {}).get("id")
            if event["op"] == "d":
                key = None
            if key is not None:
                expected[(key,)] = {"id": key, "v": event["after"]["v"]}
    deleted = {json.loads(k)["id"] for k, v in records if v is None}
    last_op = {}
    for key, value in records:
        if value:
            last_op[json.loads(key)["id"]] = json.loads(value)["op"]
    expected = {k: v for k, v in expected.items() if last_op[k[0]] != "d"}
    assert deleted and read_rows(spark, writer, whole) == expected


def test_a_bad_event_halts_the_batch_naming_topic_partition_offset(spark, broker, writer, tmp_path):
    topic = new_topic(broker, "dbserver1.inventory.bad")
    good = [(encode_key({"id": i}), envelope("c", None, {"id": i}, postgres_source(i, i, "s", "t"), i))
            for i in range(3)]
    produce(broker, topic, [*good[:2], (encode_key({"id": 9}), b"{not json"), good[2]])
    table = captured_table(topic, tmp_path)
    with pytest.raises(BadEventError, match=rf"{topic} partition 0 offset 2: value is not valid JSON") as error:
        run_batch(spark, broker, writer, table)
    assert (error.value.partition, error.value.offset) == (0, 2)
    assert writer.read_progress(table.target, table.app_id) is None  # nothing committed


def test_a_value_the_line_reader_cannot_read_gets_from_json_s_verdict(spark, broker, writer, tmp_path):
    """The local hand-over first reads a batch without its fallback for unreadable lines: an object
    followed by other text is such a line. The batch is read again exactly, and the event gets
    ``from_json``'s verdict, as on a cluster: the object is taken, the event applied."""
    topic = new_topic(broker, "dbserver1.inventory.trailing")
    events = [(encode_key({"id": i}), envelope("c", None, {"id": i}, postgres_source(i + 1, i, "s", "t"), i))
              for i in range(3)]
    events[1] = (events[1][0], events[1][1] + b" trailing text")
    produce(broker, topic, events)
    table = captured_table(topic, tmp_path)
    report = run_batch(spark, broker, writer, table)
    assert report.summary.bad_events == () and report.outcome.inserted == 3
    assert sorted(k[0] for k in read_rows(spark, writer, table)) == [0, 1, 2]


def test_seed_db2_customers_create_update_delete(spark, broker, writer, tmp_path):
    """Seed 000: the Db2 customers create, update and delete (with its tombstone)."""
    topic = new_topic(broker, "mydatabase.MYSCHEMA.CUSTOMERS")
    row = {"ID": 1005, "FIRST_NAME": "john", "LAST_NAME": "doe", "EMAIL": "john.doe@example.org"}
    updated = {**row, "EMAIL": "noreply@example.org"}
    key = encode_key({"ID": 1005}, with_schema=True, name="mydatabase.MYSCHEMA.CUSTOMERS.Key")
    create = envelope("c", None, row, db2_source("00000027:00000758:0005", "00000027:00000758:0003",
                                                 1559729468470, "MYSCHEMA", "CUSTOMERS"), 1559729471739,
                      with_schema=True, row_name="mydatabase.MYSCHEMA.CUSTOMERS.Value")
    update = envelope("u", row, updated, db2_source("00000027:00000ac0:0007", "00000027:00000ac0:0002",
                                                    1559729995937, "MYSCHEMA", "CUSTOMERS"), 1559729998706,
                      with_schema=True, row_name="mydatabase.MYSCHEMA.CUSTOMERS.Value")
    delete = envelope("d", updated, None, db2_source("00000027:00000db0:0007", "00000027:00000db0:0005",
                                                     1559730445243, "MYSCHEMA", "CUSTOMERS"), 1559730450205,
                      with_schema=True, row_name="mydatabase.MYSCHEMA.CUSTOMERS.Value")
    table = captured_table(topic, tmp_path, kind="db2", key_columns=("ID",))
    produce(broker, topic, [(key, create), (key, update)])
    run_batch(spark, broker, writer, table)
    assert read_rows(spark, writer, table) == {(1005,): updated}
    produce(broker, topic, [(key, delete), (key, None)])
    report = run_batch(spark, broker, writer, table)
    assert read_rows(spark, writer, table) == {} and report.outcome.deleted == 1 and report.tombstones == 1


def test_seed_sqlserver_create_event(spark, broker, writer, tmp_path):
    """Seed 003: the SQL Server customers create event, schema and payload, as printed there."""
    topic = new_topic(broker, "server1.dbo.customers")
    fields = [{"type": t, "optional": o, "field": f} for t, o, f in
              [("int32", False, "id"), ("string", False, "first_name"), ("string", False, "last_name"),
               ("string", False, "email")]]
    value = {
        "schema": {"type": "struct", "name": "server1.dbo.customers.Envelope", "optional": False, "fields": [
            {"type": "struct", "fields": fields, "optional": True, "name": "server1.dbo.customers.Value",
             "field": "before"},
            {"type": "struct", "fields": fields, "optional": True, "name": "server1.dbo.customers.Value",
             "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"}]},
        "payload": {"before": None,
                    "after": {"id": 1005, "first_name": "john", "last_name": "doe", "email": "john.doe@example.org"},
                    "source": {"version": "1.0.3.Final", "connector": "sqlserver", "name": "server1",
                               "ts_ms": 1559729468470, "snapshot": False, "db": "testDB", "schema": "dbo",
                               "table": "customers", "change_lsn": "00000027:00000758:0003",
                               "commit_lsn": "00000027:00000758:0005", "event_serial_no": "1"},
                    "op": "c", "ts_ms": 1559729471739}}
    key = {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
                      "optional": False, "name": "server1.dbo.customers.Key"}, "payload": {"id": 1005}}
    produce(broker, topic, [(json.dumps(key).encode(), json.dumps(value).encode())])
    table = captured_table(topic, tmp_path, kind="sqlserver")
    run_batch(spark, broker, writer, table)
    rows = read_rows(spark, writer, table, visible_only=False)
    row = rows[(1005,)]
    assert {k: row[k] for k in ("id", "first_name", "last_name", "email", "_cdc_op")} == {
        "id": 1005, "first_name": "john", "last_name": "doe", "email": "john.doe@example.org", "_cdc_op": "c"}
    assert row["_cdc_position"].startswith("0" * 14 + "27" + "0" * 13 + "758" + "0" * 15 + "5")  # commit_lsn first


def test_dead_letter_policy_applies_good_events_and_keeps_every_bad_one(spark, broker, writer, tmp_path):
    """A batch with 1,000 malformed events among good ones: every good event applied, every bad one
    in the dead-letter table with its coordinates and raw bytes; a rerun adds no duplicates."""
    from deltalake import DeltaTable

    from cdc_assets.io.delta import DeltaTarget

    topic = new_topic(broker, "dbserver1.inventory.poison", partitions=2)
    records, bad_values = [], set()
    for i in range(3000):
        key = encode_key({"id": i})
        if i % 3 == 1:
            value = b"{broken %d" % i if i % 2 else json.dumps({"op": "z", "after": {"id": i}}).encode()
            bad_values.add(value)
        else:
            value = envelope("c", None, {"id": i, "v": i}, postgres_source(i + 1, i, "s", "t"), i)
        records.append((key, value))
    produce(broker, topic, records)
    table = with_merge(captured_table(topic, tmp_path, key_columns=("id",), columns={"id": "bigint", "v": "bigint"}),
                       on_bad_event="dead_letter", dead_letter=DeltaTarget(str(tmp_path / "dead_letter")))
    report = run_batch(spark, broker, writer, table)
    assert report.dead_lettered == 1000 and report.outcome.inserted == 2000
    assert sorted(k[0] for k in read_rows(spark, writer, table)) == [i for i in range(3000) if i % 3 != 1]
    dead = DeltaTable(str(tmp_path / "dead_letter")).to_pyarrow_table().to_pylist()
    assert len(dead) == 1000 and {row["value"] for row in dead} == bad_values
    assert {row["topic"] for row in dead} == {topic} and all(row["error"] for row in dead)
    assert any("not valid JSON" in row["error"] for row in dead) and any("unknown op 'z'" in row["error"]
                                                                         for row in dead)
    # The same bad events landed again (a retried batch) leave one row each.
    from cdc_assets.core.fold import BadEvent
    from cdc_assets.io.dead_letter import dead_letter_rows, write_dead_letters

    again = [BadEvent(row["offset"], row["partition"], row["error"]) for row in dead[:10]]
    events = pa.table({"partition": pa.array([r["partition"] for r in dead[:10]], pa.int32()),
                       "offset": pa.array([r["offset"] for r in dead[:10]], pa.int64()),
                       "key": pa.array([r["key"] for r in dead[:10]], pa.binary()),
                       "value": pa.array([r["value"] for r in dead[:10]], pa.binary())})
    write_dead_letters(table.merge.dead_letter, dead_letter_rows(topic, table.name, events, again))
    assert DeltaTable(str(tmp_path / "dead_letter")).count() == 1000


def test_logical_types_reach_delta(spark, broker, writer, tmp_path):
    from tests.support.logical_types import FIELDS, wrapped

    topic = new_topic(broker, "dbserver1.public.typed")
    value = wrapped([f for f, _, _ in FIELDS], {f["field"]: v for f, v, _ in FIELDS})
    produce(broker, topic, [(b'{"id": 1}', value)])
    table = captured_table(topic, tmp_path)
    run_batch(spark, broker, writer, table)
    row = read_rows(spark, writer, table)[(1,)]
    for field, _, expected in FIELDS:
        got = row[field["field"]]
        if isinstance(got, dt.datetime) and got.tzinfo is not None:
            got = got.astimezone(dt.timezone.utc).replace(tzinfo=None)
        got = got.asDict(recursive=True) if hasattr(got, "asDict") else got  # delta-spark reads structs as Rows
        got = bytes(got) if isinstance(got, (bytearray, memoryview)) else got
        assert got == expected, field["field"]


def test_an_unknown_logical_type_halts_naming_topic_and_offsets(spark, broker, writer, tmp_path):
    from cdc_assets.core.layout import LayoutError
    from tests.support.logical_types import wrapped

    topic = new_topic(broker, "dbserver1.public.money")
    fields = [{"type": "int32", "field": "id"}, {"type": "string", "name": "com.example.Money", "field": "m"}]
    produce(broker, topic, [(b'{"id": 1}', wrapped(fields, {"id": 1, "m": "1 EUR"}))])
    table = captured_table(topic, tmp_path)
    with pytest.raises(LayoutError, match=rf"topic {topic}, batch offsets by partition {{0: '0..1'}}: logical "
                                          r"type 'com\.example\.Money'"):
        run_batch(spark, broker, writer, table)
    assert writer.read_progress(table.target, table.app_id) is None


def test_a_first_batch_of_unreadable_events_halts_naming_why_they_cannot_be_read(spark, broker, writer, tmp_path):
    """No Delta table yet and no event readable: nothing to create the table from, so the batch halts; the
    error names why the events cannot be read, not only that no column was found."""
    from cdc_assets.core.layout import LayoutError
    from cdc_assets.io.delta import DeltaTarget

    topic = new_topic(broker, "dbserver1.public.unreadable")
    produce(broker, topic, [(b'{"id": 1}', b"not json"), (b'{"id": 2}', b"{oops")])
    table = captured_table(topic, tmp_path, on_bad_event="dead_letter", dead_letter=DeltaTarget(str(tmp_path / "dl")))
    with pytest.raises(LayoutError, match=r"no event names any column: set columns for this table \(sampled events "
                                          r"cannot be read, e\.g\. value is not valid JSON"):
        run_batch(spark, broker, writer, table)
    assert writer.read_progress(table.target, table.app_id) is None

    # Its columns and keys configured, the table is created from them and the events are dead-lettered.
    declared = with_merge(table, key_columns=("id",), columns={"id": "bigint"})
    report = run_batch(spark, broker, writer, declared)
    assert report.dead_lettered == 2
    assert writer.read_progress(table.target, table.app_id) is not None


def test_columns_added_in_value_schemas_reach_delta_without_a_schema_change_event(spark, broker, writer, tmp_path):
    from tests.support.logical_types import wrapped

    topic = new_topic(broker, "dbserver1.public.evolving")
    table = captured_table(topic, tmp_path)
    id_field, a_field = {"type": "int32", "field": "id"}, {"type": "string", "field": "a"}
    produce(broker, topic, [(b'{"id": 1}', wrapped([id_field, a_field], {"id": 1, "a": "x"}))])
    run_batch(spark, broker, writer, table)
    b_field = {"type": "int64", "field": "b"}
    produce(broker, topic, [(b'{"id": 2}', wrapped([id_field, a_field], {"id": 2, "a": "y"})),
                            (b'{"id": 3}', wrapped([id_field, a_field, b_field], {"id": 3, "a": "z", "b": 7}))])
    run_batch(spark, broker, writer, table)
    rows = read_rows(spark, writer, table)
    assert {k[0]: (r["a"], r["b"]) for k, r in rows.items()} == {1: ("x", None), 2: ("y", None), 3: ("z", 7)}


def run_batches(spark, broker, writer, table, max_records: int, reports: list) -> list:
    """``merge_micro_batches`` until caught up (or an error), its reports appended to ``reports``."""
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    try:
        limits = BatchLimits(max_records=max_records, max_batches_per_run=1000, poll_timeout_s=10)
        reports.extend(merge_micro_batches(spark, source, writer, table, limits))
    finally:
        source.close()
    return reports


@pytest.fixture
def reads(monkeypatch):
    """The thread that read each batch (the fault hook's ``consumed`` point), in order."""
    threads: list[str] = []

    def hook(point: str) -> None:
        if point == "consumed":
            threads.append(threading.current_thread().name)

    monkeypatch.setattr(faults, "fault_hook", hook)
    return threads


@pytest.fixture
def folding_ahead_writer():
    """The writer with which batches are folded ahead: delta-rs (delta-spark MERGEs through the session
    that folds, so its batches are read and folded one after another: see the first test below)."""
    return DeltaRsWriter()


def test_the_next_batch_is_folded_while_one_is_merged_and_commits_stay_in_order(spark, broker, writer, tmp_path,
                                                                                reads):
    """Every batch after the first is read and folded in the thread ahead (none twice); each starts
    where the one before it committed, one Delta version each; the table ends as with one batch.
    With delta-spark every batch is read and folded in the run's own thread."""
    ahead = writer.name == "delta-rs"
    topic = new_topic(broker, "dbserver1.inventory.ahead", partitions=3)
    produce(broker, topic, keyed_history(80, 9, 13))
    whole, pieces = captured_table(topic, tmp_path / "whole"), captured_table(topic, tmp_path / "pieces")
    run_batch(spark, broker, writer, whole)
    reads.clear()
    reports = run_batches(spark, broker, writer, pieces, 5, [])
    assert len(reports) > 10 and reports[-1].raw.caught_up
    assert len(reads) == len(reports) and reads[0] == "MainThread"
    for before, after, thread in zip(reports, reports[1:], reads[1:], strict=False):
        assert after.raw.start_offsets == before.raw.end_offsets
        if before.summary is not None:  # folded (not tombstones only): the next one was read ahead
            assert thread.startswith("cdc-batch-ahead") if ahead else thread == "MainThread", thread
    versions = [r.outcome.delta_version for r in reports if r.outcome is not None]
    assert versions == list(range(versions[0], versions[0] + len(versions)))
    assert read_rows(spark, writer, pieces) == read_rows(spark, writer, whole)
    # Each commit carries the greatest source position applied, a batch folded ahead the one committed before it.
    recorded = [json.loads(entry["userMetadata"])["cdc_assets"].get("source_position")
                for entry in reversed(DeltaTable(pieces.target.path).history()) if entry.get("userMetadata")]
    assert len(recorded) == len(versions) and None not in recorded and recorded == sorted(recorded)
    assert recorded[-1] == writer.read_progress(whole.target, whole.app_id).source_position


def test_a_batch_folded_ahead_is_prepared_again_when_the_commit_before_it_changed_the_layout(
        spark, broker, folding_ahead_writer, tmp_path, reads):
    """Batch 2 adds a column to the table; batch 3, folded ahead without it, is read and folded again."""
    from tests.support.logical_types import wrapped

    writer = folding_ahead_writer
    topic = new_topic(broker, "dbserver1.public.ahead_evolving")
    table = captured_table(topic, tmp_path)
    id_field, a_field, b_field = ({"type": "int32", "field": "id"}, {"type": "string", "field": "a"},
                                  {"type": "int64", "field": "b"})
    produce(broker, topic, [(b'{"id": 1}', wrapped([id_field, a_field], {"id": 1, "a": "x"})),
                            (b'{"id": 2}', wrapped([id_field, a_field, b_field], {"id": 2, "a": "y", "b": 7})),
                            (b'{"id": 3}', wrapped([id_field, a_field], {"id": 3, "a": "z"}))])
    reports = run_batches(spark, broker, writer, table, 1, [])
    assert [r.events_read for r in reports] == [1, 1, 1]
    assert reads[0] == "MainThread" and reads[1].startswith("cdc-batch-ahead")
    assert reads[2].startswith("cdc-batch-ahead") and reads[3] == "MainThread"  # batch 3: ahead, then again
    rows = read_rows(spark, writer, table)
    assert {k[0]: (r["a"], r["b"]) for k, r in rows.items()} == {1: ("x", None), 2: ("y", 7), 3: ("z", None)}


def test_a_bad_event_in_a_batch_folded_ahead_halts_after_the_batch_before_it_commits(
        spark, broker, folding_ahead_writer, tmp_path, reads):
    writer = folding_ahead_writer
    topic = new_topic(broker, "dbserver1.inventory.ahead_bad")
    good = [(encode_key({"id": i}), envelope("c", None, {"id": i}, postgres_source(i, i, "s", "t"), i))
            for i in range(4)]
    produce(broker, topic, [*good[:2], (encode_key({"id": 9}), b"{not json"), *good[2:]])
    table = captured_table(topic, tmp_path)
    reports: list = []
    with pytest.raises(BadEventError, match=rf"{topic} partition 0 offset 2: value is not valid JSON"):
        run_batches(spark, broker, writer, table, 2, reports)
    assert len(reports) == 1 and reads[1].startswith("cdc-batch-ahead")
    progress = writer.read_progress(table.target, table.app_id)
    assert progress is not None and progress.offsets == {0: 2}  # the first batch, nothing of the second
    assert set(read_rows(spark, writer, table)) == {(0,), (1,)}


TOAST_FIELDS = [{"type": "int32", "field": "id"}, {"type": "int32", "field": "n"},
                {"type": "string", "field": "body"},
                {"type": "string", "name": "io.debezium.data.Json", "field": "doc"},
                {"type": "bytes", "field": "blob"},
                {"type": "array", "items": {"type": "string"}, "field": "tags"}]


def toast_event(op, key, n, placeholder=None, lsn=1):
    """A PostgreSQL event of a table with TOASTable columns; ``placeholder``: every large column left
    unchanged, as the connector writes it for each type (text, the bytes in base64, a one-element array)."""
    from tests.support.logical_types import wrapped

    if placeholder is None:
        values = {"body": f"body {key}" * 500, "doc": json.dumps({"k": key}),
                  "blob": base64.b64encode(b"\x00" * key).decode(), "tags": [f"t{key}"]}
    else:
        values = {"body": placeholder, "doc": placeholder, "blob": base64.b64encode(placeholder.encode()).decode(),
                  "tags": [placeholder]}
    value = json.loads(wrapped(TOAST_FIELDS, {"id": key, "n": n, **values}, op))
    value["payload"]["source"]["lsn"] = lsn
    return encode_key({"id": key}), json.dumps(value).encode()


@pytest.mark.parametrize("placeholder", ["__debezium_unavailable_value", "__custom_toast__"])
def test_unavailable_toast_values_never_reach_the_table(spark, broker, writer, tmp_path, placeholder):
    topic = new_topic(broker, "dbserver1.public.toasty")
    table = captured_table(topic, tmp_path, unavailable_placeholder=placeholder)
    produce(broker, topic, [toast_event("c", 1, 0, lsn=1), toast_event("c", 2, 0, lsn=2)])
    run_batch(spark, broker, writer, table)
    before = read_rows(spark, writer, table)
    produce(broker, topic, [
        toast_event("u", 1, 1, placeholder, lsn=3),  # stored row: keeps its values
        toast_event("c", 3, 0, lsn=4), toast_event("u", 3, 1, placeholder, lsn=5),  # insert + update in one batch
        toast_event("u", 4, 1, placeholder, lsn=6),  # never captured: nothing to keep
    ])
    report = run_batch(spark, broker, writer, table)
    rows = read_rows(spark, writer, table)
    large = ("body", "doc", "blob", "tags")
    assert rows[(1,)]["n"] == 1 and {c: rows[(1,)][c] for c in large} == {c: before[(1,)][c] for c in large}
    assert rows[(3,)]["n"] == 1 and rows[(3,)]["body"] == "body 3" * 500 and list(rows[(3,)]["tags"]) == ["t3"]
    assert bytes(rows[(3,)]["blob"]) == b"\x00" * 3
    assert rows[(4,)]["n"] == 1 and all(rows[(4,)][c] is None for c in large)
    assert (report.summary.unavailable_kept, report.summary.unavailable_never_seen) == (4, 4)
    assert not any(placeholder in str(row) for row in rows.values())


def test_an_unavailable_toast_value_carries_the_previous_version_in_scd2(spark, broker, writer, tmp_path):
    placeholder = "__debezium_unavailable_value"
    topic = new_topic(broker, "dbserver1.public.toasty_history")
    table = captured_table(topic, tmp_path, apply_mode="scd2")
    produce(broker, topic, [toast_event("c", 1, 0, lsn=1)])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [toast_event("u", 1, 1, placeholder, lsn=3), toast_event("c", 3, 0, lsn=4),
                            toast_event("u", 3, 1, placeholder, lsn=5), toast_event("u", 3, 2, placeholder, lsn=6)])
    report = run_batch(spark, broker, writer, table)
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        versions = DeltaTable(table.target.path).to_pyarrow_table().to_pylist()
    else:
        versions = [row.asDict() for row in spark.read.format("delta").load(table.target.path).collect()]
    assert sorted((v["id"], v["n"], v["_cdc_current"]) for v in versions) == [
        (1, 0, False), (1, 1, True), (3, 0, False), (3, 1, False), (3, 2, True)]
    for version in versions:
        assert version["body"] == f"body {version['id']}" * 500 and list(version["tags"]) == [f"t{version['id']}"]
    assert (report.summary.unavailable_kept, report.summary.unavailable_never_seen) == (4, 0)


def truncate_event(lsn):
    """A PostgreSQL TRUNCATE as Debezium writes it (skipped.operations=none): no key, no row images."""
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "public", "t")
    return None, json.dumps({"before": None, "after": None, "source": source, "op": "t", "ts_ms": lsn,
                             "transaction": None}).encode()


@pytest.mark.parametrize("on_truncate", ["halt", "ignore"])
def test_a_truncate_follows_the_table_s_policy_and_never_loses_rows_silently(spark, broker, writer, tmp_path,
                                                                               on_truncate):
    from cdc_assets.merge import TruncateError

    topic = new_topic(broker, "dbserver1.public.truncated")
    table = captured_table(topic, tmp_path, on_truncate=on_truncate)
    produce(broker, topic, [(encode_key({"id": i}), envelope("c", None, {"id": i, "v": i},
                                                             postgres_source(i, i, "public", "t"), i))
                            for i in (1, 2)])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [truncate_event(10)])  # a batch of only the keyless TRUNCATE
    if on_truncate == "halt":
        with pytest.raises(TruncateError, match=rf"{topic} partition 0 offset 2: TRUNCATE of table 's.t'"):
            run_batch(spark, broker, writer, table)
        assert writer.read_progress(table.target, table.app_id).offsets == {0: 2}
    else:
        report = run_batch(spark, broker, writer, table)
        assert [(t.partition, t.offset) for t in report.summary.truncates] == [(0, 2)]
        assert writer.read_progress(table.target, table.app_id).offsets == {0: 3}
    assert sorted(read_rows(spark, writer, table)) == [(1,), (2,)]


def _truncate_world_event(key, op, lsn, v=None):
    """A change of row ``key`` at ``lsn`` (op c, u or d), as the PostgreSQL connector writes it."""
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "public", "t")
    before = {"id": key, "v": None} if op == "d" else None
    after = None if op == "d" else {"id": key, "v": v if v is not None else f"v{key}@{lsn}"}
    return encode_key({"id": key}), envelope(op, before, after, source, lsn)


@pytest.mark.parametrize("apply_mode", ["scd1", "soft_delete", "scd2"])
def test_an_applied_truncate_removes_the_rows_from_before_it_and_nothing_after(spark, broker, writer, tmp_path,
                                                                               apply_mode):
    """on_truncate: apply. The TRUNCATE (lsn 10) reaches partition 0, after partition 1's changes from after it
    were applied (key 2 inserted again at lsn 12) and before one from before it is read (lsn 8): the table ends
    as the source, rows from before it removed (soft_delete: marked deleted at its position; scd2: every version
    that lived past it ends there)."""
    topic = new_topic(broker, "dbserver1.public.truncapplied", partitions=2)
    table = captured_table(topic, tmp_path, on_truncate="apply", apply_mode=apply_mode)
    produce(broker, topic, [_truncate_world_event(k, "c", k) for k in (1, 3, 4)], partition=0)
    produce(broker, topic, [_truncate_world_event(k, "c", k) for k in (2, 7)], partition=1)
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [_truncate_world_event(2, "c", 12, "again"), _truncate_world_event(6, "c", 13)],
            partition=1)
    run_batch(spark, broker, writer, table)  # from after the TRUNCATE, read before it
    produce(broker, topic, [_truncate_world_event(3, "u", 9), truncate_event(10), _truncate_world_event(5, "c", 11)],
            partition=0)
    produce(broker, topic, [_truncate_world_event(6, "u", 14, "six")], partition=1)
    report = run_batch(spark, broker, writer, table)
    assert len(report.summary.truncates) == 1 and report.summary.before_truncate == 1
    assert report.events_read == 4
    # Late: a change from before the TRUNCATE read after it never revives its row.
    produce(broker, topic, [_truncate_world_event(7, "u", 8, "late"), _truncate_world_event(8, "c", 15)],
            partition=1)
    late = run_batch(spark, broker, writer, table)
    assert late.summary.before_truncate == 1 and not late.summary.truncates
    expected = {(2,): "again", (5,): "v5@11", (6,): "six", (8,): "v8@15"}
    rows = read_rows(spark, writer, table, visible_only=False)
    truncated_at = writer.read_progress(table.target, table.app_id).truncated_at
    assert truncated_at == report.summary.truncates[0].position
    if apply_mode == "scd1":
        assert {key: row["v"] for key, row in rows.items()} == expected
    elif apply_mode == "soft_delete":
        assert {key: row["v"] for key, row in rows.items() if not row["_cdc_deleted"]} == expected
        gone = {key: row for key, row in rows.items() if row["_cdc_deleted"]}
        assert sorted(gone) == [(1,), (3,), (4,), (7,)]
        assert {row["_cdc_position"] for row in gone.values()} == {truncated_at}
        assert {row["_cdc_source_ts"].replace(tzinfo=None) for row in gone.values()} == {
            report.summary.truncates[0].source_ts.replace(tzinfo=None)}
    else:
        from deltalake import DeltaTable
        versions = (DeltaTable(table.target.path).to_pyarrow_table().to_pylist() if writer.name == "delta-rs" else
                    [r.asDict() for r in spark.read.format("delta").load(table.target.path).collect()])
        current = {(v["id"],): v["v"] for v in versions if v["_cdc_current"]}
        assert current == expected
        ended = sorted((v["id"], v["_cdc_valid_to"]) for v in versions if v["_cdc_valid_from"] < truncated_at)
        assert ended == [(k, truncated_at) for k in (1, 2, 3, 4, 7)]
        assert len(versions) == 5 + 5  # 1, 2, 3, 4, 7 before the TRUNCATE; 2, 6 (twice), 5, 8 after it
