"""Which session a batch is folded on: the run's (generated code) or its small-batch session (``SMALL_BATCH_SETTINGS``).

A batch's query on a warm local Spark server costs planning and code generation whatever its size; Spark's
interpreted expressions save that and cost more per record. For each batch size, W2's events of one table
(``benchmarks.many_tables.generate``: JSON with schemas, a fifth snapshot reads, then creates, updates and
deletes) are handed over, decoded and folded as the pipeline does (``spark_records``, ``decode_change_events``,
the scd1 fold), on the run's session and on its small-batch session by turns, after warm-up queries on each;
prints the server's CPU seconds a query on each (medians of ``--rounds``, the JIT compilers' beside them), the
wall seconds, and the small-batch session's CPU as a ratio to the run's session's in the same rounds. The
crossover sets ``cdc_assets.io.spark.SMALL_BATCH_RECORDS``. Both sessions must fold every batch to the same rows.

    python -m benchmarks.batch_session [--sizes 50,500,1000,2500] [--rounds 4] [--queries 20] [--warm 100]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from benchmarks.many_tables import generate
from benchmarks.measure import own_spark_server, server_cpu
from cdc_assets.core import decode_change_events, derive_layout
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.envelope import value_type
from cdc_assets.core.layout import ChangeEventLayout
from cdc_assets.io.spark import parsed_from_files, without_schemas
from cdc_assets.io.spark_server import small_batch_session


def w2_batch(events: int) -> pa.Table:
    """One W2 table's first ``events`` events as the pipeline hands them over (tombstones left out, values
    without their schemas)."""
    pairs = [pair for pair in generate(1, events, 1000, random.Random(3))[0] if pair[1] is not None]
    values = pa.chunked_array([pa.array([v for _, v in pairs], pa.binary())])
    return pa.table({"partition": pa.array([i % 3 for i in range(len(pairs))], pa.int32()),
                     "offset": pa.array(range(len(pairs)), pa.int64()),
                     "key": pa.array([k for k, _ in pairs], pa.binary()),
                     "value": without_schemas(values)})


def w2_layout() -> ChangeEventLayout:
    """The layout of W2's tables, derived from sampled events with their schemas (no placeholder tests: W2's
    events carry none)."""
    pairs = generate(1, 100, 1000, random.Random(3))[0]
    return replace(derive_layout("postgresql", [k for k, v in pairs if v], [v for _, v in pairs if v]),
                   placeholder=None)


def folder(batch: pa.Table, scratch: Path) -> Callable[[SparkSession], pa.Table]:
    """A function that folds ``batch`` on a session, as the pipeline does, and returns the rows."""
    layout = w2_layout()
    mode = apply_mode("scd1", "postgresql")

    def fold(session: SparkSession) -> pa.Table:
        with tempfile.TemporaryDirectory(dir=scratch) as directory:
            frame = parsed_from_files(session, batch, value_type(layout), Path(directory), exact=False)
            rows, _ = mode.rows(decode_change_events(frame, layout), layout, lambda keys, columns: None)
        return rows.sort_by("id")

    return fold


def measure(fold: Callable[[SparkSession], pa.Table], session: SparkSession, queries: int, pids: list[int]
            ) -> dict[str, float]:
    """The server's CPU seconds (and its compilers') and the wall seconds, a query, over ``queries`` folds."""
    before, started = server_cpu(pids), time.perf_counter()
    for _ in range(queries):
        fold(session)
    now = server_cpu(pids)
    return {"cpu": (now["server"] - before["server"]) / queries,
            "jit": (now["server_jit"] - before["server_jit"]) / queries,
            "wall": (time.perf_counter() - started) / queries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,500,1000,2500", help="events a batch, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--queries", type=int, default=20, help="queries a session a round")
    parser.add_argument("--warm", type=int, default=100, help="warm-up queries a session a size")
    args = parser.parse_args()
    with (own_spark_server("cdc-bench-session-") as (session, pids),
          tempfile.TemporaryDirectory(prefix="cdc-bench-session-work-") as work):
        run(args, session, pids, Path(work))


def run(args: argparse.Namespace, session: SparkSession, pids: list[int], work: Path) -> None:
    small = small_batch_session(session)
    assert small is not None
    print("events  records | run's session: CPU ms (JIT) / wall ms | small-batch session: CPU ms (JIT) / wall ms "
          "| small / run CPU")
    for size in (int(s) for s in args.sizes.split(",")):
        batch = w2_batch(size)
        fold = folder(batch, work)
        if not fold(session).equals(fold(small)):
            raise SystemExit(f"the two sessions folded {size} events to different rows")
        for each in (session, small):
            for _ in range(args.warm):
                fold(each)
        results: dict[str, list[dict[str, float]]] = {"run": [], "small": []}
        for _ in range(args.rounds):
            results["run"].append(measure(fold, session, args.queries, pids))
            results["small"].append(measure(fold, small, args.queries, pids))
        median = {name: {key: 1000 * statistics.median(r[key] for r in rounds) for key in ("cpu", "jit", "wall")}
                  for name, rounds in results.items()}
        run_, small_ = median["run"], median["small"]
        print(f"{size:6d} {batch.num_rows:8d} | {run_['cpu']:7.1f} ({run_['jit']:4.1f}) / {run_['wall']:6.1f}"
              f"{'':16s}| {small_['cpu']:7.1f} ({small_['jit']:4.1f}) / {small_['wall']:6.1f}{'':22s}"
              f"| {small_['cpu'] / run_['cpu']:.2f}", flush=True)


if __name__ == "__main__":
    main()
