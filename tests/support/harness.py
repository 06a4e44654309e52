"""The parts of the conformance suite: real Debezium in a subprocess, the project's real Dagster jobs, and
the comparison of each Delta table with its source table (the database is the oracle)."""

from __future__ import annotations

import ast
import base64
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from dagster import DagsterInstance, ExecuteInProcessResult
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.io.storage import delta_rs_options
from tests.support.processes import terminate

REPOSITORY = Path(__file__).resolve().parents[2]
DEBEZIUM_VERSION = "3.6.3.Final"


def postgres_source(prefix: str, dsn: Mapping[str, str], tables: Iterable[str]) -> dict[str, str]:
    """The settings every Debezium PostgreSQL connector of the suite shares: the database, pgoutput, its own
    slot and publication (named by ``prefix``), the tables captured (``public.x`` names)."""
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": dsn["host"],
        "database.port": dsn["port"],
        "database.user": dsn["user"],
        "database.password": "unused",  # trust authentication
        "database.dbname": dsn["dbname"],
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        # Slots belong to the server, not the database: named by the topic prefix, so that every test's
        # connectors on the session's PostgreSQL have their own.
        "slot.name": f"slot_{prefix}",
        "publication.name": f"pub_{prefix}",
        "table.include.list": ",".join(tables),
    }


def connect_config(prefix: str, dsn: Mapping[str, str], tables: Iterable[str], **overrides: str) -> dict[str, str]:
    """A Debezium PostgreSQL connector for a Kafka Connect worker's REST API, as production registers it: JSON
    converter with schemas, 3 partitions per topic the worker creates, offsets in the worker's offset topic.
    Its publication is ``FOR ALL TABLES``: ``filtered`` would leave out a table created after it."""
    return {
        **postgres_source(prefix, dsn, tables),
        "tasks.max": "1",
        "publication.autocreate.mode": "all_tables",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "topic.creation.default.partitions": "3",
        "topic.creation.default.replication.factor": "1",
        **overrides,
    }


def connector_properties(name: str, prefix: str, dsn: Mapping[str, str], tables: Iterable[str], work_dir: Path,
                         **overrides: str) -> dict[str, str]:
    """A Debezium PostgreSQL connector for the embedded engine over ``tables``, its own offset file;
    ``overrides`` are further connector properties (dots as given)."""
    return {
        "name": name,
        **postgres_source(prefix, dsn, tables),
        "publication.autocreate.mode": "filtered",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work_dir / f"offsets-{name}.dat"),
        "offset.flush.interval.ms": "0",
        "converter.schemas.enable": "true",
        "poll.interval.ms": "50",
        **overrides,
    }


class DebeziumRunner:
    """Real Debezium connectors in a subprocess (``debezium_runner``), producing into the test broker."""

    def __init__(self, bootstrap_servers: str, connectors: list[dict[str, str]], work_dir: Path,
                 partitions: int = 3) -> None:
        self.work_dir = work_dir
        self.status_file = work_dir / "status.json"
        self.spec_file = work_dir / "spec.json"
        self.log_file = work_dir / "debezium.log"
        self.spec_file.write_text(json.dumps({"bootstrap_servers": bootstrap_servers, "partitions": partitions,
                                              "status_file": str(self.status_file), "connectors": connectors}))
        self.prefixes = [c["topic.prefix"] for c in connectors]
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (or restart) the engines; they resume from their offset files."""
        self.starts += 1
        with self.log_file.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.debezium_runner", str(self.spec_file)],
                cwd=self.work_dir, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPOSITORY)})

    def stop(self) -> None:
        """Stop the engines gracefully."""
        if self.process is not None:
            terminate(self.process)
            self.process = None

    def status(self) -> dict[str, Any]:
        """What the runner has produced so far (see ``debezium_runner``)."""
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {}

    def check_alive(self, waiting_for: str) -> None:
        """Fail, with the runner's log, if the runner is not running."""
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"Debezium runner is not running while waiting for {waiting_for}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        """The end of the runner's log (Debezium's own log lines included)."""
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_for_marker(self, marker: int, timeout_s: float = 180) -> None:
        """Wait until every connector has produced marker row ``marker`` (and all before it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            markers = self.status().get("markers", {})
            missing = [p for p in self.prefixes if markers.get(f"{p}.public.cdc_marker", -1) < marker]
            if not missing:
                return
            self.check_alive(f"marker {marker}")
            if time.monotonic() > deadline:
                raise AssertionError(f"connectors {missing} did not produce marker {marker} in {timeout_s}s:\n"
                                     f"{self.log_tail()}")
            time.sleep(0.2)

    def wait_for_notification(self, prefix: str, predicate: Callable[[dict[str, Any]], bool], what: str,
                              timeout_s: float = 180) -> dict[str, Any]:
        """Wait for a Debezium notification (sink channel, topic ``<prefix>.notifications``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for notification in self.status().get("notifications", {}).get(f"{prefix}.notifications", []):
                if predicate(notification):
                    return notification
            self.check_alive(what)
            if time.monotonic() > deadline:
                raise AssertionError(f"no notification '{what}' from {prefix} in {timeout_s}s: "
                                     f"{self.status().get('notifications')}\n{self.log_tail()}")
            time.sleep(0.2)


def write_marker(runner: DebeziumRunner, connection: psycopg.Connection, marker: int) -> None:
    """Write row ``marker`` of ``cdc_marker`` (again, until the connector streams: one without an initial snapshot
    sees only rows written after its slot exists) and wait until the runner produced it."""
    deadline = time.monotonic() + 180
    while True:
        connection.execute("INSERT INTO cdc_marker VALUES (%s) ON CONFLICT DO NOTHING", [marker])
        try:
            runner.wait_for_marker(marker, timeout_s=5)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            connection.execute("DELETE FROM cdc_marker WHERE id = %s", [marker])


def parse_dsn(dsn: str) -> dict[str, str]:
    """``key=value`` libpq DSN as a dict."""
    return dict(part.split("=", 1) for part in dsn.split())


def avro_format(registry_url: str | None, ca: str | Path | None = None) -> str:
    """A connector's record-format lines in a pipeline config (YAML at a connector's indent): Avro through the
    registry at ``registry_url`` (with the CA file ``ca`` for https), or none, JSON, for None."""
    if registry_url is None:
        return ""
    trust = f', ssl_ca_location: "{ca}"' if ca else ""
    return f'    format: avro\n    schema_registry: {{url: "{registry_url}"{trust}}}\n'


def run_job(config_text: str, job: str = "cdc_merge_job", run_config: Mapping[str, Any] | None = None
            ) -> ExecuteInProcessResult:
    """Run one of the project's jobs for a pipeline config, as Dagster runs it (in process)."""
    definitions = build_definitions(parse_config(config_text))
    with DagsterInstance.ephemeral() as instance:
        return definitions.resolve_job_def(job).execute_in_process(
            instance=instance, run_config=dict(run_config or {}), raise_on_error=False)


def failures(result: ExecuteInProcessResult) -> list[str]:
    """The failed steps of a run with their errors (each with its causes: Dagster wraps the op's own error)."""
    found = []
    for event in result.get_step_failure_events():
        error, messages = event.event_specific_data.error, []
        while error is not None:
            messages.append(error.message.strip())
            error = error.cause
        found.append(f"{event.step_key}: " + " <- ".join(messages))
    return found


def delta_rows(path: str | Path, storage_options: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """All rows of a Delta table (``storage_options``: the config's, for a table on object storage)."""
    return DeltaTable(str(path), storage_options=delta_rs_options(storage_options or {})).to_pyarrow_table().to_pylist()


def current_rows(path: str | Path, apply_mode: str, storage_options: Mapping[str, str] | None = None
                 ) -> list[dict[str, Any]]:
    """The rows of a Delta table that stand for live source rows in its apply mode, hidden columns dropped."""
    rows = delta_rows(path, storage_options)
    if apply_mode == "scd2":
        rows = [row for row in rows if row["_cdc_current"]]
    elif apply_mode == "soft_delete":
        rows = [row for row in rows if not row["_cdc_deleted"]]
    return [{k: v for k, v in row.items() if not k.startswith("_cdc_")} for row in rows]


def source_rows(dsn: str, query: str) -> list[dict[str, Any]]:
    """The oracle: the source database's rows."""
    with psycopg.connect(dsn) as connection, connection.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        return cursor.execute(query).fetchall()


Normaliser = Callable[[Any], Any]


def compare(expected_rows: list[dict[str, Any]], actual_rows: list[dict[str, Any]], key: tuple[str, ...],
            expected: Mapping[str, Normaliser], actual: Mapping[str, Normaliser]) -> list[str]:
    """Differences between the source's rows and a Delta table's rows, per key and column, after each
    side's normaliser (a normaliser raises ``TypeError`` for a value of the wrong type). Empty: equal."""
    problems: list[str] = []
    by_key_actual: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in actual_rows:
        row_key = tuple(row.get(k) for k in key)
        if row_key in by_key_actual:
            problems.append(f"key {row_key}: more than one row in Delta")
        by_key_actual[row_key] = row
    by_key_expected = {tuple(row[k] for k in key): row for row in expected_rows}
    for row_key in sorted(set(by_key_expected) - set(by_key_actual), key=repr):
        problems.append(f"key {row_key}: in the source, missing from Delta")
    for row_key in sorted(set(by_key_actual) - set(by_key_expected), key=repr):
        problems.append(f"key {row_key}: in Delta, not in the source: {by_key_actual[row_key]}")
    for row_key in sorted(set(by_key_expected) & set(by_key_actual), key=repr):
        source, target = by_key_expected[row_key], by_key_actual[row_key]
        for column, source_value in source.items():
            if column not in target:
                problems.append(f"key {row_key}: column {column} missing from Delta")
                continue
            want = expected.get(column, _same)(source_value) if source_value is not None else None
            try:
                got = actual.get(column, _same)(target[column]) if target[column] is not None else None
            except (TypeError, ValueError) as exc:
                got = f"<{type(target[column]).__name__} {target[column]!r}: {exc}>"
            if not _equal(want, got):
                problems.append(f"key {row_key}: {column}: source {want!r}, Delta {got!r} (raw {target[column]!r})")
    return problems


def _same(value: Any) -> Any:
    return value


def _equal(want: Any, got: Any) -> bool:
    # Same type and value: a double that arrives as text, or an int as a float, is a difference.
    return type(want) is type(got) and want == got


@dataclass(frozen=True)
class TopicRecord:
    """A record of a change-event topic: key and value as the JSON converter's payload (``value`` None for a
    tombstone), and its headers."""

    partition: int
    offset: int
    key: dict[str, Any]
    value: dict[str, Any] | None
    headers: dict[str, bytes | None]


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    """Each partition of ``topic`` and its end offset now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"ends-{time.time_ns()}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    finally:
        consumer.close()


def read_topic(bootstrap_servers: str, topic: str, decode: Callable[[bytes], bytes] | None = None
               ) -> list[TopicRecord]:
    """Every record of ``topic`` up to its current end, in (partition, offset) order; ``decode`` turns each key
    and value into the JSON converter's bytes first (an Avro topic's ``AvroRecords.to_json``)."""
    from confluent_kafka import Consumer, TopicPartition

    def payload(raw: bytes | None) -> Any:
        if raw and decode is not None:
            raw = decode(raw)
        parsed = json.loads(raw) if raw else None
        return parsed.get("payload", parsed) if isinstance(parsed, dict) and "schema" in parsed else parsed

    records: list[TopicRecord] = []
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"diagnose-{time.time_ns()}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            message = consumer.poll(10)
            if message is None:
                break
            if message.error() is not None or message.offset() >= ends[message.partition()]:
                continue
            if message.offset() == ends[message.partition()] - 1:
                remaining.discard(message.partition())
            records.append(TopicRecord(message.partition(), message.offset(), payload(message.key()) or {},
                                       payload(message.value()), dict(message.headers() or [])))
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


@dataclass(frozen=True)
class TransactionMarker:
    """A BEGIN or END of a connector's transaction topic, where it is and what it says."""

    partition: int
    offset: int
    status: str
    id: str
    event_count: int | None
    collections: dict[str, int]

    def key(self, kind: str) -> str:
        """The transaction it belongs to: PostgreSQL ids are ``txID:LSN`` with the LSN of the marker itself (a
        BEGIN's and its END's differ), so the txID; other connectors' ids are the same on BEGIN and END."""
        return self.id.split(":", 1)[0] if kind == "postgresql" else self.id


def transaction_markers(bootstrap_servers: str, topic: str, decode: Callable[[bytes], bytes] | None = None
                        ) -> list[TransactionMarker]:
    """Every marker of a transaction topic up to its current end, in (partition, offset) order."""
    return [TransactionMarker(r.partition, r.offset, r.value["status"], r.value["id"], r.value.get("event_count"),
                              {c["data_collection"]: c["event_count"] for c in r.value.get("data_collections") or []})
            for r in read_topic(bootstrap_servers, topic, decode) if r.value is not None]


def split_transactions(markers: Iterable[TransactionMarker], kind: str) -> dict[str, list[TransactionMarker]]:
    """The transactions with a BEGIN and an END, not all in one partition of the topic, with their markers (a
    transaction with no END, as MariaDB's TRUNCATE, is none of them)."""
    by_key: dict[str, list[TransactionMarker]] = {}
    for marker in markers:
        by_key.setdefault(marker.key(kind), []).append(marker)
    partitions = {key: [{m.partition for m in found if m.status == status} for status in ("BEGIN", "END")]
                  for key, found in by_key.items()}
    return {key: found for key, found in by_key.items()
            if all(partitions[key]) and len(set.union(*partitions[key])) > 1}


def reemitted_transactions(markers: Iterable[TransactionMarker], kind: str) -> dict[str, list[TransactionMarker]]:
    """The transactions with more than one BEGIN or more than one END (a connector restarted inside or just after
    them produces their markers again), with their markers in topic order per partition."""
    by_key: dict[str, list[TransactionMarker]] = {}
    for marker in markers:
        by_key.setdefault(marker.key(kind), []).append(marker)
    return {key: found for key, found in by_key.items()
            if max(sum(m.status == status for m in found) for status in ("BEGIN", "END")) > 1}


def wait_for_growth(bootstrap_servers: str, topic: str, since: Mapping[int, int], records: int = 1,
                    timeout_s: float = 60) -> None:
    """Wait until ``topic`` (which exists) holds at least ``records`` records past the end offsets ``since``: the
    connector has produced (the first of) what was written after them. Returns within a few milliseconds of their
    arrival, so that a kill right after lands before the worker stores an offset past them (it does every second)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"growth-{time.time_ns()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    try:
        consumer.assign([TopicPartition(topic, partition, offset) for partition, offset in since.items()])
        seen, deadline = 0, time.monotonic() + timeout_s
        while seen < records:
            message = consumer.poll(0.05)
            seen += message is not None and message.error() is None
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: {seen} of {records} records produced past {dict(since)} in "
                                     f"{timeout_s}s")
    finally:
        consumer.close()


def header_key(record: TopicRecord, name: str) -> Any:
    """A key Debezium put in header ``name`` (``__debezium.oldkey`` / ``__debezium.newkey``), parsed; None: absent."""
    raw = record.headers.get(name)
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
    return parsed.get("payload", parsed) if isinstance(parsed, dict) else parsed


def topic_events(bootstrap_servers: str, topic: str, keys: Iterable[tuple[Any, ...]], key_names: tuple[str, ...]
                 ) -> dict[tuple[Any, ...], list[str]]:
    """Every record of ``topic`` whose key is one of ``keys``, as ``partition:offset op lsn sequence snapshot``
    lines per key, in (partition, offset) order: says whether a difference came with Debezium's events or
    from the pipeline."""
    found: dict[tuple[Any, ...], list[str]] = {k: [] for k in keys}
    for record in read_topic(bootstrap_servers, topic):
        record_key = tuple(record.key.get(k) for k in key_names)
        if record_key not in found:
            continue
        if record.value is None:
            found[record_key].append(f"{record.partition}:{record.offset} tombstone")
            continue
        source = record.value.get("source", {})
        found[record_key].append(f"{record.partition}:{record.offset} {record.value.get('op')} "
                                 f"lsn={source.get('lsn')} seq={source.get('sequence')} "
                                 f"snapshot={source.get('snapshot')} after={record.value.get('after')}")
    return found


def assert_same_rows(dsn: str, bootstrap_servers: str, topic: str, path: str | Path, query: str,
                     expected: Mapping[str, Normaliser], actual: Mapping[str, Normaliser],
                     key: tuple[str, ...] = ("id",), apply_mode: str = "scd1", label: str = "",
                     storage_options: Mapping[str, str] | None = None) -> None:
    """The Delta table at ``path`` holds the source's rows (``query``) in its apply mode; otherwise fail with the
    differences and the topic's events of the first differing keys."""
    problems = compare(source_rows(dsn, query), current_rows(path, apply_mode, storage_options), key, expected,
                       actual)
    if problems:
        differing = [ast.literal_eval(m.group(1)) for m in map(re.compile(r"key (\(.*?,\)):").match, problems)
                     if m][:10]
        events = topic_events(bootstrap_servers, topic, differing, key)
        history = "\n".join(f"  {k}:\n    " + "\n    ".join(lines) for k, lines in events.items())
        raise AssertionError(f"{label or topic} ({apply_mode}): {summarise(problems)}\n"
                             f"the topic's events of the first differing keys:\n{history}")


def one_current_version_per_key(path: str | Path, storage_options: Mapping[str, str] | None = None
                                 ) -> dict[Any, int]:
    """The keys (``id``) of an scd2 table with more than one current version, and how many they have."""
    current: dict[Any, int] = {}
    for row in delta_rows(path, storage_options):
        current[row["id"]] = current.get(row["id"], 0) + bool(row["_cdc_current"])
    return {k: n for k, n in current.items() if n > 1}


def summarise(problems: list[str], limit: int = 25) -> str:
    """A readable failure message: per column how many rows differ, then the first differences."""
    per_column: dict[str, int] = {}
    for problem in problems:
        column = problem.split(": ")[1] if problem.count(": ") >= 2 else "rows"
        per_column[column] = per_column.get(column, 0) + 1
    head = ", ".join(f"{column}: {count}" for column, count in sorted(per_column.items()))
    return f"{len(problems)} differences ({head}):\n  " + "\n  ".join(problems[:limit])


# Normalisers: turn a value into the canonical Python value compared, refusing values of the wrong type.

def typed(kind: type | tuple[type, ...]) -> Normaliser:
    """The value itself, which must be of type ``kind``."""
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {kind}")
        return value
    return check


def decimal_value(value: Any) -> Decimal:
    """A Decimal column read exactly (a Decimal, or exact decimal text where the setting sends strings)."""
    if isinstance(value, Decimal):
        return value
    raise TypeError("expected a decimal")


def decimal_text(value: Any) -> Decimal:
    """A string column holding a decimal's exact text."""
    if not isinstance(value, str):
        raise TypeError("expected decimal text")
    return Decimal(value)


def decimal_or_text(value: Any) -> Decimal:
    """Exact as a decimal column or as exact decimal text."""
    return value if isinstance(value, Decimal) else decimal_text(value)


def as_float(value: Any) -> float:
    """A double column; the source side's decimals become the nearest double (as Java's doubleValue)."""
    if isinstance(value, Decimal):
        return float(value)
    if not isinstance(value, float):
        raise TypeError("expected a double")
    return value


def base64_bytes(value: Any) -> bytes:
    """A base64 string column, decoded."""
    if not isinstance(value, str):
        raise TypeError("expected base64 text")
    return base64.b64decode(value, validate=True)


def hex_bytes(value: Any) -> bytes:
    """A hex string column, decoded."""
    if not isinstance(value, str):
        raise TypeError("expected hex text")
    return bytes.fromhex(value)


def time_text(value: Any) -> dt.time:
    """The project's time-of-day string (``HH:mm:ss.SSSSSS``, ZonedTime with ``Z``), parsed."""
    if not isinstance(value, str):
        raise TypeError("expected time text")
    return dt.time.fromisoformat(value)


def utc_time(value: dt.time) -> dt.time:
    """A ``timetz`` in UTC."""
    moment = dt.datetime.combine(dt.date(2000, 1, 3), value.replace(tzinfo=None)) - value.utcoffset()
    return moment.time().replace(tzinfo=dt.timezone.utc)


def to_millis(value: dt.time | dt.datetime) -> dt.time | dt.datetime:
    """Truncated to milliseconds (``time.precision.mode=connect``)."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def instant(value: Any) -> dt.datetime:
    """An aware timestamp as a UTC instant."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise TypeError("expected an aware timestamp")
    return value.astimezone(dt.timezone.utc)


def naive_timestamp(value: Any) -> dt.datetime:
    """A wall-clock timestamp (timestamp_ntz)."""
    if not isinstance(value, dt.datetime) or value.tzinfo is not None:
        raise TypeError("expected a timestamp without time zone")
    return value


def interval_micros(parts: list[Decimal]) -> int:
    """Debezium's ``MicroDuration`` of an interval given as (years, months, days, hours, minutes, seconds):
    months at the average length of 365.25 / 12 days, computed in doubles as Debezium does."""
    years, months, days, hours, minutes, seconds = parts
    days_total = (int(years) * 12 + int(months)) * (365.25 / 12.0) + int(days)
    seconds_total = (((days_total * 24 + int(hours)) * 60) + int(minutes)) * 60 + float(seconds)
    return int(seconds_total * 1e6)


# How the random workloads' table (``workloads.rnd_changes``) reads back from Delta.
RND_ACTUAL: dict[str, Normaliser] = {"id": typed(int), "grp": typed(int), "name": typed(str),
                                     "amount": decimal_value, "score": as_float, "at": instant}
RND_EXPECTED: dict[str, Normaliser] = {"at": instant}


def wal_position(dsn: str) -> int:
    """The server's current WAL position as a number, as Debezium's offsets hold an LSN: every change made
    after this call has a greater LSN."""
    with psycopg.connect(dsn) as connection:
        row = connection.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def drop_replication_slots(dsn: str) -> None:
    """Drop the (inactive) replication slots of ``dsn``'s database: a slot left behind keeps its WAL."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                           "WHERE database = current_database() AND NOT active")


def converter_settings(registry_url: str) -> dict[str, str]:
    """The Avro converter settings of docs/connectors/avro.md, for the registry at ``registry_url``: what the
    suite registers is what the documentation shows."""
    text = (REPOSITORY / "docs" / "connectors" / "avro.md").read_text()
    match = re.search(r"^```json\n(.*?)^```$", text, re.M | re.S)
    assert match is not None, "docs/connectors/avro.md has no json block"
    settings: dict[str, str] = json.loads(match.group(1))
    return {key: registry_url if key.endswith(".apicurio.registry.url") else value for key, value in settings.items()}
