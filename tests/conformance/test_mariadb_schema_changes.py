"""The schema-change sensor end to end on real DDL: MariaDB captured by Debezium's MariaDB connector under
Kafka Connect, ``schema_change_sensor`` evaluated and every run it requests executed (in reverse order:
runs finish in any order), then ``cdc_merge_job``; each Delta table compared with the source (the oracle).

Steps: the initial snapshot's DDL (``DROP TABLE IF EXISTS`` + ``CREATE TABLE`` of every table) on tables
that already hold data; then ALTER ADD / MODIFY (widen) / RENAME COLUMN / DROP COLUMN / CHANGE (rename),
CREATE TABLE, RENAME TABLE and DROP TABLE mid-stream, with rows written across each (rows untouched since
a rename read their value under the new name, as SELECT * does), RENAME COLUMN on an scd2 and a soft_delete
table (with delta-rs), and a DROP TABLE then CREATE TABLE of the same name (the new table starts empty, the
old rows are kept at ``<path>__retired_1``); then a connector restart that may emit its last DDL again.

With the delta-rs writer the schema-change runs merge with batches of 2 events and one batch a run: the
backlogs they merge before a DROP, a RENAME TABLE and a RENAME COLUMN are longer than one run (the job's merge
rounds are the same with either writer; delta-spark's MERGEs cost seconds each, so that case keeps the default).

With the delta-rs writer the same database is also captured by a second connector with Apicurio's Avro
converter and a real Apicurio Registry (``format: avro``): its schema-change topic, read by the same sensor,
must request the same changes, and its tables must equal the source too.
"""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.catalog import schema_registry_settings
from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.io.avro import record_decoder
from cdc_assets.io.kafka import KafkaSource, UnknownTopicError
from cdc_assets.resources import kafka_client_settings
from tests.support.harness import (
    Normaliser,
    avro_format,
    compare,
    converter_settings,
    current_rows,
    delta_rows,
    summarise,
)
from tests.support.mariadb_workloads import ALLTYPES_ACTUAL, ALLTYPES_EXPECTED, EDGE_ROWS, SCHEMA

pytestmark = pytest.mark.conformance

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
  writer: {writer}
{batch}connectors:
  - name: shop
    kind: mariadb
    topic.prefix: {prefix}
{record_format}{tables}    include: ['{database}\\..*']
"""
# The delta-rs case's schema-change runs' batches: a backlog of more than 2 events takes more than one run's.
SMALL_BATCHES = "batch:\n  max_records: 2\n  max_batches_per_run: 1\n"
# Tables in the other apply modes, with the delta-rs writer (the rename's copy is the same predicate with either).
MODES = {"history": "scd2", "ledger": "soft_delete"}


def mode_tables(database: str) -> str:
    """The config's entries of ``database``'s tables in other apply modes."""
    return "    tables:\n" + "".join(f"      - {{name: {database}.{table}, apply_mode: {mode}}}\n"
                                  for table, mode in MODES.items())


class Shop:
    """A database of the tests' MariaDB, captured under ``prefix`` (by a connector writing JSON, or Avro with the
    registry at ``registry_url``), and its pipeline."""

    def __init__(self, mariadb, broker, root: Path, prefix: str, database: str, writer: str = "delta-rs",
                 registry_url: str | None = None) -> None:
        self.mariadb, self.broker, self.root, self.prefix = mariadb, broker, root, prefix
        self.database = database
        settings = {"bootstrap": broker.bootstrap_servers, "root": root, "prefix": prefix, "database": self.database,
                    "writer": writer, "record_format": avro_format(registry_url),
                    "tables": mode_tables(database) if writer == "delta-rs" else ""}
        self.config = parse_config(CONFIG.format(**settings, batch=""))
        self.schema_change_config = parse_config(CONFIG.format(
            **settings, batch=SMALL_BATCHES if writer == "delta-rs" else ""))
        self.cursor: str | None = None
        self.marker = 0

    def sql(self, *statements: str) -> None:
        for statement in statements:
            self.mariadb.execute(statement, database=self.database)

    def caught_up(self, timeout_s: float = 120, marker: int | None = None) -> None:
        """Wait until Debezium emitted everything written so far: a new marker row (or ``marker``, written for
        another shop of the same database) reached its topic."""
        if marker is None:
            self.marker += 1
            self.sql(f"INSERT INTO marker VALUES ({self.marker})")
        else:
            self.marker = marker
        topic = f"{self.prefix}.{self.database}.marker"
        deadline = time.monotonic() + timeout_s
        while self.marker not in self.markers(topic):
            assert time.monotonic() < deadline, f"marker {self.marker} never reached {topic}"
            time.sleep(0.5)
        time.sleep(1.0)  # the connector's other topics were written in the same producer flush

    def markers(self, topic: str) -> set[int]:
        """The ids of the marker rows inserted in ``topic``, read as the pipeline reads its records (Avro too)."""
        source = KafkaSource(kafka_client_settings(self.config.kafka), backoff_s=0.5)  # a new topic elects its leader
        try:
            batch = source.read_batch(topic, None, 100_000, 64 * 1024 * 1024, 5,
                                      decode=record_decoder(schema_registry_settings(self.config.connectors[0])))
        except UnknownTopicError:
            return set()
        finally:
            source.close()
        values = [json.loads(value)["payload"] for value in batch.records["value"].to_pylist() if value]
        return {value["after"]["id"] for value in values if value.get("after")}

    def apply_schema_changes(self, instance: DagsterInstance) -> list[str]:
        """Tick the sensor, run what it requests in reverse order (merging in small batches); the changes
        requested."""
        defs = build_definitions(self.schema_change_config)
        tick = defs.resolve_sensor_def("schema_change_sensor").evaluate_tick(
            build_sensor_context(instance=instance, cursor=self.cursor, definitions=defs))
        self.cursor = tick.cursor
        job = defs.resolve_job_def("apply_schema_change_job")
        for request in reversed(tick.run_requests):
            result = job.execute_in_process(run_config=request.run_config, instance=instance, raise_on_error=False)
            assert result.success, request.tags
        return [request.tags["cdc_assets/schema_change"] for request in tick.run_requests]

    def merge(self, instance: DagsterInstance) -> None:
        defs = build_definitions(self.config)
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance, raise_on_error=False)
        assert result.success, [event.message for event in result.get_step_failure_events()]

    def path(self, table: str) -> str:
        return str(self.root / self.prefix / self.database / table)

    def status(self) -> dict[str, str]:
        """Each table's asset status, as the code location loads it."""
        return {spec.key.path[-1]: spec.tags["cdc_assets/status"]
                for spec in build_definitions(self.config).resolve_all_asset_specs() if "delta" in spec.kinds}

    def check(self, table: str, expected: dict[str, Normaliser] | None = None,
              actual: dict[str, Normaliser] | None = None) -> None:
        """The Delta table holds the source's rows, and the source's columns (the others listed as dropped)."""
        source = self.mariadb.query(f"SELECT * FROM {table}", database=self.database)
        delta = DeltaTable(self.path(table))
        number = {"amount": Decimal, "discount": Decimal, "rebate": Decimal, "big": Decimal}
        problems = compare(source, current_rows(self.path(table), MODES.get(table, "scd1")), ("id",),
                           expected or number, actual or number)
        assert not problems, summarise(problems)
        columns = [row["COLUMN_NAME"] for row in self.mariadb.query(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION", args=(self.database, table))]
        dropped = [c for c in delta.metadata().configuration.get("cdc_assets.dropped_columns", "").split(",") if c]
        held = [f.name for f in delta.schema().fields if not f.name.startswith("_cdc_")]
        assert sorted(c for c in held if c not in dropped) == sorted(columns), (held, dropped)


def caught_up(shops: list[Shop]) -> None:
    """Every shop's connector emitted everything written so far (one marker row, seen by each)."""
    shops[0].caught_up()
    for shop in shops[1:]:
        shop.caught_up(marker=shops[0].marker)


def apply_schema_changes(shops: list[Shop], instances: list[DagsterInstance]) -> list[str]:
    """The sensor's requested changes, the same whatever the connector's converter; their runs executed."""
    changes = [sorted(shop.apply_schema_changes(instance)) for shop, instance in zip(shops, instances, strict=True)]
    assert all(other == changes[0] for other in changes[1:]), changes
    return changes[0]


@pytest.mark.parametrize("writer, formats", [pytest.param("delta-rs", ("json", "avro"), id="delta-rs-json-and-avro"),
                                             pytest.param("delta-spark", ("json",), id="delta-spark-json")])
def test_schema_changes_of_a_real_mariadb_reach_delta_in_source_order(mariadb, connect_worker, broker, tmp_path,
                                                                       request, writer, formats):
    database = f"sc{uuid.uuid4().hex[:8]}"
    registry = request.getfixturevalue("schema_registry") if "avro" in formats else None
    shops = [Shop(mariadb, broker, tmp_path / fmt, database if fmt == "json" else f"{database}{fmt}", database, writer,
                  registry.confluent_url if fmt == "avro" else None) for fmt in formats]
    shop = shops[0]
    mariadb.execute(f"CREATE DATABASE {database}")
    shop.sql("CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(50), amount DECIMAL(10,2))",
             "CREATE TABLE order_lines (id INT PRIMARY KEY, order_id INT, big BIGINT UNSIGNED)",
             "CREATE TABLE marker (id INT PRIMARY KEY)",
             "CREATE TABLE gone (id INT PRIMARY KEY, note VARCHAR(20))",
             "INSERT INTO gone VALUES (1, 'old'), (2, 'older')",
             # every type users keep: the table the snapshot's CREATE makes must take the events' values
             next(statement for statement in SCHEMA if "CREATE TABLE alltypes" in statement),
             "INSERT INTO orders VALUES (1, 'first', 10.50), (2, 'second', 20.00), (3, NULL, NULL)",
             # above 2^63 (defect 4: exact under bigint.unsigned.handling.mode=precise), and the largest
             "INSERT INTO order_lines VALUES (1, 1, 9567973520996537333), (2, 1, 18446744073709551615), (3, 2, 7)")
    moded = tuple(MODES) if writer == "delta-rs" else ()
    for table in moded:
        shop.sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, note VARCHAR(20))",
                 f"INSERT INTO {table} VALUES (1, '{table[0]}1'), (2, '{table[0]}2'), (3, '{table[0]}3')")
    for row in EDGE_ROWS:
        mariadb.execute(f"INSERT INTO alltypes ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                        database=database, args=list(row.values()))
    for fmt, each in zip(formats, shops, strict=True):
        converter = converter_settings(registry.url) if registry is not None and fmt == "avro" else {}
        connect_worker.register(each.prefix, mariadb.connector_config(each.prefix, [database],
                                                                      broker.bootstrap_servers, **converter))
    for each in shops:
        connect_worker.wait_running(each.prefix)
    caught_up(shops)
    instances = [DagsterInstance.ephemeral() for _ in shops]
    try:
        # The snapshot's DDL: DROP TABLE IF EXISTS is not acted on; each CREATE makes the table.
        changes = apply_schema_changes(shops, instances)
        assert changes == [f"CREATE shop/{database}.{t}" for t in sorted(("alltypes", "gone", "marker", "order_lines",
                                                                           "orders", *moded))]
        for each, instance in zip(shops, instances, strict=True):
            assert each.status() == {"order_lines": "active", "marker": "active", "orders": "active",
                                     "alltypes": "active", "gone": "active", **{t: "active" for t in moded}}
            each.merge(instance)
            for table in ("orders", "order_lines", "gone", *moded):
                each.check(table)
            each.check("alltypes", ALLTYPES_EXPECTED, ALLTYPES_ACTUAL)

        # Mid-stream DDL, rows written across each; order_lines gets rows no merge saw before its DROP.
        shop.sql("INSERT INTO order_lines VALUES (4, 3, 12345678901234567890), (5, 3, 0)",
                 "UPDATE order_lines SET big = 18446744073709551614 WHERE id = 3",
                 "DROP TABLE order_lines",
                 "ALTER TABLE orders ADD COLUMN discount DECIMAL(5,2)",
                 "INSERT INTO orders VALUES (4, 'fourth', 40.00, 1.25)",
                 "UPDATE orders SET discount = 0.50 WHERE id = 1",
                 "ALTER TABLE orders MODIFY note VARCHAR(200)",
                 f"UPDATE orders SET note = '{'n' * 150}' WHERE id = 2",
                 "ALTER TABLE orders RENAME COLUMN note TO memo",
                 "UPDATE orders SET memo = NULL WHERE id = 1",
                 "ALTER TABLE orders DROP COLUMN amount",
                 "INSERT INTO orders VALUES (5, 'fifth', NULL)",
                 "ALTER TABLE orders CHANGE discount rebate DECIMAL(5,2)",
                 "INSERT INTO orders VALUES (6, 'sixth', 2.00)")
        if moded:  # scd2 and soft_delete: versions and rows from before the rename read their value as memo
            shop.sql("UPDATE history SET note = 'h2b' WHERE id = 2",
                     "ALTER TABLE history RENAME COLUMN note TO memo",
                     "INSERT INTO history VALUES (4, 'h4')",
                     "UPDATE history SET memo = 'h1b' WHERE id = 1",
                     "DELETE FROM ledger WHERE id = 3",
                     "UPDATE ledger SET note = 'l2b' WHERE id = 2",
                     "ALTER TABLE ledger RENAME COLUMN note TO memo",
                     "INSERT INTO ledger VALUES (4, 'l4')")
        # gone is dropped and created again: the old rows must not come back as the new table's
        shop.sql("DROP TABLE gone",
                 "CREATE TABLE gone (id INT PRIMARY KEY, label VARCHAR(20))",
                 "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))",
                 "INSERT INTO items VALUES (1, 'bolt'), (2, 'nut'), (3, 'screw')",
                 "CREATE TABLE parts (id INT PRIMARY KEY, name VARCHAR(20))",
                 "INSERT INTO parts VALUES (1, 'gear'), (2, 'cog')",
                 "UPDATE parts SET name = 'spring' WHERE id = 2",
                 # the rows go on under the new name; the old name's table is retired as of the rename
                 "RENAME TABLE parts TO components",
                 "INSERT INTO components VALUES (3, 'axle')",
                 "UPDATE components SET name = 'wheel' WHERE id = 1")
        caught_up(shops)
        changes = apply_schema_changes(shops, instances)
        assert f"DROP shop/{database}.order_lines" in changes and f"CREATE shop/{database}.items" in changes
        assert f"DROP shop/{database}.parts" in changes and f"ALTER shop/{database}.components" in changes
        assert f"DROP shop/{database}.gone" in changes and f"CREATE shop/{database}.gone" in changes
        versions = []
        for each, instance in zip(shops, instances, strict=True):
            assert each.status() == {"order_lines": "retired", "marker": "active", "orders": "active",
                                     "items": "active", "parts": "retired", "components": "active",
                                     "alltypes": "active", "gone": "active", **{t: "active" for t in moded}}
            # The old incarnation's rows are kept aside, retired; the new one starts empty with its own columns.
            gone = DeltaTable(each.path("gone"))
            assert current_rows(each.path("gone"), "scd1") == []
            assert {f.name for f in gone.schema().fields if not f.name.startswith("_cdc_")} == {"id", "label"}
            assert gone.metadata().configuration["cdc_assets.earlier_incarnations"] == each.path("gone__retired_1")
            old = DeltaTable(each.path("gone__retired_1"))
            assert sorted(r["note"] for r in current_rows(each.path("gone__retired_1"), "scd1")) == ["old", "older"]
            assert old.metadata().configuration["cdc_assets.retired"] == "true"
            parts = {row["id"]: row["name"] for row in current_rows(each.path("parts"), "scd1")}
            assert parts == {1: "gear", 2: "spring"}
            # The dropped table holds its rows as of the DROP: the DROP's run merged what no merge had.
            lines = {row["id"]: row["big"] for row in current_rows(each.path("order_lines"), "scd1")}
            assert lines == {1: Decimal(9567973520996537333), 2: Decimal(18446744073709551615), 3:
                             Decimal(18446744073709551614), 4: Decimal(12345678901234567890), 5: Decimal(0)}
            each.merge(instance)
            for table in ("orders", "items", "components", "gone", *moded):
                each.check(table)
            if moded:  # every scd2 version from before the rename reads its value as memo
                assert {(r["id"], r["memo"]) for r in delta_rows(each.path("history")) if not r["_cdc_current"]} == {
                    (1, "h1"), (2, "h2")}
            versions.append({table: DeltaTable(each.path(table)).version()
                             for table in ("orders", "items", "order_lines", "parts", "components", "gone", *moded)})

        # A restart of the worker: the connectors resume from their offsets, may emit their last DDL again,
        # and nothing changes.
        connect_worker.restart()
        for each in shops:
            connect_worker.wait_running(each.prefix)
        shop.sql("INSERT INTO gone VALUES (3, 'new')")
        caught_up(shops)
        for each, instance, before in zip(shops, instances, versions, strict=True):
            each.apply_schema_changes(instance)
            assert {table: DeltaTable(each.path(table)).version() for table in before} == before
            each.merge(instance)
            for table in ("orders", "items", "components", "gone", *moded):
                each.check(table)
    finally:
        for instance in instances:
            instance.dispose()
    for each in shops:
        connect_worker.delete(each.prefix)
