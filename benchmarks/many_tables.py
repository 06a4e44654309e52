"""W2, many tables: one ``cdc_merge_job`` run applying 200 small tables of one connector, warm local server.

Produces, into a local Apache Kafka, ``--tables`` topics of one PostgreSQL connector (``--partitions``
each) with ``--events`` Debezium events per table (JSON converter with schemas: snapshot reads, then
creates, updates and deletes each followed by a tombstone; columns bigint, text, double, boolean,
decimal(12,2), timestamp, date), waits until the broker is idle, then:

1. warms the local Spark server until it is steady: ``cdc_merge_job`` runs over the first ``--warm-tables``
   tables (default: all), each into a Delta root of its own (the first starts the server; reported apart),
   until the server's JIT compilers used at most 10% of its CPU in a run (``benchmarks.measure.JIT_SHARE``; at
   most ``--warm-passes``, default 12). A server that has served runs for a while has Spark's planning and
   the decode and fold compiled by the JVM's JIT: run after run of the same tables its CPU falls for many
   passes (docs/performance.md), and a measured run on a server that still compiles paid for that;
2. the measured runs, one per ``--concurrent-tables`` setting (``batch.concurrent_tables``), each in a fresh
   process as a run worker has it and into a Delta root of its own: ``cdc_merge_job`` over all the tables
   (``execute_in_process``, the job's in-process executor, its instance made before), on the warm server.

Every table is checked against the reference fold (row count and checksum). Prints the run's seconds,
events/s, the per-table overhead (the run's seconds over the tables, and with the events' own cost at the
W1 rate taken out), peak RSS of the run (+ the server), the CPU seconds of run, server and broker, and
where a table's time goes: the pipeline's stage seconds summed over the tables, the Dagster time around
them, and with ``--profile`` the run's cProfile (cumulative, the top functions).

    python -m benchmarks.many_tables [--tables 200] [--events 500] [--partitions 3] [--concurrent-tables 1,2]
                                     [--profile]
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import cProfile
import datetime as dt
import decimal
import hashlib
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

from benchmarks.measure import PeakRss, process_cpu, run_cpu, server_cpu, used_since, warm_until_steady
from benchmarks.merge_throughput import wait_until_idle
from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker, produce_waiting
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers, stop_all

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

PREFIX = "w2"
SCHEMA = "public"
W1_EVENTS_PER_S = 100_000  # the events' own cost is taken out at about W1's rate (docs/performance.md)
BATCH_SIZE_ENV_VAR = "DAGSTER_EVENT_BATCH_SIZE"  # read by Dagster at each event it stores

CONFIG = """
kafka:
  bootstrap_servers: {bootstrap}
  group_id: bench-w2
delta:
  root: {root}
  writer: {writer}
batch:
  max_records: 100000
  concurrent_tables: {concurrent}
spark:
  local_server: true
merge_schedule:
  cron: "*/5 * * * *"
connectors:
  - name: w2
    kind: postgresql
    topic.prefix: {prefix}
    tables:
{tables}
"""

_ROW_FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "double", "optional": True, "field": "score"},
    {"type": "boolean", "optional": True, "field": "active"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "field": "amount"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1,
     "field": "updated_at"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "born_on"},
]
_KEY_SCHEMA = {"type": "struct", "optional": False, "name": "Key",
               "fields": [{"type": "int64", "optional": False, "field": "id"}]}


def table_name(index: int) -> str:
    return f"t{index:04d}"


def _value_schema(table: str, schema: str) -> dict[str, Any]:
    row = {"type": "struct", "optional": True, "name": f"{PREFIX}.{schema}.{table}.Value", "fields": _ROW_FIELDS}
    source = {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "field": "snapshot"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"}]}
    return {"type": "struct", "optional": False, "name": f"{PREFIX}.{schema}.{table}.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"}, {**source, "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"}]}


def _decimal_bytes(value: decimal.Decimal) -> str:
    """A Connect Decimal (scale 2) as the JSON converter writes it: the unscaled value's two's complement, base64."""
    unscaled = int(value.scaleb(2))
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


class TableEvents:
    """One table's change events, drawn one at a time, and their reference fold (``state``: key -> (name,
    score, active, amount, updated_at, born_on)). Of ``events`` draws, the first fifth are snapshot reads;
    then ~60% updates, ~25% creates, ~15% deletes, each delete followed by a tombstone. ``schema``: the source
    schema, in the topic's name (``topic``) and the events."""

    def __init__(self, index: int, events: int, lsn_base: int, rng: random.Random, schema: str = SCHEMA):
        self.table = table_name(index)
        self.schema = schema
        self.topic = f"{PREFIX}.{schema}.{self.table}"
        self.state: dict[int, tuple] = {}
        self.drawn = 0
        self._schema = json.dumps(_value_schema(self.table, schema))  # serialized once: most of an event's bytes
        self._live: list[int] = []  # the state's keys in creation order (ascending), for a draw without a list copy
        self._rng, self._lsn_base, self._base_ts = rng, lsn_base, 1_795_000_000_000 + index
        self._snapshot = events // 5
        self._next_key = 0

    def next(self, ts_ms: int | None = None) -> list[tuple[bytes, bytes | None]]:
        """The next event's records (the event, and its tombstone after a delete); ``ts_ms``: the event's
        source time (default: a fixed base plus the event's number)."""
        rng, i, state = self._rng, self.drawn, self.state
        self.drawn += 1
        draw = rng.random()
        if i < self._snapshot or draw < 0.25 or not state:
            op, key = ("r" if i < self._snapshot else "c"), self._next_key
            self._next_key += 1
        else:
            op, key = ("u" if draw < 0.85 else "d"), rng.choice(self._live)
        amount = decimal.Decimal(rng.randrange(-10_000_000, 10_000_000)) / 100
        ts = self._base_ts + i if ts_ms is None else ts_ms
        micros = ts * 1000
        days = 7000 + rng.randrange(12000)
        row = None if op == "d" else {"id": key, "name": f"name-{key}-{i}", "score": rng.random() * 100,
                                      "active": rng.random() < 0.5, "amount": _decimal_bytes(amount),
                                      "updated_at": micros, "born_on": days}
        before = {"id": key, "name": None, "score": None, "active": None, "amount": None, "updated_at": None,
                  "born_on": None} if op == "d" else None
        source = {"version": "2.7.0.Final", "connector": "postgresql", "name": PREFIX, "ts_ms": ts,
                  "snapshot": "true" if op == "r" else "false", "db": "bench", "schema": self.schema,
                  "table": self.table, "txId": 1000 + i, "lsn": self._lsn_base + 64 * i, "xmin": None}
        payload = {"before": before, "after": row, "source": source, "op": op, "ts_ms": ts + 5}
        value = f'{{"schema": {self._schema}, "payload": {json.dumps(payload)}}}'
        key_bytes = json.dumps({"schema": _KEY_SCHEMA, "payload": {"id": key}}).encode()
        records: list[tuple[bytes, bytes | None]] = [(key_bytes, value.encode())]
        if op == "d":
            records.append((key_bytes, None))
            del state[key]
            del self._live[bisect.bisect_left(self._live, key)]
        else:
            if key not in state:
                self._live.append(key)
            state[key] = (row["name"], row["score"], row["active"], amount,  # type: ignore[index]
                          dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros),
                          dt.date(1970, 1, 1) + dt.timedelta(days=days))
        return records


def generate(index: int, events: int, lsn_base: int, rng: random.Random, schema: str = SCHEMA
             ) -> tuple[list[tuple[bytes, bytes | None]], dict[int, tuple]]:
    """One table's records (``TableEvents``) and its reference fold."""
    table = TableEvents(index, events, lsn_base, rng, schema)
    records = [record for _ in range(events) for record in table.next()]
    return records, table.state


def checksum(rows: dict[int, tuple]) -> str:
    digest = hashlib.sha256()
    for key in sorted(rows):
        name, score, active, amount, updated_at, born_on = rows[key]
        digest.update(f"{key}|{name}|{score!r}|{active}|{decimal.Decimal(amount):.2f}|{updated_at}|{born_on}\n".encode())
    return digest.hexdigest()[:16]


def produce(bootstrap: str, tables: int, events: int, partitions: int, schema: str = SCHEMA
            ) -> tuple[dict[str, tuple[int, str]], int]:
    """Every table's topic and records (tables of the source ``schema``); the oracle per table (rows,
    checksum) and the events produced."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [f"{PREFIX}.{schema}.{table_name(i)}" for i in range(tables)]
    for future in admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1)
                                       for t in topics]).values():
        future.result()
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap, "linger.ms": 20})
    rng = random.Random(26)
    oracle: dict[str, tuple[int, str]] = {}
    produced = 0
    for index, topic in enumerate(topics):
        records, state = generate(index, events, 100_000_000 + index * 1_000_000, rng, schema)
        produced += sum(1 for _, value in records if value is not None)
        for key, value in records:
            produce_waiting(producer, topic, key, value)
        producer.poll(0)
        oracle[table_name(index)] = (len(state), checksum(state))
    producer.flush(120)
    return oracle, produced


def write_config(work: Path, bootstrap: str, tables: int, root: Path, writer: str, concurrent: int = 1) -> Path:
    listed = "\n".join(f"      - name: {SCHEMA}.{table_name(i)}" for i in range(tables))
    path = work / f"pipeline-{root.name}.yaml"
    path.write_text(CONFIG.format(bootstrap=bootstrap, root=root, writer=writer, prefix=PREFIX, tables=listed,
                                  concurrent=concurrent))
    return path


def child(config_path: Path, profile: bool, quiet: bool = False, ticks_only: bool = False,
          home: Path | None = None, storage_url: str | None = None) -> None:
    """One ``cdc_merge_job`` run in this (fresh) process; prints one ``RESULT {json}`` line. ``quiet``: the
    tables are caught up; the run's instance keeps its events on disk (as a deployment's does), in ``home`` when
    given (the quiet runs share one: the first records the tables as caught up, the next find them recorded, as
    a deployment's runs after the merges do), its storage Dagster's PostgreSQL one at ``storage_url`` when given,
    and after the run ``cdc_merge_schedule`` ticks on it (``tick_s``: each tick's seconds, the code location
    loaded)."""
    os.environ["CDC_ASSETS_CONFIG"] = str(config_path)
    from dagster import DagsterEventType, DagsterInstance, build_schedule_context

    from cdc_assets.config import load_config
    from cdc_assets.definitions import build_definitions

    with PeakRss(exclude_pid=-1) as rss:
        config = load_config(config_path)
        job = build_definitions(config).resolve_job_def("cdc_merge_job")
        # A run worker has its instance (and code location) before its run.
        if home is not None:
            home.mkdir(parents=True, exist_ok=True)
        storage = {"storage": {"postgres": {"postgres_url": storage_url}}} if storage_url else None
        instance = DagsterInstance.local_temp(str(home or tempfile.mkdtemp(prefix="cdc-w2-home-")), storage) \
            if quiet or ticks_only else DagsterInstance.ephemeral()
        profiler = cProfile.Profile() if profile else None
        # The reference, in the same process: its start, imports, definitions load and instance, before the run.
        loaded_cpu, loaded_s = run_cpu(), time.time() - psutil.Process().create_time()
        started, started_at = time.perf_counter(), time.time()
        if profiler:
            profiler.enable()
        result = None if ticks_only else job.execute_in_process(instance=instance, raise_on_error=False)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - started
        whole = {"loaded_s": loaded_s, "loaded_cpu": loaded_cpu,  # the run's end, before the ticks below
                 "ended_s": time.time() - psutil.Process().create_time(), "ended_cpu": run_cpu()}
        ticks, skipped = [], None
        if quiet or ticks_only:
            schedule = build_definitions(config).get_schedule_def("cdc_merge_schedule")
            for _ in range(3):
                mark = time.perf_counter()
                data = schedule.evaluate_tick(build_schedule_context(instance=instance))
                ticks.append(time.perf_counter() - mark)
                requests = data.run_requests or []
                skipped = data.skip_message or f"a run of {len(requests[0].asset_selection or [])} tables"
    if result is None:  # the ticks alone, on an instance with no materialization: every table requested
        print("RESULT " + json.dumps({"tick_s": ticks, "skipped": skipped}), flush=True)
        os._exit(0)
    if not result.success:
        failures = [str(e.event_specific_data) for e in result.all_events if e.is_failure][:3]
        raise SystemExit("cdc_merge_job failed: " + "\n".join(failures))
    stages: dict[str, float] = {}
    per_table: list[float] = []
    events = 0
    for event in result.get_asset_materialization_events():
        metadata = event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
        # A table with nothing new (caught up) is materialized without a batch: no stage seconds.
        table_stages = dict(metadata["stage_seconds"].value) if "stage_seconds" in metadata else {}  # type: ignore[arg-type]
        per_table.append(table_stages.pop("total_s", 0.0))
        for stage, seconds in table_stages.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
        events += int(metadata["events_read"].value)  # type: ignore[arg-type]
    checks = len(list(result.get_asset_check_evaluations()))
    # execute_in_process creates the run first: its planned events, written by the launcher in a deployment.
    creation = min(entry.timestamp for entry in instance.all_logs(result.run_id, of_type=DagsterEventType.RUN_START))
    creation -= started_at
    top = ""
    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
        stats.print_stats(45)
        stats.print_stats(r"cdc_assets|deltalake|confluent_kafka|pyspark", 30)  # the project's code and its clients
        top = out.getvalue()
    print("RESULT " + json.dumps({
        "wall_s": wall, "creation_s": creation, "tables": len(per_table), "table_seconds": per_table, "stages": stages,
        "checks": checks, "events": events, "peak_rss": rss.peak, "profile": top, "tick_s": ticks, "skipped": skipped,
        "run_cpu": run_cpu(), "whole": whole}), flush=True)
    os._exit(0)


def run_child(config_path: Path, broker: ApacheKafkaBroker, profile: bool, label: str, quiet: bool = False,
              ticks_only: bool = False, home: Path | None = None, storage_url: str | None = None,
              event_batch_size: int | None = None) -> dict:
    """One ``child`` run in a fresh process, its CPU and the server's and broker's beside it. ``event_batch_size``:
    the process's ``DAGSTER_EVENT_BATCH_SIZE`` (Dagster stores a batch of events it marks as one with one
    ``store_event_batch`` when > 0; None: this process's environment)."""
    broker_pid = broker.pid
    assert broker_pid is not None
    wait_until_idle(broker_pid)
    servers = [state["pid"] for _, state in running_servers()]
    before = {"broker": process_cpu(broker_pid), **server_cpu(servers)}
    with contextlib.ExitStack() as stack:
        server_rss = [stack.enter_context(PeakRss(exclude_pid=-1, pid=pid)) for pid in servers]
        command = [sys.executable, "-m", "benchmarks.many_tables", "--child", str(config_path)]
        done = subprocess.run(command + (["--profile"] if profile else []) + (["--quiet"] if quiet else [])
                              + (["--ticks-only"] if ticks_only else []) + (["--home", str(home)] if home else [])
                              + (["--storage-url", storage_url] if storage_url else []),
                              capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent,
                              env=os.environ if event_batch_size is None
                              else {**os.environ, BATCH_SIZE_ENV_VAR: str(event_batch_size)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{label} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    servers = servers or [state["pid"] for _, state in running_servers()]
    result["cpu"] = {"run": result["run_cpu"],
                     **used_since(before, {"broker": process_cpu(broker_pid), **server_cpu(servers)})}
    result["server_rss"] = sum(r.peak for r in server_rss)
    print(f"  {label}: {result['wall_s']:.1f} s for {result['tables']} tables "
          f"(CPU s: run {result['cpu']['run']:.1f}, server {result['cpu']['server']:.1f} "
          f"of which JIT {result['cpu']['server_jit']:.1f}, "
          f"broker {result['cpu']['broker']:.1f})", flush=True)
    return result


def mismatches(root: Path, oracle: dict[str, tuple[int, str]]) -> list[str]:
    """The tables that differ from their reference fold (rows, checksum), each with what it holds."""
    found = []
    for table, expected in oracle.items():
        path = root / PREFIX / SCHEMA / table
        if not DeltaTable.is_deltatable(str(path)):
            found.append(f"table {table}: no Delta table; expected {expected}")
            continue
        rows = DeltaTable(str(path)).to_pyarrow_table(
            columns=["id", "name", "score", "active", "amount", "updated_at", "born_on"]).to_pylist()
        got = {r["id"]: (r["name"], r["score"], r["active"], r["amount"], r["updated_at"], r["born_on"])
               for r in rows}
        if (len(got), checksum(got)) != expected:
            found.append(f"table {table}: {len(got)} rows, checksum {checksum(got)}; expected {expected}")
    return found


def verify(root: Path, oracle: dict[str, tuple[int, str]]) -> None:
    """Every table equals its reference fold."""
    if found := mismatches(root, oracle):
        raise SystemExit("\n".join(found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--events", type=int, default=500, help="events per table (tombstones not counted)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--warm-tables", type=int, default=None,
                        help="tables of each warm-up run (default: all)")
    parser.add_argument("--warm-passes", type=int, default=12,
                        help="warm-up runs at most, until the server's JIT compilers use at most 10%% of its CPU "
                             "in a run")
    parser.add_argument("--writer", default="delta-rs", choices=("delta-rs", "delta-spark"))
    parser.add_argument("--profile", action="store_true", help="run the measured run under cProfile")
    parser.add_argument("--concurrent-tables", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2],
                        help="batch.concurrent_tables of the measured runs, comma-separated: one run each")
    parser.add_argument("--quiet-runs", type=int, default=1,
                        help="runs after the measured ones with nothing new in any topic, on one instance: the "
                             "first records the tables (none is recorded there yet), the next find them recorded, "
                             "as a deployment's runs after its merges do")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quiet-storage", type=storages, default=["sqlite"],
                        help="the quiet runs' Dagster storage, comma-separated for one series of quiet runs each: "
                             "sqlite, under their DAGSTER_HOME (Dagster's default), or postgres, a private PostgreSQL "
                             "server (fsync on; tests/support/postgres.py), as Dagster advises for deployments")
    parser.add_argument("--event-batch-size", type=lambda text: [int(n) for n in text.split(",")], default=[0],
                        help=f"the quiet runs' {BATCH_SIZE_ENV_VAR}, comma-separated for one series of quiet runs "
                             "each (with each storage), on an instance of its own: 0, Dagster's default, stores "
                             "each event on its own")
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--storage-url", help=argparse.SUPPRESS)
    parser.add_argument("--ticks-only", action="store_true",
                        help="no merge: cdc_merge_schedule's ticks alone over the produced tables (each requested)")
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.profile, args.quiet, args.ticks_only, Path(args.home) if args.home else None,
              args.storage_url)
        return

    with tempfile.TemporaryDirectory(prefix="cdc-w2-") as scratch, \
            ApacheKafkaBroker(Path(scratch) / "broker") as broker, contextlib.ExitStack() as stack:
        work = Path(scratch)
        os.environ[SERVER_DIR_ENV_VAR] = str(work / "spark-servers")  # the benchmark's own server
        started = time.perf_counter()
        oracle, events = produce(broker.bootstrap_servers, args.tables, args.events, args.partitions)
        print(f"W2: {args.tables} tables x {args.events} events ({events:,} events, {args.partitions} partitions "
              f"each), writer {args.writer}; produced in {time.perf_counter() - started:.1f} s", flush=True)
        if args.ticks_only:
            config = write_config(work, broker.bootstrap_servers, args.tables, work / "delta-ticks", args.writer)
            wait_until_idle(broker.pid or 0)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "benchmarks.many_tables", "--child", str(config),
                                   "--ticks-only"], capture_output=True, text=True,
                                  cwd=Path(__file__).resolve().parent.parent)
            whole = time.perf_counter() - started
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"ticks failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            ticks = json.loads(lines[-1].removeprefix("RESULT "))
            print(f"cdc_merge_schedule ticks over {args.tables} tables (code location loaded, no materialization "
                  "yet): " + ", ".join(f"{1000 * tick:.0f} ms" for tick in ticks["tick_s"])
                  + f" ({1000 * min(ticks['tick_s']) / args.tables:.2f} ms a table); it asked for "
                  f"{ticks['skipped']}; the process, start-up and definitions load included: {whole:.1f} s")
            return
        try:
            warm_tables = min(args.warm_tables or args.tables, args.tables)
            warm_ups = warm_until_steady(lambda number: run_child(
                write_config(work, broker.bootstrap_servers, warm_tables, work / f"delta-warm-{number}",
                             args.writer, 2), broker, False,
                f"warm-up {number} ({warm_tables} tables{', starts the server' if number == 1 else ''})"),
                args.warm_passes)
            measured = {
                concurrent: run_child(write_config(work, broker.bootstrap_servers, args.tables,
                                                   work / f"delta-{concurrent}", args.writer, concurrent),
                                      broker, args.profile, f"measured run (warm server, {concurrent} tables at once)")
                for concurrent in args.concurrent_tables}
            # The same tables again with nothing new: what a schedule tick costs when the tables are quiet.
            last = args.concurrent_tables[-1]
            config = write_config(work, broker.bootstrap_servers, args.tables, work / f"delta-{last}", args.writer,
                                  last)
            server = quiet_storage(stack) if "postgres" in args.quiet_storage and args.quiet_runs else None
            quiet: dict[tuple[str, int], list[dict]] = {}
            for storage in args.quiet_storage:
                for size in args.event_batch_size:
                    # Each series on an instance of its own: its first run finds no record of the tables.
                    name = f"{storage}_batch_{size}"
                    storage_url = None
                    if storage == "postgres" and server is not None:
                        server.create_database(name)
                        storage_url = f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/{name}"
                    quiet[storage, size] = [
                        run_child(config, broker, args.profile, f"quiet run {number + 1} ({storage}, "
                                  f"{BATCH_SIZE_ENV_VAR}={size})", quiet=True, home=work / f"dagster-home-{name}",
                                  storage_url=storage_url, event_batch_size=size)
                        for number in range(args.quiet_runs)]
        finally:
            stop_all()
        for concurrent in args.concurrent_tables:
            verify(work / f"delta-{concurrent}", oracle)
    print(f"warm-up: {len(warm_ups)} runs of {warm_ups[0]['tables']} tables, the first on a cold server: "
          + ", ".join(f"{run['wall_s']:.1f} s" for run in warm_ups) + "; the server's CPU s: "
          + ", ".join(f"{run['cpu']['server']:.1f}" for run in warm_ups))
    for concurrent, result in measured.items():
        print(f"\n== batch.concurrent_tables: {concurrent} ==")
        report(result, events, args.tables, concurrent)
    for (storage, size), results in quiet.items():
        print(f"\nquiet runs on one Dagster instance, storage {storage}, {BATCH_SIZE_ENV_VAR}={size}")
        for number, result in enumerate(results, 1):
            report_quiet(number, result, args.tables, args.concurrent_tables[-1])
            print("  cdc_merge_schedule's ticks on it (code location loaded): "
                  + ", ".join(f"{1000 * tick:.0f} ms" for tick in result["tick_s"])
                  + f" ({1000 * min(result['tick_s']) / args.tables:.2f} ms a table); it said: {result['skipped']}")
            if result["profile"]:
                print(result["profile"])
    if 1 in measured:
        print()
        for concurrent, result in measured.items():
            print(f"{concurrent} tables at once: {measured[1]['wall_s'] / result['wall_s']:.2f}x the speed of 1")


def storages(text: str) -> list[str]:
    """``--quiet-storage``'s list: each of sqlite, postgres."""
    kinds = text.split(",")
    if unknown := set(kinds) - {"sqlite", "postgres"}:
        raise argparse.ArgumentTypeError(f"unknown storage {', '.join(sorted(unknown))}: sqlite or postgres")
    return kinds


def quiet_storage(stack: contextlib.ExitStack) -> PostgresServer:
    """The quiet runs' PostgreSQL storage: a private server (started on ``stack``), fsync on as a deployment's;
    each series of quiet runs has a database of its own there, by the psycopg2 driver (docs/operations.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' server: one place for it
    from tests.support.postgres import PostgresServer

    return stack.enter_context(PostgresServer({"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}))


def report_quiet(number: int, result: dict, tables: int, concurrent: int) -> None:
    """A quiet run's figures: from its process's start to the run's end (the goal's figure), wall and CPU, beside
    the reference in the same process (its start, imports, definitions load and instance, before the run)."""
    whole = result["whole"]
    run_s, run_cpu_s = whole["ended_s"] - whole["loaded_s"], whole["ended_cpu"] - whole["loaded_cpu"]
    print(f"\nquiet run {number} (nothing new, {concurrent} tables at once): {whole['ended_s']:.2f} s from the "
          f"process's start ({whole['ended_cpu']:.1f} CPU s), of which the reference, the process's start and load "
          f"alone: {whole['loaded_s']:.2f} s ({whole['loaded_cpu']:.1f} CPU s), and the run: {run_s:.2f} s "
          f"({run_cpu_s:.1f} CPU s, {1000 * run_cpu_s / tables:.1f} CPU ms a table; the Spark server "
          f"{result['cpu']['server']:.1f} CPU s); whole / reference: {whole['ended_s'] / whole['loaded_s']:.2f}x wall, "
          f"{whole['ended_cpu'] / whole['loaded_cpu']:.2f}x CPU; {result['tables']} materializations, "
          f"{result['checks']} check evaluations; creating the run (its planned events: a webserver's or daemon's "
          f"work in a deployment, before the run worker starts) {result['creation_s']:.2f} s of the run")


def report(result: dict, events: int, tables: int, concurrent: int) -> None:
    wall = result["wall_s"]
    inner = sum(result["table_seconds"])
    events_cost = events / W1_EVENTS_PER_S
    print(f"\nall {tables} tables equal their reference folds")
    print(f"run: {wall:.1f} s, {events / wall:,.0f} events/s, {result['checks']} check evaluations; creating the run "
          f"(its planned events, the launcher's work in a deployment) {result['creation_s']:.1f} s of it")
    print(f"per-table overhead: {wall / tables:.3f} s (the run over the tables); "
          f"{(wall - events_cost) / tables:.3f} s with the events' own cost at {W1_EVENTS_PER_S:,} events/s "
          f"({events_cost:.1f} s) taken out")
    seconds = result["table_seconds"]
    print(f"a table's first poll to last commit: median {statistics.median(seconds):.3f} s, "
          f"max {max(seconds):.3f} s, sum {inner:.1f} s; " + (
              f"Dagster around them (op, events, checks): {wall - inner:.1f} s ({(wall - inner) / tables:.3f} s a "
              "table)" if concurrent == 1 else "(tables overlap)"))
    print(f"peak RSS: run {result['peak_rss'] / 2**30:.2f} GiB, + server "
          f"{(result['peak_rss'] + result['server_rss']) / 2**30:.2f} GiB; CPU s: run {result['cpu']['run']:.1f}, "
          f"server {result['cpu']['server']:.1f}, broker {result['cpu']['broker']:.1f}")
    print("pipeline stages summed over the tables (seconds, per table):")
    for stage, total in sorted(result["stages"].items(), key=lambda item: -item[1]):
        print(f"  {stage:<26}{total:8.1f}{total / tables:8.3f}")
    if result["profile"]:
        print("cProfile of the run (cumulative):")
        print(result["profile"])


if __name__ == "__main__":
    main()
