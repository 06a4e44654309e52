"""Soak: produce at a fixed rate while Dagster runs of ``cdc_merge_job`` keep merging, for a bounded
time; report how long changes took to become visible in Delta (lag percentiles), the backlog, and
peak RSS.

A producer thread writes PostgreSQL change events at ``--rate`` events/s to a local broker and
remembers when each offset was produced. The main thread plays the sensor: whenever the topic has
events beyond the table's committed offsets, it launches a run. By default each run is a fresh
process (``dagster job execute``), as Dagster's default run launcher does, so every run pays for
its Python and Dagster start (Spark is the local Spark server the runs share, started by the first);
``--runs-in same`` runs them with ``execute_in_process`` in this process. Peak RSS counts the
runs and the local Spark server, sampled together (with ``--runs-in same``, this process too); the
soak's own process (``harness_peak_rss_gib``) is reported apart. An event's lag is the time from its
production to the end of the run that committed it (the offsets come from the table's Delta commits).

    python -m benchmarks.soak [--rate 5000] [--seconds 600] [--runs-in fresh|same]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from dagster import DagsterInstance

from benchmarks.measure import PeakRss
from cdc_assets.catalog import resolve_tables
from cdc_assets.config import load_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.broker import PRODUCER_SETTINGS, ApacheKafkaBroker, produce_waiting
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.delta import DeltaRsWriter
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers, stop_all

TOPIC = "soak.public.accounts"


class RateProducer(threading.Thread):
    """Produces ``rate`` events/s for ``seconds``; records each offset's production time."""

    def __init__(self, bootstrap: str, rate: int, seconds: float, keys: int):
        super().__init__(daemon=True)
        self.rate, self.seconds, self.keys = rate, seconds, keys
        self.produced_at: dict[tuple[int, int], float] = {}
        self.count = 0
        self._producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap, "linger.ms": 5})

    def run(self) -> None:
        started = time.time()
        tick = 0.05
        while time.time() - started < self.seconds:
            due = int((time.time() - started) * self.rate) - self.count
            for _ in range(max(due, 0)):
                now = time.time()
                key = self.count % self.keys
                value = envelope("u" if self.count >= self.keys else "c", None, {"id": key, "n": self.count},
                                 postgres_source(10_000 + self.count, int(now * 1000), "public", "accounts"),
                                 int(now * 1000))

                def delivered(error: object, message: object, at: float = now) -> None:
                    if error is None:
                        self.produced_at[(message.partition(), message.offset())] = at  # type: ignore[attr-defined]

                produce_waiting(self._producer, TOPIC, encode_key({"id": key}), value, 0.05, on_delivery=delivered)
                self.count += 1
            self._producer.poll(0)
            time.sleep(tick)
        self._producer.flush(60)


def high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-watch"})
    partitions = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    highs = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in partitions}
    consumer.close()
    return highs


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=5000, help="events per second")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--max-records", type=int, default=100_000)
    parser.add_argument("--runs-in", choices=("fresh", "same"), default="fresh",
                        help="fresh: each run a new process (dagster job execute); same: execute_in_process here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cdc-soak-") as work, ApacheKafkaBroker(Path(work) / "broker") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, num_partitions=args.partitions, replication_factor=1)])[TOPIC].result()
        config_path = Path(work) / "pipeline.yaml"
        config_path.write_text(f"""
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{work}/delta", writer: delta-rs}}
batch: {{max_records: {args.max_records}}}
connectors:
  - {{name: soak, kind: postgresql, topic.prefix: soak, tables: [{{name: public.accounts}}]}}
""")
        config = load_config(config_path)
        table = resolve_tables(config)[0]
        job = build_definitions(config).resolve_job_def("cdc_merge_job")
        dagster_home = Path(work) / "dagster_home"
        dagster_home.mkdir()
        # The soak's own local Spark server, set before the runs' environment is copied from this one's:
        # runs that looked in the default directory started a server the soak neither measured nor stopped.
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")
        env = {**os.environ, "CDC_ASSETS_CONFIG": str(config_path), "DAGSTER_HOME": str(dagster_home)}
        command = [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m", "cdc_assets.definitions",
                   "-j", "cdc_merge_job"]
        producer = RateProducer(broker.bootstrap_servers, args.rate, args.seconds, args.keys)
        lags: list[float] = []
        runs = 0
        committed: dict[int, int] = {}
        server_found = False
        with contextlib.ExitStack() as stack:
            instance = stack.enter_context(DagsterInstance.ephemeral())
            # Fresh runs: the runs and the local server, sampled together; this process (the producer,
            # the sensor's loop, every offset's production time) is the harness, counted apart.
            rss = stack.enter_context(PeakRss(exclude_pid=broker.pid or -1, count_root=args.runs_in == "same"))
            producer.start()
            deadline = time.time() + args.seconds + 120
            while time.time() < deadline:
                highs = high_watermarks(broker.bootstrap_servers)
                if all(committed.get(p, 0) >= h for p, h in highs.items()):
                    if not producer.is_alive():
                        break
                    time.sleep(0.5)
                    continue
                if args.runs_in == "same":
                    ok = job.execute_in_process(instance=instance, raise_on_error=False).success
                else:
                    ok = subprocess.run(command, env=env, capture_output=True).returncode == 0
                finished = time.time()
                runs += 1
                if not ok:
                    raise SystemExit(f"run {runs} of cdc_merge_job failed")
                # Started by the first fresh run, it outlives it: no child of this process.
                servers = running_servers() if not server_found and args.runs_in == "fresh" else []
                if servers:
                    rss.add_root(servers[0][1]["pid"])
                    server_found = True
                progress = DeltaRsWriter().read_progress(table.target, table.app_id)
                for partition, end in (progress.offsets if progress else {}).items():
                    for offset in range(committed.get(partition, 0), end):
                        produced = producer.produced_at.get((partition, offset))
                        if produced is not None:
                            lags.append(finished - produced)
                    committed[partition] = end
        print(json.dumps({
            "rate_events_per_s": args.rate, "seconds": args.seconds, "events_produced": producer.count,
            "events_applied": len(lags), "runs": runs, "runs_in": args.runs_in,
            "lag_p50_s": round(percentile(lags, 50), 2) if lags else None,
            "lag_p95_s": round(percentile(lags, 95), 2) if lags else None,
            "lag_max_s": round(max(lags), 2) if lags else None,
            "peak_rss_gib": round(rss.peak / 2**30, 2),
            "harness_peak_rss_gib": round(rss.peak_python / 2**30, 2),
        }, indent=2))
        stop_all()


if __name__ == "__main__":
    main()
