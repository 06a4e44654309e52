"""Conformance in Avro: the suite's PostgreSQL type and TOAST workload captured by Debezium's PostgreSQL connector on
a real Kafka Connect 4.3 worker with Apicurio's Avro converter (the Confluent wire format: magic byte, schema id,
Avro body) and a real Apicurio Registry, merged by ``cdc_merge_job`` with ``format: avro``. Every Delta table must
equal its source table (the oracle), and the same workload captured at the same time by a second connector with the
JSON converter must give the same Delta tables, hidden columns included.

The session's registry (durable storage) and Connect worker, and one pair of connector registrations, feed every
test of this module. Two private registries get the captured records written through them again: Apicurio 3.3 over
TLS with Kafka-backed storage (TLS, and a restart that loses nothing) and Apicurio 2.6 in memory (what a restart of
an in-memory registry does).
"""

from __future__ import annotations

import base64
import datetime
import io
import ipaddress
import json
import random
import re
import ssl
import struct
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_assets.core.envelope import UNDECODABLE_MEMBER, explain_bad_value
from cdc_assets.io import avro
from cdc_assets.io.avro import AvroRecords, SchemaRegistrySettings, record_decoder
from tests.support import harness as h
from tests.support import workloads as w
from tests.support.apicurio import APICURIO3_VERSION, Apicurio, AvroConnectWorker
from tests.support.harness import converter_settings
from tests.support.processes import free_port
from tests.support.workloads import ALLTYPES_QUERY, TOAST_ACTUAL, TOAST_QUERY, actual_alltypes, expected_alltypes

pytestmark = pytest.mark.conformance

SEED = 48_2026
TABLES = ("alltypes", "toast")


@dataclass
class AvroRun:
    """The captured database, and the two connectors' topic prefixes (``avro``, ``json``)."""

    dsn: str
    bootstrap_servers: str
    registry_url: str
    root: Path
    prefixes: dict[str, str]
    alltypes_ends: dict[int, int]  # the Avro leg's alltypes topic once captured: partition -> end offset

    def config(self, leg: str, registry_url: str | None = None, on_bad_event: str = "halt",
               root: Path | None = None) -> str:
        """The pipeline config of one leg: its connector's tables, in Avro or JSON (``registry_url``: another
        registry's than the run's, ``root``: another Delta root)."""
        record_format = h.avro_format(registry_url or self.registry_url if leg == "avro" else None)
        return f"""\
kafka: {{bootstrap_servers: "{self.bootstrap_servers}"}}
delta: {{root: "{root or self.root}", writer: delta-rs}}
batch: {{max_records: 300, poll_timeout_s: 5, max_batches_per_run: 200}}
connectors:
  - name: {leg}
    kind: postgresql
    topic.prefix: {self.prefixes[leg]}
{record_format}    tables:
      - {{name: public.alltypes, columns: {{c_numeric_extreme: string}}, on_bad_event: {on_bad_event}}}
      - {{name: public.toast, consistency: transaction}}
"""

    def path(self, leg: str, table: str, root: Path | None = None) -> Path:
        return (root or self.root) / self.prefixes[leg] / "public" / table


@pytest.fixture(scope="module")
def avro_run(broker: Any, postgres: Any, schema_registry: Apicurio, connect_worker: AvroConnectWorker,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[AvroRun]:
    """The workload captured once by both connectors (before capture: the snapshot; then streamed)."""
    run_id = uuid.uuid4().hex[:6]
    dsn = postgres.create_database(f"avro_{run_id}")
    run = AvroRun(dsn, broker.bootstrap_servers, schema_registry.confluent_url, tmp_path_factory.mktemp("avro-delta"),
                  {"avro": f"av{run_id}", "json": f"js{run_id}"}, {})
    rng = random.Random(SEED)
    with psycopg.connect(dsn, autocommit=True) as connection:
        alltypes_ids, next_alltypes, toast_ids = w.seed_alltypes_and_toast(connection, rng)
        names = {leg: f"{leg}-{run_id}" for leg in run.prefixes}
        tables = [f"public.{t}" for t in (*TABLES, "cdc_marker")]
        for leg, prefix in run.prefixes.items():
            converter = converter_settings(schema_registry.url) if leg == "avro" else {}
            # The transaction topic in 3 partitions, as every topic the worker creates: a PostgreSQL transaction's
            # BEGIN and END have other keys, so often other partitions (issue 58).
            connect_worker.register(names[leg], h.connect_config(prefix, h.parse_dsn(dsn), tables, **converter,
                                                                 **{"provide.transaction.metadata": "true"}))
        try:
            for name in names.values():
                connect_worker.wait_running(name)
            next_alltypes = w.alltypes_random_changes(connection, rng, alltypes_ids, next_alltypes, 40)
            next_toast = w.toast_changes(connection, rng, toast_ids, 100, 40)
            # A new column: the converter registers a new value schema (a new id) mid-stream.
            connection.execute("ALTER TABLE toast ADD COLUMN note text")
            for row_id in toast_ids[::2]:
                connection.execute("UPDATE toast SET note = %s WHERE id = %s", [f"note {row_id}", row_id])
            w.toast_changes(connection, rng, toast_ids, next_toast, 20)
            connection.execute("INSERT INTO cdc_marker VALUES (1)")
            for prefix in run.prefixes.values():
                _wait_for_topic_record(broker.bootstrap_servers, f"{prefix}.public.cdc_marker")
            run.alltypes_ends.update(h.end_offsets(broker.bootstrap_servers, f"{run.prefixes['avro']}.public.alltypes"))
        finally:
            for name in names.values():
                connect_worker.delete(name)
            h.drop_replication_slots(dsn)
    yield run


def _wait_for_topic_record(bootstrap_servers: str, topic: str, timeout_s: float = 180) -> None:
    """Wait until ``topic`` holds a record: the connector streamed every change written before it."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"marker-{time.time_ns()}"})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                metadata = consumer.list_topics(topic, timeout=5).topics[topic]
                if metadata.error is None and any(
                        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] > 0
                        for p in metadata.partitions):
                    return
            except KafkaException:
                pass
            time.sleep(0.5)
    finally:
        consumer.close()
    raise AssertionError(f"no marker record in {topic} within {timeout_s}s")


@pytest.fixture(scope="module")
def merged(avro_run: AvroRun) -> dict[str, list[str]]:
    """``cdc_merge_job`` run once per leg; each leg's failed steps."""
    return {leg: h.failures(h.run_job(avro_run.config(leg))) for leg in avro_run.prefixes}


def _assert_equal(run: AvroRun, table: str, query: str, expected: dict[str, h.Normaliser],
                  actual: dict[str, h.Normaliser], path: Path | None = None) -> None:
    """The Delta table (the Avro leg's, or the one at ``path``) equals the source table."""
    path = path or run.path("avro", table)
    problems = h.compare(h.source_rows(run.dsn, query), h.current_rows(path, "scd1"), ("id",), expected, actual)
    assert not problems, f"{path}: {h.summarise(problems)}"


def test_every_type_in_avro_equals_the_source(avro_run, merged):
    """Numeric with scale, unconstrained numeric (VariableScaleDecimal), money, date, time, timetz, timestamp,
    timestamptz, interval, uuid, json, jsonb, enum, bytea, arrays: the Avro leg's table equals the source."""
    assert not merged["avro"], merged["avro"]
    _assert_equal(avro_run, "alltypes", ALLTYPES_QUERY, expected_alltypes("adaptive", "precise"),
                  actual_alltypes("precise", "bytes"))


def test_toast_placeholders_in_avro_keep_unchanged_columns(avro_run, merged):
    """Updates that leave TOASTed columns out carry Debezium's placeholder (text, bytes, json, arrays in Avro):
    the column keeps the value the table holds. The table applies whole transactions only, read from the
    connector's transaction topic (3 partitions), in Avro too."""
    assert not merged["avro"], merged["avro"]
    _assert_equal(avro_run, "toast", TOAST_QUERY, {}, TOAST_ACTUAL)
    log = avro_run.root / "_cdc_assets" / "transactions" / f"{avro_run.prefixes['avro']}.transaction"
    assert h.delta_rows(log), "no transaction of the Avro transaction topic was ingested"
    # Its transaction topic has 3 partitions, a BEGIN and its END in different ones for some transactions.
    topic = f"{avro_run.prefixes['avro']}.transaction"
    assert len(h.end_offsets(avro_run.bootstrap_servers, topic)) == 3
    to_json = AvroRecords(SchemaRegistrySettings(avro_run.registry_url)).to_json
    assert h.split_transactions(h.transaction_markers(avro_run.bootstrap_servers, topic, to_json), "postgresql")


# Each connector has its own slot and snapshot: their events' source times and LSN sequences differ.
_OWN_TO_EACH_CONNECTOR = ("_cdc_position", "_cdc_source_ts")


@pytest.mark.parametrize("table", TABLES)
def test_avro_and_json_give_the_same_delta_table(avro_run, merged, table):
    """The same changes, through the JSON converter and through the Avro converter: the same rows, every
    column the same value of the same type, the last op included."""
    assert not merged["avro"] and not merged["json"], merged
    avro_rows, json_rows = ([{k: v for k, v in row.items() if k not in _OWN_TO_EACH_CONNECTOR}
                             for row in h.delta_rows(avro_run.path(leg, table))] for leg in ("avro", "json"))
    assert len(avro_rows) == len(json_rows) > 0
    by_id = {row["id"]: row for row in json_rows}
    differences = [f"id {row['id']}: {column}: avro {value!r}, json {other!r}"
                   for row in avro_rows for column, value in row.items()
                   if type(other := by_id.get(row["id"], {}).get(column)) is not type(value) or other != value]
    assert not differences, h.summarise(differences)


def test_a_column_added_mid_stream_comes_with_its_new_schema_id(avro_run, merged, schema_registry):
    """``ALTER TABLE ... ADD COLUMN``: the converter registers the value schema again (a new id); the column
    is added to the table and holds the source's values."""
    assert not merged["avro"], merged["avro"]
    subject = f"{avro_run.prefixes['avro']}.public.toast-value"
    with urllib.request.urlopen(f"{schema_registry.confluent_url}/subjects/{subject}/versions") as answer:
        assert len(json.load(answer)) >= 2
    _assert_equal(avro_run, "toast", "SELECT id, note FROM toast", {}, {"id": h.typed(int), "note": h.typed(str)})


def test_an_unreachable_registry_halts_even_a_dead_lettering_table(avro_run, merged, tmp_path):
    """No registry at the configured address: the batch halts with an error naming the address, topic,
    partition, offset and schema id, and nothing is dead-lettered (an outage is not a bad event)."""
    assert not merged["avro"], merged["avro"]
    nowhere = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    failed = h.failures(h.run_job(avro_run.config("avro", nowhere, "dead_letter", tmp_path)))
    assert failed and all(f"cannot reach the schema registry at {nowhere} for schema id" in f for f in failed), failed
    assert re.search(rf"{avro_run.prefixes['avro']}\.public\.\w+\[\d\] at offset \d+", failed[0]), failed
    assert not (tmp_path / "_cdc_assets" / "dead_letter").exists()


@pytest.fixture
def fresh_schema_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process's view of the registries for one test: ``record_decoder``'s shared schemas emptied."""
    monkeypatch.setattr(avro, "_SHARED", {})


def _registry_contents(registry: Apicurio, ca: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every subject of ``registry`` (an https one's certificate checked with ``ca``) with each of its versions' id
    and schema."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None

    def answer(path: str) -> Any:
        with urllib.request.urlopen(f"{registry.confluent_url}/{path}", timeout=30, context=context) as reply:
            return json.load(reply)

    return {subject: [answer(f"subjects/{subject}/versions/{version}")
                      for version in answer(f"subjects/{subject}/versions")] for subject in answer("subjects")}


def test_a_registry_restart_with_durable_storage_loses_nothing(avro_run, merged, schema_registry, fresh_schema_cache,
                                                               tmp_path):
    """The session's registry keeps its schemas on disk (as production keeps them durably): restarted after the
    workload was captured, it gives a fresh process every schema again, whose merge into new Delta tables equals the
    source; and it answers every subject, version and id as before."""
    assert not merged["avro"], merged["avro"]
    before = _registry_contents(schema_registry)
    assert any(subject.startswith(avro_run.prefixes["avro"]) for subject in before), before
    schema_registry.restart()
    assert not h.failures(h.run_job(avro_run.config("avro", root=tmp_path)))
    _assert_equal(avro_run, "alltypes", ALLTYPES_QUERY, expected_alltypes("adaptive", "precise"),
                  actual_alltypes("precise", "bytes"), avro_run.path("avro", "alltypes", tmp_path))
    _assert_equal(avro_run, "toast", TOAST_QUERY, {}, TOAST_ACTUAL, avro_run.path("avro", "toast", tmp_path))
    assert _registry_contents(schema_registry) == before


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signs for 127.0.0.1 (PEM files): the CA's, the server's and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                    signer: ec.EllipticCurvePrivateKey, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("cdc-assets test CA", ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                                                 "cdc-assets test CA")]), ca_key, True)
    server = certificate("127.0.0.1", server_key, ca.subject, ca_key, False)
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


@dataclass
class PrivateRegistry:
    """A private Apicurio Registry, and the CA of its certificate when it is https only."""

    server: Apicurio
    ca: Path | None = None

    def settings(self) -> SchemaRegistrySettings:
        return SchemaRegistrySettings(self.server.confluent_url, ssl_ca_location=str(self.ca) if self.ca else None)

    def yaml(self) -> str:
        """A pipeline config's record-format lines reading Avro through it, with its CA."""
        return h.avro_format(self.server.confluent_url, self.ca)


@pytest.fixture(scope="module")
def kafkasql_registry(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRegistry]:
    """Apicurio 3.3, https only, its schemas in a journal topic on the session broker (one registry for the TLS
    and the Kafka-backed restart tests: each start costs half a minute)."""
    ca, certificate, key = _certificates(tmp_path_factory.mktemp("registry-tls"))
    with Apicurio(storage="kafkasql", tls=(certificate, key), version=APICURIO3_VERSION,
                  bootstrap_servers=broker.bootstrap_servers) as server:
        yield PrivateRegistry(server, ca)


@pytest.fixture
def memory_registry() -> Iterator[PrivateRegistry]:
    """Apicurio 2.6 (it starts faster than 3.3) with in-memory storage, plain HTTP."""
    with Apicurio(storage="memory") as server:
        yield PrivateRegistry(server)


Copied = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


def _written_through(run: AvroRun, registry: PrivateRegistry, prefix: str) -> list[Copied]:
    """The Avro leg's captured ``alltypes`` records written again through ``registry``, as its converter would have
    written them: each schema registered there under the new topic's subjects, the record framed with the id it
    gets. Produced to a new topic ``<prefix>.public.alltypes`` (same partitions, same order); returns them with
    their offsets there."""
    source, target = f"{run.prefixes['avro']}.public.alltypes", f"{prefix}.public.alltypes"
    session = SchemaRegistryClient({"url": run.registry_url})
    private = SchemaRegistryClient({"url": registry.server.confluent_url,
                                    **({"ssl.ca.location": str(registry.ca)} if registry.ca else {})})
    ids: dict[tuple[str, int], int] = {}

    def reframed(data: bytes | None, part: str) -> bytes | None:
        if data is None:
            return None
        schema_id = struct.unpack_from(">bI", data)[1]
        if (part, schema_id) not in ids:
            ids[part, schema_id] = private.register_schema(f"{target}-{part}", session.get_schema(schema_id))
        return struct.pack(">bI", 0, ids[part, schema_id]) + data[5:]

    consumer = Consumer({"bootstrap.servers": run.bootstrap_servers, "group.id": f"copy-{time.time_ns()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(source, partition, 0) for partition in run.alltypes_ends])
    records: list[Copied] = []
    written: dict[int, int] = {}  # records per partition of the copy so far: the next one's offset
    remaining = {p: end for p, end in run.alltypes_ends.items() if end > 0}
    try:
        while remaining:
            message = consumer.poll(10)
            assert message is not None, f"{source}: nothing more to read before {remaining}"
            partition, offset = message.partition(), message.offset()
            if message.error() is not None or partition is None or offset is None or offset >= remaining.get(
                    partition, -1):
                continue
            records.append((partition, written.get(partition, 0), reframed(message.key(), "key"),
                            reframed(message.value(), "value")))
            written[partition] = written.get(partition, 0) + 1
            if offset + 1 >= remaining[partition]:
                del remaining[partition]
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": run.bootstrap_servers})
    topic = NewTopic(target, num_partitions=len(run.alltypes_ends), replication_factor=1)
    admin.create_topics([topic])[target].result()
    producer = Producer({"bootstrap.servers": run.bootstrap_servers})
    failed: list[str] = []
    for partition, _, key, value in records:
        producer.produce(target, key=key, value=value, partition=partition,
                         on_delivery=lambda error, _: failed.append(str(error)) if error else None)
    assert producer.flush(30) == 0 and not failed, failed
    return records


def _alltypes_config(run: AvroRun, prefix: str, registry: str, root: Path, on_bad_event: str = "halt",
                     declared: str = "") -> str:
    """A pipeline config of ``<prefix>.public.alltypes`` alone, read as ``registry`` says (``h.avro_format``'s
    lines); ``declared``: more of the table's settings (e.g. ``key_columns: [id], ``)."""
    return f"""\
kafka: {{bootstrap_servers: "{run.bootstrap_servers}"}}
delta: {{root: "{root}", writer: delta-rs}}
batch: {{max_records: 300, poll_timeout_s: 5, max_batches_per_run: 200}}
connectors:
  - name: copy
    kind: postgresql
    topic.prefix: {prefix}
{registry}    tables:
      - {{name: public.alltypes, {declared}columns: {{c_numeric_extreme: string}}, on_bad_event: {on_bad_event}}}
"""


def test_a_registry_over_tls_is_read_with_its_ca(avro_run, merged, kafkasql_registry, tmp_path):
    """An https-only registry whose certificate a CA of the test signed: with ``ssl_ca_location`` the records
    written through it decode and the table equals the source; without it the batch halts naming the registry
    and the certificate failure, nothing applied."""
    assert not merged["avro"], merged["avro"]
    prefix = f"tls{uuid.uuid4().hex[:6]}"
    _written_through(avro_run, kafkasql_registry, prefix)
    url = kafkasql_registry.server.confluent_url
    assert url.startswith("https://")
    failed = h.failures(h.run_job(_alltypes_config(avro_run, prefix, h.avro_format(url), tmp_path)))
    assert len(failed) == 1 and f"cannot reach the schema registry at {url} for schema id" in failed[0], failed
    assert "CERTIFICATE_VERIFY_FAILED" in failed[0], failed
    table = tmp_path / prefix / "public" / "alltypes"
    assert not table.exists()

    assert not h.failures(h.run_job(_alltypes_config(avro_run, prefix, kafkasql_registry.yaml(), tmp_path)))
    _assert_equal(avro_run, "alltypes", ALLTYPES_QUERY, expected_alltypes("adaptive", "precise"),
                  actual_alltypes("precise", "bytes"), table)


def test_a_registry_restart_with_kafka_backed_storage_loses_nothing(avro_run, merged, kafkasql_registry, broker,
                                                                    fresh_schema_cache, tmp_path):
    """Apicurio 3.3 keeping its schemas in a Kafka topic (``kafkasql``), the captured records written through it:
    a fresh process merges them into a table equal to the source; the registry restarted (it reads its journal
    topic back), another fresh process reads every record as before and merges them into a table equal to the
    source again, and the registry answers every subject, version and id as before."""
    assert not merged["avro"], merged["avro"]
    prefix = f"ksql{uuid.uuid4().hex[:6]}"
    records = _written_through(avro_run, kafkasql_registry, prefix)
    decoded = [AvroRecords(kafkasql_registry.settings()).to_json(part) for *_, key, value in records
               for part in (key, value) if part is not None]
    assert decoded and all(decoded)
    journal = f"{kafkasql_registry.server.journal}-journal"
    assert any(h.end_offsets(broker.bootstrap_servers, journal).values()), f"no schema in {journal}"
    before = _registry_contents(kafkasql_registry.server, kafkasql_registry.ca)
    assert any(subject.startswith(prefix) for subject in before), before
    for run, table in enumerate(("before", "after")):
        if run:
            kafkasql_registry.server.restart()
            avro._SHARED.clear()  # the merge after the restart is a fresh process's too: no schema cached
            assert [AvroRecords(kafkasql_registry.settings()).to_json(part) for *_, key, value in records
                    for part in (key, value) if part is not None] == decoded
        root = tmp_path / table
        assert not h.failures(h.run_job(_alltypes_config(avro_run, prefix, kafkasql_registry.yaml(), root)))
        _assert_equal(avro_run, "alltypes", ALLTYPES_QUERY, expected_alltypes("adaptive", "precise"),
                      actual_alltypes("precise", "bytes"), root / prefix / "public" / "alltypes")
    assert _registry_contents(kafkasql_registry.server, kafkasql_registry.ca) == before


def test_an_in_memory_registry_restarted_cannot_decode_and_says_why(avro_run, merged, memory_registry,
                                                                     fresh_schema_cache, tmp_path):
    """Records written through a registry with in-memory storage, which then restarts: their ids are gone, so the
    batch halts saying the registry lost them and why. With ``on_bad_event: dead_letter`` it halts so too while the
    table has nothing to be created from (no key readable); with its key columns declared, every one of them is
    dead-lettered with that reason and its bytes as they were in Kafka (none dropped)."""
    assert not merged["avro"], merged["avro"]
    prefix = f"mem{uuid.uuid4().hex[:6]}"
    records = _written_through(avro_run, memory_registry, prefix)
    decoder = AvroRecords(memory_registry.settings())
    assert all(decoder.to_json(value) for *_, value in records if value is not None)  # readable before the restart
    memory_registry.server.restart()
    url = memory_registry.server.confluent_url
    registry = memory_registry.yaml()
    failed = h.failures(h.run_job(_alltypes_config(avro_run, prefix, registry, tmp_path)))
    assert len(failed) == 1 and f"is unknown to the schema registry at {url}" in failed[0], failed
    assert "forgets them when it restarts" in failed[0], failed
    assert re.search(rf"{prefix}\.public\.alltypes\[\d\] at offset \d+", failed[0]), failed
    assert not (tmp_path / prefix / "public" / "alltypes").exists()

    failed = h.failures(h.run_job(_alltypes_config(avro_run, prefix, registry, tmp_path, "dead_letter")))
    assert len(failed) == 1 and "set key_columns for this table (sampled events cannot be read" in failed[0], failed
    assert "forgets them when it restarts" in failed[0], failed
    assert not (tmp_path / "_cdc_assets" / "dead_letter").exists()

    declared = _alltypes_config(avro_run, prefix, registry, tmp_path, "dead_letter", "key_columns: [id], ")
    assert not h.failures(h.run_job(declared))
    letters = h.delta_rows(tmp_path / "_cdc_assets" / "dead_letter")
    events = {(partition, offset): (key, value) for partition, offset, key, value in records if value is not None}
    assert {(letter["partition"], letter["offset"]): (letter["key"], letter["value"]) for letter in letters} == events
    assert all("forgets them when it restarts" in letter["error"] for letter in letters)


def test_an_unknown_schema_id_halts_naming_topic_partition_offset_and_id(avro_run, merged):
    """A record whose schema id the registry does not know is a bad event: the batch halts, nothing committed,
    the error names topic, partition, offset and the id."""
    assert not merged["avro"], merged["avro"]
    topic = f"{avro_run.prefixes['avro']}.public.alltypes"
    producer = Producer({"bootstrap.servers": avro_run.bootstrap_servers})
    producer.produce(topic, value=struct.pack(">bI", 0, 987_654) + b"\x02", key=None, partition=0)
    producer.flush(30)
    before = len(h.delta_rows(avro_run.path("avro", "alltypes")))
    failed = h.failures(h.run_job(avro_run.config("avro")))
    assert len(failed) == 1 and "schema id 987654 is unknown to the schema registry" in failed[0], failed
    assert f"{topic}[0] at offset" in failed[0], failed
    assert len(h.delta_rows(avro_run.path("avro", "alltypes"))) == before

    # With on_bad_event: dead_letter the rest is applied and the record kept, its raw bytes and the reason.
    assert not h.failures(h.run_job(avro_run.config("avro", on_bad_event="dead_letter")))
    (letter,) = h.delta_rows(avro_run.root / "_cdc_assets" / "dead_letter")
    assert letter["topic"] == topic and letter["partition"] == 0
    assert "schema id 987654 is unknown to the schema registry" in letter["error"]
    assert "forgets them when it restarts" in letter["error"]  # why, for the registry that lost its schemas
    assert f"{topic}[0] at offset {letter['offset']}" in letter["error"]
    assert (letter["key"], letter["value"]) == (None, struct.pack(">bI", 0, 987_654) + b"\x02")  # as in Kafka


def test_records_read_as_the_json_converter_writes_them(schema_registry):
    """The Avro rule alone against the registry: the JSON converter's encodings, and every record it cannot read
    a bad event whose value names topic, partition, offset and why (a bad key makes its event bad too)."""
    client = SchemaRegistryClient({"url": schema_registry.confluent_url})
    value_schema = {"type": "record", "name": "Value", "namespace": "t", "connect.name": "t.Value", "fields": [
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2,
                                   "connect.name": "org.apache.kafka.connect.data.Decimal",
                                   "connect.parameters": {"scale": "2", "connect.decimal.precision": "6"}}},
        {"name": "ratio", "type": ["null", "float"], "default": None},
        {"name": "raw", "type": ["null", "bytes"], "default": None},
        {"name": "name", "type": ["null", "string"], "default": None}]}
    value_id = client.register_schema("t-value", Schema(json.dumps(value_schema), "AVRO"))
    key_id = client.register_schema("t-key", Schema(json.dumps(
        {"type": "record", "name": "Key", "namespace": "t", "fields": [{"name": "id", "type": "int"}]}), "AVRO"))

    def wire(schema_id: int, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(schema), datum)
        return struct.pack(">bI", 0, schema_id) + body.getvalue()

    value = wire(value_id, value_schema, {"price": Decimal("-12.34"), "ratio": 0.1, "raw": b"\x00\xff",
                                          "name": "caf\u00e9 \u2603"})
    key = wire(key_id, {"type": "record", "name": "Key", "namespace": "t", "fields": [{"name": "id", "type": "int"}]},
               {"id": 7})
    records = pa.table({"partition": pa.array([0, 0, 1, 1, 2], pa.int32()), "offset": pa.array([5, 6, 7, 8, 9]),
                        "key": pa.array([key, key, b"\x01oops", key, key], pa.binary()),
                        "value": pa.array([value, None, value, b'{"op":"c"}', value[:6]], pa.binary())})
    decoded = record_decoder(SchemaRegistrySettings(schema_registry.confluent_url))("t", records)  # type: ignore[misc]
    keys, values = decoded["key"].to_pylist(), decoded["value"].to_pylist()
    assert json.loads(keys[0]) == {"schema": {"type": "struct", "optional": False, "name": "t.Key", "fields": [
        {"type": "int32", "optional": False, "field": "id"}]}, "payload": {"id": 7}}
    text = values[0].decode()
    assert '"name":"café ☃"' in text  # UTF-8 as the JSON converter writes it: a placeholder is found in the bytes
    payload = json.loads(text)["payload"]
    # The unscaled value -1234 big-endian, the float's shortest 32-bit text, bytes as base64.
    assert payload == {"price": base64.b64encode((-1234).to_bytes(2, "big", signed=True)).decode(), "ratio": 0.1,
                       "raw": "AP8=", "name": "café ☃"}
    assert values[1] is None  # a tombstone stays one
    reasons = [json.loads(v)[UNDECODABLE_MEMBER] for v in (values[2], values[3], values[4])]
    assert reasons[0].startswith("Avro key of t[1] at offset 7: not the Confluent wire format")
    assert reasons[1].startswith("Avro value of t[1] at offset 8: not the Confluent wire format")
    assert reasons[2].startswith(f"Avro value of t[2] at offset 9: Avro body does not fit schema id {value_id}")
    assert explain_bad_value(values[4], "no op") == reasons[2]

