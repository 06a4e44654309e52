"""Conformance with real Debezium: a private PostgreSQL captured by Debezium's PostgreSQL connector (embedded
engine, pgoutput, JSON converter) producing into the test broker as Kafka Connect does; the project's own
Dagster jobs merge the topics; every Delta table must equal its source table, which is the oracle.

One Debezium run (a subprocess with several connectors over one database, restarted once mid-stream)
feeds every test of this module: fixed edge cases and seeded random workloads are written first, then
each test merges one connector's topics with ``cdc_merge_job`` and compares.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

from cdc_assets.io.delta import DeltaTarget
from cdc_assets.io.delta.metadata import recorded_commit
from cdc_assets.io.storage import delta_rs_options
from cdc_assets.io.transactions import consistent_versions
from tests.support import check_runs as cr
from tests.support import harness as h
from tests.support import workloads as w
from tests.support.objectstore import ObjectStore
from tests.support.workloads import (
    ALLTYPES_QUERY,
    TOAST_ACTUAL,
    TOAST_QUERY,
    actual_alltypes,
    expected_alltypes,
)

pytestmark = pytest.mark.conformance

SEED = 23_2023
SIGNAL_DSN_ENV = "CDC_CONFORMANCE_SIGNAL_DSN"
PLACEHOLDER = "__unchanged__"
DEFAULT_PLACEHOLDER = "__debezium_unavailable_value"

# Each connector: its tables and the Debezium settings it varies.
CONNECTORS: dict[str, tuple[list[str], dict[str, str]]] = {
    "p": (["alltypes", "toast", "full_ident", "nokey", "trunc", "rnd"],
          {"skipped.operations": "none", "message.key.columns": "public.nokey:code",
           "decimal.handling.mode": "precise", "time.precision.mode": "adaptive", "binary.handling.mode": "bytes"}),
    "s": (["alltypes"], {"decimal.handling.mode": "string", "time.precision.mode": "adaptive_time_microseconds",
                         "binary.handling.mode": "base64"}),
    "d": (["alltypes"], {"decimal.handling.mode": "double", "time.precision.mode": "connect",
                         "binary.handling.mode": "hex"}),
    "n": (["alltypes", "rnd"], {"converter.schemas.enable": "false", "decimal.handling.mode": "string"}),
    "h": (["toast"], {"unavailable.value.placeholder": PLACEHOLDER}),
    "tx": (["tx_a", "tx_b"], {"provide.transaction.metadata": "true"}),
    "sig": (["snap_k", "snap_s", "debezium_signal"],
            {"snapshot.mode": "no_data", "signal.enabled.channels": "source,kafka",
             "signal.data.collection": "public.debezium_signal", "incremental.snapshot.chunk.size": "16",
             "signal.poll.interval.ms": "200",
             "notification.enabled.channels": "sink"}),
}


@dataclass
class World:
    """The captured database after the workload, and where everything went."""

    dsn: str
    bootstrap_servers: str
    root: Path
    prefixes: dict[str, str]
    runner: h.DebeziumRunner
    midstream_failures: list[str] = field(default_factory=list)
    marker: int = 0
    snapshot_notifications: list[dict[str, Any]] = field(default_factory=list)
    merged: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    midstream_checks: list[dict[str, cr.Verdict]] = field(default_factory=list)
    checked: dict[str, dict[str, cr.Verdict]] = field(default_factory=dict)

    def config(self, connector: str, tables: str, extra: str = "", writer: str = "delta-rs", root: str = "",
               storage_options: dict[str, str] | None = None, max_records: int = 1000) -> str:
        """A pipeline config with one connector; ``tables`` is its YAML list of tables; ``root``: the Delta root
        (default: the writer's directory under the module's), reached with ``storage_options``; ``max_records``:
        the most events a batch merges."""
        options = json.dumps(storage_options or {})
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{root or self.root / writer}", writer: {writer}, storage_options: {options}}}
batch: {{max_records: {max_records}, poll_timeout_s: 5, max_batches_per_run: 200}}
connectors:
  - name: {connector}
    kind: postgresql
    topic.prefix: {self.prefixes[connector]}
{extra}    tables:
{tables}"""

    def merge(self, connector: str, tables: str, extra: str = "", writer: str = "delta-rs") -> list[str]:
        """``cdc_merge_job`` over a connector's tables (once per connector and writer); its failed steps."""
        if (connector, writer) not in self.merged:
            result = h.run_job(self.config(connector, tables, extra, writer))
            self.merged[(connector, writer)] = h.failures(result)
        return self.merged[(connector, writer)]

    def path(self, connector: str, table: str, writer: str = "delta-rs") -> Path:
        """The default Delta path of a table."""
        return self.root / writer / self.prefixes[connector] / "public" / table


def _marker(connection: psycopg.Connection, world: World) -> None:
    """Write the next marker row and wait until every connector has produced it (and all before it)."""
    world.marker += 1
    connection.execute("INSERT INTO cdc_marker VALUES (%s)", [world.marker])
    world.runner.wait_for_marker(world.marker)


def _first_marker(connection: psycopg.Connection, world: World) -> None:
    """Wait until every connector streams: a connector without an initial snapshot sees only markers written
    after its replication slot exists, so markers are written until each has seen one."""
    deadline = time.monotonic() + 180
    while True:
        world.marker += 1
        connection.execute("INSERT INTO cdc_marker VALUES (%s)", [world.marker])
        try:
            world.runner.wait_for_marker(1, timeout_s=3)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def _snapshot_while_writing(world: World, connection: psycopg.Connection, rng: random.Random, table: str,
                            ids: list[int], next_id: int, channel: str, completed_before: int) -> int:
    """Start an incremental snapshot of ``table`` with the project's job, write to it until Debezium says the
    snapshot completed; returns the next free id."""
    run = h.run_job(world.config("sig", SIG_TABLES, sig_extra(world)),
                    "incremental_snapshot_job",
                    {"ops": {"send_execute_snapshot": {"config": {"connector": "sig", "tables": [f"public.{table}"],
                                                                  "channel": channel}}}})
    assert run.success, h.failures(run)

    def completed(notifications: list[dict[str, Any]]) -> int:
        return sum(1 for n in notifications if n.get("aggregate_type") == "Incremental Snapshot"
                   and n.get("type") == "COMPLETED")

    while True:
        next_id = w.snap_changes(connection, rng, table, ids, next_id, 3)
        notifications = world.runner.status().get("notifications", {}).get(f"{world.prefixes['sig']}.notifications",
                                                                            [])
        if completed(notifications) > completed_before:
            world.snapshot_notifications = notifications
            return next_id
        world.runner.check_alive(f"the incremental snapshot of {table}")
        time.sleep(0.2)


SIG_TABLES = "      - {name: public.snap_k}\n      - {name: public.snap_s}\n"


def sig_extra(world: World) -> str:
    """The signal settings of the ``sig`` connector's config (both channels: the jobs choose one per run)."""
    topic = f"{world.prefixes['sig']}.signals"
    return (f'    signal: {{channel: kafka, topic: "{topic}", table: public.debezium_signal, '
            f"dsn_env: {SIGNAL_DSN_ENV}}}\n")


@pytest.fixture(scope="module")
def world(broker: Any, postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Runs the whole captured workload once; the tests then merge and compare."""
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"conformance_{run_id}")
    work = tmp_path_factory.mktemp("debezium")
    prefixes = {name: f"cf{run_id}{name}" for name in CONNECTORS}
    rng = random.Random(SEED)
    with psycopg.connect(dsn, autocommit=True) as connection:
        alltypes_ids, next_alltypes, toast_ids = w.seed_alltypes_and_toast(connection, rng)
        next_toast = 100
        connection.execute("INSERT INTO full_ident SELECT g, 'v' || g, g * 1.25, repeat('x', 3000) "
                           "FROM generate_series(1, 20) g")
        connection.execute("INSERT INTO nokey SELECT 'code-' || g, g, 'n' FROM generate_series(1, 10) g")
        connection.execute("INSERT INTO trunc SELECT g, 'before truncate' FROM generate_series(1, 5) g")
        rnd_ids: list[int] = []
        next_rnd = w.rnd_changes(connection, rng, rnd_ids, 1, 60)
        tx_ids: dict[str, list[int]] = {"tx_a": [], "tx_b": []}
        next_tx = w.tx_changes(connection, rng, tx_ids, 1, 5)
        snap_ids = {t: list(range(1, 401)) for t in ("snap_k", "snap_s")}
        for table in snap_ids:
            connection.execute(f"INSERT INTO {table} SELECT g, 'before capture ' || g, 0 "
                               "FROM generate_series(1, 400) g")
        next_snap = 1000

        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})  # kept alive until the topic exists
        signal_topic = f"{prefixes['sig']}.signals"
        admin.create_topics([NewTopic(signal_topic, num_partitions=1, replication_factor=1)])[signal_topic].result()
        dsn_parts = h.parse_dsn(dsn)
        connectors = []
        for name, (tables, settings) in CONNECTORS.items():
            properties = h.connector_properties(name, prefixes[name], dsn_parts,
                                                [f"public.{t}" for t in [*tables, "cdc_marker"]], work, **settings)
            if name == "sig":
                properties.update({"signal.kafka.topic": f"{prefixes['sig']}.signals",
                                   "signal.kafka.bootstrap.servers": broker.bootstrap_servers,
                                   "signal.kafka.groupId": f"signals-{run_id}",
                                   "notification.sink.topic.name": f"{prefixes['sig']}.notifications"})
            connectors.append(properties)
        runner = h.DebeziumRunner(broker.bootstrap_servers, connectors, work)
        world = World(dsn, broker.bootstrap_servers, work / "delta", prefixes, runner)
        os.environ[SIGNAL_DSN_ENV] = dsn
        runner.start()
        try:
            _first_marker(connection, world)

            # Phase 1: streamed changes of every kind.
            next_alltypes = w.alltypes_random_changes(connection, rng, alltypes_ids, next_alltypes, 40)
            connection.execute("UPDATE alltypes SET c_text = c_text || '!' WHERE id = 1")
            next_toast = w.toast_changes(connection, rng, toast_ids, next_toast, 30)
            connection.execute("UPDATE full_ident SET v = v || '+', n = n * 2 WHERE id % 3 = 0")
            connection.execute("DELETE FROM full_ident WHERE id % 7 = 0")
            connection.execute("UPDATE nokey SET v = v * 10 WHERE v % 2 = 0")
            connection.execute("UPDATE nokey SET code = 'renamed-3' WHERE code = 'code-3'")
            connection.execute("DELETE FROM nokey WHERE code = 'code-5'")
            connection.execute("TRUNCATE trunc")
            connection.execute("INSERT INTO trunc SELECT g, 'after truncate' FROM generate_series(3, 8) g")
            connection.execute("UPDATE trunc SET v = 'updated' WHERE id = 6")
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 250)
            next_tx = w.tx_changes(connection, rng, tx_ids, next_tx, 15)
            _marker(connection, world)
            world.midstream_failures = world.merge("p", _p_tables(world))
            world.merged.clear()
            # rows_match_source of rnd while the random workload keeps writing and the merge keeps merging, in
            # batches smaller than the table: changes are in flight at every look, and none of them may read as
            # drift. (test_mariadb.py does the same with an scd2 table.)
            writes = cr.RandomWrites(connection, rng, rnd_ids, next_rnd)
            busy = "      - {name: public.rnd}\n"
            world.midstream_checks = cr.while_writing(
                writes, world.config("p", busy, max_records=cr.BUSY_MAX_RECORDS),
                lambda: rows_match_source(world.config("p", busy, BUSY_ROWS_MATCH_SOURCE), {"public.rnd"}), runs=2)
            next_rnd = writes.next_id

            # Phase 2: Debezium stopped mid-stream, writes while it is down, restarted from its offset files.
            # (A hard kill is test_postgres_connect's: Connect's offset topic survives one, a file store
            # truncated mid-write does not.)
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 100)
            next_toast = w.toast_changes(connection, rng, toast_ids, next_toast, 15)
            next_tx = w.tx_changes(connection, rng, tx_ids, next_tx, 8)
            runner.stop()
            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 100)
            next_alltypes = w.alltypes_random_changes(connection, rng, alltypes_ids, next_alltypes, 30)
            next_toast = w.toast_changes(connection, rng, toast_ids, next_toast, 15)
            next_tx = w.tx_changes(connection, rng, tx_ids, next_tx, 8)
            runner.start()
            _marker(connection, world)

            # Phase 3: incremental snapshots through both channels while writes go on, then one stopped.
            next_snap = _snapshot_while_writing(world, connection, rng, "snap_k", snap_ids["snap_k"], next_snap,
                                                "kafka", 0)
            next_snap = _snapshot_while_writing(world, connection, rng, "snap_s", snap_ids["snap_s"], next_snap,
                                                "source", 1)
            sig_config = world.config("sig", SIG_TABLES, sig_extra(world))
            started = h.run_job(sig_config, "incremental_snapshot_job", {"ops": {"send_execute_snapshot": {
                "config": {"connector": "sig", "tables": ["public.snap_k"], "channel": "source"}}}})
            stopped = h.run_job(sig_config, "stop_snapshot_job", {"ops": {"send_stop_snapshot": {
                "config": {"connector": "sig", "tables": ["public.snap_k"], "channel": "source"}}}})
            assert started.success and stopped.success, h.failures(started) + h.failures(stopped)
            runner.wait_for_notification(prefixes["sig"], lambda n: n.get("type") == "ABORTED", "snapshot aborted")
            w.snap_changes(connection, rng, "snap_k", snap_ids["snap_k"], next_snap, 20)

            next_rnd = w.rnd_changes(connection, rng, rnd_ids, next_rnd, 50)
            next_tx = w.tx_changes(connection, rng, tx_ids, next_tx, 5)
            _marker(connection, world)
        finally:
            runner.stop()
            os.environ.pop(SIGNAL_DSN_ENV, None)
            h.drop_replication_slots(dsn)
    yield world


P_TABLES = """\
      - {name: public.alltypes, columns: {c_numeric_extreme: string}}
      - {name: public.toast}
      - {name: public.toast_scd2, topic: TOPIC_toast, path: p/toast_scd2, apply_mode: scd2}
      - {name: public.full_ident}
      - {name: public.nokey}
      - {name: public.rnd}
      - {name: public.rnd_soft, topic: TOPIC_rnd, path: p/rnd_soft, apply_mode: soft_delete}
      - {name: public.rnd_scd2, topic: TOPIC_rnd, path: p/rnd_scd2, apply_mode: scd2}
"""


def _p_tables(world: World) -> str:
    return P_TABLES.replace("TOPIC_", f"{world.prefixes['p']}.public.")


RND_TABLES = """\
      - {name: public.rnd}
      - {name: public.rnd_soft, topic: TOPIC_rnd, path: p/rnd_soft, apply_mode: soft_delete}
      - {name: public.rnd_scd2, topic: TOPIC_rnd, path: p/rnd_scd2, apply_mode: scd2}
"""
ROWS_MATCH_SOURCE = cr.rows_match_source_settings(SIGNAL_DSN_ENV)
BUSY_ROWS_MATCH_SOURCE = cr.rows_match_source_settings(SIGNAL_DSN_ENV, cr.BUSY_SETTLE_TIMEOUT_S)


def _rnd_tables(world: World) -> str:
    return RND_TABLES.replace("TOPIC_", f"{world.prefixes['p']}.public.")


def rows_match_source(config: str, tables: set[str] | None = None) -> dict[str, cr.Verdict]:
    """The ``rows_match_source`` verdicts of the config's tables (the ``p`` connector's check job, the source's
    DSN in ``SIGNAL_DSN_ENV``), by table: ``tables`` (default the three of ``RND_TABLES``)."""
    found = cr.verdicts(config, "p_rows_match_source_job")
    assert set(found) == (tables or {"public.rnd", "public.rnd_soft", "public.rnd_scd2"}), found
    return found


# --- the oracle's view of each table and how each side is normalised ---


def _assert_equal(world: World, connector: str, table: str, query: str, expected: dict[str, h.Normaliser],
                  actual: dict[str, h.Normaliser], key: tuple[str, ...] = ("id",), apply_mode: str = "scd1",
                  path: str | Path | None = None, storage_options: dict[str, str] | None = None) -> None:
    h.assert_same_rows(world.dsn, world.bootstrap_servers, f"{world.prefixes[connector]}.public.{table}",
                       path or world.path(connector, table), query, expected, actual, key, apply_mode,
                       f"{connector}/{table}", storage_options)


@pytest.mark.parametrize(("connector", "decimal_mode", "time_mode", "binary_mode"), [
    ("p", "precise", "adaptive", "bytes"),
    ("s", "string", "adaptive_time_microseconds", "base64"),
    ("d", "double", "connect", "hex"),
])
def test_every_type_under_each_setting_equals_the_source(world, connector, decimal_mode, time_mode, binary_mode):
    # string and double modes send no VariableScaleDecimal: nothing to declare.
    tables = _p_tables(world) if connector == "p" else "      - {name: public.alltypes}\n"
    failed = world.merge(connector, tables)
    assert not failed, failed
    _assert_equal(world, connector, "alltypes", ALLTYPES_QUERY, expected_alltypes(time_mode, decimal_mode),
                  actual_alltypes(decimal_mode, binary_mode))


NO_SCHEMA_COLUMNS = {
    "id": "bigint", "c_smallint": "bigint", "c_int": "bigint", "c_bigint": "bigint", "c_num": "decimal(20,8)",
    "c_num_wide": "decimal(38,12)", "c_num0": "decimal(10,0)", "c_numeric": "decimal(38,18)",
    "c_numeric_extreme": "string", "c_real": "double", "c_double": "double", "c_money": "decimal(38,2)",
    "c_bool": "boolean", "c_char": "string", "c_varchar": "string", "c_text": "string", "c_bytea": "binary",
    "c_date": "date", "c_time": "io.debezium.time.MicroTime", "c_timetz": "string",
    "c_ts": "io.debezium.time.MicroTimestamp", "c_ts3": "io.debezium.time.Timestamp",
    "c_tstz": "timestamp", "c_interval": "bigint", "c_uuid": "string", "c_json": "string", "c_jsonb": "string",
    "c_enum": "string", "c_int_arr": "array<bigint>", "c_text_arr": "array<string>",
}


def test_schemas_off_the_columns_config_reads_debeziums_encodings(world):
    columns = ", ".join(f'"{k}": "{v}"' for k, v in NO_SCHEMA_COLUMNS.items())
    tables = (f"      - {{name: public.alltypes, columns: {{{columns}}}}}\n"
              '      - {name: public.rnd, columns: {id: bigint, grp: bigint, name: string, amount: "decimal(12,4)", '
              "score: double, at: timestamp}}\n")
    failed = world.merge("n", tables)
    assert not failed, failed
    actual = actual_alltypes("precise", "bytes")
    # Without a schema a Spark type cannot say the unit of Debezium's numbers: time and timestamp columns
    # name their logical type (MicroTime, MicroTimestamp; Timestamp for timestamp(3)) and read as with a
    # schema; a date column reads Debezium's days since the epoch.
    actual.update({"c_numeric": h.decimal_value, "c_numeric_extreme": h.decimal_text})
    expected = expected_alltypes("adaptive", "string")
    _assert_equal(world, "n", "rnd", "SELECT * FROM rnd", h.RND_EXPECTED, h.RND_ACTUAL)
    _assert_equal(world, "n", "alltypes", ALLTYPES_QUERY, expected, actual)


def _placeholders_in(rows: list[dict[str, Any]], placeholder: str) -> list[str]:
    found = []
    for row in rows:
        for column, value in row.items():
            text = value.decode("latin-1") if isinstance(value, bytes) else repr(value)
            if placeholder in text:
                found.append(f"id {row.get('id')}: {column}")
    return found


def test_toast_placeholders_never_reach_a_table(world):
    """REPLICA IDENTITY DEFAULT: updates that leave large text/jsonb/bytea/array values alone carry
    Debezium's placeholder; the tables keep the real values (scd1, and every scd2 version)."""
    failed = world.merge("p", _p_tables(world))
    assert not failed, failed
    _assert_equal(world, "p", "toast", TOAST_QUERY, {}, TOAST_ACTUAL)
    scd2 = world.root / "delta-rs" / "p" / "toast_scd2"
    _assert_equal(world, "p", "toast", TOAST_QUERY, {}, TOAST_ACTUAL, apply_mode="scd2", path=scd2)
    assert _placeholders_in(h.delta_rows(scd2), DEFAULT_PLACEHOLDER) == []


def test_a_custom_unavailable_value_placeholder_is_configurable_per_connector(world):
    failed = world.merge("h", "      - {name: public.toast}\n",
                         f"    unavailable_value_placeholder: {PLACEHOLDER}\n")
    assert not failed, failed
    _assert_equal(world, "h", "toast", TOAST_QUERY, {}, TOAST_ACTUAL)


TRUNC_TABLES = """\
      - {name: public.trunc}
      - {name: public.trunc_ignored, topic: TOPIC_trunc, path: p/trunc_ignored, on_truncate: ignore}
      - {name: public.trunc_applied, topic: TOPIC_trunc, path: p/trunc_applied, on_truncate: apply}
      - {name: public.trunc_soft, topic: TOPIC_trunc, path: p/trunc_soft, on_truncate: apply, apply_mode: soft_delete}
      - {name: public.trunc_scd2, topic: TOPIC_trunc, path: p/trunc_scd2, on_truncate: apply, apply_mode: scd2}
      - {name: public.alltypes_undeclared, topic: TOPIC_alltypes, path: p/alltypes_undeclared}
"""


def test_replica_identity_full_message_key_columns_and_truncate(world):
    failed = world.merge("p", _p_tables(world))
    assert not failed, failed
    _assert_equal(world, "p", "full_ident", "SELECT * FROM full_ident", {}, {"n": h.decimal_value})
    _assert_equal(world, "p", "nokey", "SELECT * FROM nokey", {}, {"v": h.typed(int)}, key=("code",))

    # TRUNCATE (op t, skipped.operations=none): by default the table halts at it, naming where, and keeps
    # its rows; with on_truncate: ignore the rest applies and the rows from before the TRUNCATE stay.
    # The same run: alltypes without its columns config halts at the first unconstrained numeric beyond
    # decimal(38,18), naming the column and the declaration that keeps it (never a rounded value).
    topic = f"{world.prefixes['p']}.public.trunc"
    run = h.run_job(world.config("p", TRUNC_TABLES.replace("TOPIC_", f"{world.prefixes['p']}.public.")))
    halted = "\n".join(h.failures(run))
    assert f"{topic} partition" in halted and "TRUNCATE of table 'public.trunc'" in halted, halted
    assert "column 'c_numeric_extreme' value does not fit type decimal(38,18) exactly" in halted, halted
    kept = {row["id"]: row["v"] for row in h.delta_rows(world.root / "delta-rs" / "p" / "trunc_ignored")}
    with psycopg.connect(world.dsn) as connection:
        source = dict(connection.execute("SELECT id, v FROM trunc").fetchall())
    assert kept == {1: "before truncate", 2: "before truncate", **source}
    # on_truncate: apply: the table is the source's, in every apply mode (ids 3-5 came back after the TRUNCATE).
    for name, mode in (("trunc_applied", "scd1"), ("trunc_soft", "soft_delete"), ("trunc_scd2", "scd2")):
        path = world.root / "delta-rs" / "p" / name
        assert {row["id"]: row["v"] for row in h.current_rows(path, mode)} == source, name


@pytest.mark.parametrize("apply_mode", ["scd1", "soft_delete", "scd2"])
def test_random_workload_with_key_changes_and_a_restart_in_every_apply_mode(world, apply_mode, monkeypatch):
    """Seeded random inserts, updates, deletes and primary-key changes, merged once mid-stream, with
    Debezium stopped and restarted (it resumes from its offsets). rows_match_source finds no drift: run twice on
    the scd1 table while the workload wrote and the merge merged (changes in flight at a first look), and on
    every apply mode's table at the end (its checksums of each side's SQL agree where the rows do)."""
    failed = world.merge("p", _p_tables(world))
    assert not world.midstream_failures and not failed, world.midstream_failures + failed
    path = {"scd1": world.path("p", "rnd"), "soft_delete": world.root / "delta-rs" / "p" / "rnd_soft",
            "scd2": world.root / "delta-rs" / "p" / "rnd_scd2"}[apply_mode]
    _assert_equal(world, "p", "rnd", "SELECT * FROM rnd", h.RND_EXPECTED, h.RND_ACTUAL, apply_mode=apply_mode,
                  path=path)
    table = {"scd1": "public.rnd", "soft_delete": "public.rnd_soft", "scd2": "public.rnd_scd2"}[apply_mode]
    if apply_mode == "scd1":
        cr.assert_no_drift_while_writing(world.midstream_checks, table, cr.BUSY_MAX_RECORDS)
    if "local" not in world.checked:  # one check run for the three tables
        monkeypatch.setenv(SIGNAL_DSN_ENV, world.dsn)
        world.checked["local"] = rows_match_source(world.config("p", _rnd_tables(world), ROWS_MATCH_SOURCE))
    assert world.checked["local"][table].passed, world.checked["local"][table].description
    if apply_mode == "scd2":
        assert h.one_current_version_per_key(path) == {}
        assert world.runner.starts == 2




def _half_of_the_topic(world: World, table: str) -> int:
    """A batch size that splits connector p's topic of ``table`` in two: the S3 legs' tables are built batch by
    batch, so the check runs on them, in the fewest batches that do (each MERGE on the store costs seconds)."""
    events = sum(h.end_offsets(world.bootstrap_servers, f"{world.prefixes['p']}.public.{table}").values())
    return events // 2 + 1


@pytest.fixture(scope="module")
def lake(object_store: ObjectStore) -> str:
    """The module's bucket on the tests' S3-API server: the S3 legs of both writers keep their tables there."""
    return object_store.create_bucket(f"conformance-{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_random_workload_on_s3_with_each_writer_in_every_apply_mode(world, object_store, lake, writer, monkeypatch):
    """The random workload's tables, merged by ``writer`` under an ``s3://`` root on a private S3-API server
    (moto's) in one run after Debezium's restart, in batches smaller than their histories, equal the source in
    every apply mode, as on local disk, and rows_match_source (reading them in Spark from the store) finds no
    drift in tables that took several batches."""
    root, options = f"s3://{lake}/{writer}", object_store.storage_options()
    config = world.config("p", _rnd_tables(world), ROWS_MATCH_SOURCE, writer=writer, root=root,
                          storage_options=options, max_records=_half_of_the_topic(world, "rnd"))
    result = h.run_job(config)
    assert result.success, h.failures(result)
    monkeypatch.setenv(SIGNAL_DSN_ENV, world.dsn)
    checked = rows_match_source(config)
    assert all(verdict.passed for verdict in checked.values()), checked
    paths = {"scd1": f"{root}/{world.prefixes['p']}/public/rnd", "soft_delete": f"{root}/p/rnd_soft",
             "scd2": f"{root}/p/rnd_scd2"}
    for apply_mode, path in paths.items():
        _assert_equal(world, "p", "rnd", "SELECT * FROM rnd", h.RND_EXPECTED, h.RND_ACTUAL, apply_mode=apply_mode,
                      path=path, storage_options=options)
        # The writer asked for made the commits: Spark names itself in engineInfo, delta-rs in clientVersion.
        history = DeltaTable(path, storage_options=delta_rs_options(options)).history()
        assert ("Spark" in history[0].get("engineInfo", "")) == (writer == "delta-spark"), history[0]
        assert sum(recorded_commit(entry) is not None for entry in history) >= 2, (apply_mode, history)
    assert h.one_current_version_per_key(paths["scd2"], options) == {}
    assert object_store.keys(lake, f"{writer}/p/rnd_scd2/_delta_log/")  # on the store, not on local disk


def test_multi_table_transactions_are_applied_whole(world):
    tables = "      - {name: public.tx_a}\n      - {name: public.tx_b}\n"
    failed = world.merge("tx", tables, "    transaction_metadata: true\n")
    assert not failed, failed
    for table in ("tx_a", "tx_b"):
        _assert_equal(world, "tx", table, f"SELECT * FROM {table}", {}, {"v": h.typed(int)})
    transaction, versions = consistent_versions(
        DeltaTarget(str(world.root / "delta-rs" / "_cdc_assets" / "watermarks")), "tx")
    assert transaction is not None
    assert versions == {f"public.{t}": DeltaTable(str(world.path("tx", t))).version() for t in ("tx_a", "tx_b")}


def test_incremental_snapshots_through_both_channels_while_writing(world):
    """Rows that predate capture (snapshot.mode=no_data) reach Delta only through the incremental snapshots
    the project's incremental_snapshot_job requested (Kafka signal topic, then signal table), while writes
    went on; stop_snapshot_job aborted a third one."""
    kinds = [n.get("type") for n in world.snapshot_notifications]
    assert kinds.count("COMPLETED") >= 2, kinds
    failed = world.merge("sig", SIG_TABLES, sig_extra(world))
    assert not failed, failed
    for table in ("snap_k", "snap_s"):
        _assert_equal(world, "sig", table, f"SELECT * FROM {table}", {}, {"n": h.typed(int)})
    with psycopg.connect(world.dsn) as connection:
        assert connection.execute("SELECT count(*) FROM snap_k WHERE v LIKE 'before capture%'").fetchone()[0] > 300

