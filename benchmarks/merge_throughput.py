"""Throughput of the merge path, end to end on the embedded default, beside its references.

Produces W1 (default: 1,000,000 Debezium PostgreSQL events over 100,000 keys, ~80% updates, ~10%
creates, ~10% deletes each followed by a tombstone, 3 partitions) into a local broker once, waits
until the broker is idle, then runs each variant ``--runs`` times, each run in a fresh process (with
a fresh JVM for the in-process Spark ones), round after round:

- ``consume_only``: confluent-kafka reads every record, no parsing (the broker/client ceiling);
- ``no_spark``: pyarrow JSON parse + fold, delta-rs MERGE (``benchmarks.references``);
- ``plain_spark``: the canonical pattern a Spark user writes: Structured Streaming's Kafka source
  (``maxOffsetsPerTrigger``, ``availableNow``), ``foreachBatch`` with ``from_json``, a window fold and
  a delta-spark MERGE, Spark's default settings, in the run's own JVM;
- ``declarative_pipeline``: Spark 4.2's declarative pipelines (``spark-pipelines run``): the same Kafka
  stream into ``create_auto_cdc_flow`` (SCD1, keys + ``sequence_by``) and a Delta streaming table;
- ``project``: the project's ``cdc_merge_job`` (a real Dagster run, ``execute_in_process``) on the
  embedded default (delta-rs writer), draining the topic in micro-batches of ``--batch`` records.
  Spark is the local Spark server that runs share (``cdc_assets.io.spark_server``): the benchmark's
  first project run starts it (reported apart, as "project, cold server"), and project runs warm it until
  its JIT compilers use at most 10% of its CPU in a run (at most ``--warm-passes``, reported apart as
  "project, warming up"), as a deployment's long-lived server is; the measured runs find it warm;
- ``project_delta_spark``: the same run with ``delta.writer: delta-spark`` (MERGE in the local server);
- not run unless named in ``--variants``: ``spark_fold`` (confluent-kafka, Spark from_json + window fold,
  delta-rs MERGE: the plain-Spark reference of the earlier tables) and ``project_in_process`` (the
  project with ``spark.local_server: false``, Spark in the run's own fresh JVM).

Every variant that writes Delta is checked against an oracle (row count and checksum of the
reference fold). Prints medians of the seconds from the first poll to the last committed Delta
version (Spark session start reported apart; for the project, the whole Dagster run, its instance
made before, as a run worker has it, and that run's own first poll to last commit beside it),
events/s, ratios, per-stage seconds, the peak RSS of each run's process tree (Python + JVM) plus
the local Spark server's, the CPU seconds each run cost the run (and of it, its process's start-up:
imports, and for the project its definitions and Dagster instance), the server and the broker (the
broker is not part of the RSS), and the project's CPU (run + server) as a ratio to each reference's,
with and without the start-up that a run process pays once.

``--store local,s3`` runs the variants that write Delta on both stores in the same run, round after round:
on local disk and under an ``s3://`` root on a private S3-API server (moto's, ``tests/support/objectstore.py``: run
``scripts/setup-tests`` first), the project's runs on a local Spark server of their own with that store's
settings (warmed up apart). ``consume_only`` writes nothing and ``declarative_pipeline`` keeps its tables in
its own pipeline storage: they run on local disk only. Each store's runs are checked against the oracle; the
report prints each variant's events/s and CPU seconds on both stores side by side (the S3-API server's CPU
apart: it is this machine's emulator, not the store's), as ratios to ``no_spark`` on local disk.

    python -m benchmarks.merge_throughput [--events 1000000] [--keys 100000] [--batch 100000] [--runs 3]
                                          [--warm-passes 12] [--store local|s3|local,s3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from benchmarks.measure import PeakRss, process_cpu, run_cpu, server_cpu, used_since, warm_until_steady
from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker, produce_waiting
from cdc_assets.io.spark import DELTA_CATALOG, DELTA_EXTENSION, delta_jars, object_store_jars, spark_config
from cdc_assets.io.spark_server import (
    SERVER_DIR_ENV_VAR,
    connect,
    disconnect,
    ensure_local_server,
    fingerprint,
    jvm_environ,
    running_servers,
    stop_all,
)
from cdc_assets.io.storage import delta_rs_options, spark_path, spark_settings

TOPIC = "bench.public.accounts"


def generate(events: int, keys: int, seed: int = 7) -> tuple[list[tuple[bytes, bytes | None]], dict[int, dict]]:
    """W1 events (with tombstones after deletes) and the reference fold: key -> final row."""
    rng = random.Random(seed)
    state: dict[int, dict] = {}
    records: list[tuple[bytes, bytes | None]] = []
    base_ts = int(time.time() * 1000) - 3_600_000
    for i in range(events):
        key = rng.randrange(keys)
        draw = rng.random()
        op = "u" if draw < 0.8 else ("c" if draw < 0.9 else "d")
        if key not in state:
            op = "c"
        elif op == "c":
            op = "u"
        row = None if op == "d" else {"id": key, "balance": rng.randrange(1_000_000), "owner": f"owner-{key}",
                                      "status": rng.choice(("open", "frozen", "closed")), "seq": i}
        source = {"version": "2.3.4.Final", "connector": "postgresql", "name": "bench", "ts_ms": base_ts + i,
                  "snapshot": "false", "db": "bench", "schema": "public", "table": "accounts",
                  "txId": 1000 + i, "lsn": 100_000_000 + 64 * i, "xmin": None}
        value = {"before": None, "after": row, "source": source, "op": op, "ts_ms": base_ts + i + 5,
                 "transaction": None}
        key_bytes = json.dumps({"id": key}).encode()
        records.append((key_bytes, json.dumps(value).encode()))
        if op == "d":
            records.append((key_bytes, None))
            state.pop(key, None)
        else:
            state[key] = row
    return records, state


def checksum(rows: list[dict]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r["id"]):
        digest.update(f"{row['id']}|{row['balance']}|{row['owner']}|{row['status']}|{row['seq']}\n".encode())
    return digest.hexdigest()[:16]


def produce(bootstrap: str, records: list[tuple[bytes, bytes | None]], partitions: int, topic: str = TOPIC) -> None:
    """``records`` (key, value) into a new ``topic`` of ``partitions``, in order, flushed."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result()
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
    for i, (key, value) in enumerate(records):
        produce_waiting(producer, topic, key, value)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)


def consume_only(bootstrap: str) -> dict[str, float]:
    """The broker/client ceiling: read every record of the topic with confluent-kafka, no parsing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-consume-only",
                         "enable.auto.commit": False})
    partitions = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    total = sum(consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in partitions)
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    started, seen = time.perf_counter(), 0
    while seen < total:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return {"total_s": elapsed}


PROJECT_CONFIG = """
kafka:
  bootstrap_servers: {bootstrap}
  group_id: bench
delta:
  root: {root}
  writer: {writer}
  storage_options: {storage_options}
batch:
  max_records: {batch}
  max_batches_per_run: 1000
spark:
  local_server: {local_server}
connectors:
  - name: bench
    kind: postgresql
    topic.prefix: bench
    tables:
      - name: public.accounts
"""


def run_project(bootstrap: str, batch: int, work: Path, root: str, storage_options: Mapping[str, str],
                local_server: bool = True, writer: str = "delta-rs") -> tuple[dict[str, float], str]:
    """The project's ``cdc_merge_job`` in this process, its tables under ``root`` (Spark session made
    first, timed apart); its stage seconds and the Delta table's path."""
    config_path = work / "pipeline.yaml"
    config_path.write_text(PROJECT_CONFIG.format(bootstrap=bootstrap, root=root, batch=batch,
                                                 storage_options=json.dumps(dict(storage_options)),
                                                 local_server=str(local_server).lower(), writer=writer))
    os.environ["CDC_ASSETS_CONFIG"] = str(config_path)
    from dagster import DagsterInstance

    from cdc_assets.catalog import resolve_tables
    from cdc_assets.config import load_config
    from cdc_assets.definitions import build_definitions

    config = load_config(config_path)
    # The settings the run's Spark resource has (the store's too): the warm-up session is on the run's server.
    settings = spark_config(config.spark.master, conf=config.spark.conf, use_class_archive=not local_server,
                            delta_root=config.delta.root, storage_options=config.delta.storage_options)
    if local_server:
        started = time.perf_counter()
        warm_up = connect(ensure_local_server(settings))  # the run's own session comes next
        warm_up.range(1).count()
        disconnect(warm_up)  # frees its session slot, which the run takes next
        spark_start = time.perf_counter() - started
    else:
        spark_start = _start_spark(settings)
    job = build_definitions(config).resolve_job_def("cdc_merge_job")
    # A run worker has its instance before its run starts (the first one made in a process imports
    # Dagster's storage modules: ~0.5 s), as it has its code location loaded.
    instance = DagsterInstance.ephemeral()
    startup_cpu = process_cpu(os.getpid())  # imports, definitions and instance: once per run process
    started = time.perf_counter()
    result = job.execute_in_process(instance=instance)
    wall = time.perf_counter() - started
    if not result.success:
        raise SystemExit("cdc_merge_job failed")
    (event,) = result.get_asset_materialization_events()
    metadata = event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
    stages: dict[str, float] = dict(metadata["stage_seconds"].value)  # type: ignore[arg-type]
    inner = stages.pop("total_s")  # the run's own first poll to last commit
    stages.update(first_poll_to_commit_s=inner, dagster_run_overhead_s=wall - inner, total_s=wall,
                  spark_start_s=spark_start, startup_cpu=startup_cpu,
                  batches=float(metadata["batches"].value))  # type: ignore[arg-type]
    return stages, resolve_tables(config)[0].target.path


def _start_spark(settings: dict[str, str]) -> float:
    started = time.perf_counter()
    SparkSession.builder.config(map=settings).getOrCreate().sparkContext.setLogLevel("ERROR")
    return time.perf_counter() - started


def child(variant: str, bootstrap: str, batch: int, work: Path, root: str, storage_options: Mapping[str, str],
          spark_overrides: Mapping[str, str] | None = None) -> None:
    """One run of one variant in this (fresh) process, its tables under ``root``; prints one ``RESULT {json}``
    line. ``spark_overrides`` override the Spark references' defaults (the tests' small workload: a few shuffle
    partitions instead of Spark's 200; the benchmark never sets them)."""
    from benchmarks.references import (
        run_declarative_pipeline,
        run_no_spark,
        run_plain_spark,
        run_spark_fold,
        spark_kafka_jars,
    )

    target = f"{root}/accounts"
    rs_options = delta_rs_options(storage_options)
    # Spark opens s3:// as s3a://, with the store's connector jars and Hadoop settings.
    store_settings = spark_settings(root, storage_options)
    store_jars = [jar for jar in object_store_jars(root).split(",") if jar]
    startup_cpu = process_cpu(os.getpid())  # the imports (the project's run replaces it with its own)
    with PeakRss(exclude_pid=-1) as rss:
        if variant == "consume_only":
            stages = consume_only(bootstrap)
        elif variant == "no_spark":
            stages = run_no_spark(bootstrap, TOPIC, batch, target, rs_options)
        elif variant == "spark_fold":
            # Spark's own defaults: only the master, the UI off and UTC.
            spark_start = _start_spark({"spark.master": "local[*]", "spark.ui.enabled": "false",
                                        "spark.sql.session.timeZone": "UTC", **(spark_overrides or {})})
            stages = run_spark_fold(SparkSession.getActiveSession(), bootstrap, TOPIC, batch, target, rs_options)
            stages["spark_start_s"] = spark_start
        elif variant == "plain_spark":
            # Spark's own defaults, with Delta's and the Kafka connector's jars: the master, the UI off and UTC.
            spark_start = _start_spark({
                "spark.master": "local[*]", "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                "spark.jars": ",".join([*delta_jars().split(","), *spark_kafka_jars(), *store_jars]),
                "spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
                **store_settings, **(spark_overrides or {})})
            stages = run_plain_spark(SparkSession.getActiveSession(), bootstrap, TOPIC, batch, spark_path(target),
                                     str(work / "checkpoint"))
            stages["spark_start_s"] = spark_start
        elif variant == "declarative_pipeline":
            stages, target = run_declarative_pipeline(bootstrap, TOPIC, batch, work)
        else:
            stages, target = run_project(bootstrap, batch, work, root, storage_options,
                                         local_server=variant != "project_in_process",
                                         writer="delta-spark" if variant == "project_delta_spark" else "delta-rs")
    result: dict[str, object] = {"stages": stages, "peak_rss": rss.peak, "run_cpu": run_cpu(),
                                 "startup_cpu": stages.pop("startup_cpu", startup_cpu)}
    if variant != "consume_only":
        table = DeltaTable(target, storage_options=rs_options)
        rows = table.to_pyarrow_table(columns=["id", "balance", "owner", "status", "seq"]).to_pylist()
        result.update(rows=len(rows), checksum=checksum(rows))
    print("RESULT " + json.dumps(result), flush=True)
    # Skip interpreter teardown: native threads (delta-rs, librdkafka, py4j) can abort it after the result.
    os._exit(0)


def wait_until_idle(pid: int, below: float = 0.05, timeout_s: float = 120.0) -> None:
    """Wait until the broker's CPU use over a second (its child processes too) drops below ``below``
    (it flushes and cleans up after writes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = process_cpu(pid)
        time.sleep(1.0)
        if process_cpu(pid) - before < below:
            return


VARIANTS = ("consume_only", "no_spark", "plain_spark", "declarative_pipeline", "project", "project_delta_spark")
OPTIONAL_VARIANTS = ("spark_fold", "project_in_process")
MAY_FAIL = ("declarative_pipeline",)  # on delta-spark 4.4 + Spark 4.2 it cannot run (docs/performance.md)
SERVED = ("project", "project_delta_spark")  # the variants that run on the local Spark server
REFERENCES = ("consume_only", "no_spark", "plain_spark", "declarative_pipeline", "spark_fold", "project_in_process")
# consume_only writes no table; declarative_pipeline keeps its tables in its own pipeline storage.
LOCAL_ONLY = ("consume_only", "declarative_pipeline")
STORES = ("local", "s3")


@dataclass(frozen=True)
class Store:
    """Where one leg's Delta tables live: local disk, or a bucket of the private S3-API server."""

    name: str
    storage_options: dict[str, str] = field(default_factory=dict)
    bucket: str = ""
    pid: int | None = None  # the S3-API server's process: its CPU is counted apart

    def root(self, run_dir: Path) -> str:
        """The Delta root of the run in ``run_dir``."""
        return str(run_dir / "delta") if self.name == "local" else f"s3://{self.bucket}/{run_dir.name}"

    def key(self, variant: str) -> str:
        """The name of ``variant``'s results on this store (the local disk's are the variant's own name)."""
        return variant if self.name == "local" else f"{variant}@{self.name}"

    def server_key(self) -> str:
        """The key of the local Spark server the project's runs on this store use (``run_project``'s settings)."""
        return fingerprint(spark_config(delta_root=self.root(Path("any")), storage_options=self.storage_options))


def object_store(cleanup: contextlib.ExitStack) -> Store:
    """A bucket on a private S3-API server started for this run (stopped by ``cleanup``), its keys in the
    environment variables its storage options name (the runs and their Spark servers inherit them)."""
    from tests.support.objectstore import ObjectStore  # the tests' server: one place for it

    server = cleanup.enter_context(ObjectStore())
    server.export_keys()
    return Store("s3", server.storage_options(), server.create_bucket("w1-bench"), server.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100_000, help="max records per micro-batch")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per variant (medians are reported)")
    parser.add_argument("--warm-passes", type=int, default=12,
                        help="runs of the first served variant before the measured ones (the first starts the "
                             "local server) until the server's JIT compilers use at most 10%% of its CPU in a run: "
                             "at most this many, on each store")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {VARIANTS + OPTIONAL_VARIANTS} (default: {VARIANTS})")
    parser.add_argument("--store", default="local",
                        help=f"comma-separated, of {STORES}: where the Delta tables live (local disk, or s3:// on a "
                             "private S3-API server); with both, every variant that writes Delta runs on each")
    parser.add_argument("--child", choices=VARIANTS + OPTIONAL_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)  # default: <work>/delta, on local disk
    parser.add_argument("--storage-options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--spark-settings", default="{}", help=argparse.SUPPRESS)  # a child's, tests only
    args = parser.parse_args()
    if args.child:
        child(args.child, args.bootstrap, args.batch, Path(args.work), args.root or str(Path(args.work) / "delta"),
              json.loads(args.storage_options), json.loads(args.spark_settings))
        return

    variants = [v for v in args.variants.split(",") if v]
    store_names = [s for s in args.store.split(",") if s]
    if not store_names or set(store_names) - set(STORES):
        parser.error(f"--store: comma-separated, of {STORES}")
    records, reference = generate(args.events, args.keys)
    events = sum(1 for _, value in records if value is not None)
    oracle = (len(reference), checksum(list(reference.values())))
    print(f"W1: {events:,} events + {len(records) - events:,} tombstones over {args.keys:,} keys, "
          f"{args.partitions} partitions, batches of {args.batch:,}; {args.runs} fresh process(es) per variant")
    results: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work, ApacheKafkaBroker(Path(work) / "broker") as broker, \
            contextlib.ExitStack() as cleanup:
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")  # the benchmark's own, started cold
        stores = [Store("local") if name == "local" else object_store(cleanup) for name in store_names]
        if len(stores) > 1:
            print("stores: " + ", ".join(store.name for store in stores) + "; on S3 not run: "
                  + ", ".join(v for v in variants if v in LOCAL_ONLY) + " (local disk only)")
        produce(broker.bootstrap_servers, records, args.partitions)
        del records
        served = [v for v in variants if v in SERVED]
        round_ = [(variant, store) for store in stores for variant in variants
                  if store.name == "local" or variant not in LOCAL_ONLY]

        def warm(store: Store, number: int) -> dict:
            return run_child(served[0], "cold" if number == 1 else f"w{number}", args.batch, broker,
                             Path(work) / f"{store.key(served[0])}-warm-{number}", oracle, store)

        try:
            for store in stores if served else []:
                # The first served run on a store starts its local Spark server, and the ones after it warm the
                # server until it is steady; they are reported apart from the measured runs.
                warm_ups = warm_until_steady(functools.partial(warm, store), args.warm_passes)
                results[f"{store.key(served[0])}, cold server"] = warm_ups[:1]
                if warm_ups[1:]:
                    results[f"{store.key(served[0])}, warming up"] = warm_ups[1:]
            for run in range(args.runs):
                for variant, store in round_:
                    name = store.key(variant)
                    if name in failed:
                        continue
                    result = run_child(variant, str(run + 1), args.batch, broker, Path(work) / f"{name}-{run + 1}",
                                       oracle, store)
                    if "failed" in result:
                        failed[name] = result["failed"]
                        continue
                    results.setdefault(name, []).append(result)
        finally:
            stop_all()
    report(results, events)
    if len(stores) > 1:
        report_stores(results, events, variants, stores)
    for variant, error in failed.items():
        print(f"{variant}: did not run: {error}")


def run_child(variant: str, label: str, batch: int, broker: ApacheKafkaBroker, run_dir: Path,
              oracle: tuple[int, str], store: Store) -> dict:
    """One run of ``variant`` on ``store`` in a fresh process, checked against the oracle; its result, with
    the CPU seconds of the run, the local Spark server, the broker and the S3-API server, and the Spark
    server's peak RSS."""
    wait_until_idle(broker.pid)
    run_dir.mkdir()
    served = variant in SERVED

    def own_servers() -> list[int]:
        # The server of this store's settings: another store's, idle meanwhile, is not this run's.
        return [state["pid"] for path, state in running_servers() if path.stem == store.server_key()]

    servers = own_servers() if served else []
    parts = {"broker": broker.pid, **({"store": store.pid} if store.pid else {})}
    before = {**{part: process_cpu(pid) for part, pid in parts.items()}, **server_cpu(servers)}
    with contextlib.ExitStack() as stack:
        server_rss = [stack.enter_context(PeakRss(exclude_pid=-1, pid=pid)) for pid in servers]
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.merge_throughput", "--child", variant, "--bootstrap",
             broker.bootstrap_servers, "--batch", str(batch), "--work", str(run_dir), "--root", store.root(run_dir),
             "--storage-options", json.dumps(store.storage_options)],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, env=jvm_environ())
    if served and not servers:  # started by this run (its RSS counted in the run's)
        servers = own_servers()
        if not servers and done.returncode == 0:
            raise SystemExit(f"{variant} run {label}: no local Spark server has the settings of store {store.name}")
    name = store.key(variant)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if variant in MAY_FAIL and (done.returncode != 0 or not lines):
        # The finding is the error: print the last line that names one, go on with the other variants.
        errors = [line.strip() for line in (done.stdout + done.stderr).splitlines()
                  if "Exception:" in line or line.startswith("Error:")] or ["no error line: see its stderr"]
        print(f"  run {label:<4} {name:<22} FAILED: {errors[-1]}", flush=True)
        return {"failed": str(errors[-1])}
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{name} run {label} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    after = {**{part: process_cpu(pid) for part, pid in parts.items()}, **server_cpu(servers)}
    cpu = {"store": 0.0, **used_since(before, after), "run": result["run_cpu"], "startup": result["startup_cpu"]}
    if "rows" in result and (result["rows"], result["checksum"]) != oracle:
        raise SystemExit(f"{name} run {label}: the table does not match the oracle "
                         f"({result['rows']} rows, expected {oracle[0]})")
    result["cpu"] = cpu
    result["server_rss"] = sum(r.peak for r in server_rss)
    print(f"  run {label:<4} {name:<22} {result['stages']['total_s']:6.1f} s"
          + (" oracle OK" if "rows" in result else "")
          + f"  (CPU s: run {cpu['run']:.1f}, server {cpu['server']:.1f} of which JIT {cpu['server_jit']:.1f}, "
          f"broker {cpu['broker']:.1f}" + (f", S3-API server {cpu['store']:.1f}" if store.pid else "") + ")",
          flush=True)
    return result


def report(results: dict[str, list[dict]], events: int) -> None:
    """Medians per variant, ratios to the references, the project's stages."""

    def median(variant: str, key: str, part: str = "stages") -> float:
        return statistics.median(r[part].get(key, 0.0) for r in results[variant])

    def cpu_seconds(variant: str, startup: bool = True) -> float:
        """The median CPU seconds of a run of ``variant``: its process's and the Spark server's."""
        return statistics.median(r["cpu"]["run"] + r["cpu"]["server"] - (0 if startup else r["cpu"]["startup"])
                                 for r in results[variant])

    print(f"\n{'variant':<22}{'seconds':>9}{'events/s':>11}{'spark start':>13}{'peak RSS':>10}"
          f"{'+ server':>10}{'CPU s start-up/run/server/broker':>34}  (medians)")
    for variant, runs in results.items():
        seconds = median(variant, "total_s")
        start = f"{median(variant, 'spark_start_s'):.1f} s" if "spark_start_s" in runs[0]["stages"] else "-"
        rss = statistics.median(r["peak_rss"] for r in runs) / 2**30
        with_server = statistics.median(r["peak_rss"] + r["server_rss"] for r in runs) / 2**30
        cpu = "/".join(f"{median(variant, part, 'cpu'):.1f}" for part in ("startup", "run", "server", "broker"))
        print(f"{variant:<22}{seconds:>8.1f}s{events / seconds:>11,.0f}{start:>13}{rss:>6.2f} GiB"
              f"{with_server:>6.2f} GiB{cpu:>34}")
    # Each store's project variants, with ratios to the references on the same store ("@s3": on S3).
    measured = [name for name in results if "," not in name and name.partition("@")[0] in SERVED]
    for project_variant in measured:
        on = project_variant[len(project_variant.partition("@")[0]):]
        references = [reference + on for reference in REFERENCES if reference + on in results]
        project = median(project_variant, "total_s")
        ratios = [f"{median(reference, 'total_s') / project:.2f}x {reference}" for reference in references]
        print(f"{project_variant}: throughput " + ", ".join(ratios))
        print(f"{project_variant}: CPU (run + server) " + ", ".join(
            f"{cpu_seconds(project_variant) / cpu_seconds(reference):.2f}x {reference}" for reference in references
            if not reference.startswith("consume_only")) + "; without each process's start-up "
            "(imports, definitions, Dagster instance): " + ", ".join(
            f"{cpu_seconds(project_variant, False) / cpu_seconds(reference, False):.2f}x {reference}"
            for reference in references if not reference.startswith("consume_only")))
        inner = median(project_variant, "first_poll_to_commit_s")
        print(f"{project_variant}, first poll to last commit (the Dagster run's start and end aside): {inner:.1f} s, "
              f"{events / inner:,.0f} events/s")
        stages = {k: median(project_variant, k) for k in results[project_variant][0]["stages"]
                  if k.endswith("_s") and k not in ("total_s", "spark_start_s", "first_poll_to_commit_s")}
        print(f"{project_variant} stages (medians, seconds):")
        for stage, seconds in sorted(stages.items(), key=lambda item: -item[1]):
            print(f"  {stage:<26}{seconds:7.2f}")
    for reference in [name for name in results if name.partition("@")[0] in ("plain_spark", "declarative_pipeline")]:
        stages = {k: median(reference, k) for k in results[reference][0]["stages"] if k.endswith("_s")}
        print(f"{reference} stages (medians, seconds): "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(stages.items(), key=lambda item: -item[1])))


def report_stores(results: dict[str, list[dict]], events: int, variants: list[str], stores: list[Store]) -> None:
    """Each variant's events/s and CPU seconds (its process's and the Spark server's) on every store side by
    side, as ratios to ``no_spark`` on local disk (the S3-API server's CPU apart: it is this machine's
    emulator's, which a real store's is not)."""

    def medians(name: str) -> tuple[float, float, float] | None:
        runs = results.get(name)
        if not runs:
            return None
        return (events / statistics.median(r["stages"]["total_s"] for r in runs),
                statistics.median(r["cpu"]["run"] + r["cpu"]["server"] for r in runs),
                statistics.median(r["cpu"]["store"] for r in runs))

    reference = medians("no_spark")
    print("\nLocal disk beside S3 (medians; x: the ratio to no_spark on local disk, events/s and CPU s)")
    print(f"{'variant':<22}" + "".join(f"{store.name + ' events/s':>22}{store.name + ' CPU s':>18}"
                                        for store in stores) + f"{'S3-API server CPU s':>21}")
    for variant in variants:
        line, store_cpu = f"{variant:<22}", "-"
        for store in stores:
            figures = medians(store.key(variant))
            if figures is None:
                line += f"{'-':>22}{'-':>18}"
                continue
            per_s, cpu, on_store = figures
            ratios = (f" ({per_s / reference[0]:.2f}x)", f" ({cpu / reference[1]:.2f}x)") if reference else ("", "")
            line += f"{per_s:>13,.0f}{ratios[0]:>9}{cpu:>11.1f}{ratios[1]:>7}"
            if store.pid:
                store_cpu = f"{on_store:.1f}"
        print(line + f"{store_cpu:>21}")


if __name__ == "__main__":
    main()
