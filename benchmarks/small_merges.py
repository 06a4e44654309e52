"""Server CPU and wall time of small delta-spark MERGEs on the local Spark server, with the embedded
defaults and the writer's MERGE settings against three references in the same run: the same MERGEs with Delta's
own snapshot partitions (50), with Delta's copy of the source first (``MERGE_SOURCE_SETTINGS`` left out), and in
the run's session instead of its small-batch session (``SMALL_BATCH_SETTINGS``), where the writer MERGEs a batch
of fewer than ``SMALL_BATCH_RECORDS`` rows.

    python -m benchmarks.small_merges --rounds 3

After a warm-up round, each round runs ``--merges`` MERGEs of 3 rows per variant, the variants taking turns
first, each on a table of its own; figures are summed over rounds and printed per MERGE, with the ratio of the
defaults to each reference.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pyarrow as pa

from benchmarks.measure import process_cpu
from cdc_assets.io.delta.spark import MERGE_SOURCE_SETTINGS
from cdc_assets.io.spark import spark_config
from cdc_assets.io.spark_server import (
    connect,
    disconnect,
    ensure_local_server,
    running_servers,
    small_batch_session,
)

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
    small = small_batch_session(spark) or spark
    # name -> (session, its settings for the MERGE: an empty value unsets one, Delta's own default then)
    defaults = {SNAPSHOT_PARTITIONS: settings[SNAPSHOT_PARTITIONS], **MERGE_SOURCE_SETTINGS}
    variants = {"defaults": (small, defaults), "reference": (small, {**defaults, SNAPSHOT_PARTITIONS: ""}),
                "source copied": (small, {**defaults, **dict.fromkeys(MERGE_SOURCE_SETTINGS, "")}),
                "run's session": (spark, defaults)}
    totals = {name: [0.0, 0.0] for name in variants}
    try:
        for name in variants:
            spark.sql(f"CREATE TABLE delta.`{root}/{_slug(name)}` (id bigint, v string) USING delta").collect()
        for round_ in range(-1, args.rounds):  # round -1 warms the JVM up for all, uncounted
            turn = (round_ + 1) % len(variants)  # each variant first in turn: no order favours one
            for name in [*variants][turn:] + [*variants][:turn]:
                session, merge_settings = variants[name]
                for key, value in merge_settings.items():
                    if value:
                        session.conf.set(key, value)
                    else:
                        session.conf.unset(key)
                cpu, wall = sum(map(process_cpu, servers)), time.perf_counter()
                for i in range((round_ + 1) * args.merges, (round_ + 2) * args.merges):
                    session.createDataFrame(pa.table({"id": [3 * i, 3 * i + 1, 10**6 + i % 7], "v": ["a", "b", "c"]})
                                            ).createOrReplaceTempView("batch")
                    session.sql(f"MERGE INTO delta.`{root}/{_slug(name)}` t USING batch s ON t.id = s.id "
                                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").first()
                for key in merge_settings:  # as the session was: the writer sets the MERGE's settings per MERGE
                    session.conf.unset(key)
                session.conf.set(SNAPSHOT_PARTITIONS, settings[SNAPSHOT_PARTITIONS])
                if round_ >= 0:
                    totals[name][0] += sum(map(process_cpu, servers)) - cpu
                    totals[name][1] += time.perf_counter() - wall
    finally:
        disconnect(spark)
    merges = args.rounds * args.merges
    for name, (cpu, wall) in totals.items():
        print(f"{name:13} server CPU {cpu / merges:.2f} s a MERGE, wall {wall / merges:.2f} s")
    cpu, wall = totals["defaults"]
    for name in ("reference", "source copied", "run's session"):
        ref_cpu, ref_wall = totals[name]
        print(f"defaults / {name}: server CPU {cpu / ref_cpu:.2f}x, wall {wall / ref_wall:.2f}x")


def _slug(name: str) -> str:
    return name.replace("'", "").replace(" ", "_")


if __name__ == "__main__":
    main()
