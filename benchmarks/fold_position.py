"""The fold's aggregation by the form of the position it orders by, on a local Spark server of its own.

    python -m benchmarks.fold_position --events 1000000 --keys 100000 --runs 3

Per key, the latest event's values, as ``core.fold`` takes them (``max_by`` of a struct of the values), over one
materialized batch: ordered by a position of text as wide as the fold's (48 characters, the reference), by one
of 16 bytes (``binary``: what any connector kind's position packs into), by one of 8 (a ``long``), and as the
maximum position per key (a hash aggregation: its buffer is fixed-width) joined back to the events. Spark
hash-aggregates only where every aggregation buffer is fixed-width: ``max_by`` of a struct of values is
sort-based whatever the position's type. Prints each variant's median wall and server CPU seconds (one warm-up
each, then the variants in turn), and its ratio to the reference.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.measure import own_spark_server, server_cpu

REFERENCE = "text position"


def variants(events: DataFrame) -> dict[str, Callable[[], DataFrame]]:
    """Each way to take a key's latest values from ``events`` (k, the position in each form, v, w)."""
    def latest_by(position: str) -> Callable[[], DataFrame]:
        return lambda: events.groupBy("k").agg(F.max_by(F.struct("v", "w"), F.col(position)).alias("latest"))

    def joined() -> DataFrame:
        latest = events.groupBy("k").agg(F.max("position_long").alias("position_long"))
        return events.join(latest, ["k", "position_long"]).select("k", "v", "w")

    return {REFERENCE: latest_by("position_text"), "binary position": latest_by("position_binary"),
            "long position": latest_by("position_long"), "hash max, then join": joined}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with own_spark_server("cdc-bench-position-") as (session, pids):
        events = session.range(args.events).select(
            (F.col("id") % args.keys).alias("k"), F.col("id").alias("position_long"),
            F.lpad(F.col("id").cast("string"), 48, "0").alias("position_text"),
            F.unhex(F.lpad(F.hex(F.col("id")), 32, "0")).alias("position_binary"),
            F.concat(F.lit("owner-"), (F.col("id") % 977).cast("string")).alias("v"), (F.col("id") * 3).alias("w"))
        events = events.localCheckpoint()  # made once: the variants differ in the fold alone
        folds = variants(events)
        for fold in folds.values():
            fold().write.format("noop").mode("overwrite").save()  # warm-up
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name in folds}
        for _ in range(args.runs):  # the variants in turn: the JIT's warming favours none
            for name, fold in folds.items():
                server, started = server_cpu(pids)["server"], time.perf_counter()
                fold().write.format("noop").mode("overwrite").save()
                timings[name].append((time.perf_counter() - started, server_cpu(pids)["server"] - server))
        figures = {name: (statistics.median(t[0] for t in each), statistics.median(t[1] for t in each))
                   for name, each in timings.items()}
        print("variant | wall s | server CPU s")
        for name, (wall, cpu) in figures.items():
            print(f"{name} | {wall:.2f} | {cpu:.2f}")
        wall, cpu = figures[REFERENCE]
        for name, (each_wall, each_cpu) in figures.items():
            if name != REFERENCE:
                print(f"{name} / {REFERENCE}: server CPU {each_cpu / cpu:.2f}x, wall {each_wall / wall:.2f}x")


if __name__ == "__main__":
    main()
