"""W1 in Avro beside W1 in JSON: what reading the Confluent wire format (``cdc_assets.io.avro``) costs a merge.

Produces the same W1 events (``benchmarks.merge_throughput.generate``: Debezium PostgreSQL events over a key
space, ~80% updates, ~10% creates, ~10% deletes each followed by a tombstone, 3 partitions) into three topics of
a local broker: as W1 has them (the JSON converter without schemas), with the JSON converter's schemas (the form
the Avro records are turned into), and in Avro (magic byte, schema id, body; the key and value schemas
registered in a private Apicurio Registry, ``tests/support/apicurio.py``: run ``scripts/setup-tests`` first). Then runs
the project's ``cdc_merge_job`` on each topic, round after round, each run in a fresh process on the warm local
Spark server (warmed by runs first, not measured), and prints the medians of the first poll to the last commit,
events/s, the CPU seconds of the run's process and of the Spark server, and each as a ratio to the JSON-with-
schemas run measured in the same rounds. Every table is checked against the reference fold.

The decode level (issue 48: why the Avro decode is not Spark's ``from_avro``) reads the same topics batch by batch
to the decoded change-event columns, each variant in a fresh process on one warm Spark server that also has Spark's
Avro data source (``spark-avro``, fetched from Maven Central once): the project's Avro path (fastavro to the JSON
converter's form in the run's process, then Spark's JSON decode), JSON with schemas (Spark's JSON decode alone),
and ``from_avro`` (the raw records handed to Spark as Parquet files, the 5-byte wire header stripped,
``from_avro(body, <writer schema>)`` once per schema id, then the same columns taken from its struct). Each batch's
decoded columns are materialized by one aggregate over all of them (a count and XORs of row hashes), which must
agree across the variants. What the ``from_avro`` variant leaves out, and the project's path does:
``decode_rows``' docstring.

    python -m benchmarks.avro_decode [--events 300000] [--keys 30000] [--batch 100000] [--runs 3]
                                     [--levels merge,decode]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from deltalake import DeltaTable

from benchmarks.measure import process_cpu, run_cpu, server_cpu
from benchmarks.merge_throughput import checksum, generate, produce
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers, stop_all

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VARIANTS = {"json": "bjson", "json_schemas": "bschema", "avro": "bavro"}  # variant -> topic prefix
BASELINE = "json_schemas"
# The decode level's variants -> topic prefix: from_avro reads the Avro topic.
DECODE_VARIANTS = {"json_schemas": "bschema", "avro": "bavro", "from_avro": "bavro"}
SPARK_AVRO_JARS = Path(sys.prefix) / "share" / "cdc-assets" / "spark-avro-jars"


def _optional(connect_type: str, field: str, name: str | None = None) -> dict[str, Any]:
    return {"type": connect_type, "optional": True, "field": field, **({"name": name} if name else {})}


ROW = {"type": "struct", "optional": True, "name": "PREFIX.public.accounts.Value", "fields": [
    {"type": "int64", "optional": False, "field": "id"}, _optional("int64", "balance"), _optional("string", "owner"),
    _optional("string", "status"), _optional("int64", "seq")]}
SOURCE = {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source",
          "fields": [{"type": "string", "optional": False, "field": f} for f in ("version", "connector", "name")]
          + [{"type": "int64", "optional": False, "field": "ts_ms"},
             {"type": "string", "optional": True, "field": "snapshot", "name": "io.debezium.data.Enum",
              "parameters": {"allowed": "true,last,false,incremental"}}]
          + [{"type": "string", "optional": False, "field": f} for f in ("db", "schema", "table")]
          + [_optional("int64", f) for f in ("txId", "lsn", "xmin")]}
ENVELOPE = {"type": "struct", "optional": False, "name": "PREFIX.public.accounts.Envelope", "version": 2, "fields": [
    {**ROW, "field": "before"}, {**ROW, "field": "after"}, SOURCE, {"type": "string", "optional": False, "field": "op"},
    _optional("int64", "ts_ms"),
    {"type": "struct", "optional": True, "name": "event.block", "version": 1, "field": "transaction", "fields": [
        {"type": "string", "optional": False, "field": "id"}, {"type": "int64", "optional": False,
                                                               "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"}]}]}
KEY = {"type": "struct", "optional": False, "name": "PREFIX.public.accounts.Key",
       "fields": [{"type": "int64", "optional": False, "field": "id"}]}
_AVRO_TYPES = {"int64": "long", "int32": "int", "string": "string", "boolean": "boolean", "double": "double"}


def avro_schema(connect: dict[str, Any], defined: set[str] | None = None) -> Any:
    """The Avro schema Kafka Connect's AvroData writes for a Connect schema (records named by it, optional
    fields as unions with null, a record's second use by its name)."""
    defined = set() if defined is None else defined
    if connect["type"] == "struct":
        name = connect["name"]
        if name in defined:
            body: Any = name
        else:
            defined.add(name)
            namespace, _, short = name.rpartition(".")
            body = {"type": "record", "name": short, "namespace": namespace, "connect.name": name,
                    "fields": [{"name": f["field"], "type": avro_schema(f, defined),
                                **({"default": None} if f.get("optional") else {})} for f in connect["fields"]]}
            if "version" in connect:
                body["connect.version"] = connect["version"]
    else:
        body = {"type": _AVRO_TYPES[connect["type"]]}
        if "name" in connect:
            body["connect.name"] = connect["name"]
        if "parameters" in connect:
            body["connect.parameters"] = connect["parameters"]
    return ["null", body] if connect.get("optional") else body


def _named(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    return json.loads(json.dumps(schema).replace("PREFIX", prefix))


def encode(records: list[tuple[bytes, bytes | None]], variant: str, registry_url: str
           ) -> list[tuple[bytes, bytes | None]]:
    """W1's records as ``variant`` writes them."""
    prefix = VARIANTS[variant]
    if variant == "json":
        return records
    key_schema, value_schema = _named(KEY, prefix), _named(ENVELOPE, prefix)
    if variant == "json_schemas":
        key_opening = b'{"schema":' + json.dumps(key_schema).encode() + b',"payload":'
        value_opening = b'{"schema":' + json.dumps(value_schema).encode() + b',"payload":'
        return [(key_opening + key + b"}", None if value is None else value_opening + value + b"}")
                for key, value in records]
    client = SchemaRegistryClient({"url": registry_url})
    topic = f"{prefix}.public.accounts"
    writers = []
    for side, connect in (("key", key_schema), ("value", value_schema)):
        avro = avro_schema(connect)
        schema_id = client.register_schema(f"{topic}-{side}", Schema(json.dumps(avro), "AVRO"))
        writers.append((struct.pack(">bI", 0, schema_id), fastavro.parse_schema(avro)))

    def to_avro(data: bytes, header: bytes, parsed: Any) -> bytes:
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, parsed, json.loads(data))
        return out.getvalue()

    return [(to_avro(key, *writers[0]), None if value is None else to_avro(value, *writers[1]))
            for key, value in records]


CONFIG = """
kafka: {{bootstrap_servers: "{bootstrap}", group_id: bench}}
delta: {{root: "{root}", writer: delta-rs}}
batch: {{max_records: {batch}, max_batches_per_run: 1000}}
connectors:
  - name: bench
    kind: postgresql
    topic.prefix: {prefix}
{record_format}    tables:
      - name: public.accounts
"""


def child(variant: str, bootstrap: str, registry_url: str, batch: int, root: str) -> None:
    """One ``cdc_merge_job`` run of ``variant``'s topic in this fresh process; prints one ``RESULT {json}`` line."""
    from dagster import DagsterInstance

    from cdc_assets.config import parse_config
    from cdc_assets.definitions import build_definitions

    record_format = f'    format: avro\n    schema_registry: {{url: "{registry_url}"}}\n' if variant == "avro" else ""
    config = parse_config(CONFIG.format(bootstrap=bootstrap, root=root, batch=batch, prefix=VARIANTS[variant],
                                        record_format=record_format))
    job = build_definitions(config).resolve_job_def("cdc_merge_job")
    instance = DagsterInstance.ephemeral()
    startup_cpu = process_cpu(os.getpid())
    result = job.execute_in_process(instance=instance)
    if not result.success:
        raise SystemExit(f"cdc_merge_job failed on {variant}")
    (event,) = result.get_asset_materialization_events()
    metadata = event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
    stages: dict[str, float] = dict(metadata["stage_seconds"].value)  # type: ignore[arg-type]
    table = DeltaTable(f"{root}/{VARIANTS[variant]}/public/accounts")
    rows = table.to_pyarrow_table(columns=["id", "balance", "owner", "status", "seq"]).to_pylist()
    print("RESULT " + json.dumps({"stages": stages, "run_cpu": run_cpu() - startup_cpu, "rows": len(rows),
                                  "checksum": checksum(rows)}), flush=True)
    os._exit(0)  # native threads (delta-rs, librdkafka) can abort the interpreter's teardown


def _child_result(what: str, *args: str) -> dict[str, Any]:
    """This module run with ``args`` in a fresh process: its ``RESULT``, with the Spark server's CPU seconds."""
    servers = [state["pid"] for _, state in running_servers()]
    before = server_cpu(servers)["server"]
    done = subprocess.run([sys.executable, "-m", "benchmarks.avro_decode", *args],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    servers = servers or [state["pid"] for _, state in running_servers()]
    result["server_cpu"] = server_cpu(servers)["server"] - before
    return result


def run_child(variant: str, bootstrap: str, registry_url: str, batch: int, root: Path,
              oracle: tuple[int, str]) -> dict[str, Any]:
    """One run in a fresh process, checked against the oracle, with the Spark server's CPU seconds."""
    result = _child_result(variant, "--child", variant, "--bootstrap", bootstrap, "--registry", registry_url,
                           "--batch", str(batch), "--root", str(root))
    if (result["rows"], result["checksum"]) != oracle:
        raise SystemExit(f"{variant}: the table does not match the oracle ({result['rows']} rows, "
                         f"expected {oracle[0]})")
    return result


def spark_avro_jars() -> list[str]:
    """Spark's Avro data source for this pyspark (``from_avro``), fetched from Maven Central into this
    installation on first use, as ``scripts/setup`` fetches Spark's Kafka connector: the one jar, since
    the pyspark distribution ships Avro itself. Only this benchmark's decode server gets it."""
    import pyspark

    jar = SPARK_AVRO_JARS / f"spark-avro_2.13-{pyspark.__version__}.jar"
    if not jar.exists():
        print(f"fetching Spark's Avro data source {pyspark.__version__} into {SPARK_AVRO_JARS}", flush=True)
        subprocess.run(["mvn", "-B", "-q", "-Dstyle.color=never", "dependency:copy",
                        f"-Dartifact=org.apache.spark:spark-avro_2.13:{pyspark.__version__}",
                        f"-DoutputDirectory={SPARK_AVRO_JARS}"], check=True, stdout=sys.stderr)
    return [str(jar)]


def decode_settings() -> dict[str, str]:
    """The decode level's Spark server: the pipeline's local server settings plus ``spark-avro`` (a server of
    its own: its settings differ), so that every decode variant runs on the same server."""
    from cdc_assets.io.spark import spark_config

    settings = spark_config()
    settings["spark.jars"] = ",".join(filter(None, [settings.get("spark.jars", ""), *spark_avro_jars()]))
    return settings


def _record_fields(schema: dict[str, Any], field: str | None = None) -> list[str]:
    """The field names of an Avro record schema (a key's), or of the record its ``field`` holds where that is
    defined (an envelope's row record, at ``before``: ``after`` names it)."""
    if field is not None:
        (held,) = (f["type"] for f in schema["fields"] if f["name"] == field)
        (schema,) = [branch for branch in held if branch != "null"] if isinstance(held, list) else [held]
    return [f["name"] for f in schema["fields"]]


def decode_rows(spark: SparkSession, records: pa.Table, writer_schemas: dict[bytes, str], scratch: Path
                ) -> DataFrame:
    """The decoded change-event columns of Avro ``records`` (wire format; ``writer_schemas``: each wire header's
    writer schema) by Spark's ``from_avro``: the raw records handed to Spark as Parquet files in ``scratch``
    (which must outlive the frame), one per core, as the local hand-over writes JSON text files, per pair of
    key and value schema ids (one query branch each) the bodies after the 5-byte header decoded with their
    writer schemas, the columns taken from the structs as ``core.envelope.decode_change_events`` names them
    (a key column from the key where the row image lacks it: a delete's). Not ``createDataFrame``: it puts
    the records in the plan, and Spark's optimizer (``ConvertToLocalRelation``) then runs the whole decode in
    the driver, interpreted, while it plans the query (a 100,000-record batch filled the server's heap).

    What this leaves out, which the project's path does (so the comparison flatters ``from_avro``): Debezium's
    semantic types (Decimal, VariableScaleDecimal, Date, Time, MicroTimestamp, ZonedTimestamp, Json, Enum
    parameters...) stay Avro's physical values (W1 has only int64 and strings, which need none of it); no
    unavailable-value placeholders are tested; no layout is derived (the row columns are the writer schema's,
    not merged with the table's Delta schema or config); no per-event ``_cdc_error`` (a body that does not fit
    its schema fails the whole query, ``from_avro``'s FAILFAST mode, instead of a bad event naming topic,
    partition and offset); the source's position fields are cast to text, as the JSON path reads them, for
    ``core.position.event_position``."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from cdc_assets.core.envelope import (
        OFFSET_COLUMN,
        PARTITION_COLUMN,
        SNAPSHOT_COLUMN,
        TRANSACTION_COLUMN,
        source_type,
    )
    from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN
    from cdc_assets.core.position import event_position

    pairs = pc.unique(pc.binary_join_element_wise(pc.binary_slice(records["key"], 0, 5),
                                                  pc.binary_slice(records["value"], 0, 5), b"")).to_pylist()
    parts = os.cpu_count() or 2
    per_part = -(-records.num_rows // parts)
    for index in range(parts):
        pq.write_table(records.select(["partition", "offset", "key", "value"]).slice(index * per_part, per_part),
                       scratch / f"part-{index}.parquet", compression="none")
    frame = spark.read.parquet(str(scratch))
    branches = []
    for pair in pairs:
        key_header, value_header = pair[:5], pair[5:]
        value_schema, key_schema = json.loads(writer_schemas[value_header]), json.loads(writer_schemas[key_header])
        value, key = F.col("v"), F.col("k")
        source = value["source"]
        own = set(_record_fields(value_schema, "source"))
        position_source = F.struct(*[(source[name] if name in own else F.lit(None)).cast("string").alias(name)
                                     for name in source_type("postgresql").names])
        image = F.when(value["op"] == "d", value["before"]).otherwise(value["after"])
        key_fields = set(_record_fields(key_schema))
        row = [(F.coalesce(F.col("_image")[name], key[name]) if name in key_fields else F.col("_image")[name])
               .alias(name) for name in _record_fields(value_schema, "before")]

        def body(column: str) -> Any:
            return F.substring(F.col(column), 6, 1 << 30)  # after the magic byte and the 4-byte schema id

        branches.append(
            frame.where((F.substring("key", 1, 5) == F.lit(key_header))
                        & (F.substring("value", 1, 5) == F.lit(value_header)))
            .select(F.col("partition").alias(PARTITION_COLUMN), F.col("offset").alias(OFFSET_COLUMN),
                    from_avro(body("key"), writer_schemas[key_header]).alias("k"),
                    from_avro(body("value"), writer_schemas[value_header]).alias("v"))
            .select(PARTITION_COLUMN, OFFSET_COLUMN, "k", image.alias("_image"), value["op"].alias(OP_COLUMN),
                    event_position(position_source, "postgresql", F.col(PARTITION_COLUMN),
                                   F.col(OFFSET_COLUMN)).alias(POSITION_COLUMN),
                    F.timestamp_millis(source["ts_ms"]).alias(SOURCE_TS_COLUMN),
                    F.lower(source["snapshot"]).alias(SNAPSHOT_COLUMN),
                    value["transaction"]["id"].alias(TRANSACTION_COLUMN))
            .select(PARTITION_COLUMN, OFFSET_COLUMN, *row, OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN,
                    SNAPSHOT_COLUMN, TRANSACTION_COLUMN))
    decoded = branches[0]
    for branch in branches[1:]:
        decoded = decoded.unionByName(branch)
    return decoded


def materialized(decoded: DataFrame, row_columns: list[str]) -> tuple[int, int, int]:
    """Every decoded column of ``decoded`` computed, in one aggregate: the row count, an XOR of the hashes of
    each event's values (``row_columns``, op, source time, snapshot, transaction) and one of its coordinates
    (Kafka partition and offset, position): order-free, so equal values in any order give equal results. The
    coordinates depend on the topic (the partitioner hashes the key's bytes), the values do not."""
    from pyspark.sql import functions as F

    from cdc_assets.core.envelope import OFFSET_COLUMN, PARTITION_COLUMN, SNAPSHOT_COLUMN, TRANSACTION_COLUMN
    from cdc_assets.core.layout import OP_COLUMN, POSITION_COLUMN, SOURCE_TS_COLUMN

    def digest(columns: list[str]) -> Any:
        return F.coalesce(F.bit_xor(F.xxhash64(*columns)), F.lit(0))

    row = decoded.agg(
        F.count(F.lit(1)).alias("n"),
        digest([*row_columns, OP_COLUMN, SOURCE_TS_COLUMN, SNAPSHOT_COLUMN, TRANSACTION_COLUMN]).alias("values"),
        digest([PARTITION_COLUMN, OFFSET_COLUMN, POSITION_COLUMN]).alias("coordinates")).collect()[0]
    return int(row["n"]), int(row["values"]), int(row["coordinates"])


def decode_child(variant: str, bootstrap: str, registry_url: str, batch: int) -> None:
    """One decode-level run of ``variant``: the topic read batch by batch (reading ahead, as a run does) to the
    decoded change-event columns in Spark, materialized; prints one ``RESULT {json}`` line."""
    from cdc_assets.core.envelope import decode_change_events, value_type
    from cdc_assets.core.layout import derive_layout
    from cdc_assets.io.avro import SchemaRegistrySettings, record_decoder
    from cdc_assets.io.kafka import KafkaSource
    from cdc_assets.io.spark import spark_records, without_schemas
    from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server

    spark = connect(ensure_local_server(decode_settings()))
    source = KafkaSource({"bootstrap.servers": bootstrap, "group.id": "bench-decode"})
    topic = f"{DECODE_VARIANTS[variant]}.public.accounts"
    decode = record_decoder(SchemaRegistrySettings(registry_url)) if variant == "avro" else None
    client = SchemaRegistryClient({"url": registry_url})
    writer_schemas: dict[bytes, str] = {}  # wire header -> writer schema (from_avro)
    startup_cpu = run_cpu()  # the server it may have started is not the run's
    start = time.perf_counter()
    offsets: dict[int, int] | None = None
    rows = values = coordinates = 0
    while True:
        raw = source.read_batch(topic, offsets, batch, 1 << 40, read_ahead=True, decode=decode)
        events = raw.records.filter(pc.is_valid(raw.records["value"]))
        if events.num_rows:
            if variant == "from_avro":
                for side in ("key", "value"):
                    for header in pc.unique(pc.binary_slice(events[side], 0, 5)).to_pylist():
                        if header not in writer_schemas:
                            schema_id = struct.unpack(">bI", header)[1]
                            writer_schemas[header] = str(client.get_schema(schema_id).schema_str)
                newest = json.loads(writer_schemas[events["value"][-1].as_py()[:5]])
                with tempfile.TemporaryDirectory(prefix="cdc-batch-") as scratch:
                    found = materialized(decode_rows(spark, events, writer_schemas, Path(scratch)),
                                         _record_fields(newest, "before"))
            else:  # as ``cdc_assets.merge.prepare`` does (W1's batches hold no placeholder)
                samples = [events[side].slice(0, 4).to_pylist() + events[side].slice(events.num_rows - 4).to_pylist()
                           for side in ("key", "value")]
                layout = derive_layout("postgresql", *samples)
                handed = events.set_column(events.schema.get_field_index("value"), "value",
                                           without_schemas(events["value"]))
                with spark_records(spark, handed, value_type(layout), exact=False) as frame:
                    found = materialized(decode_change_events(frame, layout), layout.row_type.names)
            rows += found[0]
            values ^= found[1]
            coordinates ^= found[2]
        offsets = raw.end_offsets
        if raw.caught_up:
            break
    wall = time.perf_counter() - start
    own_cpu = run_cpu() - startup_cpu
    source.close()
    disconnect(spark)
    print("RESULT " + json.dumps({"wall_s": wall, "run_cpu": own_cpu, "rows": rows, "values": values,
                                  "coordinates": coordinates}), flush=True)
    os._exit(0)  # native threads (librdkafka) can abort the interpreter's teardown


def run_decode_child(variant: str, bootstrap: str, registry_url: str, batch: int, events: int) -> dict[str, Any]:
    """One decode-level run in a fresh process, with the Spark server's CPU seconds; every event decoded."""
    result = _child_result(f"decode {variant}", "--decode-child", variant, "--bootstrap", bootstrap, "--registry",
                           registry_url, "--batch", str(batch))
    if result["rows"] != events:
        raise SystemExit(f"decode {variant}: {result['rows']} events decoded, expected {events}")
    return result


def decode_level(bootstrap: str, registry_url: str, batch: int, events: int, runs: int, warm_runs: int) -> None:
    """The decode level's rounds (after ``warm_runs`` rounds that warm the server, not measured) and its table,
    as ratios to JSON with schemas; the variants' decoded columns must agree (``materialized``'s digests)."""
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for run in range(warm_runs + runs):
            for variant in DECODE_VARIANTS:
                result = run_decode_child(variant, bootstrap, registry_url, batch, events)
                if run < warm_runs:
                    continue
                print(f"  decode run {run - warm_runs + 1} {variant:<13} {result['wall_s']:6.2f} s (CPU s: run "
                      f"{result['run_cpu']:.1f}, server {result['server_cpu']:.1f})", flush=True)
                results.setdefault(variant, []).append(result)
    finally:
        stop_all()
    # The same values from every topic; the same coordinates too from the same topic.
    for part, same in (("values", lambda variant: "W1"), ("coordinates", DECODE_VARIANTS.get)):
        found: dict[str | None, set[int]] = {}
        for variant, measured in results.items():
            found.setdefault(same(variant), set()).update(r[part] for r in measured)
        if any(len(digests) != 1 for digests in found.values()):
            raise SystemExit(f"the decode variants' decoded {part} differ: {found}")
    base = {key: statistics.median(r[key] for r in results[BASELINE]) for key in ("wall_s", "run_cpu", "server_cpu")}
    print(f"\nDecode level: to the decoded columns, materialized (every variant decoded the same values)\n"
          f"{'variant':<13} {'s':>7} {'events/s':>9} {'x time':>7} {'run CPU s':>10} {'server CPU s':>13} {'x CPU':>6}")
    for variant, measured in results.items():
        wall, run_cpu, server = (statistics.median(r[key] for r in measured)
                                 for key in ("wall_s", "run_cpu", "server_cpu"))
        print(f"{variant:<13} {wall:7.2f} {events / wall:9,.0f} {wall / base['wall_s']:7.2f} {run_cpu:10.1f} "
              f"{server:13.1f} {(run_cpu + server) / (base['run_cpu'] + base['server_cpu']):6.2f}")
    print(f"(x: as a ratio to {BASELINE}, measured in the same rounds; from_avro leaves out Debezium's semantic "
          "types, placeholders, the layout and per-event errors: benchmarks/avro_decode.py decode_rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=3, help="runs that warm the Spark server first (per level)")
    parser.add_argument("--levels", default="merge,decode",
                        help="merge: cdc_merge_job per variant; decode: to the decoded columns, with from_avro")
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--decode-child", choices=list(DECODE_VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.bootstrap, args.registry, args.batch, args.root)
        return
    if args.decode_child:
        decode_child(args.decode_child, args.bootstrap, args.registry, args.batch)
        return
    levels = set(args.levels.split(","))
    if not levels or not levels <= {"merge", "decode"}:
        raise SystemExit(f"--levels: 'merge', 'decode' or both, not '{args.levels}'")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.apicurio import Apicurio

    if "decode" in levels:
        spark_avro_jars()  # fetched before any timing
    records, reference = generate(args.events, args.keys)
    events = sum(1 for _, value in records if value is not None)
    oracle = (len(reference), checksum(list(reference.values())))
    print(f"W1: {events:,} events + {len(records) - events:,} tombstones over {args.keys:,} keys, "
          f"{args.partitions} partitions, batches of {args.batch:,}; {args.runs} fresh process(es) per variant")
    with tempfile.TemporaryDirectory(prefix="cdc-avro-bench-") as work, \
            ApacheKafkaBroker(Path(work) / "broker") as broker, Apicurio() as registry:
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")
        for variant, prefix in VARIANTS.items():
            encoded = encode(records, variant, registry.confluent_url)
            size = sum(len(key) + len(value or b"") for key, value in encoded)
            print(f"  {variant:<13} {size / len(encoded):7.0f} bytes a record (key + value)")
            produce(broker.bootstrap_servers, encoded, args.partitions, topic=f"{prefix}.public.accounts")
        del records
        if "merge" in levels:
            merge_level(broker.bootstrap_servers, registry.confluent_url, args.batch, Path(work), oracle, events,
                        args.runs, args.warm_runs)
        if "decode" in levels:
            decode_level(broker.bootstrap_servers, registry.confluent_url, args.batch, events, args.runs,
                         args.warm_runs)


def merge_level(bootstrap: str, registry_url: str, batch: int, work: Path, oracle: tuple[int, str], events: int,
                runs: int, warm_runs: int) -> None:
    """The merge level's rounds (``cdc_merge_job`` per variant, after ``warm_runs`` runs that warm the server)
    and its table, as ratios to JSON with schemas."""
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for number in range(warm_runs):
            run_child(BASELINE, bootstrap, registry_url, batch, work / f"warm-{number}", oracle)
        for run in range(runs):
            for variant in VARIANTS:
                result = run_child(variant, bootstrap, registry_url, batch, work / f"{variant}-{run}", oracle)
                print(f"  run {run + 1} {variant:<13} {result['stages']['total_s']:6.2f} s (CPU s: run "
                      f"{result['run_cpu']:.1f}, server {result['server_cpu']:.1f})", flush=True)
                results.setdefault(variant, []).append(result)
    finally:
        stop_all()
    base = {key: statistics.median(r[key] if key != "total_s" else r["stages"]["total_s"]
                                   for r in results[BASELINE]) for key in ("total_s", "run_cpu", "server_cpu")}
    print(f"\n{'variant':<13} {'s':>7} {'events/s':>9} {'x time':>7} {'run CPU s':>10} {'server CPU s':>13} "
          f"{'x CPU':>6}  decode_s")
    for variant, measured in results.items():
        total = statistics.median(r["stages"]["total_s"] for r in measured)
        run_cpu, server = (statistics.median(r[key] for r in measured) for key in ("run_cpu", "server_cpu"))
        decode = statistics.median(r["stages"].get("decode_s", 0.0) for r in measured)
        print(f"{variant:<13} {total:7.2f} {events / total:9,.0f} {total / base['total_s']:7.2f} {run_cpu:10.1f} "
              f"{server:13.1f} {(run_cpu + server) / (base['run_cpu'] + base['server_cpu']):6.2f}  {decode:.2f}")
    print(f"(x: as a ratio to {BASELINE}, measured in the same rounds; decode_s: Avro to JSON-converter bytes in the "
          "foreground, a batch read ahead decodes in the background)\n")


if __name__ == "__main__":
    main()
