"""Conformance with real MariaDB, continued: transaction metadata, incremental snapshots and TRUNCATE, as a private
MariaDB 10.11 captured by Debezium's MariaDB connector (3.5.0) in a Kafka Connect 4.3 worker emits them (JSON with
schemas, 3 partitions per topic); the project's jobs merge the topics as the ``mariadb`` kind; the source database
is the oracle.

One connector registration (``provide.transaction.metadata=true``, ``snapshot.mode=no_data``, the signal table and
the Kafka signal channel, notifications to a topic, ``skipped.operations=none``) feeds every test: a seeded workload
of multi-table transactions merged once mid-stream, two incremental snapshots requested with the project's
``incremental_snapshot_job`` (one per channel) while their tables are written, and a TRUNCATE among writes. Each
aspect has its own pipeline config over the same topics (its own Delta root), so the tests do not hang on each other.

A second connector with Apicurio's Avro converter and a real Apicurio Registry captures the transaction tables and the
truncated table at the same time (``provide.transaction.metadata=true``, ``snapshot.mode=no_data``, no signals): its
transaction topic and its TRUNCATE event, in Avro, are merged with ``format: avro`` as the JSON ones are.

Last, the worker is killed (SIGKILL) while both connectors produce transactions over two more tables (``kill_a``,
``kill_b``), and started again: each connector resumes on its stored offsets and produces again the markers of the
transaction it resumes in (with other counts: as seen, a later END of ``event_count`` 0 and no data collections) and
the markers and events of the transactions after it. Those tables are merged in transaction mode in both formats.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from dagster import ExecuteInProcessResult
from deltalake import DeltaTable

from cdc_assets.io.avro import AvroRecords, SchemaRegistrySettings
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.transactions import consistent_versions
from tests.support import harness as h
from tests.support import workloads as w
from tests.support.apicurio import Apicurio
from tests.support.connect import ConnectWorker
from tests.support.harness import converter_settings
from tests.support.mariadb import MariaDBServer
from tests.support.mariadb_workloads import CapturedDatabase, PsycopgLike

pytestmark = pytest.mark.conformance

SEED = 43_1043
SIGNAL_DSN_ENV = "CDC_MARIADB_SIGNAL_DSN"
TX_TABLES = ("tx_a", "tx_b", "tx_c")
KILL_TABLES = ("kill_a", "kill_b")  # written around the worker's kill: their own aspect, the others' stay as they were
KILL_SEED = 43_1058
KILL_ATTEMPTS = 3  # kills until both connectors announced a transaction again otherwise (the first one does, as seen)
BIG_TX_ROWS = 30  # inserts per table of the transaction the worker is killed in: with its updates, deletes and
# tombstones, fewer records than a batch even when produced twice (a transaction must fit in one)
MAX_RECORDS = 100  # per table and batch: a partition's share of it is a third
PARTITION_SHARE = MAX_RECORDS // 3
BEFORE_CAPTURE = 400  # rows of each snap_* table that only an incremental snapshot brings (snapshot.mode=no_data)

SCHEMA = [
    "CREATE TABLE cdc_marker (id INT PRIMARY KEY)",
    # Debezium's signal table: the project inserts signals, the connector its snapshot-window watermarks.
    "CREATE TABLE debezium_signal (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048))",
    *(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT, note VARCHAR(64))" for t in (*TX_TABLES, *KILL_TABLES)),
    "CREATE TABLE snap_k (id INT PRIMARY KEY, v VARCHAR(64), n INT)",
    "CREATE TABLE snap_s (id INT PRIMARY KEY, v VARCHAR(64), n INT)",
    "CREATE TABLE trunc (id INT PRIMARY KEY, v VARCHAR(64))",
]


def tx_changes(sql: PsycopgLike, rng: random.Random, ids: dict[str, list[int]], next_id: list[int],
               transactions: int, sizes: list[dict[str, int]], tables: tuple[str, ...] = TX_TABLES) -> None:
    """``transactions`` seeded random transactions, each touching 2 or 3 of ``tables`` with inserts, updates and
    deletes; about one in four has more statements for one table than a partition's share of a batch (but fewer than
    a batch, tombstones included). Each transaction's statements per table are appended to ``sizes``."""
    for _ in range(transactions):
        touched = rng.sample(tables, min(len(tables), rng.choice([2, 2, 3])))
        big = rng.random() < 0.25
        counts = {table: rng.randint(PARTITION_SHARE + 5, MAX_RECORDS - 30) if big and index == 0
                  else rng.randint(1, 12) for index, table in enumerate(touched)}
        with sql.transaction():
            for table, count in counts.items():
                live = ids[table]
                for _ in range(count):
                    choice = rng.random()
                    if choice < 0.5 or len(live) < 5:
                        sql.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                                    [next_id[0], rng.randint(0, 10**6), f"tx row {next_id[0]}"])
                        live.append(next_id[0])
                        next_id[0] += 1
                    elif choice < 0.85:
                        sql.execute(f"UPDATE {table} SET v = %s, note = %s WHERE id = %s",
                                    [rng.randint(0, 10**6), None if rng.random() < 0.2 else "updated",
                                     rng.choice(live)])
                    else:
                        old = rng.choice(live)
                        live.remove(old)
                        sql.execute(f"DELETE FROM {table} WHERE id = %s", [old])
        sizes.append(counts)


@dataclass
class World(CapturedDatabase):
    """The captured database after the workload, and where everything went."""

    tx_sizes: list[dict[str, int]] = field(default_factory=list)
    midstream_tx: list[str] = field(default_factory=list)
    midstream_trunc: list[str] = field(default_factory=list)
    notifications: list[dict[str, Any]] = field(default_factory=list)
    before_truncate: list[dict[str, Any]] = field(default_factory=list)
    tx_result: ExecuteInProcessResult | None = None
    avro_prefix: str = ""  # the Avro connector's topic prefix
    registry_url: str = ""  # its schema registry (the Confluent-compatible API)
    kill_attempts: int = 0  # kills until both connectors announced a transaction again otherwise

    def config(self, aspect: str, tables: str, extra: str = "") -> str:
        """A pipeline config of the connector for one aspect (``tx``, ``snap``, ``trunc``: its own Delta root; an
        aspect ending in ``_avro``: the Avro connector's)."""
        prefix = self.prefix
        if aspect.endswith("_avro"):
            prefix = self.avro_prefix
            extra = h.avro_format(self.registry_url) + extra
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root / aspect}", writer: delta-rs}}
batch: {{max_records: 1000, poll_timeout_s: 5, max_batches_per_run: 200}}
checks_after_merge: all
connectors:
  - name: maria_{aspect}
    kind: mariadb
    topic.prefix: {prefix}
{extra}    tables:
{tables}"""

    def tx_config(self, aspect: str = "tx", tables: tuple[str, ...] = TX_TABLES) -> str:
        """Transaction mode over ``tables`` (the three tx tables)."""
        names = "".join(f"      - {{name: {self.database}.{t}}}\n" for t in tables)
        return self.config(aspect, names, "    transaction_metadata: true\n")

    def merge_tx(self, aspect: str = "tx", tables: tuple[str, ...] = TX_TABLES) -> ExecuteInProcessResult:
        """``cdc_merge_job`` of ``tables`` (the tx tables) with batches of ``MAX_RECORDS`` records (run config)."""
        return h.run_job(self.tx_config(aspect, tables), run_config={
            "ops": {f"maria_{aspect}_merge": {"config": {"max_records_per_batch": MAX_RECORDS}}}})

    def markers(self, avro: bool = False) -> list[h.TransactionMarker]:
        """The markers of the JSON (or the Avro) connector's transaction topic."""
        prefix = self.avro_prefix if avro else self.prefix
        return h.transaction_markers(self.bootstrap_servers, f"{prefix}.transaction",
                                     self.more_prefixes[prefix] if avro else None)

    def reemitted(self, avro: bool = False) -> dict[str, list[h.TransactionMarker]]:
        """The transactions over the kill tables whose markers a connector produced more than once."""
        return {key: markers for key, markers in h.reemitted_transactions(self.markers(avro), "mariadb").items()
                if any(c.rsplit(".", 1)[-1] in KILL_TABLES for m in markers for c in m.collections)}

    def recounted(self, avro: bool = False) -> dict[str, list[h.TransactionMarker]]:
        """Of those, the transactions with a later END that announces other counts than an earlier one (a connector
        that resumes inside a transaction it had produced whole announces it again with what it produced since)."""
        return {key: markers for key, markers in self.reemitted(avro).items()
                if len({(m.event_count, tuple(sorted(m.collections.items())))
                        for m in markers if m.status == "END"}) > 1}

    def snap_config(self) -> str:
        """The snapshotted tables, with both signal channels (each job run names one)."""
        tables = f"      - {{name: {self.database}.snap_k}}\n      - {{name: {self.database}.snap_s}}\n"
        return self.config("snap", tables, (
            f'    signal: {{channel: kafka, topic: "{self.prefix}.signals", table: {self.database}.debezium_signal, '
            f'dsn_env: {SIGNAL_DSN_ENV}, debezium_version: "3.5"}}\n'))

    def trunc_config(self, on_truncate: str, aspect: str = "trunc", apply_mode: str = "scd1") -> str:
        """The truncated table with its ``on_truncate`` and ``apply_mode``."""
        return self.config(aspect, f"      - {{name: {self.database}.trunc, on_truncate: {on_truncate}, "
                                   f"apply_mode: {apply_mode}}}\n")

    def path(self, aspect: str, table: str) -> Path:
        """The default Delta path of a table under an aspect's root."""
        return self.root / aspect / (self.avro_prefix if aspect.endswith("_avro") else self.prefix) / \
            self.database / table

    def completed_snapshots(self) -> int:
        """Incremental snapshots the connector announced as completed on its notification topic so far."""
        consumer = self.consumer(f"{self.prefix}.notifications")
        while (message := consumer.poll(0.5)) is not None:
            if message.error() is None and message.value():
                self.notifications.append(json.loads(message.value())["payload"])
        return sum(1 for n in self.notifications
                   if n.get("aggregate_type") == "Incremental Snapshot" and n.get("type") == "COMPLETED")

    def snapshot_while_writing(self, sql: PsycopgLike, rng: random.Random, table: str, channel: str,
                               ids: list[int], next_id: int, timeout_s: float = 240) -> int:
        """Ask for an incremental snapshot of ``table`` through ``channel`` with the project's job and write to the
        table until the connector says it completed; returns the next free id."""
        completed = self.completed_snapshots()
        run = h.run_job(self.snap_config(), "incremental_snapshot_job", {"ops": {"send_execute_snapshot": {
            "config": {"connector": "maria_snap", "tables": [f"{self.database}.{table}"], "channel": channel}}}})
        assert run.success, h.failures(run)
        deadline = time.monotonic() + timeout_s
        while self.completed_snapshots() <= completed:
            if time.monotonic() > deadline:
                raise AssertionError(f"the {channel} channel's snapshot of {table} did not complete in {timeout_s}s: "
                                     f"{self.notifications}\n{self.worker.log_tail()}")
            next_id = w.snap_changes(sql, rng, table, ids, next_id, 3)  # type: ignore[arg-type]
        return next_id


@pytest.fixture(scope="module")
def world(broker: Any, mariadb: MariaDBServer, connect_worker: ConnectWorker, schema_registry: Apicurio,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Runs the whole captured workload once; the tests then merge and compare."""
    run_id = uuid.uuid4().hex[:6]
    database, prefix, avro_prefix = f"tx_{run_id}", f"mtx{run_id}", f"mtxav{run_id}"
    mariadb.execute(f"CREATE DATABASE {database}")
    avro_keys = AvroRecords(SchemaRegistrySettings(schema_registry.confluent_url))
    world = World(mariadb, connect_worker, database, prefix, broker.bootstrap_servers,
                  tmp_path_factory.mktemp("mariadb-tx") / "delta", more_prefixes={avro_prefix: avro_keys.to_json},
                  avro_prefix=avro_prefix, registry_url=schema_registry.confluent_url)
    rng = random.Random(SEED)
    signals = f"{prefix}.signals"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(signals, num_partitions=1, replication_factor=1)])[signals].result()
    os.environ[SIGNAL_DSN_ENV] = (f"mariadb://{mariadb.admin_user}:{mariadb.admin_password}@{mariadb.host}:"
                                  f"{mariadb.port}/{database}")
    with contextlib.closing(mariadb.connect(database)) as connection:
        sql = PsycopgLike(connection)
        for statement in SCHEMA:
            sql.execute(statement)
        for host in ("127.0.0.1", "localhost"):  # the connector writes its snapshot windows into the signal table
            sql.execute(f"GRANT INSERT, UPDATE, DELETE ON {database}.debezium_signal TO '{mariadb.user}'@'{host}'")
        snap_ids: dict[str, list[int]] = {}
        for table in ("snap_k", "snap_s"):
            with sql.transaction():
                for row_id in range(1, BEFORE_CAPTURE + 1):
                    sql.execute(f"INSERT INTO {table} VALUES (%s, %s, 0)", [row_id, f"before capture {row_id}"])
            snap_ids[table] = list(range(1, BEFORE_CAPTURE + 1))

        connect_worker.register(prefix, mariadb.connector_config(prefix, [database], broker.bootstrap_servers, **{
            "snapshot.mode": "no_data", "provide.transaction.metadata": "true",
            "signal.enabled.channels": "source,kafka", "signal.data.collection": f"{database}.debezium_signal",
            "signal.kafka.topic": signals, "signal.kafka.bootstrap.servers": broker.bootstrap_servers,
            "signal.kafka.groupId": f"signals-{run_id}", "incremental.snapshot.chunk.size": "25",
            "notification.enabled.channels": "sink", "notification.sink.topic.name": f"{prefix}.notifications"}))
        connect_worker.register(avro_prefix, mariadb.connector_config(
            avro_prefix, [database], broker.bootstrap_servers, **converter_settings(schema_registry.url), **{
                "snapshot.mode": "no_data", "provide.transaction.metadata": "true",
                "table.include.list": ",".join(f"{database}.{t}" for t in ("cdc_marker", *TX_TABLES, "trunc",
                                                                           *KILL_TABLES))}))
        try:
            connect_worker.wait_running(prefix)
            connect_worker.wait_running(avro_prefix)
            world.wait_for_marker(sql)
            tx_ids: dict[str, list[int]] = {t: [] for t in TX_TABLES}
            next_tx = [1]
            # Phase 1: transactions and the truncated table's first rows; both merged mid-stream.
            tx_changes(sql, rng, tx_ids, next_tx, 30, world.tx_sizes)
            for row_id in range(1, 21):
                sql.execute("INSERT INTO trunc VALUES (%s, %s)", [row_id, f"first {row_id}"])
            world.wait_for_marker(sql)
            world.midstream_tx = h.failures(world.merge_tx())
            world.midstream_trunc = h.failures(h.run_job(world.trunc_config("halt")))

            # Incremental snapshots through each channel while their tables (and the tx tables) are written.
            next_snap = BEFORE_CAPTURE + 1
            next_snap = world.snapshot_while_writing(sql, rng, "snap_k", "kafka", snap_ids["snap_k"], next_snap)
            tx_changes(sql, rng, tx_ids, next_tx, 10, world.tx_sizes)
            next_snap = world.snapshot_while_writing(sql, rng, "snap_s", "source", snap_ids["snap_s"], next_snap)
            w.snap_changes(sql, rng, "snap_k", snap_ids["snap_k"], next_snap, 20)  # type: ignore[arg-type]

            # Phase 2: more transactions; the truncated table written, truncated, written again.
            tx_changes(sql, rng, tx_ids, next_tx, 30, world.tx_sizes)
            for row_id in range(21, 31):
                sql.execute("INSERT INTO trunc VALUES (%s, %s)", [row_id, f"second {row_id}"])
            sql.execute("UPDATE trunc SET v = CONCAT(v, ' updated') WHERE id % 3 = 0")
            world.before_truncate = mariadb.query("SELECT * FROM trunc", database)
            sql.execute("TRUNCATE TABLE trunc")
            for row_id in [*range(31, 41), 3, 4, 5]:  # ids from before the TRUNCATE come back
                sql.execute("INSERT INTO trunc VALUES (%s, %s)", [row_id, f"after truncate {row_id}"])
            sql.execute("UPDATE trunc SET v = 'after truncate, updated' WHERE id = 31")
            world.wait_for_marker(sql)

            # Phase 3: the worker killed while both connectors produce transactions over the kill tables, and
            # started again on their stored offsets; transactions go on while it is down and after.
            time.sleep(2.5)  # offsets are stored every second: nothing of the phases before is produced again
            _kill_mid_transaction(world, sql, broker.bootstrap_servers)
            yield world
        finally:
            world.close()
            connect_worker.delete(prefix)
            connect_worker.delete(avro_prefix)
            os.environ.pop(SIGNAL_DSN_ENV, None)


def _kill_mid_transaction(world: World, sql: PsycopgLike, bootstrap_servers: str) -> None:
    """Kill the worker (SIGKILL) once both connectors produced a transaction over the kill tables and stored their
    offsets in it (a restart resumes in it), as soon as the first events of a bigger transaction written next reach
    the topics (the stored offsets are behind it: it is produced again). Transactions are written while the worker
    is down and after it started again. Again, with a seeded delay before the kill, until both connectors have
    announced a kill-table transaction again with other counts (``World.recounted``)."""
    rng = random.Random(KILL_SEED)
    ids: dict[str, list[int]] = {t: [] for t in KILL_TABLES}
    next_id = [1]
    sizes: list[dict[str, int]] = []  # the kill tables' transactions are not the tx tables' (``World.tx_sizes``)
    tx_changes(sql, rng, ids, next_id, 10, sizes, KILL_TABLES)
    world.wait_for_marker(sql)
    markers = [f"{prefix}.transaction" for prefix in (world.prefix, world.avro_prefix)]
    topic = f"{world.prefix}.{world.database}.{KILL_TABLES[0]}"
    while world.kill_attempts < KILL_ATTEMPTS:
        world.kill_attempts += 1
        since = {name: h.end_offsets(bootstrap_servers, name) for name in markers}
        tx_changes(sql, rng, ids, next_id, 1, sizes, KILL_TABLES)
        for name in markers:  # its BEGIN and END
            h.wait_for_growth(bootstrap_servers, name, since[name], records=2)
        time.sleep(2.5)  # offsets are stored every second
        since = {topic: h.end_offsets(bootstrap_servers, topic)}
        next_id[0] = w.big_transaction(sql, rng, ids, next_id[0], BIG_TX_ROWS)
        h.wait_for_growth(bootstrap_servers, topic, since[topic])
        time.sleep(rng.uniform(0, 0.5) if world.kill_attempts > 1 else 0)
        world.worker.kill()
        tx_changes(sql, rng, ids, next_id, 5, sizes, KILL_TABLES)
        world.worker.start()
        for name in (world.prefix, world.avro_prefix):
            world.worker.wait_running(name)
        tx_changes(sql, rng, ids, next_id, 5, sizes, KILL_TABLES)
        world.wait_for_marker(sql)
        if world.recounted() and world.recounted(avro=True):
            return


def _assert_equal(world: World, aspect: str, table: str, actual: dict[str, h.Normaliser]) -> None:
    rows = h.current_rows(world.path(aspect, table), "scd1")
    source = world.mariadb.query(f"SELECT * FROM {table}", world.database)
    problems = h.compare(source, rows, ("id",), {}, actual)
    if problems:
        raise AssertionError(f"{table}: {h.summarise(problems)}")


def test_multi_table_transactions_are_applied_whole_in_small_batches(world):
    """Transactions over 2-3 tables, some with more events for a table than a partition's share of a batch, merged
    in batches of 100 records from 3-partition topics (mid-stream and at the end): every table equals the source,
    every transaction is reconciled and the consistent watermark names each table's Delta version."""
    assert max(n for sizes in world.tx_sizes for n in sizes.values()) > PARTITION_SHARE  # the workload's premise
    assert sum(1 for sizes in world.tx_sizes if max(sizes.values()) > PARTITION_SHARE) >= 5
    if world.tx_result is None:
        world.tx_result = world.merge_tx()
    failed = h.failures(world.tx_result)
    assert not world.midstream_tx and not failed, world.midstream_tx + failed
    for table in TX_TABLES:
        _assert_equal(world, "tx", table, {"v": h.typed(int), "note": h.typed(str)})
    checks = {(e.asset_key.path[-1], e.check_name): e for e in world.tx_result.get_asset_check_evaluations()}
    for table in TX_TABLES:
        reconciled = checks[(table, "transactions_reconciled")]
        assert reconciled.passed, (table, reconciled.description, reconciled.metadata)
        assert checks[(table, "consistent_watermark_fresh")].passed, table
    transaction, versions = consistent_versions(DeltaTarget(str(world.root / "tx" / "_cdc_assets" / "watermarks")),
                                                "maria_tx")
    assert transaction is not None
    assert versions == {f"{world.database}.{t}": DeltaTable(str(world.path("tx", t))).version() for t in TX_TABLES}


def test_incremental_snapshots_through_the_signal_table_and_the_kafka_channel_while_writing(world):
    """Rows that predate capture (snapshot.mode=no_data) reach Delta only through the incremental snapshots the
    project's incremental_snapshot_job asked for, one through the Kafka signal topic and one through the signal
    table (a ``mariadb://`` DSN), while their tables were written."""
    completed = [n for n in world.notifications
                 if n.get("aggregate_type") == "Incremental Snapshot" and n.get("type") == "COMPLETED"]
    assert len(completed) == 2, world.notifications
    run = h.run_job(world.snap_config())
    assert run.success, h.failures(run)
    for table in ("snap_k", "snap_s"):
        _assert_equal(world, "snap", table, {"v": h.typed(str), "n": h.typed(int)})
        kept = [r for r in h.delta_rows(world.path("snap", table)) if r["v"].startswith("before capture")]
        assert len(kept) > BEFORE_CAPTURE // 2, (table, len(kept))
    audit = h.delta_rows(world.root / "snap" / "_cdc_assets" / "signals")
    assert sorted(r["channel"] for r in audit) == ["kafka", "source"]


def test_a_truncate_halts_its_table_naming_where_and_nothing_is_lost(world):
    """MariaDB's TRUNCATE (op t, a null key): with on_truncate halt (the default) the run fails naming the topic,
    partition and offset of the TRUNCATE event and the table keeps what it had; run again with on_truncate ignore,
    it applies every change before and after the TRUNCATE."""
    assert not world.midstream_trunc, world.midstream_trunc
    path, topic = world.path("trunc", "trunc"), f"{world.prefix}.{world.database}.trunc"
    merged_before = {r["id"]: r["v"] for r in h.delta_rows(path)}
    assert merged_before == {i: f"first {i}" for i in range(1, 21)}

    truncates = [r for r in h.read_topic(world.bootstrap_servers, topic) if r.value and r.value.get("op") == "t"]
    assert len(truncates) == 1 and truncates[0].key == {}, truncates
    where = f"{topic} partition {truncates[0].partition} offset {truncates[0].offset}: TRUNCATE of table " \
            f"'{world.database}.trunc'"
    for _ in range(2):  # halted again at the same event: nothing was committed past it
        halted = "\n".join(h.failures(h.run_job(world.trunc_config("halt"))))
        assert where in halted, halted
        assert {r["id"]: r["v"] for r in h.delta_rows(path)} == merged_before

    run = h.run_job(world.trunc_config("ignore"))
    assert run.success, h.failures(run)
    source = world.mariadb.query("SELECT * FROM trunc", world.database)
    expected = {r["id"]: r["v"] for r in world.before_truncate} | {r["id"]: r["v"] for r in source}
    assert {r["id"]: r["v"] for r in h.delta_rows(path)} == expected


@pytest.mark.parametrize("apply_mode", ["scd1", "soft_delete", "scd2"])
def test_an_applied_truncate_leaves_the_table_as_the_source_in_every_apply_mode(world, apply_mode):
    """on_truncate: apply, on MariaDB's real TRUNCATE (one partition of three) amid inserts and updates before and
    after it, ids from before it inserted again: the table ends as the source; soft_delete keeps the truncated rows
    marked deleted at the TRUNCATE's position, scd2 ends their versions there. Batches of 7 records, so that the
    TRUNCATE and the changes around it are read in different batches."""
    aspect = f"trunc_{apply_mode}"
    run = h.run_job(world.trunc_config("apply", aspect, apply_mode),
                    run_config={"ops": {f"maria_{aspect}_merge": {"config": {"max_records_per_batch": 7}}}})
    assert run.success, h.failures(run)
    path = world.path(aspect, "trunc")
    source = world.mariadb.query("SELECT * FROM trunc", world.database)
    problems = h.compare(source, h.current_rows(path, apply_mode), ("id",), {}, {"v": h.typed(str)})
    assert not problems, h.summarise(problems)
    # Every row of the table from before the TRUNCATE is deleted (soft_delete) or ended (scd2) at its position.
    truncated_at = json.loads(DeltaTable(str(path)).history(1)[0]["userMetadata"])["cdc_assets"]["truncated_at"]
    gone = {r["id"] for r in world.before_truncate} - {r["id"] for r in source}
    rows = h.delta_rows(path)
    if apply_mode == "soft_delete":
        deleted = {row["id"] for row in rows if row["_cdc_deleted"]}
        assert deleted and deleted <= gone, (deleted, gone)
        assert {row["_cdc_position"] for row in rows if row["_cdc_deleted"]} == {truncated_at}
    if apply_mode == "scd2":
        before = [row for row in rows if row["_cdc_valid_from"] < truncated_at]
        outlived = [(row["id"], row["v"], row["_cdc_valid_from"].strip(), row["_cdc_valid_to"], row["_cdc_current"])
                    for row in before if row["_cdc_current"] or row["_cdc_valid_to"] > truncated_at]
        assert before and not outlived, (truncated_at, outlived)
        assert max(row["_cdc_valid_to"] for row in before) == truncated_at
        assert h.one_current_version_per_key(path) == {}


def test_transactions_and_a_truncate_in_avro(world):
    """The Avro connector's transaction topic and table topics, merged with ``format: avro`` in batches of 100
    records: every tx table equals the source and its transactions are reconciled; its TRUNCATE event (op t, a null
    key, an Avro value) applied with ``on_truncate: apply`` leaves the truncated table as the source."""
    run = world.merge_tx("tx_avro")
    assert run.success, h.failures(run)
    for table in TX_TABLES:
        _assert_equal(world, "tx_avro", table, {"v": h.typed(int), "note": h.typed(str)})
    checks = {(e.asset_key.path[-1], e.check_name): e for e in run.get_asset_check_evaluations()}
    for table in TX_TABLES:
        reconciled = checks[(table, "transactions_reconciled")]
        assert reconciled.passed, (table, reconciled.description, reconciled.metadata)
        assert checks[(table, "consistent_watermark_fresh")].passed, table
    run = h.run_job(world.trunc_config("apply", "trunc_avro"),
                    run_config={"ops": {"maria_trunc_avro_merge": {"config": {"max_records_per_batch": 7}}}})
    assert run.success, h.failures(run)
    _assert_equal(world, "trunc_avro", "trunc", {"v": h.typed(str)})


def test_each_transaction_has_its_begin_and_end_in_one_partition_of_three(world):
    """The transaction topics have 3 partitions (``topic.creation.default.partitions=3``), but MariaDB's BEGIN and END
    carry the same id (the GTID), so the same key: each transaction's markers share a partition, in both formats."""
    for avro in (False, True):
        prefix = world.avro_prefix if avro else world.prefix
        assert len(h.end_offsets(world.bootstrap_servers, f"{prefix}.transaction")) == 3, prefix
        markers = world.markers(avro)
        assert {m.partition for m in markers} == {0, 1, 2}, prefix
        assert h.split_transactions(markers, "mariadb") == {}, prefix


@pytest.mark.parametrize("aspect", ["kill", "kill_avro"])
def test_markers_produced_again_after_a_kill_mid_transaction_leave_no_transaction_waiting(world, aspect):
    """The worker killed while producing a transaction, restarted on its stored offsets: each connector produced
    kill-table transactions' markers again (two BEGINs and ENDs of one GTID), one of them with a later END that
    announces other counts than the first (as seen: ``event_count`` 0 and no data collections, the connector having
    resumed inside the transaction and skipped its events). Transaction mode, in batches of 100 records, still leaves
    each kill table equal to the source, caught up, with every transaction reconciled and none left waiting."""
    avro = aspect.endswith("_avro")
    again = world.reemitted(avro)
    assert again, "no marker produced again after the kill: the workload does not test what it means to"
    assert world.recounted(avro), ("no transaction announced again with other counts after the kill", again)
    run = world.merge_tx(aspect, KILL_TABLES)
    assert run.success, h.failures(run)
    for table in KILL_TABLES:
        _assert_equal(world, aspect, table, {"v": h.typed(int), "note": h.typed(str)})
    checks = {(e.asset_key.path[-1], e.check_name): e for e in run.get_asset_check_evaluations()}
    for table in KILL_TABLES:
        reconciled = checks[(table, "transactions_reconciled")]
        assert reconciled.passed, (table, reconciled.description, reconciled.metadata)
        [*_, last] = [e.materialization for e in run.get_asset_materialization_events()
                      if e.asset_key.path[-1] == table]
        assert last.metadata["caught_up"].value is True, (table, last.metadata)
        assert last.metadata["transactions_waiting"].value == {}, (table, last.metadata)
