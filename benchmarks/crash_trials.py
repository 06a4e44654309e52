"""Crash safety: SIGKILL the merge process at random points, rerun it, and
check the Delta table against the reference fold of everything produced.

Each trial merges the same topic into a fresh Delta table in small batches, in a worker process
that is killed either at a named point (after consuming, after the Spark fold, after the Delta
commit) or at a random moment inside the work. The random moment is timed from the run's own
progress: the worker prints a marker at each point it passes (consumed, folded, committed, batch
by batch) and, at a random marker, arms a timer for a random fraction of how long the phase after
that marker lasted the time before, so the kill lands inside a fold, a MERGE and its commit, or
the read of the next batch. Each such trial prints where the kill landed, from the markers the
worker printed before it; a worker that finished before its timer fired is a missed aim, and the
script reports how many random kills landed inside the work. A normal rerun then catches up. The
trial passes when the table equals the reference (no key lost, none duplicated), the committed
offsets reach the end of every partition, and the Delta history never commits the same offsets
twice.

``--store s3`` keeps the tables under an ``s3://`` root on a private S3-API server (moto's, the
tests' ``tests/support/objectstore.py``: run ``scripts/setup-tests`` first), checked the same way. ``--writer
delta-spark`` MERGEs and commits with delta-spark in the local Spark server (delta-rs by default): a kill
of the worker leaves the server running, so a MERGE it had sent may still commit after the worker died,
which the rerun must then find applied.

``--s3-root`` and ``--s3-options`` name an S3-API server of the caller's instead (its keys in the environment
variables the options name): the tests pass theirs, whose local Spark server, started with the same settings, is
then shared with this run's workers.

    python benchmarks/crash_trials.py [--trials 20] [--events 20000] [--store local|s3] [--writer delta-rs|delta-spark]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Named points and random moments alternate, so a short run (the tests' few trials) has random kills too.
POINTS = ("random", "consumed", "random", "folded", "random", "committed")
TOPIC = "crash.public.accounts"
MARKER = re.compile(r"^marker (\d+) (\w+) ", re.MULTILINE)


def worker(args: argparse.Namespace) -> None:
    """Merge until caught up, printing a marker at each point; kill this process group at
    ``--crash-at`` (a named point) or ``--kill-fraction`` of a marker gap after marker ``--kill-after``."""
    from cdc_assets.catalog import CapturedTable
    from cdc_assets.config import BatchLimits
    from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget, DeltaWriter
    from cdc_assets.io.kafka import KafkaSource
    from cdc_assets.io.spark import spark_config
    from cdc_assets.io.spark_server import connect, ensure_local_server
    from cdc_assets.merge import faults, merge_micro_batches

    rng = random.Random(args.seed)
    lock = threading.Lock()
    seen: list[tuple[str, float]] = []  # the markers passed: point, when
    started = time.monotonic()

    def kill() -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def hook(point: str) -> None:
        # Called from the batch-ahead thread too (the next batch is folded while one is merged).
        with lock:
            seen.append((point, time.monotonic()))
            print(f"marker {len(seen)} {point} at {seen[-1][1] - started:.2f} s", flush=True)
            if len(seen) == args.kill_after:
                timer = threading.Timer(args.kill_fraction * _phase_s(seen), kill)
                timer.daemon = True  # a worker that finishes first is not killed after its work
                timer.start()
        if point == args.crash_at and rng.random() < 1 / 3:
            kill()

    faults.fault_hook = hook
    # The embedded default: the local Spark server (it folds; delta-rs or, in it, delta-spark writes), with the
    # store's settings as a run has them, which a SIGKILL of this process leaves running.
    storage_options = json.loads(args.storage_options)
    spark = connect(ensure_local_server(spark_config(delta_root=args.delta, storage_options=storage_options,
                                                     writer=args.writer)))
    target = DeltaTarget(args.delta, storage_options)
    table = CapturedTable("crash", "postgresql", "crash", "public.accounts", TOPIC, target)
    source = KafkaSource({"bootstrap.servers": args.bootstrap, "group.id": "crash"})
    writer: DeltaWriter = DeltaSparkWriter(spark) if args.writer == "delta-spark" else DeltaRsWriter()
    # As a run does: the next batch folded while one is merged (so kills land in either).
    limits = BatchLimits(max_records=args.batch, max_batches_per_run=1_000_000)
    for _ in merge_micro_batches(spark, source, writer, table, limits):
        pass
    source.close()
    print("caught up", flush=True)


def _phase_s(seen: list[tuple[str, float]]) -> float:
    """How long the phase after the newest marker lasted the last time: from the previous marker of
    its kind to the marker after that (1 s for a first one, the cold first fold: it is longer)."""
    point = seen[-1][0]
    for index in range(len(seen) - 2, 0, -1):
        if seen[index - 1][0] == point:
            return seen[index][1] - seen[index - 1][1]
    return 1.0


def produce(bootstrap: str, events: int, keys: int, partitions: int, seed: int) -> tuple[dict[int, dict], int]:
    """Produce a history with updates, deletes (and tombstones) and re-creates; return the reference."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from cdc_assets.demo.broker import PRODUCER_SETTINGS
    from cdc_assets.demo.events import encode_key, envelope, postgres_source

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])[TOPIC].result()
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap, "linger.ms": 20})
    rng, records = random.Random(seed), 0
    state: dict[int, dict] = {}
    for i in range(events):
        key = rng.randrange(keys)
        op = "d" if key in state and rng.random() < 0.15 else ("u" if key in state else "c")
        row = {"id": key, "v": i}
        value = envelope(op, state.get(key) if op == "d" else None, None if op == "d" else row,
                         postgres_source(1000 + i, i, "public", "accounts"), i)
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


def check(delta: str, storage_options: Mapping[str, str], reference: dict[int, dict], bootstrap: str) -> list[str]:
    """What is wrong with the table after a trial (empty: nothing)."""
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import DeltaTable

    from cdc_assets.io.delta import recorded_commit
    from cdc_assets.io.storage import delta_rs_options

    problems = []
    table = DeltaTable(delta, storage_options=delta_rs_options(storage_options))
    rows = table.to_pyarrow_table(columns=["id", "v"]).to_pylist()
    ids = [row["id"] for row in rows]
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} duplicate keys")
    if {row["id"]: row for row in rows} != reference:
        problems.append(f"table differs from the reference ({len(rows)} rows, expected {len(reference)})")
    committed = []
    for entry in reversed(table.history()):
        recorded = recorded_commit(entry)
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


def run_worker(args: argparse.Namespace, delta: str, storage_options: Mapping[str, str], seed: int,
               crash_at: str | None = None, kill_after: int = 0, kill_fraction: float = 0.0) -> subprocess.Popen:
    command = [sys.executable, __file__, "--worker", "--bootstrap", args.bootstrap, "--delta", delta,
               "--storage-options", json.dumps(dict(storage_options)), "--batch", str(args.batch), "--seed", str(seed),
               "--kill-after", str(kill_after), "--kill-fraction", str(kill_fraction), "--writer", args.writer]
    if crash_at:
        command += ["--crash-at", crash_at]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            text=True)


def landed(output: str) -> str:
    """Where a kill landed, from the markers the worker printed before it: the batches whose fold, or
    whose MERGE and commit, had begun and not ended (a batch is folded while the one before it is merged)."""
    points = [point for _, point in MARKER.findall(output)]
    consumed, folded, committed = (points.count(point) for point in ("consumed", "folded", "committed"))
    inside = [f"the fold of batch {consumed}"] if consumed > folded else []
    inside += [f"the MERGE and commit of batch {committed + 1}"] if folded > committed else []
    return " and ".join(inside) or f"the read of batch {consumed + 1} (after {committed} committed)"


def object_store_root(cleanup: contextlib.ExitStack) -> tuple[str, dict[str, str]]:
    """An ``s3://`` root on a private S3-API server started for this run (stopped by ``cleanup``), and its
    storage options (keys named by environment variable, set here for the workers to inherit)."""
    sys.path.insert(0, str(ROOT))  # the tests' server (tests/support/objectstore.py): one place for it
    from tests.support.objectstore import ObjectStore

    store = cleanup.enter_context(ObjectStore())
    store.export_keys()
    return f"s3://{store.create_bucket('crash-trials')}", store.storage_options()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="where the Delta tables live: local disk, or s3:// on a private S3-API server")
    parser.add_argument("--s3-root", default=None,
                        help="with --store s3: an s3:// root on an S3-API server of the caller's (--s3-options "
                             "names it), instead of a private server started for this run")
    parser.add_argument("--s3-options", default="{}", help="the caller's server's storage options (JSON)")
    parser.add_argument("--writer", choices=("delta-rs", "delta-spark"), default="delta-rs",
                        help="the Delta writer of the merges (delta-spark: in the local Spark server)")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--delta", help=argparse.SUPPRESS)
    parser.add_argument("--storage-options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--crash-at", help=argparse.SUPPRESS)
    parser.add_argument("--kill-after", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--kill-fraction", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    from cdc_assets.demo.broker import ApacheKafkaBroker
    from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, stop_all

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cdc-crash-"))
    rng = random.Random(11)
    passed = aimed = inside = 0
    own_server = SERVER_DIR_ENV_VAR not in os.environ  # else a caller's (the tests') server is shared
    if own_server:
        os.environ[SERVER_DIR_ENV_VAR] = str(work / "spark-servers")
    with ApacheKafkaBroker(work / "broker") as broker, contextlib.ExitStack() as cleanup:
        if own_server:
            cleanup.callback(stop_all)
        if args.store == "s3" and args.s3_root:  # the caller's store: its Spark server (the same settings) is warm
            root, storage_options = args.s3_root.rstrip("/"), json.loads(args.s3_options)
        else:
            root, storage_options = object_store_root(cleanup) if args.store == "s3" else (str(work), {})
        args.bootstrap = broker.bootstrap_servers
        reference, records = produce(broker.bootstrap_servers, args.events, args.keys, args.partitions, seed=5)
        # A worker passes three markers a batch (consumed, folded, committed).
        markers = 3 * math.ceil(records / args.batch)
        print(f"{records} records ({args.events} events) over {args.keys} keys, batches of {args.batch}, "
              f"tables under {root}, writer {args.writer}")
        for trial in range(args.trials):
            point = POINTS[trial % len(POINTS)]
            delta = f"{root}/trial-{trial}"
            if point == "random":
                aimed += 1
                kill_after = rng.randint(1, markers - 1)
                crashed = run_worker(args, delta, storage_options, trial, kill_after=kill_after,
                                     kill_fraction=rng.random())
            else:
                crashed = run_worker(args, delta, storage_options, trial, crash_at=point)
            output, _ = crashed.communicate(timeout=600)
            killed = crashed.returncode == -signal.SIGKILL
            if point == "random":
                inside += killed
                where = f"at a random moment, in {landed(output)}" if killed else \
                    f"at a random moment (missed: finished with {len(MARKER.findall(output))} markers before the " \
                    f"kill armed at marker {kill_after})"
            else:
                where = f"at {point}" if killed else f"at {point} (never killed: passed every {point} by chance)"
            rerun = run_worker(args, delta, storage_options, trial)
            output, _ = rerun.communicate(timeout=600)
            if rerun.returncode != 0 and CONCURRENT_COMMIT in output:
                # A MERGE runs on in the Spark server after its worker is killed, and the rerun's commit met
                # it: the documented outcome (docs/operations.md), nothing committed. The run after goes on.
                where += "; the rerun met the killed worker's MERGE still running in the server (nothing " \
                         "committed) and the run after it went on"
                rerun = run_worker(args, delta, storage_options, trial)
                output, _ = rerun.communicate(timeout=600)
            problems = [] if rerun.returncode == 0 else [f"rerun failed: {_failure(output)}"]
            problems = problems or check(delta, storage_options, reference, broker.bootstrap_servers)
            passed += not problems
            print(f"trial {trial + 1}: kill {where}: {problems or 'ok'}", flush=True)
    print(f"{inside} of {aimed} random kills landed inside the work")
    print(f"{passed} of {args.trials} trials passed")
    return 0 if passed == args.trials else 1


# What a batch whose commit met another commit of its table says (``io.delta.ConcurrentCommitError``).
CONCURRENT_COMMIT = "nothing of this batch was committed"


def _failure(output: str) -> str:
    """What a worker that failed printed: its Python traceback's last lines (a Spark error's JVM stack trace,
    which follows the message, left out), else its output's end."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return output[-2000:]
    python = [line for line in lines[starts[-1]:] if not line.startswith(("\tat ", "JVM stacktrace"))]
    return "\n".join(python)[-3000:]


if __name__ == "__main__":
    sys.exit(main())
