"""Server CPU and wall time of small delta-spark MERGEs on the local Spark server, with the embedded
defaults against a reference in the same run: the same MERGEs with Delta's own snapshot partitions (50).

    python -m benchmarks.small_merges --rounds 3

After a warm-up round, each round runs ``--merges`` MERGEs of 3 rows per variant, the variants alternating,
each on a table of its own; figures are summed over rounds and printed per MERGE, with the ratio of the
defaults to the reference.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pyarrow as pa

from benchmarks.measure import process_cpu
from cdc_assets.io.spark import spark_config
from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server, running_servers

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--merges", type=int, default=5, help="MERGEs per variant and round")
    args = parser.parse_args()
    settings = spark_config()
    url = ensure_local_server(settings)
    spark = connect(url)
    # Only this run's server: another local server (a test worker's) may stop meanwhile and take its CPU along.
    servers = [state["pid"] for _, state in running_servers() if url.endswith(f":{state['port']}")]
    root = tempfile.mkdtemp(prefix="cdc-small-merges-")
    variants = {"defaults": settings[SNAPSHOT_PARTITIONS], "reference": None}
    totals = {name: [0.0, 0.0] for name in variants}
    try:
        for name in variants:
            spark.sql(f"CREATE TABLE delta.`{root}/{name}` (id bigint, v string) USING delta").collect()
        for round_ in range(-1, args.rounds):  # round -1 warms the JVM up for both, uncounted
            for name, partitions in variants.items():
                if partitions is None:
                    spark.conf.unset(SNAPSHOT_PARTITIONS)
                else:
                    spark.conf.set(SNAPSHOT_PARTITIONS, partitions)
                cpu, wall = sum(map(process_cpu, servers)), time.perf_counter()
                for i in range((round_ + 1) * args.merges, (round_ + 2) * args.merges):
                    spark.createDataFrame(pa.table({"id": [3 * i, 3 * i + 1, 10**6 + i % 7], "v": ["a", "b", "c"]})
                                          ).createOrReplaceTempView("batch")
                    spark.sql(f"MERGE INTO delta.`{root}/{name}` t USING batch s ON t.id = s.id "
                              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").first()
                if round_ >= 0:
                    totals[name][0] += sum(map(process_cpu, servers)) - cpu
                    totals[name][1] += time.perf_counter() - wall
    finally:
        spark.conf.set(SNAPSHOT_PARTITIONS, settings[SNAPSHOT_PARTITIONS])
        disconnect(spark)
    merges = args.rounds * args.merges
    for name, (cpu, wall) in totals.items():
        print(f"{name:9} server CPU {cpu / merges:.2f} s a MERGE, wall {wall / merges:.2f} s")
    (cpu, wall), (ref_cpu, ref_wall) = totals["defaults"], totals["reference"]
    print(f"defaults / reference: server CPU {cpu / ref_cpu:.2f}x, wall {wall / ref_wall:.2f}x")


if __name__ == "__main__":
    main()
