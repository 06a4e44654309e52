"""The benchmark's reference merge paths leave the table the reference fold describes, each run as the
benchmark runs it (a child process with the session it would have)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.merge_throughput import checksum, generate, produce
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.io.spark_server import jvm_environ

BATCH = 2_000
# Spark's 200 shuffle partitions and Delta's 50 snapshot partitions are the references' defaults in the benchmark;
# for 2,000-event batches they are 600 tasks of nothing a batch (most of the test's time), and the table is the same.
SPARK_SETTINGS = {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}


@pytest.fixture(scope="module")
def workload(broker: ApacheKafkaBroker) -> tuple[int, dict[int, dict]]:
    """6,000 events over 600 keys in the benchmark's topic (3 partitions), three batches: record count and final
    rows."""
    records, reference = generate(6_000, 600)
    produce(broker.bootstrap_servers, records, partitions=3)
    return len(records), reference


@pytest.mark.parametrize("reference_name", ["no_spark", "plain_spark"])
def test_reference_matches_fold(reference_name: str, workload: tuple[int, dict[int, dict]], broker: ApacheKafkaBroker,
                                tmp_path: Path) -> None:
    records, reference = workload
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.merge_throughput", "--child", reference_name, "--bootstrap",
         broker.bootstrap_servers, "--batch", str(BATCH), "--work", str(tmp_path),
         "--spark-settings", json.dumps(SPARK_SETTINGS)],
        capture_output=True, text=True, timeout=600, check=False, env=jvm_environ())
    results = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, child.stdout[-2000:] + child.stderr[-4000:]
    result = json.loads(results[-1].removeprefix("RESULT "))

    assert result["stages"]["batches"] == -(-records // BATCH)
    assert result["stages"]["total_s"] > 0
    assert result["rows"] == len(reference)
    assert result["checksum"] == checksum(list(reference.values()))
