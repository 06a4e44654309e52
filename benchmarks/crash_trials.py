"""Crash safety: SIGKILL the merge process at random points, rerun it, and
check the Delta table against the reference fold of everything produced.

Each trial merges the same topic into a fresh Delta table in small batches, in a worker process
that is killed either at a named point (after consuming, after the Spark fold, after the Delta
commit) or at a random moment (which lands in consuming, folding, the commit, or between batches).
A normal rerun then catches up. The trial passes when the table equals the reference (no key lost,
none duplicated), the committed offsets reach the end of every partition, and the Delta history
never commits the same offsets twice.

    python benchmarks/crash_trials.py [--trials 20] [--events 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

POINTS = ("consumed", "folded", "committed", "random")
TOPIC = "crash.public.accounts"


def worker(args: argparse.Namespace) -> None:
    """Merge until caught up; with --crash-at, kill this process group at that point."""
    from cdc_assets import pipeline
    from cdc_assets.catalog import CapturedTable
    from cdc_assets.config import BatchLimits
    from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget
    from cdc_assets.io.kafka_source import KafkaSource
    from cdc_assets.io.spark import spark_config
    from cdc_assets.io.spark_server import connect, ensure_local_server

    if args.crash_at:
        rng = random.Random(args.seed)
        chance = 1 / 3

        def hook(point: str) -> None:
            if point == args.crash_at and rng.random() < chance:
                os.killpg(os.getpgid(0), signal.SIGKILL)

        pipeline.fault_hook = hook
    # The embedded default: the local Spark server, which a SIGKILL of this process leaves running.
    spark = connect(ensure_local_server(spark_config()))
    table = CapturedTable("crash", "postgresql", "crash", "public.accounts", TOPIC, DeltaTarget(args.delta))
    source = KafkaSource({"bootstrap.servers": args.bootstrap, "group.id": "crash"})
    writer = DeltaRsWriter()
    # As a run does: the next batch folded while one is merged (so kills land in either).
    limits = BatchLimits(max_records=args.batch, max_batches_per_run=1_000_000)
    for _ in pipeline.merge_micro_batches(spark, source, writer, table, limits):
        pass
    source.close()
    print("caught up", flush=True)


def produce(bootstrap: str, events: int, keys: int, partitions: int, seed: int) -> tuple[dict[int, dict], int]:
    """Produce a history with updates, deletes (and tombstones) and re-creates; return the reference."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from cdc_assets.demo.broker import PRODUCER_SETTINGS
    from cdc_assets.demo.events import encode_key, envelope, postgres_source

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])[TOPIC].result()
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap, "linger.ms": 20})
    rng, state, records = random.Random(seed), {}, 0
    for i in range(events):
        key = rng.randrange(keys)
        op = "d" if key in state and rng.random() < 0.15 else ("u" if key in state else "c")
        row = None if op == "d" else {"id": key, "v": i}
        value = envelope(op, state.get(key) if op == "d" else None, row, postgres_source(1000 + i, i, "public",
                                                                                           "accounts"), i)
        producer.produce(TOPIC, key=encode_key({"id": key}), value=value)
        records += 1
        if op == "d":
            producer.produce(TOPIC, key=encode_key({"id": key}), value=None)
            records += 1
            state.pop(key)
        else:
            state[key] = row
        if i % 5000 == 0:
            producer.poll(0)
    producer.flush(60)
    return state, records


def check(delta: str, reference: dict[int, dict], bootstrap: str) -> list[str]:
    """What is wrong with the table after a trial (empty: nothing)."""
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import DeltaTable

    problems = []
    table = DeltaTable(delta)
    rows = table.to_pyarrow_table(columns=["id", "v"]).to_pylist()
    ids = [row["id"] for row in rows]
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} duplicate keys")
    if {row["id"]: row for row in rows} != reference:
        problems.append(f"table differs from the reference ({len(rows)} rows, expected {len(reference)})")
    committed = []
    for entry in reversed(table.history()):
        recorded = json.loads(entry.get("userMetadata") or "{}").get("cdc_assets")
        if recorded:
            committed.append(recorded["version"])
    if committed != sorted(set(committed)):
        problems.append(f"offsets committed twice or out of order: {committed}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "crash-check"})
    metadata = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC]
    highs = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in metadata.partitions}
    consumer.close()
    if committed and committed[-1] != sum(highs.values()):
        problems.append(f"committed offsets end at {committed[-1]}, the topic at {sum(highs.values())}")
    return problems


def run_worker(args: argparse.Namespace, delta: str, crash_at: str | None, seed: int) -> subprocess.Popen:
    command = [sys.executable, __file__, "--worker", "--bootstrap", args.bootstrap, "--delta", delta,
               "--batch", str(args.batch), "--seed", str(seed)]
    if crash_at and crash_at != "random":
        command += ["--crash-at", crash_at]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--delta", help=argparse.SUPPRESS)
    parser.add_argument("--crash-at", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    from cdc_assets.demo.broker import ApacheKafkaBroker
    from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, stop_all

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cdc-crash-"))
    rng = random.Random(11)
    passed = 0
    own_server = SERVER_DIR_ENV_VAR not in os.environ  # else a caller's (the tests') server is shared
    if own_server:
        os.environ[SERVER_DIR_ENV_VAR] = str(work / "spark-servers")
    with ApacheKafkaBroker(work / "broker") as broker, contextlib.ExitStack() as cleanup:
        if own_server:
            cleanup.callback(stop_all)
        args.bootstrap = broker.bootstrap_servers
        reference, records = produce(broker.bootstrap_servers, args.events, args.keys, args.partitions, seed=5)
        print(f"{records} records ({args.events} events) over {args.keys} keys, batches of {args.batch}")
        for trial in range(args.trials):
            point = POINTS[trial % len(POINTS)]
            delta = str(work / f"trial-{trial}")
            crashed = run_worker(args, delta, point, seed=trial)
            if point == "random":
                try:
                    crashed.wait(rng.uniform(2.0, 15.0))
                except subprocess.TimeoutExpired:
                    os.killpg(crashed.pid, signal.SIGKILL)
            crashed.wait()
            killed = crashed.returncode == -signal.SIGKILL
            rerun = run_worker(args, delta, None, seed=trial)
            output, _ = rerun.communicate(timeout=600)
            problems = [] if rerun.returncode == 0 else [f"rerun failed: {output[-2000:]}"]
            problems = problems or check(delta, reference, broker.bootstrap_servers)
            passed += not problems
            print(f"trial {trial + 1}: kill {'at ' + point if point != 'random' else 'at a random moment'}"
                  f"{'' if killed else ' (finished before the kill)'}: {problems or 'ok'}",
                  flush=True)
    print(f"{passed} of {args.trials} trials passed")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
