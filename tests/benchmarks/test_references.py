"""The benchmark's reference merge paths leave the table the reference fold describes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from benchmarks.merge_throughput import TOPIC, checksum, generate, produce
from benchmarks.references import run_no_spark, run_plain_spark
from cdc_assets.demo.broker import ApacheKafkaBroker

BATCH = 5_000


@pytest.fixture(scope="module")
def workload(broker: ApacheKafkaBroker) -> tuple[int, dict[int, dict]]:
    """20,000 events over 2,000 keys in the benchmark's topic (3 partitions): record count and final rows."""
    records, reference = generate(20_000, 2_000)
    produce(broker.bootstrap_servers, records, partitions=3)
    return len(records), reference


@pytest.mark.parametrize("reference_name", ["no_spark", "plain_spark"])
def test_reference_matches_fold(reference_name: str, workload: tuple[int, dict[int, dict]], broker: ApacheKafkaBroker,
                                spark: SparkSession, tmp_path: Path) -> None:
    records, reference = workload
    target = str(tmp_path / "accounts")
    runs: dict[str, Callable[[], dict[str, float]]] = {
        "no_spark": lambda: run_no_spark(broker.bootstrap_servers, TOPIC, BATCH, target),
        "plain_spark": lambda: run_plain_spark(spark, broker.bootstrap_servers, TOPIC, BATCH, target),
    }

    stages = runs[reference_name]()

    assert stages["batches"] == -(-records // BATCH)
    assert stages["total_s"] > 0
    rows = DeltaTable(target).to_pyarrow_table(columns=["id", "balance", "owner", "status", "seq"]).to_pylist()
    assert len(rows) == len(reference)
    assert checksum(rows) == checksum(list(reference.values()))
