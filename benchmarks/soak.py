"""Soak: produce at a fixed rate into the topics of one connector's tables while sensor-driven Dagster runs
of ``cdc_merge_job`` keep merging, for a bounded time; report how long changes took to become visible in
Delta (capture lag over all tables), the backlog, peak RSS, and whether anything was lost. Issue 26's
goal: 5,000 events/s over 50 tables for 10 minutes, nothing lost, capture lag p95 <= 30 s.

A producer thread writes PostgreSQL change events (``benchmarks.many_tables``' tables and their reference
folds) at ``--rate`` events/s to a local Apache Kafka, round-robin over ``--tables`` topics, and remembers
when each offset was produced. The main thread plays the sensor: each tick it compares every topic's high
watermarks with the offsets its table has committed and requests one run of ``cdc_merge_job`` for the
tables with new events (an asset selection, as the product's transaction and backfill sensors request:
the connector's merge op runs for those tables only). By default each run is a fresh process that loads
the code location and executes the run, as a run worker does, so every run pays for its Python and
Dagster start (Spark is the local Spark server the runs share); ``--runs-in same`` runs them with
``execute_in_process`` in this process. Before production begins, runs over tables of their own start the
local server and warm it until it is steady, as a deployment's server outlives its runs (``--warm-passes``;
0: the first soak run starts it cold). Fresh runs store their events in the SQLite
instance of their ``DAGSTER_HOME``, as a deployment's runs do by default; ``--instance memory`` gives each
run an instance of its own in memory, to tell Dagster's storage apart from the pipeline. Peak RSS counts
the runs and the local Spark server, sampled together (with ``--runs-in same``, this process too); the
soak's own process (``harness_peak_rss_gib``) is reported apart. An event's capture lag is the time from its
production to the Delta commit of its table that holds it (each commit's time and offsets from the table's
log), when a reader sees it; the lag to the end of that commit's run is reported beside it. After
the last run every table is checked against the reference fold of what was produced (row count and checksum).

    python -m benchmarks.soak [--tables 50] [--rate 5000] [--seconds 600] [--runs-in fresh|same]
                              [--instance disk|memory] [--warm-passes 12]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from array import array
from collections.abc import Mapping
from pathlib import Path

import psutil
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from dagster import AssetCheckKey, AssetKey, DagsterInstance, JobDefinition
from deltalake import DeltaTable

from benchmarks.many_tables import PREFIX, SCHEMA, TableEvents, checksum, mismatches, produce, table_name
from benchmarks.measure import PeakRss, process_cpu, server_cpu, used_since, warm_until_steady
from cdc_assets.catalog import CapturedTable, resolve_tables
from cdc_assets.checks import merge_run_checks
from cdc_assets.config import load_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker, produce_waiting
from cdc_assets.io.delta import DeltaTarget, progress_from_history
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers, stop_all
from cdc_assets.translator import CdcTranslator

WARM_SCHEMA = "warm"
WARM_EVENTS = 2_000  # a warm-up table's events: about what a soak run finds in a table at 5,000 events/s over 50

CONFIG = """
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
batch: {{max_records: {max_records}}}
connectors:
  - name: soak
    kind: postgresql
    topic.prefix: {prefix}
    tables:
{tables}
"""


class RateProducer(threading.Thread):
    """Produces ``rate`` events/s for ``seconds``, round-robin over ``tables`` (``partitions`` each);
    records when each offset was produced (``produced_at[topic][partition][offset]``, NaN for a tombstone).

    The harness stands in for Debezium and shares the 2 cores with what it measures, so it produces as
    cheaply as it can: it picks each record's partition from its key itself (the same key, the same
    partition, as Kafka's partitioner does) and knows its offset from the order it produced it in (one
    idempotent producer of fresh topics: a partition's n-th record is offset n, checked by ``check_offsets``),
    with no delivery callback per record; and it batches and compresses (lz4, up to 100 ms), as a Kafka Connect
    worker configured for throughput does: record by record, the broker spent more CPU than the runs."""

    def __init__(self, bootstrap: str, rate: int, seconds: float, tables: list[TableEvents], partitions: int):
        super().__init__(daemon=True)
        self.rate, self.seconds, self.tables, self.partitions = rate, seconds, tables, partitions
        self.produced_at: dict[str, dict[int, array]] = {
            t.topic: {p: array("d") for p in range(partitions)} for t in tables}
        self.count = 0
        self._servers = bootstrap

    def run(self) -> None:
        producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": self._servers, "linger.ms": 100,
                             "compression.type": "lz4"})
        started = time.time()
        while time.time() - started < self.seconds:
            due = int((time.time() - started) * self.rate) - self.count
            for _ in range(max(due, 0)):
                table = self.tables[self.count % len(self.tables)]
                topic = table.topic
                now_ms = int(time.time() * 1000)
                for key, value in table.next(now_ms):
                    partition = zlib.crc32(key) % self.partitions
                    # Noted first: a run may commit the record as soon as it is produced.
                    self.produced_at[topic][partition].append(math.nan if value is None else now_ms / 1000)
                    produce_waiting(producer, topic, key, value, 0.05, partition=partition, timestamp=now_ms)
                self.count += 1
            producer.poll(0)
            time.sleep(0.05)
        if producer.flush(60):
            raise SystemExit("the soak's producer could not deliver everything within 60 s")

    def check_offsets(self, highs: dict[str, dict[int, int]]) -> None:
        """Every partition holds exactly the records produced to it (what the offsets were taken from)."""
        wrong = [f"{topic}[{p}]: high watermark {high}, {len(self.produced_at[topic][p])} produced"
                 for topic, partitions in highs.items() for p, high in partitions.items()
                 if high != len(self.produced_at[topic][p])]
        if wrong:
            raise SystemExit("the soak's offsets are not the produced order: " + "; ".join(wrong[:5]))


_NO_LEADER_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._UNKNOWN_PARTITION,
                  KafkaError.UNKNOWN_TOPIC_OR_PART)


def high_watermarks(admin: AdminClient, topics: list[str], partitions: int, attempts: int = 20
                    ) -> dict[str, dict[int, int]]:
    """Every partition's high watermark, in one request (asked again while a new topic's partitions
    have no leader yet: Kafka elects them after ``create_topics`` returns)."""
    for attempt in range(attempts):
        futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest()
                                      for t in topics for p in range(partitions)})
        highs: dict[str, dict[int, int]] = {t: {} for t in topics}
        try:
            for partition, future in futures.items():
                highs[partition.topic][partition.partition] = future.result().offset
            return highs
        except KafkaException as exc:
            if exc.args[0].code() not in _NO_LEADER_YET or attempt + 1 == attempts:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def backlog(highs: dict[str, dict[int, int]], committed: dict[str, dict[int, int]]) -> dict[str, int]:
    """Per topic, the records beyond its table's committed offsets."""
    return {topic: sum(max(high - committed[topic].get(p, 0), 0) for p, high in partitions.items())
            for topic, partitions in highs.items()}


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def batch_commits(target: DeltaTarget, app_id: str, after: int) -> list[tuple[int, float, dict[int, int]]]:
    """The table's batch commits after version ``after``, oldest first: (version, commit time in seconds,
    the offsets it recorded); none if there is no table yet."""
    if not DeltaTable.is_deltatable(target.path):
        return []
    table = DeltaTable(target.path)
    commits = []
    for entry in table.history(table.version() - after):
        progress = progress_from_history([entry], app_id)
        if progress is not None and progress.delta_version > after:
            commits.append((progress.delta_version, int(str(entry["timestamp"])) / 1000, progress.offsets))
    return sorted(commits)


def write_config(path: Path, bootstrap: str, root: Path, max_records: int, schema: str, tables: int) -> Path:
    """The soak's pipeline config: one PostgreSQL connector, ``tables`` tables of the source ``schema``."""
    path.write_text(CONFIG.format(
        bootstrap=bootstrap, root=root, max_records=max_records, prefix=PREFIX,
        tables="\n".join(f"      - name: {schema}.{table_name(i)}" for i in range(tables))))
    return path


def request(tables: Mapping[AssetKey, CapturedTable]) -> dict[str, list]:
    """A run request for ``tables``, as the project's sensors make it: their assets and the checks their merge
    run evaluates (``merge_run_checks``), as JSON."""
    return {"assets": [key.path for key in tables],
            "checks": [[check.asset_key.path, check.name] for check in merge_run_checks(tables)]}


def requested_job(job: JobDefinition, selection: Mapping[str, list]) -> JobDefinition:
    """``job`` cut to a run ``request``'s selection, as Dagster launches it."""
    return job.get_subset(asset_selection={AssetKey(path) for path in selection["assets"]},
                          asset_check_selection={AssetCheckKey(AssetKey(path), name)
                                                 for path, name in selection["checks"]})


def fresh_run(tables: Mapping[AssetKey, CapturedTable], env: dict[str, str],
              instance_kind: str) -> tuple[bool, str, float]:
    """One ``cdc_merge_job`` run of ``tables`` in a fresh process (``child_run``), as a run worker does:
    whether it succeeded, its error output, and its CPU seconds."""
    command = [sys.executable, "-m", "benchmarks.soak", "--instance", instance_kind,
               "--run", json.dumps(request(tables))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.run(command, env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                             text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return process.returncode == 0, process.stderr[-3000:], cpu


def servers_cpu() -> dict[str, float]:
    """The CPU seconds of the running local Spark servers, and of their JIT compilers (``server_cpu``)."""
    return server_cpu(state["pid"] for _, state in running_servers())


def warm_server(work: Path, bootstrap: str, args: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    """Starts the local Spark server and warms it before production begins, as a deployment's server that
    outlives its runs is: runs of the same connector over tables of their own (source schema
    ``WARM_SCHEMA``, ``WARM_EVENTS`` events each), each into a fresh Delta root, until the server is steady
    (``warm_until_steady``). The results (``wall_s``, ``cpu``) of the runs."""
    produce(bootstrap, args.tables, WARM_EVENTS, args.partitions, schema=WARM_SCHEMA)

    def run(number: int) -> dict:
        config = write_config(work / f"warm-{number}.yaml", bootstrap, work / f"delta-warm-{number}",
                              args.max_records, WARM_SCHEMA, args.tables)
        translator = CdcTranslator()
        tables = {translator.get_asset_key(table): table for table in resolve_tables(load_config(config))}
        before, started = servers_cpu(), time.time()
        ok, error, _ = fresh_run(tables, {**env, "CDC_ASSETS_CONFIG": str(config)}, args.instance)
        if not ok:
            raise SystemExit(f"warm-up run {number} failed:\n{error}")
        result = {"wall_s": time.time() - started,
                  "cpu": used_since(before, servers_cpu())}
        print(f"  warm-up {number}: {result['wall_s']:.1f} s, the server's CPU {result['cpu']['server']:.1f} s "
              f"(JIT {result['cpu']['server_jit']:.1f} s)",
              flush=True)
        return result

    return warm_until_steady(run, args.warm_passes)


def child_run(selection: str, instance_kind: str) -> None:
    """One run in this (fresh) process: load the code location, run ``cdc_merge_job`` for a run request's
    ``selection`` (``request``), storing its events in the instance of ``DAGSTER_HOME`` (``disk``) or in one
    of its own in memory."""
    from cdc_assets.definitions import defs as load_defs

    defs = load_defs()
    instance = DagsterInstance.get() if instance_kind == "disk" else DagsterInstance.ephemeral()
    job = requested_job(defs.resolve_job_def("cdc_merge_job"), json.loads(selection))
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    if not result.success:
        failures = [str(e.event_specific_data) for e in result.all_events if e.is_failure][:3]
        raise SystemExit("cdc_merge_job failed: " + "\n".join(failures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=50, help="tables (topics) of the connector")
    parser.add_argument("--rate", type=int, default=5000, help="events per second, over all tables")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--drain-seconds", type=float, default=300,
                        help="after production stops, how long runs may take to catch up (a run that started "
                             "before then and ends after it has left what arrived meanwhile waiting)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic")
    parser.add_argument("--max-records", type=int, default=100_000)
    parser.add_argument("--runs-in", choices=("fresh", "same"), default="fresh",
                        help="fresh: each run a new process that loads the code location; "
                             "same: execute_in_process here")
    parser.add_argument("--instance", choices=("disk", "memory"), default="disk",
                        help="where fresh runs store their events: disk, the SQLite instance of DAGSTER_HOME (a "
                             "deployment's default); memory, an instance of each run's own (Dagster's storage "
                             "cost left out, and no run sees another's events)")
    parser.add_argument("--warm-passes", type=int, default=12,
                        help="before production, warm the local Spark server with up to this many runs of tables "
                             "of their own, until its JIT compilers use at most 10%% of its CPU in a run (0: the "
                             "first run starts it cold)")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        child_run(args.run, args.instance)
        return

    with tempfile.TemporaryDirectory(prefix="cdc-soak-") as work, ApacheKafkaBroker(Path(work) / "broker") as broker:
        rng = random.Random(26)
        per_table = math.ceil(args.rate * args.seconds / args.tables)
        generators = [TableEvents(i, per_table, 100_000_000 + i * 1_000_000, rng) for i in range(args.tables)]
        producer = RateProducer(broker.bootstrap_servers, args.rate, args.seconds, generators, args.partitions)
        topics = list(producer.produced_at)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for future in admin.create_topics([NewTopic(t, num_partitions=args.partitions, replication_factor=1)
                                           for t in topics]).values():
            future.result()
        root = Path(work) / "delta"
        config_path = write_config(Path(work) / "pipeline.yaml", broker.bootstrap_servers, root, args.max_records,
                                   SCHEMA, args.tables)
        config = load_config(config_path)
        tables: dict[str, CapturedTable] = {table.topic: table for table in resolve_tables(config)}
        assert set(tables) == set(topics), "the connector's tables are the produced topics"
        job = build_definitions(config).resolve_job_def("cdc_merge_job")
        dagster_home = Path(work) / "dagster_home"
        dagster_home.mkdir()
        # The soak's own local Spark server, set before the runs' environment is copied from this one's:
        # runs that looked in the default directory started a server the soak neither measured nor stopped.
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")
        env = {**os.environ, "CDC_ASSETS_CONFIG": str(config_path), "DAGSTER_HOME": str(dagster_home)}
        translator = CdcTranslator()
        # An event's lag: from its production to its table's commit that holds it (visible in Delta), and
        # to the end of that commit's run (as the sensor sees it).
        lags: dict[str, list[float]] = {topic: [] for topic in topics}
        run_end_lags: list[float] = []
        committed: dict[str, dict[int, int]] = {topic: {} for topic in topics}
        versions = dict.fromkeys(topics, -1)
        run_seconds: list[float] = []
        # Where the 2 cores go: this process (producer and sensor loop; the runs too with --runs-in same),
        # the broker, the local Spark server and the fresh runs (each waited for: its own CPU).
        run_tables: list[int] = []
        max_backlog = 0
        try:
            warm_ups = warm_server(Path(work), broker.bootstrap_servers, args, env) if args.warm_passes else []
            harness_cpu = sum(psutil.Process().cpu_times()[:2])
            broker_cpu = process_cpu(broker.pid or -1)
            server_cpu_before = servers_cpu()["server"]
            runs_cpu = 0.0
            with contextlib.ExitStack() as stack:
                instance = stack.enter_context(DagsterInstance.ephemeral())
                # Fresh runs: the runs and the local server, sampled together; this process (the producer,
                # the sensor's loop, every offset's production time) is the harness, counted apart.
                rss = stack.enter_context(PeakRss(exclude_pid=broker.pid or -1, count_root=args.runs_in == "same"))
                servers = running_servers()  # started by the warm-up runs, if any
                if servers:
                    rss.add_root(servers[0][1]["pid"])
                server_found = bool(servers)
                producer.start()
                deadline = time.time() + args.seconds + args.drain_seconds
                while time.time() < deadline:
                    waiting = backlog(high_watermarks(admin, topics, args.partitions), committed)
                    max_backlog = max(max_backlog, sum(waiting.values()))
                    selected = [topic for topic in topics if waiting[topic]]
                    if not selected:
                        if not producer.is_alive():
                            break
                        time.sleep(0.5)
                        continue
                    chosen = {translator.get_asset_key(tables[topic]): tables[topic] for topic in selected}
                    started = time.time()
                    if args.runs_in == "same":
                        done = requested_job(job, request(chosen)).execute_in_process(instance=instance,
                                                                                      raise_on_error=False)
                        ok, error = done.success, "see the log above"
                    else:
                        ok, error, cpu = fresh_run(chosen, env, args.instance)
                        runs_cpu += cpu
                    finished = time.time()
                    run_seconds.append(finished - started)
                    run_tables.append(len(selected))
                    if not ok:
                        raise SystemExit(f"run {len(run_seconds)} of cdc_merge_job ({len(selected)} tables) "
                                         f"failed:\n{error}")
                    # Started by the first fresh run, it outlives it: no child of this process.
                    servers = running_servers() if not server_found and args.runs_in == "fresh" else []
                    if servers:
                        rss.add_root(servers[0][1]["pid"])
                        server_found = True
                    for topic in selected:
                        for version, committed_at, offsets in batch_commits(tables[topic].target,
                                                                            tables[topic].app_id, versions[topic]):
                            for partition, end in offsets.items():
                                times = producer.produced_at[topic].get(partition, array("d"))
                                produced = [t for t in times[committed[topic].get(partition, 0):end]
                                            if not math.isnan(t)]
                                lags[topic].extend(committed_at - t for t in produced)
                                run_end_lags.extend(finished - t for t in produced)
                                committed[topic][partition] = end
                            versions[topic] = version
            producer.join(5)
            harness_cpu = sum(psutil.Process().cpu_times()[:2]) - harness_cpu
            broker_cpu = process_cpu(broker.pid or -1) - broker_cpu
            server_cpu_used = servers_cpu()["server"] - server_cpu_before
            highs = high_watermarks(admin, topics, args.partitions)
            producer.check_offsets(highs)
            behind = sum(backlog(highs, committed).values())
            del admin  # its connections closed before the broker stops
        finally:
            stop_all()
        oracle = {g.table: (len(g.state), checksum(g.state)) for g in generators}
        lost = mismatches(root, oracle)
        every = [lag for table_lags in lags.values() for lag in table_lags]
        table_p95 = {topic: percentile(values, 95) for topic, values in lags.items() if values}
        worst = max(table_p95, key=table_p95.__getitem__) if table_p95 else None
        print(json.dumps({
            "tables": args.tables, "rate_events_per_s": args.rate, "seconds": args.seconds,
            "events_produced": producer.count, "events_applied": len(every), "runs": len(run_seconds),
            "runs_in": args.runs_in, "instance": args.instance,
            "warm_up_runs_s": [round(run["wall_s"], 1) for run in warm_ups],
            "warm_up_server_cpu_s": [round(run["cpu"]["server"], 1) for run in warm_ups],
            "tables_per_run_mean": round(statistics.fmean(run_tables), 1) if run_tables else None,
            "run_s_p50": round(percentile(run_seconds, 50), 2) if run_seconds else None,
            "run_s_max": round(max(run_seconds), 2) if run_seconds else None,
            "lag_p50_s": round(percentile(every, 50), 2) if every else None,
            "lag_p95_s": round(percentile(every, 95), 2) if every else None,
            "lag_max_s": round(max(every), 2) if every else None,
            "lag_to_run_end_p50_s": round(percentile(run_end_lags, 50), 2) if run_end_lags else None,
            "lag_to_run_end_p95_s": round(percentile(run_end_lags, 95), 2) if run_end_lags else None,
            "worst_table_lag_p95_s": {worst: round(table_p95[worst], 2)} if worst else None,
            "max_backlog_records": max_backlog,
            "records_waiting_at_end": behind,
            "peak_rss_gib": round(rss.peak / 2**30, 2),
            "harness_peak_rss_gib": round(rss.peak_python / 2**30, 2),
            "cpu_s": {"harness": round(harness_cpu, 1), "broker": round(broker_cpu, 1),
                      "server": round(server_cpu_used, 1), "runs": round(runs_cpu, 1)},
            "nothing_lost": not lost and not behind and len(every) == producer.count,
            "tables_differing": lost,
        }, indent=2))


if __name__ == "__main__":
    main()
