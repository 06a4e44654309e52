"""Many tables of one layout decoded and folded in one Spark query (``merge.shared``), through a run's real
orchestration (``merge_concurrently`` and the assets' ``merge_table``) on a real broker, Spark and Delta: each
table ends as the per-table path leaves it and as its reference, with unchanged TOAST values, a primary-key
change, a TRUNCATE and a poison event each in one table of the plan, and each table's offsets committed."""

from __future__ import annotations

import json
from dataclasses import replace

from confluent_kafka import Consumer, TopicPartition
from dagster import AssetKey
from deltalake import DeltaTable

from cdc_assets.assets import merge_table
from cdc_assets.catalog import CapturedTable, TransactionRules
from cdc_assets.config import BatchLimits
from cdc_assets.demo.events import postgres_source
from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.io.transactions import TransactionLog
from cdc_assets.merge import merge_concurrently
from tests.support.key_changes import TOAST_COLUMNS, current_values, pg_change, pk_change
from tests.support.merges import captured_table, with_merge
from tests.support.topics import new_topic, produce
from tests.support.transactions import tx_create, tx_event


def truncate(lsn: int) -> tuple[None, bytes]:
    """A PostgreSQL TRUNCATE of s.t (skipped.operations=none): no key, no row images."""
    source = postgres_source(lsn, 1_700_000_000_000 + lsn, "s", "t")
    return None, json.dumps({"before": None, "after": None, "source": source, "op": "t", "ts_ms": lsn,
                             "transaction": None}).encode()


def run(spark, broker, writer, tables: dict[str, CapturedTable], shared: bool) -> dict[str, dict]:
    """One run over ``tables`` as the merge op runs them (two at once, ``merge_table``), with or without shared
    plans, committing Kafka offsets for the group ``group(shared)``: each table's materialization metadata."""
    limits = BatchLimits(max_records=1000, poll_timeout_s=10, shared_plan_max_records=SHARED_MAX if shared else 0)
    settings = {"bootstrap.servers": broker.bootstrap_servers, "group.id": group(shared)}

    def merge(key, session, source, table_writer, log, first):
        return merge_table(tables[key], limits, None, session, source, table_writer, AssetKey(key), log, first)

    def writer_for(session):
        return DeltaRsWriter() if writer.name == "delta-rs" else DeltaSparkWriter(session)

    metadata = {}
    for name, merged in zip(tables, merge_concurrently(tables, merge, 2, lambda: spark, lambda: KafkaSource(settings),
                                                       writer_for, shared=limits), strict=True):
        assert merged.error is None, merged.error
        metadata[name] = merged.result.metadata
    return metadata


# A first batch of more records than this merges alone (``batch.shared_plan_max_records``).
SHARED_MAX = 20


def group(shared: bool) -> str:
    return f"cdc-shared-plan-tests-{'shared' if shared else 'alone'}"


def tables_under(root, topics: dict[str, str]) -> dict[str, CapturedTable]:
    """The tables of the test over ``topics``, their Delta tables under ``root``: one layout (PostgreSQL,
    TOAST_COLUMNS, key id), each with the policy its events need."""
    options = {"truncated": {"on_truncate": "apply"}, "soft": {"apply_mode": "soft_delete"},
               "history": {"apply_mode": "scd2"},
               "poisoned": {"on_bad_event": "dead_letter", "dead_letter": DeltaTarget(str(root / "dead_letter"))}}
    return {name: with_merge(captured_table(topic, root / name, columns=TOAST_COLUMNS), **options.get(name, {}))
            for name, topic in topics.items()}


def shared_batches(metadata: dict) -> int:
    """How many of a table's batches a run folded in a shared plan."""
    return int(metadata["stage_seconds"].value.get("shared_plan", 0))


def test_tables_of_one_layout_fold_in_one_plan_and_end_as_each_alone(spark, broker, writer, tmp_path):
    names = ["plain", "toast", "keychange", "truncated", "soft", "poisoned", "history", "backlog"]
    # Alone, always: scd2's fold reads the table; a backlog of more than SHARED_MAX records, in the second run.
    alone_in = {"history": (True, True), "backlog": (False, True)}
    topics = {name: new_topic(broker, f"dbserver1.s.{name}", partitions=1 if name == "truncated" else 2)
              for name in names}
    # Every table has keys 1-3: a fold that mixed tables' keys would mix their rows.
    for name, topic in topics.items():
        produce(broker, topic, [*pg_change("c", 1, 10, f"{name}-one", 1), *pg_change("c", 2, 11, f"{name}-two", 2),
                                *pg_change("c", 3, 12, f"{name}-three", 3)])
    second = {
        "plain": [*pg_change("u", 1, 20, "plain-uno", 10), *pg_change("d", 2, 21), *pg_change("c", 4, 22, "four", 4)],
        # The placeholder: 1's value is the table's, 3's the batch's earlier one.
        "toast": [*pg_change("u", 1, 20, n=10), *pg_change("u", 3, 21, "toast-tres", 30), *pg_change("u", 3, 22, n=31)],
        # UPDATE t SET id = 11 WHERE id = 1, the TOASTed value unchanged: 11 takes 1's value from the table.
        "keychange": [*pk_change(1, 11, 20, n=11), *pg_change("u", 2, 21, n=20)],
        # Rows from before the TRUNCATE go, its batch's events before it too; 5 comes after it.
        "truncated": [*pg_change("u", 1, 20, "truncated-uno", 10), truncate(21), *pg_change("c", 5, 22, "five", 5)],
        "soft": [*pg_change("d", 1, 20), *pg_change("u", 2, 21, "soft-dos", 20)],
        "poisoned": [*pg_change("u", 1, 20, "poisoned-uno", 10), (b'{"id": 2}', b"{broken"),
                     *pg_change("u", 3, 22, "poisoned-tres", 30)],
        "history": [*pg_change("u", 1, 20, n=10), *pg_change("d", 3, 21)],
        "backlog": [record for key in range(4, 5 + SHARED_MAX) for record in pg_change("c", key, 20 + key, "b", key)],
    }
    expected = {
        "plain": {1: ("plain-uno", 10), 3: ("plain-three", 3), 4: ("four", 4)},
        "toast": {1: ("toast-one", 10), 2: ("toast-two", 2), 3: ("toast-tres", 31)},
        "keychange": {11: ("keychange-one", 11), 2: ("keychange-two", 20), 3: ("keychange-three", 3)},
        "truncated": {5: ("five", 5)},
        "soft": {2: ("soft-dos", 20), 3: ("soft-three", 3)},
        "poisoned": {1: ("poisoned-uno", 10), 2: ("poisoned-two", 2), 3: ("poisoned-tres", 30)},
        "history": {1: ("history-one", 10), 2: ("history-two", 2)},
        "backlog": {1: ("backlog-one", 1), 2: ("backlog-two", 2), 3: ("backlog-three", 3),
                    **{key: ("b", key) for key in range(4, 5 + SHARED_MAX)}},
    }

    shared = tables_under(tmp_path / "shared", topics)
    alone = tables_under(tmp_path / "alone", topics)
    for tables, sharing in ((shared, True), (alone, False)):
        metadata = run(spark, broker, writer, tables, sharing)
        assert all(metadata[name]["batches"] == 1 for name in names)
        assert {name: shared_batches(metadata[name]) for name in names} == {
            name: sharing and not alone_in.get(name, (False, False))[0] for name in names}
    for name, records in second.items():
        produce(broker, topics[name], records)
    for tables, sharing in ((shared, True), (alone, False)):
        metadata = run(spark, broker, writer, tables, sharing)
        # One batch each, folded in the shared plan where it may be (the poisoned table's again, exactly).
        assert all(metadata[name]["batches"] == 1 for name in names)
        assert {name: shared_batches(metadata[name]) for name in names} == {
            name: sharing and not alone_in.get(name, (False, False))[1] for name in names}
        assert metadata["poisoned"]["dead_lettered_events"] == 1
        assert metadata["truncated"]["events_truncate"] == 1
        assert all(metadata[name]["dead_lettered_events"] == 0 for name in names if name != "poisoned")

    for name in names:
        assert current_values(spark, writer, shared[name]) == expected[name], name
        assert current_values(spark, writer, alone[name]) == expected[name], name
        # Each commit recorded its own table's offsets: its topic's end.
        progress = writer.read_progress(shared[name].target, shared[name].app_id)
        assert progress.offsets == end_offsets(broker, topics[name]), name
    truncated = writer.read_progress(shared["truncated"].target, shared["truncated"].app_id)
    assert truncated.truncated_at is not None
    # The poisoned table's bad events alone went to the dead-letter table; no other table's.
    dead = DeltaTable(str(tmp_path / "shared" / "dead_letter")).to_pyarrow_table().to_pylist()
    assert [(row["topic"], row["value"]) for row in dead] == [(topics["poisoned"], b"{broken")]
    # Each table's Kafka group offsets (``merge_table``) are its own topic's end.
    for name in names:
        assert committed(broker, topics[name], group(True)) == end_offsets(broker, topics[name]), name


def in_transaction(tx_id: str, rows: list[tuple[int, int]]) -> list[tuple[bytes, bytes]]:
    """Creates of s.t in PostgreSQL transaction ``tx_id``, one a (key, LSN)."""
    return [tx_create("t", {"id": key, "big": f"tx-{key}", "n": key}, lsn, tx_id, order)
            for order, (key, lsn) in enumerate(rows, start=1)]


def test_a_table_cut_to_whole_transactions_merges_alone_beside_a_shared_plan(spark, broker, writer, tmp_path):
    """A table whose batches wait for whole transactions folds alone while the run's other tables of its layout
    share a plan: its events of a transaction without an END wait (the event outside it is applied), and the run
    after the END applies the transaction whole."""
    topics = {name: new_topic(broker, f"dbserver1.s.{name}", partitions=1 if name == "tx" else 2)
              for name in ("plain", "other", "tx")}
    log = TransactionLog(new_topic(broker, "dbserver1.transaction"), DeltaTarget(str(tmp_path / "transactions")),
                         "postgresql")
    tables = tables_under(tmp_path, topics)
    tables["tx"] = replace(tables["tx"], transactions=TransactionRules(log, DeltaTarget(str(tmp_path / "watermarks"))))
    for name in ("plain", "other"):
        produce(broker, topics[name], [*pg_change("c", 1, 10, f"{name}-one", 1),
                                       *pg_change("c", 2, 11, f"{name}-two", 2)])
    produce(broker, topics["tx"], [*pg_change("c", 1, 10, "tx-one", 1), *in_transaction("801", [(2, 12), (3, 13)])])
    produce(broker, log.topic, [tx_event("BEGIN", "801")])

    metadata = run(spark, broker, writer, tables, shared=True)
    assert {name: shared_batches(metadata[name]) for name in tables} == {"plain": 1, "other": 1, "tx": 0}
    for name in ("plain", "other"):
        assert current_values(spark, writer, tables[name]) == {1: (f"{name}-one", 1), 2: (f"{name}-two", 2)}
    assert current_values(spark, writer, tables["tx"]) == {1: ("tx-one", 1)}  # 801 has no END yet: it waits

    produce(broker, log.topic, [tx_event("END", "801", {"s.t": 2})])
    run(spark, broker, writer, tables, shared=True)
    assert current_values(spark, writer, tables["tx"]) == {1: ("tx-one", 1), 2: ("tx-2", 2), 3: ("tx-3", 3)}
    assert writer.read_progress(tables["tx"].target, tables["tx"].app_id).offsets == end_offsets(broker, topics["tx"])


def end_offsets(broker, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group(True)})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def committed(broker, topic: str, group_id: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group_id})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                    timeout=10)}
    finally:
        consumer.close()

