"""Conformance with real MariaDB: a private MariaDB 10.11 captured by Debezium's MariaDB connector (3.5.0) running in a
Kafka Connect 4.3 distributed worker (3 partitions per table, schema changes and history in Kafka) as in production,
twice: one connector with the JSON converter (with schemas), one with Apicurio's Avro converter and a real Apicurio
Registry (``format: avro``); the project's ``cdc_merge_job`` merges each leg's topics as the ``mariadb`` kind; every
Delta table of both legs must equal ``SELECT *`` of its source table, which is the oracle, and the two legs' Delta
tables must be the same.

One pair of connector registrations feeds every test of this module: fixed edge rows and a seeded random workload are
written before their snapshots and while they stream, each leg's tables are merged once mid-stream, the connectors are
stopped (their tasks store their offsets), written to while stopped and resumed; then each test merges and compares.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdc_assets.io.avro import AvroRecords, SchemaRegistrySettings
from tests.support import check_runs as cr
from tests.support import harness as h
from tests.support import workloads as w
from tests.support.apicurio import Apicurio
from tests.support.connect import ConnectWorker
from tests.support.harness import converter_settings
from tests.support.mariadb import MariaDBServer
from tests.support.mariadb_workloads import (
    ALLTYPES_ACTUAL,
    ALLTYPES_EXPECTED,
    EDGE_ROWS,
    SCHEMA,
    CapturedDatabase,
    PsycopgLike,
    utc_datetime,
)

pytestmark = pytest.mark.conformance

SEED = 43_2026
LEGS = ("json", "avro")  # the connectors' converters: Kafka Connect's JsonConverter, Apicurio's AvroConverter


ALLTYPES = [column for column in EDGE_ROWS[0] if column != "id"]  # the first edge row sets every column


def _text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("abcXYZ019 \n\t\"'\\{}é☃𝄞") for _ in range(length))


def _decimal(rng: random.Random, precision: int, scale: int) -> str:
    # Exact text: pymysql would send a Decimal such as 1E+5 as a literal MariaDB reads as a double.
    return format(Decimal(rng.randint(-10**precision + 1, 10**precision - 1)).scaleb(-scale), "f")


def _duration(rng: random.Random, micros: bool) -> str:
    value = rng.randrange(-838 * 3600 * 10**6, 839 * 3600 * 10**6) if rng.random() < 0.3 else \
        rng.randrange(86400 * 10**6)
    sign, value = ("-" if value < 0 else ""), abs(value)
    text = f"{sign}{value // 3600_000000}:{value // 60_000000 % 60:02d}:{value // 1_000000 % 60:02d}"
    return f"{text}.{value % 1_000000:06d}" if micros else text


def random_alltypes_row(rng: random.Random, row_id: int) -> dict[str, Any]:
    """A row of ``alltypes`` with seeded random values over each type's whole range, about one column in six NULL."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    moment = dt.datetime(1000, 1, 1) + dt.timedelta(microseconds=rng.randrange(9000 * 365 * 86400 * 10**6))
    instant = dt.datetime(1970, 1, 2) + dt.timedelta(microseconds=rng.randrange(68 * 365 * 86400 * 10**6))
    return {
        "id": row_id, "c_bool": maybe(rng.choice([0, 1, 1, -1])), "c_tinyint": maybe(rng.randint(-128, 127)),
        "c_tinyint_u": maybe(rng.randint(0, 255)), "c_smallint": maybe(rng.randint(-2**15, 2**15 - 1)),
        "c_smallint_u": maybe(rng.randint(0, 2**16 - 1)), "c_mediumint": maybe(rng.randint(-2**23, 2**23 - 1)),
        "c_mediumint_u": maybe(rng.randint(0, 2**24 - 1)), "c_int": maybe(rng.randint(-2**31, 2**31 - 1)),
        "c_int_u": maybe(rng.randint(0, 2**32 - 1)), "c_bigint": maybe(rng.randint(-2**63, 2**63 - 1)),
        "c_bigint_u": maybe(rng.choice([rng.randint(0, 2**63 - 1), rng.randint(2**63, 2**64 - 1)])),
        "c_bit1": maybe(rng.randint(0, 1)), "c_bit12": maybe(rng.randrange(2**12)),
        "c_bit64": maybe(rng.getrandbits(64)),
        "c_year": maybe(rng.randint(1901, 2155)), "c_dec": maybe(_decimal(rng, 10, 2)),
        "c_dec0": maybe(_decimal(rng, 18, 0)), "c_dec_wide": maybe(_decimal(rng, 38, 10)),
        "c_dec65": maybe(_decimal(rng, 65, 30)),
        "c_float": maybe(float(f"{rng.uniform(-1, 1) * 10.0 ** rng.randint(-20, 20):.6g}")),
        "c_double": maybe(rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300)),
        "c_char": maybe(_text(rng, rng.randint(0, 10)).rstrip()), "c_varchar": maybe(_text(rng, rng.randint(0, 100))),
        "c_text": maybe(_text(rng, rng.randint(0, 500))), "c_blob": maybe(rng.randbytes(rng.randint(0, 300))),
        "c_varbinary": maybe(rng.randbytes(rng.randint(0, 32))), "c_binary": maybe(rng.randbytes(rng.randint(0, 4))),
        "c_date": maybe(moment.date().isoformat()), "c_time": maybe(_duration(rng, False)),
        "c_time6": maybe(_duration(rng, True)), "c_dt": maybe(moment.replace(microsecond=0).isoformat(sep=" ")),
        "c_dt3": maybe(moment.isoformat(sep=" ", timespec="milliseconds")), "c_dt6": maybe(moment.isoformat(sep=" ")),
        "c_ts6": maybe(instant.isoformat(sep=" ", timespec="microseconds")),
        "c_json": maybe(json.dumps({"k": _text(rng, 5), "n": rng.randint(0, 9), "l": [1, None, 2.5]})),
        "c_enum": maybe(rng.choice(["sad", "ok", "happy"])),
        "c_set": maybe(",".join(v for v in "abc" if rng.random() < 0.5)),
    }


def insert(sql: PsycopgLike, table: str, row: dict[str, Any]) -> None:
    """Insert ``row`` (column -> value)."""
    sql.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})", list(row.values()))


def alltypes_changes(sql: PsycopgLike, rng: random.Random, ids: list[int], next_id: int, steps: int) -> int:
    """Random inserts, column updates (to values and to NULL), primary-key changes and deletes of ``alltypes``, some
    grouped in transactions; returns the next free id."""
    step = 0
    while step < steps:
        with sql.transaction():
            for _ in range(rng.choice([1, 1, 4])):
                step += 1
                choice = rng.random()
                if choice < 0.35 or not ids:
                    insert(sql, "alltypes", random_alltypes_row(rng, next_id))
                    ids.append(next_id)
                    next_id += 1
                elif choice < 0.8:
                    row_id, fresh = rng.choice(ids), random_alltypes_row(rng, 0)
                    columns = rng.sample(ALLTYPES, rng.randint(1, 8))
                    sql.execute(f"UPDATE alltypes SET {', '.join(f'{c} = %s' for c in columns)} WHERE id = %s",
                                [*(fresh[c] for c in columns), row_id])
                elif choice < 0.9:
                    old = rng.choice(ids)
                    ids.remove(old)
                    ids.append(next_id)
                    sql.execute("UPDATE alltypes SET id = %s WHERE id = %s", [next_id, old])
                    next_id += 1
                else:
                    old = rng.choice(ids)
                    ids.remove(old)
                    sql.execute("DELETE FROM alltypes WHERE id = %s", [old])
    return next_id


@dataclass
class World(CapturedDatabase):
    """The captured database after the workload, and where everything went: each leg (``LEGS``) has its connector's
    topic prefix and its own Delta root."""

    registry_url: str = ""  # the Avro leg's schema registry (its Confluent-compatible API)
    prefixes: dict[str, str] = field(default_factory=dict)
    midstream_failures: dict[str, list[str]] = field(default_factory=dict)
    merged: dict[str, list[str]] = field(default_factory=dict)
    midstream_checks: list[dict[str, cr.Verdict]] = field(default_factory=list)
    checked: dict[str, dict[str, cr.Verdict]] = field(default_factory=dict)

    def config(self, leg: str, only_rnd: bool = False, extra: str = "", max_records: int = 1000,
               modes: tuple[str, ...] = ("scd1", "soft_delete", "scd2")) -> str:
        """The pipeline config of one leg: one ``mariadb`` connector, alltypes and nokey (unless ``only_rnd``), and
        rnd in every apply mode of ``modes`` (delta-rs: the writer does not change the decoded types, and a
        delta-spark run of these tables costs CI about 80 s); ``extra``: more connector settings; ``max_records``:
        the most events a batch merges."""
        prefix = self.prefixes[leg]
        topic = f"{prefix}.{self.database}.rnd"
        record_format = h.avro_format(self.registry_url if leg == "avro" else None)
        others = "" if only_rnd else (f"      - {{name: {self.database}.alltypes}}\n"
                                      f"      - {{name: {self.database}.nokey}}\n")
        rnd = {"scd1": f"      - {{name: {self.database}.rnd}}\n",
               "soft_delete": f"      - {{name: {self.database}.rnd_soft, topic: {topic}, path: m/rnd_soft, "
                              "apply_mode: soft_delete}\n",
               "scd2": f"      - {{name: {self.database}.rnd_scd2, topic: {topic}, path: m/rnd_scd2, "
                       "apply_mode: scd2}\n"}
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{self.root / leg}", writer: delta-rs}}
batch: {{max_records: {max_records}, poll_timeout_s: 5, max_batches_per_run: 200}}
connectors:
  - name: maria
    kind: mariadb
    topic.prefix: {prefix}
{record_format}{extra}    tables:
{others}{"".join(rnd[mode] for mode in modes)}"""

    def merge(self, leg: str) -> list[str]:
        """``cdc_merge_job`` over every table of a leg (once for the tests); its failed steps."""
        if leg not in self.merged:
            self.merged[leg] = h.failures(h.run_job(self.config(leg)))
        return self.merged[leg]

    def dsn(self) -> str:
        """The database's DSN as rows_match_source reads it (``mariadb://``)."""
        return f"mariadb://{self.mariadb.user}:{self.mariadb.password}@{self.mariadb.host}:{self.mariadb.port}/" \
               f"{self.database}"

    def path(self, leg: str, table: str) -> Path:
        """The Delta path of a leg's table (default path, or the ``m/`` one of the other apply modes)."""
        root = self.root / leg
        return root / "m" / table if table in ("rnd_soft", "rnd_scd2") else \
            root / self.prefixes[leg] / self.database / table


@pytest.fixture(scope="module")
def world(broker: Any, mariadb: MariaDBServer, connect_worker: ConnectWorker, schema_registry: Apicurio,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Runs the whole captured workload once, captured by both legs' connectors; the tests then merge and compare."""
    run_id = uuid.uuid4().hex[:6]
    database = f"cf_{run_id}"
    prefixes = {"json": f"maria{run_id}", "avro": f"mariav{run_id}"}
    mariadb.execute(f"CREATE DATABASE {database}")
    avro_keys = AvroRecords(SchemaRegistrySettings(schema_registry.confluent_url))
    world = World(mariadb, connect_worker, database, prefixes["json"], broker.bootstrap_servers,
                  tmp_path_factory.mktemp("mariadb") / "delta", more_prefixes={prefixes["avro"]: avro_keys.to_json},
                  registry_url=schema_registry.confluent_url, prefixes=prefixes)
    rng = random.Random(SEED)
    with contextlib.closing(mariadb.connect(database)) as connection:
        sql = PsycopgLike(connection)
        for statement in SCHEMA:
            sql.execute(statement)
        for row in EDGE_ROWS:
            insert(sql, "alltypes", row)
        alltypes_ids: list[int] = []  # the random changes leave the edge rows to the fixed ones below
        next_alltypes = alltypes_changes(sql, rng, alltypes_ids, 100, 30)
        rnd_ids: list[int] = []
        next_rnd = w.rnd_changes(sql, rng, rnd_ids, 1, 60)  # type: ignore[arg-type]
        for number in range(1, 11):
            sql.execute("INSERT INTO nokey VALUES (%s, %s, 'n')", [f"code-{number}", number])

        for leg, prefix in prefixes.items():
            converter = converter_settings(schema_registry.url) if leg == "avro" else {}
            connect_worker.register(prefix, mariadb.connector_config(
                prefix, [database], broker.bootstrap_servers, **{"message.key.columns": f"{database}.nokey:code"},
                **converter))
        try:
            for prefix in prefixes.values():
                connect_worker.wait_running(prefix)
            # Phase 1 streams to both legs only once both snapshots have fixed their binlog position: a write
            # between the two would be one leg's snapshot read and the other's change (seen on 2026-12-02).
            world.wait_for_snapshots("alltypes")
            # Phase 1: streamed changes of every kind, among them primary-key changes; a merge mid-stream.
            sql.execute("UPDATE alltypes SET id = 100000 WHERE id = 3")
            sql.execute("UPDATE alltypes SET c_bigint_u = c_bigint_u - 1, c_text = CONCAT(c_text, '!') WHERE id = 1")
            sql.execute("UPDATE nokey SET v = v * 10 WHERE v % 2 = 0")
            sql.execute("UPDATE nokey SET code = 'renamed-3' WHERE code = 'code-3'")
            sql.execute("DELETE FROM nokey WHERE code = 'code-5'")
            next_alltypes = alltypes_changes(sql, rng, alltypes_ids, next_alltypes, 60)
            next_rnd = w.rnd_changes(sql, rng, rnd_ids, next_rnd, 200)  # type: ignore[arg-type]
            world.wait_for_marker(sql)
            world.midstream_failures = {leg: h.failures(h.run_job(world.config(leg))) for leg in LEGS}
            # rows_match_source of the JSON leg's rnd_scd2 while the random workload keeps writing and the merge
            # keeps merging, in batches smaller than the table: changes are in flight at every look, none of them
            # may read as drift. (test_real_debezium.py does the same with an scd1 table.)
            writes = cr.RandomWrites(sql, rng, rnd_ids, next_rnd)  # type: ignore[arg-type]
            os.environ[DSN_ENV] = world.dsn()
            try:
                world.midstream_checks = cr.while_writing(
                    writes, world.config("json", only_rnd=True, max_records=cr.BUSY_MAX_RECORDS, modes=("scd2",)),
                    lambda: rows_match_source(world.config("json", only_rnd=True, extra=BUSY_ROWS_MATCH_SOURCE,
                                                           modes=("scd2",))), runs=2)
            finally:
                os.environ.pop(DSN_ENV, None)
            next_rnd = writes.next_id

            # Phase 2: the connectors stopped (their offsets stored), writes meanwhile, resumed from their offsets.
            next_rnd = w.rnd_changes(sql, rng, rnd_ids, next_rnd, 60)  # type: ignore[arg-type]
            for prefix in prefixes.values():
                connect_worker.stop_connector(prefix)
            next_rnd = w.rnd_changes(sql, rng, rnd_ids, next_rnd, 80)  # type: ignore[arg-type]
            next_alltypes = alltypes_changes(sql, rng, alltypes_ids, next_alltypes, 30)
            for prefix in prefixes.values():
                connect_worker.resume(prefix)
            for prefix in prefixes.values():
                connect_worker.wait_running(prefix)
            w.rnd_changes(sql, rng, rnd_ids, next_rnd, 60)  # type: ignore[arg-type]
            alltypes_changes(sql, rng, alltypes_ids, next_alltypes, 20)
            world.wait_for_marker(sql)
            yield world
        finally:
            world.close()
            for prefix in prefixes.values():
                connect_worker.delete(prefix)


# --- the oracle's view of each table and how each side is normalised ---


RND_ACTUAL: dict[str, h.Normaliser] = {"id": h.typed(int), "grp": h.typed(int), "name": h.typed(str),
                                       "amount": h.decimal_value, "score": h.as_float, "at": h.instant}


def _assert_equal(world: World, leg: str, table: str, expected: dict[str, h.Normaliser],
                  actual: dict[str, h.Normaliser], apply_mode: str = "scd1", key: tuple[str, ...] = ("id",)) -> None:
    source_table = table.split("_")[0] if table.startswith("rnd") else table
    rows = h.current_rows(world.path(leg, table), apply_mode)
    source = world.mariadb.query(f"SELECT * FROM {source_table}", world.database)
    problems = h.compare(source, rows, key, expected, actual)
    if problems:
        raise AssertionError(f"{leg}/{table} ({apply_mode}): {h.summarise(problems)}")


DSN_ENV = "CDC_MARIADB_CONFORMANCE_DSN"
ROWS_MATCH_SOURCE = cr.rows_match_source_settings(DSN_ENV)
BUSY_ROWS_MATCH_SOURCE = cr.rows_match_source_settings(DSN_ENV, cr.BUSY_SETTLE_TIMEOUT_S)


def rows_match_source(config: str) -> dict[str, cr.Verdict]:
    """The ``rows_match_source`` verdicts of the config's tables (the connector's check job), by table; each
    compared the random workload's doubles (``score``)."""
    found = cr.verdicts(config, "maria_rows_match_source_job")
    for verdict in found.values():
        assert "score" in verdict.metadata["columns_compared"], verdict.metadata
    return found


def _merged(world: World, leg: str) -> None:
    """Both of the leg's merges (mid-stream and final) succeeded."""
    failed = world.midstream_failures[leg] + world.merge(leg)
    assert not failed, failed


@pytest.mark.parametrize("leg", LEGS)
def test_every_mariadb_type_equals_the_source(world, leg):
    """Signed and unsigned integers (BIGINT UNSIGNED above 2^63 under bigint.unsigned.handling.mode=precise), BIT,
    YEAR, DECIMAL up to 65 digits, FLOAT/DOUBLE, text with unicode, binaries, DATE, TIME beyond a day and negative,
    DATETIME(0/3/6), TIMESTAMP(6), JSON, ENUM, SET and NULL in every column, from the snapshot and streamed; through
    the JSON converter and through the Avro converter."""
    _merged(world, leg)
    types = {f.name: f.type.type for f in DeltaTable(str(world.path(leg, "alltypes"))).schema().fields}
    assert (types["c_bigint_u"], types["c_dec65"], types["c_bit12"], types["c_time6"]) == (
        "decimal(38,0)", "string", "binary", "string"), types
    _assert_equal(world, leg, "alltypes", ALLTYPES_EXPECTED, ALLTYPES_ACTUAL)


@pytest.mark.parametrize("leg", LEGS)
def test_a_table_without_a_primary_key_keyed_by_message_key_columns(world, leg):
    _merged(world, leg)
    _assert_equal(world, leg, "nokey", {}, {"v": h.typed(int), "note": h.typed(str)}, key=("code",))


@pytest.mark.parametrize("leg", LEGS)
@pytest.mark.parametrize("apply_mode", ["scd1", "soft_delete", "scd2"])
def test_random_workload_with_key_changes_and_a_connector_stop_in_every_apply_mode(world, apply_mode, leg,
                                                                                  monkeypatch):
    """Seeded random inserts, updates, deletes and primary-key changes (PostgreSQL's workload generator, some in
    multi-statement transactions), merged once mid-stream, with the connector stopped and resumed meanwhile.
    rows_match_source (the JSON leg's) finds no drift: run twice on the scd2 table while the workload wrote and the
    merge merged (changes in flight at a first look), and on every apply mode's table at the end: MariaDB's SQL and
    Spark's give each value the same text."""
    _merged(world, leg)
    table = {"scd1": "rnd", "soft_delete": "rnd_soft", "scd2": "rnd_scd2"}[apply_mode]
    _assert_equal(world, leg, table, {"at": utc_datetime}, RND_ACTUAL, apply_mode)
    if leg == "json":
        if apply_mode == "scd2":
            cr.assert_no_drift_while_writing(world.midstream_checks, f"{world.database}.{table}", cr.BUSY_MAX_RECORDS)
        if leg not in world.checked:  # one check run for the three tables
            monkeypatch.setenv(DSN_ENV, world.dsn())
            world.checked[leg] = rows_match_source(world.config(leg, only_rnd=True, extra=ROWS_MATCH_SOURCE))
        verdict = world.checked[leg][f"{world.database}.{table}"]
        assert verdict.passed, verdict.description
    if apply_mode == "scd2":
        current: dict[int, int] = {}
        for row in h.delta_rows(world.path(leg, table)):
            current[row["id"]] = current.get(row["id"], 0) + bool(row["_cdc_current"])
        assert {k: n for k, n in current.items() if n > 1} == {}


# An ordering position ends with its event's Kafka partition (10 digits) and offset (20) as tie-break
# (``core.position.event_position``): the Avro leg's keys are other bytes, hashed to other partitions.
_KAFKA_PART_OF_POSITION = 30
_POSITIONS = ("_cdc_position", "_cdc_valid_from", "_cdc_valid_to")  # the last two: an scd2 version's bounds


def _source_part(position: str | None) -> str | None:
    return None if position is None else position[:-_KAFKA_PART_OF_POSITION]


def _same_across_legs(column: str, avro: Any, json_value: Any) -> bool:
    """Whether the two legs' values of ``column`` are the same (of the same type)."""
    if type(avro) is not type(json_value):
        return False
    if column in _POSITIONS:
        return _source_part(avro) == _source_part(json_value)
    if column == "c_float" and avro is not None:
        # The same 32-bit FLOAT, as a double: the JSON converter writes it with the worker JDK's Float.toString (on
        # JDK 17 not always the shortest text: 5.2018799E10), the Avro leg with the shortest (5.20188E10).
        return bool(struct.pack("f", avro) == struct.pack("f", json_value))
    return bool(avro == json_value)


def _read_at_each_snapshot(column: str, avro: dict[str, Any], json_row: dict[str, Any]) -> bool:
    """Whether ``column`` is the source time of a row both legs took from their snapshot (op ``r``): each
    connector's own read time, which differs between the two by a second when their snapshots straddle one."""
    return (column in ("_cdc_source_ts", "_cdc_valid_from_ts") and avro.get("_cdc_op") == json_row.get("_cdc_op") == "r"
            and type(avro[column]) is type(json_row.get(column)))


@pytest.mark.parametrize("table", ["alltypes", "nokey", "rnd", "rnd_soft", "rnd_scd2"])
def test_avro_and_json_give_the_same_delta_table(world, table):
    """The same changes through the JSON converter and through the Avro converter: the same Delta schema and the same
    rows, every column (hidden ones included) the same value of the same type."""
    for leg in LEGS:
        _merged(world, leg)
    tables = {leg: DeltaTable(str(world.path(leg, table))) for leg in LEGS}
    schemas = {leg: [(f.name, f.type.type, f.nullable) for f in delta.schema().fields] for leg, delta in tables.items()}
    assert schemas["avro"] == schemas["json"]
    key = ("code",) if table == "nokey" else ("id",)
    rows = {leg: sorted(h.delta_rows(world.path(leg, table)),
                        key=lambda r: (*map(repr, map(r.get, key)),
                                       _source_part(r.get("_cdc_position", r.get("_cdc_valid_from")))))
            for leg in LEGS}
    assert len(rows["avro"]) == len(rows["json"]) > 0
    differences = [f"{[row[k] for k in key]}: {column}: avro {value!r}, json {json_row.get(column)!r}"
                   for row, json_row in zip(rows["avro"], rows["json"], strict=True) for column, value in row.items()
                   if not _same_across_legs(column, value, json_row.get(column))
                   and not _read_at_each_snapshot(column, row, json_row)]
    assert not differences, h.summarise(differences)
