"""The schema-change sensor end to end on real DDL: MariaDB captured by Debezium's MariaDB connector under
Kafka Connect, ``schema_change_sensor`` evaluated and every run it requests executed (in reverse order:
runs finish in any order), then ``cdc_merge_job``; each Delta table compared with the source (the oracle).

Steps: the initial snapshot's DDL (``DROP TABLE IF EXISTS`` + ``CREATE TABLE`` of every table) on tables
that already hold data; then ALTER ADD / MODIFY (widen) / RENAME COLUMN / DROP COLUMN / CHANGE (rename),
CREATE TABLE, RENAME TABLE and DROP TABLE mid-stream, with rows written across each (rows untouched since
a rename read their value under the new name, as SELECT * does); then a connector restart that may emit
its last DDL again.
"""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.conformance.harness import Normaliser, compare, current_rows, read_topic, summarise
from tests.conformance.test_mariadb import ALLTYPES_ACTUAL, ALLTYPES_EXPECTED, EDGE_ROWS, SCHEMA

pytestmark = pytest.mark.conformance

CONFIG = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
  writer: {writer}
connectors:
  - name: shop
    kind: mariadb
    topic.prefix: {prefix}
    include: ['{database}\\..*']
"""


class Shop:
    """A database of the tests' MariaDB, captured under ``prefix``, its pipeline and its Dagster instance."""

    def __init__(self, mariadb, broker, root, prefix: str, writer: str = "delta-rs") -> None:
        self.mariadb, self.broker, self.root, self.prefix = mariadb, broker, root, prefix
        self.database = prefix
        self.config = parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=root, prefix=prefix,
                                                 database=self.database, writer=writer))
        self.cursor: str | None = None
        self.marker = 0

    def sql(self, *statements: str) -> None:
        for statement in statements:
            self.mariadb.execute(statement, database=self.database)

    def caught_up(self, timeout_s: float = 120) -> None:
        """Wait until Debezium emitted everything written so far: a new marker row reached its topic."""
        self.marker += 1
        self.sql(f"INSERT INTO marker VALUES ({self.marker})")
        topic = f"{self.prefix}.{self.database}.marker"
        deadline = time.monotonic() + timeout_s
        while not any(((record.value or {}).get("after") or {}).get("id") == self.marker
                      for record in read_topic(self.broker.bootstrap_servers, topic)):
            assert time.monotonic() < deadline, f"marker {self.marker} never reached {topic}"
            time.sleep(0.5)
        time.sleep(1.0)  # the connector's other topics were written in the same producer flush

    def apply_schema_changes(self, instance: DagsterInstance) -> list[str]:
        """Tick the sensor, run what it requests in reverse order; the changes requested."""
        defs = build_definitions(self.config)
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
        problems = compare(source, current_rows(self.path(table), "scd1"), ("id",), expected or number,
                           actual or number)
        assert not problems, summarise(problems)
        columns = [row["COLUMN_NAME"] for row in self.mariadb.query(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION", args=(self.database, table))]
        dropped = [c for c in delta.metadata().configuration.get("cdc_assets.dropped_columns", "").split(",") if c]
        held = [f.name for f in delta.schema().fields if not f.name.startswith("_cdc_")]
        assert sorted(c for c in held if c not in dropped) == sorted(columns), (held, dropped)


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_schema_changes_of_a_real_mariadb_reach_delta_in_source_order(mariadb, connect_worker, broker, tmp_path,
                                                                       writer):
    shop = Shop(mariadb, broker, tmp_path, f"sc{uuid.uuid4().hex[:8]}", writer)
    mariadb.execute(f"CREATE DATABASE {shop.database}")
    shop.sql("CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(50), amount DECIMAL(10,2))",
             "CREATE TABLE order_lines (id INT PRIMARY KEY, order_id INT, big BIGINT UNSIGNED)",
             "CREATE TABLE marker (id INT PRIMARY KEY)",
             # every type users keep: the table the snapshot's CREATE makes must take the events' values
             next(statement for statement in SCHEMA if "CREATE TABLE alltypes" in statement),
             "INSERT INTO orders VALUES (1, 'first', 10.50), (2, 'second', 20.00), (3, NULL, NULL)",
             # above 2^63 (defect 4: exact under bigint.unsigned.handling.mode=precise), and the largest
             "INSERT INTO order_lines VALUES (1, 1, 9567973520996537333), (2, 1, 18446744073709551615), (3, 2, 7)")
    for row in EDGE_ROWS:
        mariadb.execute(f"INSERT INTO alltypes ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                        database=shop.database, args=list(row.values()))
    connect_worker.register(shop.prefix, mariadb.connector_config(shop.prefix, [shop.database],
                                                                  broker.bootstrap_servers))
    connect_worker.wait_running(shop.prefix)
    shop.caught_up()
    with DagsterInstance.ephemeral() as instance:
        # The snapshot's DDL: DROP TABLE IF EXISTS is not acted on; each CREATE makes the table.
        changes = shop.apply_schema_changes(instance)
        assert sorted(changes) == [f"CREATE shop/{shop.database}.{t}"
                                   for t in ("alltypes", "marker", "order_lines", "orders")]
        assert shop.status() == {"order_lines": "active", "marker": "active", "orders": "active", "alltypes": "active"}
        shop.merge(instance)
        for table in ("orders", "order_lines"):
            shop.check(table)
        shop.check("alltypes", ALLTYPES_EXPECTED, ALLTYPES_ACTUAL)

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
                 "INSERT INTO orders VALUES (6, 'sixth', 2.00)",
                 "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))",
                 "INSERT INTO items VALUES (1, 'bolt'), (2, 'nut'), (3, 'screw')",
                 "CREATE TABLE parts (id INT PRIMARY KEY, name VARCHAR(20))",
                 "INSERT INTO parts VALUES (1, 'gear'), (2, 'cog')",
                 "UPDATE parts SET name = 'spring' WHERE id = 2",
                 # the rows go on under the new name; the old name's table is retired as of the rename
                 "RENAME TABLE parts TO components",
                 "INSERT INTO components VALUES (3, 'axle')",
                 "UPDATE components SET name = 'wheel' WHERE id = 1")
        shop.caught_up()
        changes = shop.apply_schema_changes(instance)
        assert f"DROP shop/{shop.database}.order_lines" in changes and f"CREATE shop/{shop.database}.items" in changes
        assert f"DROP shop/{shop.database}.parts" in changes and f"ALTER shop/{shop.database}.components" in changes
        assert shop.status() == {"order_lines": "retired", "marker": "active", "orders": "active", "items": "active",
                                 "parts": "retired", "components": "active", "alltypes": "active"}
        parts = {row["id"]: row["name"] for row in current_rows(shop.path("parts"), "scd1")}
        assert parts == {1: "gear", 2: "spring"}
        # The dropped table holds its rows as of the DROP: the DROP's run merged what no merge had.
        lines = {row["id"]: row["big"] for row in current_rows(shop.path("order_lines"), "scd1")}
        assert lines == {1: Decimal(9567973520996537333), 2: Decimal(18446744073709551615), 3:
                         Decimal(18446744073709551614), 4: Decimal(12345678901234567890), 5: Decimal(0)}
        shop.merge(instance)
        for table in ("orders", "items", "components"):
            shop.check(table)
        versions = {table: DeltaTable(shop.path(table)).version()
                    for table in ("orders", "items", "order_lines", "parts", "components")}

        # A restart of the worker: the connector resumes from its offsets, may emit its last DDL again,
        # and nothing changes.
        connect_worker.restart()
        connect_worker.wait_running(shop.prefix)
        shop.caught_up()
        shop.apply_schema_changes(instance)
        assert {table: DeltaTable(shop.path(table)).version() for table in versions} == versions
        shop.merge(instance)
        for table in ("orders", "items", "components"):
            shop.check(table)
    connect_worker.delete(shop.prefix)
