"""MongoDB's fold: a batch of document events (creates, then updates) rebuilt into documents, as
``Documents.rows`` does in a merge (no table yet), on a local Spark server of its own.

    python -m benchmarks.mongodb_fold --events 100000 --keys 10000 --updates top,nested --runs 3

``top``: each update a ``$set`` or ``$unset`` of top-level fields (what the fold applied before nested paths);
``nested``: the same count of updates on nested paths and array indexes, half as change streams'
``updateDescription``. Prints per variant the median wall seconds and the CPU seconds of the server (its
JVM with its Python workers) and of this process, per fold, after one warm-up fold.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame

from benchmarks.measure import own_spark_server, run_cpu, server_cpu
from cdc_assets.core.apply_modes import ApplyMode, apply_mode
from cdc_assets.core.envelope import decode_change_events, value_type
from cdc_assets.core.layout import ChangeEventLayout, derive_layout
from cdc_assets.io.spark import spark_records


def batch(events: int, keys: int, updates: str, rng: random.Random) -> pa.Table:
    """``events`` records: a create per key, then updates of random keys, as Debezium's JSON converter
    (schemas off) writes them."""
    records = []
    for ord_ in range(events):
        doc = ord_ % keys
        key = json.dumps({"id": json.dumps({"$numberLong": str(doc)})}).encode()
        payload: dict[str, object] = {"source": {"ts_ms": 1_700_000_000_000, "ord": ord_}}
        if ord_ < keys:
            payload.update(op="c", after=json.dumps({"_id": {"$numberLong": str(doc)}, "a": ord_, "b": "x" * 20,
                                                      "n": {"c": {"d": 1}, "arr": [1, 2, 3]}}))
        elif updates == "top":
            field = rng.choice(["a", "b", "e"])
            payload.update(op="u", patch=json.dumps({"$set": {field: ord_}} if rng.random() < 0.8
                                                     else {"$unset": {field: True}}))
        elif rng.random() < 0.5:
            path = rng.choice(["n.c.d", "n.arr.1", "n.arr.4", "n.new.deep", "a"])
            payload.update(op="u", patch=json.dumps({"$set": {path: ord_}, "$unset": {"n.c.gone": True}}))
        else:
            path = rng.choice(["n.c.d", "n.arr.0", "n.other"])
            payload.update(op="u", updateDescription={"updatedFields": json.dumps({path: ord_}),
                                                      "removedFields": ["n.c.gone"], "truncatedArrays": None})
        records.append((key, json.dumps(payload).encode()))
    return pa.table({"partition": pa.array([0] * events, pa.int32()), "offset": pa.array(range(events), pa.int64()),
                     "key": pa.array([k for k, _ in records], pa.binary()),
                     "value": pa.array([v for _, v in records], pa.binary())})


def _fold(mode: ApplyMode, frame: DataFrame, layout: ChangeEventLayout) -> tuple[int, int]:
    """One fold of the handed-over batch: its rows and bad events."""
    rows, summary = mode.rows(decode_change_events(frame, layout), layout, lambda keys, columns: None)
    return rows.num_rows, len(summary.bad_events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", default="top,nested", help="variants, comma-separated: top, nested")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with own_spark_server("cdc-bench-mongodb-") as (session, pids):
        mode = apply_mode("scd1", "mongodb")
        print("updates | wall s | server CPU s | client CPU s | keys | bad events")
        for updates in args.updates.split(","):
            records = batch(args.events, args.keys, updates, random.Random(7))
            layout = derive_layout("mongodb", records["key"].to_pylist()[:10], records["value"].to_pylist()[:10])
            with spark_records(session, records, value_type(layout), exact=False) as frame:
                frame = frame.persist()
                frame.count()  # handed over once: the runs time the decode and the fold

                fold = partial(_fold, mode, frame, layout)
                fold()
                timings = []
                for _ in range(args.runs):
                    server, client, started = server_cpu(pids)["server"], run_cpu(), time.perf_counter()
                    rows, bad = fold()
                    timings.append((time.perf_counter() - started, server_cpu(pids)["server"] - server,
                                    run_cpu() - client))
                wall, server, client = (statistics.median(t[i] for t in timings) for i in range(3))
                print(f"{updates:7s} | {wall:6.2f} | {server:12.2f} | {client:12.2f} | {rows} | {bad}", flush=True)
                frame.unpersist()


if __name__ == "__main__":
    main()
