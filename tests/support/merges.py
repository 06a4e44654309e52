"""One captured table through the real micro-batch merge, its Delta table read back, and two merges raced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_assets.catalog import CapturedTable, MergeRules
from cdc_assets.config import BatchLimits
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.io.delta import DeltaTarget, DeltaWriter
from cdc_assets.io.kafka import KafkaSource
from cdc_assets.merge import BatchReport, merge_micro_batch


def captured_table(topic: str, root: Path, kind: str = "postgresql", **merge) -> CapturedTable:
    """A captured table reading ``topic`` into a Delta table under ``root``, ``merge`` its ``MergeRules``."""
    return CapturedTable(connector="test", kind=kind, topic_prefix=topic.split(".")[0], name="s.t", topic=topic,
                         target=DeltaTarget(str(root / topic)), merge=MergeRules(**merge))


def with_merge(table: CapturedTable, **changes) -> CapturedTable:
    """``table`` with ``changes`` to its ``MergeRules``."""
    return replace(table, merge=replace(table.merge, **changes))


def run_batch(spark: SparkSession, broker: ApacheKafkaBroker, writer: DeltaWriter, table: CapturedTable,
              max_records: int = 100_000) -> BatchReport:
    """One micro-batch of ``table`` through the real pipeline."""
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    try:
        return merge_micro_batch(spark, source, writer, table, BatchLimits(max_records=max_records,
                                                                           poll_timeout_s=10))
    finally:
        source.close()


def read_rows(spark: SparkSession, writer: DeltaWriter, table: CapturedTable, visible_only: bool = True) -> dict:
    """The Delta table as ``{key tuple: row dict}`` (hidden columns dropped unless asked)."""
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        rows = DeltaTable(table.target.path).to_pyarrow_table().to_pylist()
    else:
        rows = [row.asDict(recursive=True) for row in spark.read.format("delta").load(table.target.path).collect()]
    keys = table.merge.key_columns or ("id",)
    result = {}
    for row in rows:
        if visible_only:
            row = {k: v for k, v in row.items() if not k.startswith("_cdc_")}
        result[tuple(row[k] for k in keys)] = row
    return result


def race_after_fold(run: Callable[[], object], runs: int = 2, timeout_s: float = 180) -> None:
    """Call ``run`` in ``runs`` threads whose merges all fold their batch before any of them commits (a barrier
    at the merge's ``folded`` point), as two runs racing on one table do."""
    import threading

    from cdc_assets.merge import faults

    folded = threading.Barrier(runs, timeout=timeout_s)
    faults.fault_hook = lambda point: folded.wait() if point == "folded" else None
    try:
        threads = [threading.Thread(target=run) for _ in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        faults.fault_hook = None
