"""Conformance through Kafka Connect, as Debezium runs in production: the suite's seeded random workload on a
private PostgreSQL, captured by Debezium's PostgreSQL connector (3.6.3.Final) registered over REST on a real
Kafka Connect 4.3 distributed worker (JSON converter with schemas, 3 partitions per table topic, offsets in
the worker's offset topic, record headers kept), producing into the tests' broker. The project's
``cdc_merge_job`` merges the topics, mid-stream and at the end, and every Delta table must equal its source
table (the oracle) in every apply mode.

One connector registration feeds every test of this module. The worker is stopped and started mid-stream
(writes go on while it is down), then killed (SIGKILL) and started: the connector resumes from its stored
offsets each time, with no new snapshot.

The connector also provides transaction metadata (``provide.transaction.metadata=true``): its transaction topic
gets 3 partitions too, and a PostgreSQL transaction's BEGIN and END have other ids (``txID:LSN``, each with its own
LSN), so other keys and often other partitions. Seeded multi-table transactions over ``tx_a`` and ``tx_b`` run beside
the random workload, and the worker is killed as soon as the first events of one reach the topic: the restarted
connector produces again, with the same ids and positions, every marker and event after its last stored offset
(as seen: that transaction's BEGIN twice before its one END, and some of its events twice). Transaction mode
(``transaction_metadata: true``) merges them in batches of 100 records, mid-stream and at the end, under its own
Delta root.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dagster import ExecuteInProcessResult

from tests.support import harness as h
from tests.support import workloads as w
from tests.support.connect import ConnectWorker

pytestmark = pytest.mark.conformance

SEED = 43_2026
TX_SEED = 43_2058  # the transactions' own generator: the random workload stays what it was
TX_TABLES = ("tx_a", "tx_b")
TX_BATCH = 100  # records per batch of transaction mode: a partition's share is a third
BIG_TX_ROWS = 30  # inserts per table of the transaction the worker is killed in: with its updates, deletes and
# tombstones, fewer records than a batch even when produced twice (a transaction must fit in one)
OLD_KEY, NEW_KEY = "__debezium.oldkey", "__debezium.newkey"


@dataclass
class ConnectRun:
    """The captured database after the workload, and what the run saw on the way."""

    dsn: str
    bootstrap_servers: str
    root: Path
    prefix: str
    worker_restarts: int = 0
    snapshot_rows: int = 0
    # Each topic's end offset per partition just before the graceful stop: the records after it were
    # produced by the restarted worker.
    ends_before_restart: dict[str, dict[int, int]] = field(default_factory=dict)
    stored_offsets: list[dict[str, Any]] = field(default_factory=list)
    key_changes: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: {"rnd": [], "rnd_late": []})
    midstream_failures: list[str] = field(default_factory=list)
    merged: list[str] | None = None
    midstream_tx: list[str] = field(default_factory=list)
    tx_result: ExecuteInProcessResult | None = None

    def topic(self, table: str) -> str:
        """The topic of a source table."""
        return f"{self.prefix}.public.{table}"

    def merge(self) -> list[str]:
        """``cdc_merge_job`` over every table, run once (the result is kept); its failed steps."""
        if self.merged is None:
            self.merged = h.failures(h.run_job(self.config()))
        return self.merged

    def config(self) -> str:
        """The pipeline config: the workload's table in each apply mode, and the table created mid-stream."""
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root}", writer: delta-rs}}
batch: {{max_records: 500, poll_timeout_s: 5, max_batches_per_run: 200}}
connectors:
  - name: kc
    kind: postgresql
    topic.prefix: {self.prefix}
    tables:
      - {{name: public.rnd}}
      - {{name: public.rnd_soft, topic: {self.topic("rnd")}, path: kc/rnd_soft, apply_mode: soft_delete}}
      - {{name: public.rnd_scd2, topic: {self.topic("rnd")}, path: kc/rnd_scd2, apply_mode: scd2}}
      - {{name: public.rnd_late}}
"""

    def tx_config(self) -> str:
        """Transaction mode over the transaction tables, with small batches and every check after the merge."""
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root / 'tx'}", writer: delta-rs}}
batch: {{max_records: {TX_BATCH}, poll_timeout_s: 5, max_batches_per_run: 200}}
checks_after_merge: all
connectors:
  - name: kctx
    kind: postgresql
    topic.prefix: {self.prefix}
    transaction_metadata: true
    tables:
""" + "".join(f"      - {{name: public.{table}}}\n" for table in TX_TABLES)

    def merge_tx(self) -> ExecuteInProcessResult:
        """``cdc_merge_job`` in transaction mode, run once at the end (the result is kept)."""
        if self.tx_result is None:
            self.tx_result = h.run_job(self.tx_config())
        return self.tx_result

    def tx_path(self, table: str) -> Path:
        """Where a transaction table's Delta table is (transaction mode's root)."""
        return self.root / "tx" / self.prefix / "public" / table

    def path(self, table: str, apply_mode: str = "scd1") -> Path:
        """Where a table's Delta table is, per apply mode (the config's paths)."""
        if apply_mode == "scd1":
            return self.root / self.prefix / "public" / table
        return self.root / "kc" / {"soft_delete": "rnd_soft", "scd2": "rnd_scd2"}[apply_mode]


def _stored_lsn(worker: ConnectWorker, name: str) -> int:
    """The LSN of the connector's offset stored in the worker's offset topic (-1: none yet)."""
    offsets = worker.offsets(name).get("offsets", [])
    return max((int(o["offset"].get("lsn", -1)) for o in offsets), default=-1)


def _marker(connection: psycopg.Connection, run: ConnectRun, worker: ConnectWorker, name: str, marker: int,
            timeout_s: float = 180) -> None:
    """Write marker row ``marker`` and wait until the worker has stored an offset at or past it: Connect stores
    a source offset only once the broker has acknowledged every record before it, so all writes made before
    the marker are in the topics."""
    position = h.wal_position(run.dsn)
    connection.execute("INSERT INTO cdc_marker VALUES (%s)", [marker])
    deadline = time.monotonic() + timeout_s
    while _stored_lsn(worker, name) < position:
        if time.monotonic() > deadline:
            raise AssertionError(f"connector {name} stored no offset past marker {marker} in {timeout_s}s: "
                                 f"{worker.offsets(name)}\n{worker.log_tail()}")
        time.sleep(0.5)


def _drop_slot(dsn: str, timeout_s: float = 60) -> None:
    """Drop the deleted connector's replication slot once its task has let it go."""
    deadline = time.monotonic() + timeout_s
    while True:
        h.drop_replication_slots(dsn)
        with psycopg.connect(dsn) as connection:
            row = connection.execute("SELECT count(*) FROM pg_replication_slots "
                                     "WHERE database = current_database()").fetchone()
        if (row is not None and row[0] == 0) or time.monotonic() > deadline:
            return
        time.sleep(0.5)


@pytest.fixture(scope="module")
def run(broker: Any, postgres: Any, connect_worker: ConnectWorker,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectRun]:
    """Runs the captured workload once, through the session's Connect worker; the tests then merge and compare."""
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"connect_{run_id}")
    name = f"pg-{run_id}"
    captured = ConnectRun(dsn, broker.bootstrap_servers, tmp_path_factory.mktemp("connect-delta"), f"kc{run_id}")
    rng = random.Random(SEED)
    rnd_ids: list[int] = []
    late_ids: list[int] = []
    tx_rng = random.Random(TX_SEED)
    tx_ids: dict[str, list[int]] = {table: [] for table in TX_TABLES}
    next_tx = 1
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE cdc_marker (id int PRIMARY KEY); CREATE TABLE rnd {w.RND_COLUMNS}")
        for table in TX_TABLES:
            connection.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int, note text)")
        next_rnd = w.rnd_changes(connection, rng, rnd_ids, 1, 60)  # before capture: the initial snapshot's rows
        captured.snapshot_rows = len(rnd_ids)
        config = h.connect_config(captured.prefix, h.parse_dsn(dsn),
                                  ["public.rnd", "public.rnd_late", "public.cdc_marker",
                                   *(f"public.{table}" for table in TX_TABLES)],
                                  **{"provide.transaction.metadata": "true"})
        connect_worker.register(name, config)
        try:
            connect_worker.wait_running(name)
            starts = connect_worker.starts
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 200, key_changes=captured.key_changes["rnd"])
            # A table created mid-stream: captured only if the publication covers tables created later.
            connection.execute(f"CREATE TABLE rnd_late {w.RND_COLUMNS}")
            next_late = w.rnd_changes(connection, rng, late_ids, 1, 80, "rnd_late", captured.key_changes["rnd_late"])
            next_tx = w.tx_changes(connection, tx_rng, tx_ids, next_tx, 25)
            _marker(connection, captured, connect_worker, name, 1)
            captured.midstream_failures = captured.merge()
            captured.merged = None
            captured.midstream_tx = h.failures(h.run_job(captured.tx_config()))

            # The worker stopped gracefully mid-stream, writes while it is down, started again.
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 100, key_changes=captured.key_changes["rnd"])
            next_tx = w.tx_changes(connection, tx_rng, tx_ids, next_tx, 10)
            _marker(connection, captured, connect_worker, name, 2)
            captured.stored_offsets.append(connect_worker.offsets(name))
            captured.ends_before_restart = {t: h.end_offsets(broker.bootstrap_servers, captured.topic(t))
                                            for t in ("rnd", "rnd_late")}
            connect_worker.stop()
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 100, key_changes=captured.key_changes["rnd"])
            next_late = w.rnd_changes(connection, rng, late_ids, next_late, 40, "rnd_late",
                                      captured.key_changes["rnd_late"])
            connect_worker.start()
            connect_worker.wait_running(name)
            _marker(connection, captured, connect_worker, name, 3)

            # Killed (SIGKILL) while streaming, in the middle of producing a multi-table transaction: what came after
            # its last stored offset is produced again, that transaction's markers and events included.
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 100, key_changes=captured.key_changes["rnd"])
            since = h.end_offsets(broker.bootstrap_servers, captured.topic("tx_a"))
            next_tx = w.big_transaction(connection, tx_rng, tx_ids, next_tx, BIG_TX_ROWS)
            h.wait_for_growth(broker.bootstrap_servers, captured.topic("tx_a"), since)
            connect_worker.kill()
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 50, key_changes=captured.key_changes["rnd"])
            next_tx = w.tx_changes(connection, tx_rng, tx_ids, next_tx, 10)
            connect_worker.start()
            connect_worker.wait_running(name)
            w.tx_changes(connection, tx_rng, tx_ids, next_tx, 10)
            w.rnd_changes(connection, rng, late_ids, next_late, 40, "rnd_late", captured.key_changes["rnd_late"])
            _marker(connection, captured, connect_worker, name, 4)
            captured.stored_offsets.append(connect_worker.offsets(name))
            captured.worker_restarts = connect_worker.starts - starts
        finally:
            connect_worker.delete(name)
            _drop_slot(dsn)
    yield captured


@pytest.mark.parametrize("apply_mode", ["scd1", "soft_delete", "scd2"])
def test_random_workload_through_kafka_connect_in_every_apply_mode(run, apply_mode):
    """Seeded random inserts, updates, deletes and primary-key changes, merged once mid-stream, with the worker
    stopped and killed mid-stream (each time resuming from its offset topic)."""
    failed = run.merge()
    assert not run.midstream_failures and not failed, run.midstream_failures + failed
    h.assert_same_rows(run.dsn, run.bootstrap_servers, run.topic("rnd"), run.path("rnd", apply_mode),
                       "SELECT * FROM rnd", h.RND_EXPECTED, h.RND_ACTUAL, apply_mode=apply_mode)
    if apply_mode == "scd2":
        assert h.one_current_version_per_key(run.path("rnd", apply_mode)) == {}
        assert run.worker_restarts == 2


def test_a_table_created_mid_stream_is_captured_and_merged(run):
    """The connector's publication is FOR ALL TABLES: a table created after it exists is streamed too."""
    failed = run.merge()
    assert not failed, failed
    h.assert_same_rows(run.dsn, run.bootstrap_servers, run.topic("rnd_late"), run.path("rnd_late"),
                       "SELECT * FROM rnd_late", h.RND_EXPECTED, h.RND_ACTUAL)


def _position(record: h.TopicRecord) -> tuple[Any, ...]:
    """What identifies a change event: its key, operation and source position (tombstones by their key)."""
    if record.value is None:
        return (repr(record.key), "tombstone", None)
    source = record.value["source"]
    return (repr(record.key), record.value["op"], source["lsn"], source.get("sequence"))


def test_restarts_resume_from_the_offset_topic_without_a_new_snapshot(run):
    """The rows present at registration are read once (op r, the initial snapshot) and never again; the
    graceful restart produces nothing twice; the offsets the worker stored moved on."""
    for table in ("rnd", "rnd_late"):
        records = h.read_topic(run.bootstrap_servers, run.topic(table))
        snapshot = [r for r in records if r.value is not None and r.value["op"] == "r"]
        assert len(snapshot) == (run.snapshot_rows if table == "rnd" else 0), table
        ends = run.ends_before_restart[table]
        before = [r for r in records if r.offset < ends.get(r.partition, 0)]
        after = [r for r in records if r.offset >= ends.get(r.partition, 0)]
        assert before and after, table
        # Tombstones repeat their delete's key: only change events identify a write.
        seen = {_position(r) for r in before if r.value is not None}
        again = [r for r in after if r.value is not None and _position(r) in seen]
        assert again == [], f"{table}: produced again after the graceful restart: {again[:5]}"
    (before_restart,), (at_end,) = ([o["offset"]["lsn"] for o in offsets["offsets"]]
                                    for offsets in run.stored_offsets)
    assert at_end > before_restart


def test_primary_key_changes_carry_the_old_and_new_key_headers(run):
    """Under Connect, a primary-key change's delete (and its tombstone) carries the new key in the header
    ``__debezium.newkey`` and the create carries the old key in ``__debezium.oldkey``; both share the
    UPDATE's source position."""
    for table, changes in run.key_changes.items():
        assert changes, table
        records = h.read_topic(run.bootstrap_servers, run.topic(table))
        deletes = {r.key["id"]: r for r in records if r.value is not None and r.value["op"] == "d"}
        tombstones = {r.key["id"]: r for r in records if r.value is None}
        creates = {r.key["id"]: r for r in records if r.value is not None and r.value["op"] == "c"}
        for old, new in changes:
            delete, tombstone, create = deletes[old], tombstones[old], creates[new]
            assert h.header_key(delete, NEW_KEY) == {"id": new}, (table, old, new, delete.headers)
            assert h.header_key(tombstone, NEW_KEY) == {"id": new}, (table, old, new, tombstone.headers)
            assert h.header_key(create, OLD_KEY) == {"id": old}, (table, old, new, create.headers)
            assert OLD_KEY not in delete.headers and NEW_KEY not in create.headers
            assert delete.value is not None and create.value is not None
            assert delete.value["source"]["lsn"] == create.value["source"]["lsn"]
        # Plain inserts and deletes carry neither header.
        changed = {old for old, _ in changes} | {new for _, new in changes}
        plain = [r for r in records if r.key["id"] not in changed]
        assert plain and not [r for r in plain if OLD_KEY in r.headers or NEW_KEY in r.headers]


def _assert_transaction_tables_equal_the_source(run: ConnectRun) -> ExecuteInProcessResult:
    """Transaction mode merged without a failure, mid-stream and at the end, and each transaction table equals the
    source; the run's result."""
    result = run.merge_tx()
    failed = h.failures(result)
    assert not run.midstream_tx and not failed, run.midstream_tx + failed
    for table in TX_TABLES:
        # What the run last reported of the table, for a failure to show where it stopped and what it waited for.
        [*_, last] = [e.materialization.metadata for e in result.get_asset_materialization_events()
                      if e.asset_key.path[-1] == table] or [{}]
        shown = {name: getattr(last.get(name), "value", None)
                 for name in ("caught_up", "offsets", "transactions_waiting", "transactions_waiting_s")}
        h.assert_same_rows(run.dsn, run.bootstrap_servers, run.topic(table), run.tx_path(table),
                           f"SELECT * FROM {table}", {}, {"v": h.typed(int), "note": h.typed(str)},
                           label=f"{run.topic(table)}, the merge's last report {shown}")
    return result


def test_transactions_split_over_a_three_partition_transaction_topic_are_applied_whole(run):
    """The transaction topic has 3 partitions (``topic.creation.default.partitions=3``), and the BEGIN and END of
    some transactions are in different ones (their ids, so their keys, differ). Transaction mode, in batches of 100
    records mid-stream and at the end, leaves each table equal to the source, and every transaction is
    reconciled."""
    topic = f"{run.prefix}.transaction"
    assert len(h.end_offsets(run.bootstrap_servers, topic)) == 3
    split = h.split_transactions(h.transaction_markers(run.bootstrap_servers, topic), "postgresql")
    assert split, "every BEGIN in its END's partition: the workload does not test what it means to"
    result = _assert_transaction_tables_equal_the_source(run)
    checks = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    for table in TX_TABLES:
        reconciled = checks[(table, "transactions_reconciled")]
        assert reconciled.passed, (table, reconciled.description, reconciled.metadata)


def test_markers_produced_again_after_a_kill_leave_no_transaction_waiting(run):
    """The worker killed while producing a big multi-table transaction produces markers of a transaction over the
    transaction tables again once restarted on its stored offsets (two BEGINs or two ENDs of one transaction), and
    its events. Every table still ends equal to the source, caught up, with no transaction left waiting."""
    markers = h.transaction_markers(run.bootstrap_servers, f"{run.prefix}.transaction")
    again = {key: found for key, found in h.reemitted_transactions(markers, "postgresql").items()
             if any(name.rsplit(".", 1)[-1] in TX_TABLES for marker in found for name in marker.collections)}
    assert again, "no marker of a transaction over tx_a/tx_b produced again after the kill: the workload does not " \
                  "test what it means to"
    result = _assert_transaction_tables_equal_the_source(run)
    for table in TX_TABLES:
        [*_, last] = [e.materialization for e in result.get_asset_materialization_events()
                      if e.asset_key.path[-1] == table]
        assert last.metadata["caught_up"].value is True, (table, last.metadata)
        assert last.metadata["transactions_waiting"].value == {}, (table, last.metadata)
