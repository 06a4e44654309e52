"""Transaction-consistent merges, the transaction log, the watermark and the transaction sensor."""

import json
import re
from dataclasses import replace

import pytest
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.catalog import CapturedTable, TransactionRules
from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.transactions import (
    TransactionLog,
    TransactionLogError,
    consistent_versions,
    ingest_transactions,
    update_watermark,
)
from tests.support.merges import read_rows, run_batch, with_merge
from tests.support.topics import new_topic, new_topic_named, produce
from tests.support.transactions import transaction_sensor, tx_create, tx_event


def change(table, key, value, lsn, tx_id=None, order=1):
    """A create of s.``table`` with column ``v`` in PostgreSQL transaction ``tx_id``."""
    return tx_create(table, {"id": key, "v": value}, lsn, tx_id, order)


class Connector:
    """Two tables of one connector with transaction metadata, on fresh topics of ``partitions``."""

    def __init__(self, broker, tmp_path, partitions=1):
        self.prefix = new_topic(broker, "txdb").replace(".", "_")
        self.tx_topic = new_topic_named(broker, f"{self.prefix}.transaction")
        self.topics = {name: new_topic_named(broker, f"{self.prefix}.s.{name}", partitions) for name in ("a", "b")}
        log = TransactionLog(self.tx_topic, DeltaTarget(str(tmp_path / "_cdc_assets" / "transactions")),
                             "postgresql")
        self.watermarks = DeltaTarget(str(tmp_path / "_cdc_assets" / "watermarks"))
        self.tables = {name: CapturedTable("txdb", "postgresql", self.prefix, f"s.{name}", topic,
                                           DeltaTarget(str(tmp_path / name)),
                                           transactions=TransactionRules(log, self.watermarks))
                       for name, topic in self.topics.items()}
        self.log = log

    def watermark(self):
        return update_watermark("txdb", self.log, {t.name: t.target for t in self.tables.values()}, self.watermarks)


def ids(spark, writer, table):
    if not DeltaTable.is_deltatable(table.target.path):
        return []
    return sorted(key[0] for key in read_rows(spark, writer, table))


def test_a_transaction_over_two_tables_appears_in_both_only_after_its_end(spark, broker, writer, tmp_path):
    c = Connector(broker, tmp_path)
    produce(broker, c.tx_topic, [tx_event("BEGIN", "571")])
    produce(broker, c.topics["a"], [change("a", 1, "x", 10), change("a", 2, "x", 11, "572")])  # 1: no tx
    produce(broker, c.topics["a"], [change("a", 3, "t1", 12, "571")])
    produce(broker, c.topics["b"], [change("b", 7, "t1", 13, "571")])

    first = run_batch(spark, broker, writer, c.tables["a"])
    # Neither tx1 nor tx2 has an END yet: the batch stops before tx2; event 1 (no transaction) is applied.
    assert ids(spark, writer, c.tables["a"]) == [1]
    assert first.transactions.to_metadata()["waiting"] == {"571": {"seen": 1, "expected": None},
                                                           "572": {"seen": 1, "expected": None}}
    produce(broker, c.tx_topic, [tx_event("BEGIN", "572"), tx_event("END", "572", {"s.a": 1})])
    run_batch(spark, broker, writer, c.tables["a"])
    assert ids(spark, writer, c.tables["a"]) == [1, 2]  # tx1 still open: 3 waits
    assert run_batch(spark, broker, writer, c.tables["b"]).outcome is None
    assert not DeltaTable.is_deltatable(c.tables["b"].target.path)

    produce(broker, c.tx_topic, [tx_event("END", "571", {"s.a": 1, "s.b": 1})])
    run_batch(spark, broker, writer, c.tables["a"])
    assert ids(spark, writer, c.tables["a"]) == [1, 2, 3]
    assert ids(spark, writer, c.tables["b"]) == []  # b has not run since the END: still without tx1
    run_batch(spark, broker, writer, c.tables["b"])
    assert ids(spark, writer, c.tables["b"]) == [7]
    watermark = c.watermark()
    assert watermark["transaction_id"].startswith("571:")  # the END's own id
    tx_id, versions = consistent_versions(c.watermarks, "txdb")
    assert tx_id == watermark["transaction_id"] and versions == {"s.a": DeltaTable(c.tables["a"].target.path).version(),
                                           "s.b": DeltaTable(c.tables["b"].target.path).version()}


def test_a_transaction_split_across_batches_is_applied_whole(spark, broker, writer, tmp_path):
    c = Connector(broker, tmp_path)
    produce(broker, c.tx_topic, [tx_event("BEGIN", "573")])
    produce(broker, c.topics["a"], [change("a", k, "573", 20 + k, "573", k) for k in range(3)])
    assert run_batch(spark, broker, writer, c.tables["a"]).outcome is None  # END not seen: nothing
    produce(broker, c.topics["a"], [change("a", k, "573", 20 + k, "573", k) for k in range(3, 5)])
    produce(broker, c.tx_topic, [tx_event("END", "573", {"s.a": 5})])
    report = run_batch(spark, broker, writer, c.tables["a"])
    assert report.transactions.applied == 1 and ids(spark, writer, c.tables["a"]) == [0, 1, 2, 3, 4]


def test_reconciliation_check_names_a_transaction_missing_events(spark, broker, tmp_path):
    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path}", writer: delta-rs}}
connectors:
  - name: txdb
    kind: postgresql
    topic.prefix: PREFIX
    transaction_metadata: true
    tables: [{{name: s.a}}, {{name: s.b}}]
"""
    prefix = new_topic(broker, "recon").replace(".", "_")
    tx_topic = new_topic_named(broker, f"{prefix}.transaction")
    topics = {n: new_topic_named(broker, f"{prefix}.s.{n}") for n in ("a", "b")}
    produce(broker, tx_topic, [tx_event("BEGIN", "574"), tx_event("END", "574", {"s.a": 3})])
    produce(broker, topics["a"], [change("a", k, "v", 30 + k, "574", k) for k in range(2)])
    defs = build_definitions(parse_config(config.replace("PREFIX", prefix)))
    with DagsterInstance.ephemeral() as instance:
        # Blocking: the merge run evaluates it, and fails on it.
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        evaluations = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    failed = evaluations[("a", "transactions_reconciled")]
    assert not failed.passed and failed.metadata["incomplete_transactions"].value == ["574"]
    assert "transaction 574: END announces 3 events for s.a, the topic holds 2" in failed.description
    assert evaluations[("b", "transactions_reconciled")].passed


def test_sensor_batches_transactions_into_one_run_and_never_twice(broker, tmp_path):
    defs, sensor, tx_topic = transaction_sensor(broker, tmp_path, partitions=1)
    events = []
    for n in range(20):
        events += [tx_event("BEGIN", str(600 + n)), tx_event("END", str(600 + n), {"s.a" if n % 2 else "s.b": 1})]
    events.append(tx_event("BEGIN", "576"))
    produce(broker, tx_topic, events)
    with DagsterInstance.ephemeral() as instance:
        first = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs))
        [request] = first.run_requests
        assert request.run_key == f"transactions:{tx_topic}:0:1-39"
        assert sorted(k.path[-1] for k in request.asset_selection) == ["a", "b"]
        assert sorted((k.asset_key.path[-1], k.name) for k in request.asset_check_keys) == [
            ("a", "primary_key"), ("a", "transactions_reconciled"), ("a", "unavailable_values_kept"),
            ("b", "primary_key"), ("b", "transactions_reconciled"), ("b", "unavailable_values_kept")]
        assert json.loads(first.cursor) == {"offsets": {"0": 41}}
        again = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
        assert again.run_requests == []
        # An END whose BEGIN the sensor never read completes its transaction all the same: on a topic of several
        # partitions BEGIN and END are in different ones, and a restarted connector emits both again.
        produce(broker, tx_topic, [tx_event("END", "576", {"s.c": 2}), tx_event("END", "577", {"s.a": 1})])
        third = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
        assert sorted(k.path[-1] for k in third.run_requests[0].asset_selection) == ["a", "c"]
        assert json.loads(third.cursor)["offsets"] == {"0": 43}


@pytest.mark.parametrize(("value", "message"), [
    (json.dumps({"status": "COMMIT", "id": "x"}).encode(), "unknown transaction status 'COMMIT'"),
    (json.dumps({"status": "END", "id": "x", "data_collections": "s.a"}).encode(), "data_collections is not a list"),
    (json.dumps({"status": "END", "id": "x", "data_collections": [{"event_count": 1}]}).encode(),
     "malformed data_collections entry"),
])
def test_bad_transaction_events_name_their_offset(broker, tmp_path, value, message):
    from cdc_assets.io.kafka import KafkaSource

    topic = new_topic(broker, "badtx.transaction")
    produce(broker, topic, [tx_event("BEGIN", "578"), (b"{}", value)])
    log = TransactionLog(topic, DeltaTarget(str(tmp_path / "log")), "postgresql")
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "tx-tests"})
    try:
        with pytest.raises(TransactionLogError, match=rf"{topic} partition 0 offset 1: .*{message}"):
            ingest_transactions(source, log)
    finally:
        source.close()


def test_events_without_transactions_flow_as_before(spark, broker, writer, tmp_path):
    c = Connector(broker, tmp_path)
    produce(broker, c.topics["a"], [change("a", k, "snap", 5 + k) for k in range(3)])
    report = run_batch(spark, broker, writer, replace(c.tables["a"]))
    assert report.outcome.inserted == 3 and report.transactions.waiting == {}


def test_a_transaction_larger_than_a_batch_is_a_clear_error(spark, broker, writer, tmp_path):
    from cdc_assets.merge import BatchTooSmallError

    c = Connector(broker, tmp_path)
    produce(broker, c.tx_topic, [tx_event("BEGIN", "575"), tx_event("END", "575", {"s.a": 6})])
    produce(broker, c.topics["a"], [change("a", k, "h", 40 + k, "575", k) for k in range(6)])
    with pytest.raises(BatchTooSmallError, match="transaction 575 does not fit in a batch of 4 records"):
        run_batch(spark, broker, writer, c.tables["a"], max_records=4)
    assert run_batch(spark, broker, writer, c.tables["a"], max_records=10).transactions.applied == 1


def test_two_concurrent_ingests_append_each_transaction_event_once(broker, tmp_path):
    """Two ingests that read the same new events before either commits (the tables of one connector
    run in different pools): one appends them, the other adds nothing."""
    import threading

    from cdc_assets.io.kafka import KafkaSource

    topic = new_topic(broker, "conc.transaction")
    produce(broker, topic, [tx_event("BEGIN", "1"), tx_event("END", "1", {"s.a": 1})])
    log = TransactionLog(topic, DeltaTarget(str(tmp_path / "log")), "postgresql")
    both_read = threading.Barrier(2, timeout=60)

    class ReadTogether(KafkaSource):
        """A real source whose first read waits until the other ingest has read too."""

        waited = False

        def read_batch(self, *args, **kwargs):
            batch = super().read_batch(*args, **kwargs)
            if not self.waited:
                self.waited = True
                both_read.wait()
            return batch

    added: list[object] = []

    def ingest() -> None:
        source = ReadTogether({"bootstrap.servers": broker.bootstrap_servers, "group.id": "tx-conc"})
        try:
            added.append(ingest_transactions(source, log))
        except Exception as exc:
            added.append(exc)
        finally:
            source.close()

    threads = [threading.Thread(target=ingest) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(added) == [0, 2]
    rows = DeltaTable(log.target.path).to_pyarrow_table().to_pylist()
    assert sorted((r["status"], r["offset"]) for r in rows) == [("BEGIN", 0), ("END", 1)]


def test_a_batch_waiting_for_an_end_not_ingested_yet_waits_instead_of_blaming_the_batch_limits(spark, broker,
                                                                                               writer, tmp_path):
    """The first transaction's END is not in the log yet: the batch applies nothing and says what it
    waits for (no BatchTooSmallError, whose advice to raise the limits would be wrong); once the END
    is there, a batch too small for the transaction is the clear error, and a large enough one applies it."""
    from cdc_assets.merge import BatchTooSmallError

    c = Connector(broker, tmp_path)
    produce(broker, c.tx_topic, [tx_event("BEGIN", "7:70")])
    produce(broker, c.topics["a"], [change("a", k, "o", 70 + k, "7:70", k) for k in range(6)])
    report = run_batch(spark, broker, writer, c.tables["a"], max_records=4)
    assert report.outcome is None and report.raw.end_offsets == report.raw.start_offsets
    assert list(report.transactions.to_metadata()["waiting"].values()) == [{"seen": 4, "expected": None}]
    produce(broker, c.tx_topic, [tx_event("END", "7:70", {"s.a": 6})])
    with pytest.raises(BatchTooSmallError, match=r"transaction 7 does not fit in a batch of 4 records.*announces 6 "
                                                 r"events.*after 4 of them.*max_records_per_batch .* at least 6 "):
        run_batch(spark, broker, writer, c.tables["a"], max_records=4)
    assert run_batch(spark, broker, writer, c.tables["a"], max_records=10).transactions.applied == 1
    assert ids(spark, writer, c.tables["a"]) == list(range(6))


def row_event(op, key, value, lsn, tx_id, order):
    """A create, update or delete of row ``key`` in PostgreSQL transaction ``tx_id``."""
    transaction = {"id": f"{tx_id}:{lsn}", "total_order": order, "data_collection_order": order}
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "a")
    before = {"id": key, "v": "old"} if op != "c" else None
    after = {"id": key, "v": value} if op != "d" else None
    return encode_key({"id": key}), envelope(op, before, after, source, lsn, transaction)


def produce_transactions(broker, c, transactions, partitions):
    """Produce transactions of table ``s.a`` as the connector does: each one's events after those of the
    transactions before it in every partition (row ``key`` in partition ``key % partitions``), a
    tombstone after each delete, every BEGIN and END in the transaction topic. Returns the rows a
    table holds once all are applied, and the tombstones."""
    by_partition = {p: [] for p in range(partitions)}
    expected, lsn, tombstones = {}, 1000, 0
    tx_events = []
    for tx_id, changes in transactions:
        tx_events.append(tx_event("BEGIN", tx_id))
        for order, (op, key, value) in enumerate(changes, 1):
            lsn += 1
            by_partition[key % partitions].append(row_event(op, key, value, lsn, tx_id, order))
            if op == "d":
                by_partition[key % partitions].append((encode_key({"id": key}), None))
                tombstones += 1
                expected.pop(key, None)
            else:
                expected[key] = value
        tx_events.append(tx_event("END", tx_id, {"s.a": len(changes)}))
    produce(broker, c.tx_topic, tx_events)
    for partition, records in by_partition.items():
        produce(broker, c.topics["a"], records, partition=partition)
    return expected, tombstones


def values(spark, writer, table):
    return {key[0]: row["v"] for key, row in read_rows(spark, writer, table).items()}


def test_a_transaction_that_fits_is_applied_whatever_later_ones_fill_the_partitions_with(spark, broker, writer,
                                                                                          tmp_path):
    """Batches of 10 records over 3 partitions: the first transaction has 6 of its 8 events in partition 0,
    behind which the other partitions hold later transactions' events. A batch of 10 read from all three
    holds 6 or fewer of its events and nothing whole (which was BatchTooSmallError): the batch is read again
    without the later transactions, and every transaction that fits (one of exactly 10) is applied."""
    c = Connector(broker, tmp_path, partitions=3)
    transactions = [
        ("801", [("c", k, "t1") for k in (0, 3, 6, 9, 12, 15, 1, 2)]),
        ("802", [("c", 4, "t2"), ("c", 7, "t2"), ("c", 10, "t2"), ("c", 5, "t2"), ("c", 8, "t2"), ("u", 0, "t2")]),
        ("803", [("u", 3, "t3"), ("u", 6, "t3"), ("u", 1, "t3"), ("c", 13, "t3"), ("c", 16, "t3"), ("u", 2, "t3"),
                 ("c", 11, "t3"), ("c", 14, "t3")]),
        ("804", [("c", k, "t4") for k in range(18, 28)]),
        ("805", [("d", 9, None), *(("u", k, "t5") for k in (2, 5, 8, 11, 14))]),
        ("806", [("u", k, "t6") for k in (0, 3, 6, 12, 15, 18, 21)] + [("d", 24, None), ("d", 27, None)]),
    ]
    expected, tombstones = produce_transactions(broker, c, transactions, partitions=3)
    total = sum(len(changes) for _, changes in transactions) + tombstones
    applied, batches = 0, 0
    while batches < 30:
        report = run_batch(spark, broker, writer, c.tables["a"], max_records=10)
        batches += 1
        assert report.raw.end_offsets != report.raw.start_offsets, f"batch {batches} applied nothing: {report}"
        applied += report.transactions.applied if report.transactions else 0  # none in a batch of tombstones alone
        if sum(report.raw.end_offsets.values()) == total:
            break
    assert applied == len(transactions)
    assert values(spark, writer, c.tables["a"]) == expected


def test_a_transaction_that_cannot_fit_names_the_limit_it_needs_tombstones_included(spark, broker, writer, tmp_path):
    """The END announces 6 events; with the tombstones after its two deletes they take 8 records: a
    batch of 7 fails, saying 8, and one of 8 applies it."""
    from cdc_assets.merge import BatchTooSmallError

    c = Connector(broker, tmp_path)
    changes = [("c", 1, "x"), ("c", 2, "x"), ("d", 1, None), ("d", 2, None), ("c", 3, "x"), ("c", 4, "x")]
    expected, _ = produce_transactions(broker, c, [("901", changes), ("902", [("c", 5, "y")])], partitions=1)
    with pytest.raises(BatchTooSmallError, match=r"transaction 901 does not fit in a batch of 7 records.*announces 6 "
                                                 r"events.*at least 8 \(the 6 events, and a record for each "
                                                 r"tombstone"):
        run_batch(spark, broker, writer, c.tables["a"], max_records=7)
    assert run_batch(spark, broker, writer, c.tables["a"], max_records=8).transactions.applied == 1
    run_batch(spark, broker, writer, c.tables["a"], max_records=8)
    assert values(spark, writer, c.tables["a"]) == expected


def test_a_transaction_topic_of_three_partitions_pairs_begin_and_end_by_transaction(spark, broker, writer, tmp_path):
    """PostgreSQL's BEGIN and END ids differ, so a transaction topic of three partitions holds a transaction's END
    in another partition than its BEGIN, and ENDs before BEGINs in offset order (every run failed with 'END of
    transaction ... without a BEGIN before it'). Pairing by transaction and ordering by the ENDs' commit LSNs,
    both tables are applied whole and the watermark names the last transaction."""
    c = Connector(broker, tmp_path)
    tx_topic = new_topic_named(broker, f"{c.prefix}.transaction3", partitions=3)
    log = replace(c.log, topic=tx_topic)
    tables = {name: replace(table, transactions=TransactionRules(log, c.watermarks))
              for name, table in c.tables.items()}
    markers = {p: [] for p in range(3)}
    # (txID, BEGIN's partition, END's partition, events per table)
    for tx_id, begin_in, end_in, counts in [("701", 1, 0, {"s.a": 2}), ("702", 0, 2, {"s.b": 1}),
                                            ("703", 2, 1, {"s.a": 1, "s.b": 1})]:
        markers[begin_in].append(tx_event("BEGIN", tx_id))
        lsn = 2000 + 10 * int(tx_id)
        for table, count in counts.items():
            name = table.split(".")[1]
            produce(broker, c.topics[name], [change(name, int(tx_id) * 10 + k, tx_id, lsn + k, tx_id, k + 1)
                                             for k in range(count)])
        markers[end_in].append(tx_event("END", tx_id, counts))
    for partition, records in markers.items():
        produce(broker, tx_topic, records, partition=partition)
    for name in ("a", "b"):
        report = run_batch(spark, broker, writer, tables[name])
        assert report.transactions.waiting == {} and report.transactions.applied == 2
    assert ids(spark, writer, tables["a"]) == [7010, 7011, 7030]
    assert ids(spark, writer, tables["b"]) == [7020, 7030]
    row = update_watermark("txdb", log, {t.name: t.target for t in tables.values()}, c.watermarks)
    assert row is not None and row["transaction_id"].startswith("703:")
    ends = sorted((r["position"], r["key"]) for r in DeltaTable(log.target.path).to_pyarrow_table().to_pylist()
                  if r["status"] == "END")
    assert [key for _, key in ends] == ["701", "702", "703"]  # commit order, whatever partitions they are in


def test_a_connector_without_commit_order_needs_a_transaction_topic_of_one_partition(broker, tmp_path):
    """SQL Server's transaction ids (commit LSNs of 80 bits) order nothing here: a log over a topic of several
    partitions is refused, naming the topic, its partitions and the remedy, instead of pairing ENDs out of order."""
    from cdc_assets.io.kafka import KafkaSource

    topic = new_topic(broker, "sqltx.transaction", partitions=2)
    body = {"status": "BEGIN", "id": "00000025:00000d98:0003", "ts_ms": 1, "event_count": None,
            "data_collections": None}
    produce(broker, topic, [(b"{}", json.dumps(body).encode())])
    log = TransactionLog(topic, DeltaTarget(str(tmp_path / "log")), "sqlserver")
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "tx-tests"})
    try:
        with pytest.raises(TransactionLogError, match=rf"{topic} has 2 partitions.*sqlserver connector, whose "
                                                      "transaction ids carry no commit order.*one partition"):
            ingest_transactions(source, log)
    finally:
        source.close()


def test_markers_and_events_a_restarted_connector_emits_again_complete_the_transaction_once(spark, broker, writer,
                                                                                           tmp_path):
    """A connector restarted on its stored offsets mid-transaction emits BEGIN again, the events after its last
    stored offset again (same LSNs), and an END counting only what it emitted after the restart: the transaction
    is applied whole once, the later END taking back nothing the first announced, and the next one flows."""
    c = Connector(broker, tmp_path)
    first = [change("a", k, "t1", 3000 + k, "760", k + 1) for k in range(3)]
    produce(broker, c.tx_topic, [tx_event("BEGIN", "760")])
    restart_begin = tx_event("BEGIN", "760")
    end_before = tx_event("END", "760", {"s.a": 3})
    # The restarted connector's END has the first END's id (the commit LSN) and counts one event.
    body = json.loads(end_before[1])
    again = dict(body, event_count=1, data_collections=[{"data_collection": "s.a", "event_count": 1}])
    produce(broker, c.topics["a"], [*first, first[2]])
    produce(broker, c.tx_topic, [end_before, restart_begin, (end_before[0], json.dumps(again).encode())])
    produce(broker, c.topics["a"], [change("a", 9, "t2", 3100, "761")])
    produce(broker, c.tx_topic, [tx_event("BEGIN", "761"), tx_event("END", "761", {"s.a": 1})])
    report = run_batch(spark, broker, writer, c.tables["a"])
    assert report.transactions.waiting == {} and report.transactions.applied == 2
    assert values(spark, writer, c.tables["a"]) == {0: "t1", 1: "t1", 2: "t1", 9: "t2"}


def test_a_restarted_connectors_only_end_names_only_the_tables_it_emitted_to_after_the_restart(spark, broker, writer,
                                                                                               tmp_path):
    """Killed before it wrote a transaction's END, a connector restarted on its stored offsets emits BEGIN again,
    the events after its last stored offset, and an END counting only those: it names ``s.b``, whose event came
    after the restart, and not ``s.a``, whose events all came before. Both tables apply the transaction and the
    next one flows (``s.a`` waited for an END that would never name it: a CI run of the real connector)."""
    c = Connector(broker, tmp_path)
    produce(broker, c.tx_topic, [tx_event("BEGIN", "790")])
    produce(broker, c.topics["a"], [change("a", k, "t1", 3400 + k, "790", k + 1) for k in range(3)])
    produce(broker, c.tx_topic, [tx_event("BEGIN", "790")])  # the restarted connector's
    produce(broker, c.topics["b"], [change("b", 5, "t1", 3410, "790", 1)])
    produce(broker, c.tx_topic, [tx_event("END", "790", {"s.b": 1})])
    produce(broker, c.topics["a"], [change("a", 9, "t2", 3500, "791")])
    produce(broker, c.tx_topic, [tx_event("BEGIN", "791"), tx_event("END", "791", {"s.a": 1})])
    for name, expected in (("a", {0: "t1", 1: "t1", 2: "t1", 9: "t2"}), ("b", {5: "t1"})):
        report = run_batch(spark, broker, writer, c.tables[name])
        assert report.transactions.waiting == {}, (name, report.transactions)
        assert values(spark, writer, c.tables[name]) == expected, name


def test_an_event_delivered_twice_does_not_make_a_transaction_whole(spark, broker, writer, tmp_path):
    """An END announces 3 events; the topic holds two of them, one delivered twice: the transaction is not whole
    and nothing of it is applied; the reconciliation names 2 of 3."""
    c = Connector(broker, tmp_path)
    events = [change("a", k, "x", 3200 + k, "770", k + 1) for k in range(2)]
    produce(broker, c.topics["a"], [*events, events[1]])
    produce(broker, c.tx_topic, [tx_event("BEGIN", "770"), tx_event("END", "770", {"s.a": 3})])
    report = run_batch(spark, broker, writer, c.tables["a"])
    assert report.transactions.applied == 0
    assert report.transactions.to_metadata()["incomplete"] == {"770": {"seen": 2, "expected": 3}}
    assert ids(spark, writer, c.tables["a"]) == []


@pytest.mark.parametrize("on_bad_event", ["halt", "dead_letter"])
def test_a_bad_event_inside_a_transaction_counts_toward_it_and_meets_on_bad_event(spark, broker, writer, tmp_path,
                                                                                  on_bad_event):
    """A transaction's event that cannot be read (an unknown op) is one of the events its END announces: the
    transaction completes, and the bad event halts the batch naming its topic, partition and offset, or goes to
    the dead-letter table while the rest of the transaction is applied (it waited forever, and on_bad_event never
    applied)."""
    from cdc_assets.merge import BadEventError

    c = Connector(broker, tmp_path)
    table = with_merge(c.tables["a"], on_bad_event=on_bad_event, dead_letter=DeltaTarget(str(tmp_path / "dead")))
    good = change("a", 1, "ok", 3300, "780", 1)
    bad_value = json.loads(change("a", 2, "bad", 3301, "780", 2)[1])
    bad = (encode_key({"id": 2}), json.dumps(dict(bad_value, op="x")).encode())
    produce(broker, c.topics["a"], [good, bad])
    produce(broker, c.tx_topic, [tx_event("BEGIN", "780"), tx_event("END", "780", {"s.a": 2})])
    if on_bad_event == "halt":
        with pytest.raises(BadEventError, match=rf"{c.topics['a']} partition 0 offset 1.*unknown op 'x'"):
            run_batch(spark, broker, writer, table)
        assert ids(spark, writer, table) == []
        return
    report = run_batch(spark, broker, writer, table)
    assert report.transactions.applied == 1 and report.dead_lettered == 1
    assert ids(spark, writer, table) == [1]


def test_a_transaction_that_blocks_a_table_past_its_timeout_fails_the_blocking_check(spark, broker, tmp_path):
    """A transaction whose END never comes (its events captured long ago): the merge applies nothing, and once it
    has waited past the connector's transaction_timeout_s, instead of a green run the blocking
    transactions_reconciled check fails, naming the transaction, what it waits for and how long it has kept the
    table waiting; the materialization shows it under transactions_stalled. Within the timeout the run is green."""
    prefix = new_topic(broker, "stall").replace(".", "_")
    new_topic_named(broker, f"{prefix}.transaction")
    topic = new_topic_named(broker, f"{prefix}.s.a")
    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path}", writer: delta-rs}}
connectors:
  - name: txdb
    kind: postgresql
    topic.prefix: {prefix}
    transaction_metadata: true
    transaction_timeout_s: 60
    tables: [{{name: s.a}}]
"""
    produce(broker, f"{prefix}.transaction", [tx_event("BEGIN", "790")])
    produce(broker, topic, [change("a", k, "v", 3400 + k, "790", k + 1) for k in range(2)])
    with DagsterInstance.ephemeral() as instance:
        # Within the timeout it waits, listed, and the run stays green: its END may be on its way.
        patient = build_definitions(parse_config(config.replace("timeout_s: 60", "timeout_s: 1e10")))
        waiting = patient.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance)
        [check] = [e for e in waiting.get_asset_check_evaluations() if e.check_name == "transactions_reconciled"]
        assert check.passed and check.metadata["stalled_transactions"].value == []
        [materialization] = waiting.asset_materializations_for_node("txdb_merge")
        assert list(materialization.metadata["transactions_waiting"].value) == ["790"]
    defs = build_definitions(parse_config(config))
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "transactions_reconciled"]
        [materialization] = result.asset_materializations_for_node("txdb_merge")
    assert not check.passed and check.metadata["stalled_transactions"].value == ["790"]
    assert re.search(r"transaction 790: 2 of its events for s.a are in the topic and the transaction log has no END "
                     r"naming s.a for it; it has kept s.a from applying anything for \d", check.description), \
        check.description
    assert list(materialization.metadata["transactions_stalled"].value) == ["790"]


def test_events_a_restarted_connector_emits_again_from_far_back_never_hold_the_table(spark, broker, writer, tmp_path):
    """A connector killed while producing transaction 812 (partition 0 got all of its events, partition 1 one,
    partition 2 none) and restarted on an offset stored inside 811, applied long before: it emits 811's events after
    that offset again (2 of its 3), its END again, and everything after. In batches of 15 records over 3 partitions,
    811's second delivery comes after 812's first events, and 812's after the first delivery of 812 and its own
    remainder: every batch moves on, every transaction is applied whole once, and nothing is left waiting (811's
    second delivery, counted against its END as a transaction of its own, waited forever: the table stopped)."""
    c = Connector(broker, tmp_path, partitions=3)
    lsn = iter(range(5000, 6000))

    def transaction(tx_id, changes):
        """(partition, record) of each event: row ``key`` in partition ``key % 3``."""
        return [(key % 3, row_event(op, key, value, next(lsn), tx_id, order))
                for order, (op, key, value) in enumerate(changes, 1)]

    t810 = transaction("810", [("c", k, "t0") for k in range(6)])
    t811 = transaction("811", [("u", k, "t1") for k in (0, 1, 2)])
    t812 = transaction("812", [("c", k, "t2") for k in range(6, 15)])
    t813 = transaction("813", [("u", k, "t3") for k in range(3, 9)])
    t814 = transaction("814", [("c", k, "t4") for k in (20, 21, 22)])
    ends = {tx: tx_event("END", tx, {"s.a": n}) for tx, n in (("810", 6), ("811", 3), ("812", 9), ("813", 6),
                                                               ("814", 3))}
    body = json.loads(ends["811"][1])  # the restarted connector's END of 811: its id, the events it emitted again
    end_again = (ends["811"][0], json.dumps(dict(body, event_count=2, data_collections=[
        {"data_collection": "s.a", "event_count": 2}])).encode())
    killed = [*t810, *t811, *(e for e in t812 if e[0] == 0), *[e for e in t812 if e[0] == 1][:1]]
    again = [*t811[1:], *t812, *t813, *t814]
    produce(broker, c.tx_topic, [tx_event("BEGIN", "810"), ends["810"], tx_event("BEGIN", "811"), ends["811"],
                                 tx_event("BEGIN", "812"),  # killed here; restarted inside 811:
                                 tx_event("BEGIN", "811"), end_again, tx_event("BEGIN", "812"), ends["812"],
                                 tx_event("BEGIN", "813"), ends["813"], tx_event("BEGIN", "814"), ends["814"]])
    for partition in range(3):
        produce(broker, c.topics["a"], [record for p, record in [*killed, *again] if p == partition],
                partition=partition)
    total = len(killed) + len(again)
    reports = []
    while not reports or sum(reports[-1].raw.end_offsets.values()) < total:
        assert len(reports) < 20, [(r.raw.start_offsets, r.raw.end_offsets) for r in reports]
        reports.append(run_batch(spark, broker, writer, c.tables["a"], max_records=15))
        report = reports[-1]
        assert report.raw.end_offsets != report.raw.start_offsets, \
            f"batch {len(reports)} from {report.raw.start_offsets} applied nothing: {report.transactions}"
    assert reports[-1].transactions.waiting == {}
    assert sum(r.transactions.applied for r in reports if r.transactions) == 5
    assert values(spark, writer, c.tables["a"]) == {**{k: "t1" for k in (0, 1, 2)}, **{k: "t3" for k in range(3, 9)},
                                                    **{k: "t2" for k in range(9, 15)}, 20: "t4", 21: "t4", 22: "t4"}
