"""W1 in Avro beside W1 in JSON: what reading the Confluent wire format (``cdc_assets.io.avro``) costs a merge.

Produces the same W1 events (``benchmarks.merge_throughput.generate``: Debezium PostgreSQL events over a key
space, ~80% updates, ~10% creates, ~10% deletes each followed by a tombstone, 3 partitions) into three topics of
a local broker: as W1 has them (the JSON converter without schemas), with the JSON converter's schemas (the form
the Avro records are turned into), and in Avro (magic byte, schema id, body; the key and value schemas
registered in a private Apicurio Registry, ``tests/apicurio.py``: run ``scripts/setup-tests`` first). Then runs
the project's ``cdc_merge_job`` on each topic, round after round, each run in a fresh process on the warm local
Spark server (warmed by runs first, not measured), and prints the medians of the first poll to the last commit,
events/s, the CPU seconds of the run's process and of the Spark server, and each as a ratio to the JSON-with-
schemas run measured in the same rounds. Every table is checked against the reference fold.

    python -m benchmarks.avro_decode [--events 300000] [--keys 30000] [--batch 100000] [--runs 3]
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
from pathlib import Path
from typing import Any

import fastavro
import psutil
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from deltalake import DeltaTable

from benchmarks.measure import process_cpu, server_cpu
from benchmarks.merge_throughput import checksum, generate, produce
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers, stop_all

VARIANTS = {"json": "bjson", "json_schemas": "bschema", "avro": "bavro"}  # variant -> topic prefix
BASELINE = "json_schemas"


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
    servers = {state["pid"] for _, state in running_servers()}
    me = psutil.Process()
    tree = [me, *(p for p in me.children(recursive=True) if p.pid not in servers)]
    table = DeltaTable(f"{root}/{VARIANTS[variant]}/public/accounts")
    rows = table.to_pyarrow_table(columns=["id", "balance", "owner", "status", "seq"]).to_pylist()
    print("RESULT " + json.dumps({"stages": stages, "run_cpu": sum(sum(p.cpu_times()[:2]) for p in tree)
                                  - startup_cpu, "rows": len(rows), "checksum": checksum(rows)}), flush=True)
    os._exit(0)  # native threads (delta-rs, librdkafka) can abort the interpreter's teardown


def run_child(variant: str, bootstrap: str, registry_url: str, batch: int, root: Path,
              oracle: tuple[int, str]) -> dict[str, Any]:
    """One run in a fresh process, checked against the oracle, with the Spark server's CPU seconds."""
    servers = [state["pid"] for _, state in running_servers()]
    before = server_cpu(servers)["server"]
    done = subprocess.run([sys.executable, "-m", "benchmarks.avro_decode", "--child", variant, "--bootstrap",
                           bootstrap, "--registry", registry_url, "--batch", str(batch), "--root", str(root)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{variant} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    if (result["rows"], result["checksum"]) != oracle:
        raise SystemExit(f"{variant}: the table does not match the oracle ({result['rows']} rows, "
                         f"expected {oracle[0]})")
    servers = servers or [state["pid"] for _, state in running_servers()]
    result["server_cpu"] = server_cpu(servers)["server"] - before
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=3, help="runs that warm the Spark server first")
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.bootstrap, args.registry, args.batch, args.root)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.apicurio import Apicurio

    records, reference = generate(args.events, args.keys)
    events = sum(1 for _, value in records if value is not None)
    oracle = (len(reference), checksum(list(reference.values())))
    print(f"W1: {events:,} events + {len(records) - events:,} tombstones over {args.keys:,} keys, "
          f"{args.partitions} partitions, batches of {args.batch:,}; {args.runs} fresh process(es) per variant")
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="cdc-avro-bench-") as work, \
            ApacheKafkaBroker(Path(work) / "broker") as broker, Apicurio() as registry:
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")
        for variant, prefix in VARIANTS.items():
            encoded = encode(records, variant, registry.confluent_url)
            size = sum(len(key) + len(value or b"") for key, value in encoded)
            print(f"  {variant:<13} {size / len(encoded):7.0f} bytes a record (key + value)")
            produce(broker.bootstrap_servers, encoded, args.partitions, topic=f"{prefix}.public.accounts")
        del records
        try:
            for number in range(args.warm_runs):
                run_child(BASELINE, broker.bootstrap_servers, registry.confluent_url, args.batch,
                          Path(work) / f"warm-{number}", oracle)
            for run in range(args.runs):
                for variant in VARIANTS:
                    result = run_child(variant, broker.bootstrap_servers, registry.confluent_url, args.batch,
                                       Path(work) / f"{variant}-{run}", oracle)
                    print(f"  run {run + 1} {variant:<13} {result['stages']['total_s']:6.2f} s (CPU s: run "
                          f"{result['run_cpu']:.1f}, server {result['server_cpu']:.1f})", flush=True)
                    results.setdefault(variant, []).append(result)
        finally:
            stop_all()
    base = {key: statistics.median(r[key] if key != "total_s" else r["stages"]["total_s"]
                                   for r in results[BASELINE]) for key in ("total_s", "run_cpu", "server_cpu")}
    print(f"\n{'variant':<13} {'s':>7} {'events/s':>9} {'x time':>7} {'run CPU s':>10} {'server CPU s':>13} "
          f"{'x CPU':>6}  decode_s")
    for variant, runs in results.items():
        total = statistics.median(r["stages"]["total_s"] for r in runs)
        run_cpu, server = (statistics.median(r[key] for r in runs) for key in ("run_cpu", "server_cpu"))
        decode = statistics.median(r["stages"].get("decode_s", 0.0) for r in runs)
        print(f"{variant:<13} {total:7.2f} {events / total:9,.0f} {total / base['total_s']:7.2f} {run_cpu:10.1f} "
              f"{server:13.1f} {(run_cpu + server) / (base['run_cpu'] + base['server_cpu']):6.2f}  {decode:.2f}")
    print(f"(x: as a ratio to {BASELINE}, measured in the same rounds; decode_s: Avro to JSON-converter bytes in the "
          "foreground, a batch read ahead decodes in the background)")


if __name__ == "__main__":
    main()
