"""W3, large tables: seconds per batch (merge + commit) and Delta files rewritten per batch, for one
table at several sizes, through the project's own writers (``DeltaRsWriter``, ``DeltaSparkWriter``).

Each size's table is built once (``write_deltalake``: rows sorted by key, the scd1 hidden columns as the
writers make them) and copied for each variant; each variant then applies ``--batches`` folded batches of
``--batch`` changes (80% updates, 10% deletes of live keys and 10% inserts of new keys; keys uniform over
the table) with ``writer.merge`` in scd1, timing each call. Files added and removed (and deletion vectors
written) are read from the batch's commits in ``_delta_log``. The ratio printed per variant is the
largest size's median seconds per batch over the smallest's (the issue-26 goal: <= 2x from 1M to 10M).

    python -m benchmarks.large_tables --rows 1000000,10000000 --batch 100000 --batches 3 \
        --variants delta-rs,delta-spark,delta-spark-dv [--target-file-mb 32]

Variants: ``delta-rs``; ``delta-spark`` (deletion vectors off); ``delta-spark-dv`` (the table property
``delta.enableDeletionVectors`` on). delta-spark runs on a local Spark server of the benchmark's own
(``--spark-memory``: its driver heap), stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from benchmarks.measure import PeakRss, process_cpu
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.delta import (
    DELETION_VECTORS,
    CommitRequest,
    DeltaRsWriter,
    DeltaSparkWriter,
    DeltaTarget,
    DeltaWriter,
)

SCD1 = apply_mode("scd1")
KEY = "id"
VARIANTS = ("delta-rs", "delta-spark", "delta-spark-dv")
SCHEMA = pa.schema([
    (KEY, pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("qty", pa.int32()),
    ("updated_at", pa.timestamp("us", tz="UTC")),
    ("_cdc_op", pa.string()), ("_cdc_position", pa.string()), ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
])
BASE_TS = 1_700_000_000_000_000


def rows_for(ids: np.ndarray, ops: np.ndarray, position_base: int, rng: np.random.Generator) -> pa.Table:
    """Folded scd1 rows for ``ids``: a delete carries only its key and hidden columns."""
    n = len(ids)
    key = pa.array(ids, pa.int64())
    deleted = pa.array(ops == "d")
    name = pc.binary_join_element_wise("name-", pc.cast(key, pa.string()), "-", pc.cast(
        pa.array(rng.integers(0, 1_000_000, n)), pa.string()), "")
    ts = pa.array(BASE_TS + rng.integers(0, 10**12, n), pa.int64()).cast(pa.timestamp("us", tz="UTC"))

    def live(values: pa.Array) -> pa.Array:
        return pc.if_else(deleted, pa.nulls(n, values.type), values)

    position = pc.utf8_lpad(pc.cast(pa.array(position_base + np.arange(n), pa.int64()), pa.string()), 20, "0")
    return pa.Table.from_arrays([
        key, live(name), live(pa.array(rng.random(n) * 1000)), live(pa.array(rng.integers(0, 100, n), pa.int32())),
        live(ts), pa.array(ops, pa.string()), position, ts,
    ], schema=SCHEMA)


def build(path: Path, rows: int, target_file_mb: int | None) -> float:
    """The initial table: ``rows`` snapshot rows sorted by key, written in chunks; seconds taken."""
    started = time.monotonic()
    rng = np.random.default_rng(1)
    chunk = 2_000_000
    configuration = {"delta.targetFileSize": str(target_file_mb * 1024 * 1024)} if target_file_mb else None
    for start in range(0, rows, chunk):
        ids = np.arange(start, min(rows, start + chunk))
        table = rows_for(ids, np.full(len(ids), "r", dtype=object), 0, rng)
        write_deltalake(str(path), table, mode="append", configuration=configuration,
                        target_file_size=target_file_mb * 1024 * 1024 if target_file_mb else None)
    return time.monotonic() - started


def commit_actions(path: Path, after: int) -> dict[str, int]:
    """From the commits after version ``after``: data files written, files dropped (removed and not re-added),
    files given a deletion vector (re-added with one, not rewritten) and bytes written."""
    counts = {"added": 0, "removed": 0, "dvs": 0, "bytes_added": 0}
    for entry in sorted((path / "_delta_log").glob("*.json")):
        if int(entry.stem) <= after:
            continue
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        adds = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
        removes = {a["remove"]["path"] for a in actions if "remove" in a}
        for file, add in adds.items():
            if add.get("deletionVector"):
                counts["dvs"] += 1
            if file not in removes:
                counts["added"] += 1
                counts["bytes_added"] += int(add.get("size") or 0)
        counts["removed"] += len(removes - set(adds))
    return counts


def live_files(path: Path) -> int:
    """Data files in the table's latest version (from the log: delta-rs will not read a table with deletion vectors)."""
    live: set[str] = set()
    for entry in sorted((path / "_delta_log").glob("*.json"), key=lambda p: int(p.stem)):
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        # A file given a deletion vector is removed and re-added in one commit: the add wins.
        live -= {a["remove"]["path"] for a in actions if "remove" in a}
        live |= {a["add"]["path"] for a in actions if "add" in a}
    return len(live)


def latest_version(path: Path) -> int:
    return max(int(p.stem) for p in (path / "_delta_log").glob("*.json"))


@contextlib.contextmanager
def spark_session(work: Path, memory: str) -> Iterator[object]:
    """A session on a local Spark server of the benchmark's own (with Delta), stopped afterwards."""
    from cdc_assets.io.spark import spark_config
    from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, connect, disconnect, ensure_local_server, stop_all

    os.environ[SERVER_DIR_ENV_VAR] = str(work / "spark-servers")
    session = connect(ensure_local_server(spark_config(conf={"spark.driver.memory": memory})))
    try:
        yield session
    finally:
        disconnect(session)
        stop_all()


def cpu_seconds() -> float:
    """CPU seconds so far of this process and the local Spark servers (with their JVMs): under a shared
    CPU they judge a batch better than its seconds."""
    return sum(psutil.Process().cpu_times()[:2]) + sum(process_cpu(pid) for pid in server_pids())


def server_pids() -> list[int]:
    from cdc_assets.io.spark_server import running_servers

    return [state["pid"] for _, state in running_servers()]


def warm_up(spark: object, work: Path) -> None:
    """Two small merges first, so the server's first MERGE (class loading, JIT) is not measured."""
    path = work / "warm-up"
    build(path, 10_000, None)
    writer = DeltaSparkWriter(spark)  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    for number in range(2):
        ids = np.arange(0, 10_000, 7)
        writer.merge(DeltaTarget(str(path)), rows_for(ids, np.full(len(ids), "u", dtype=object), 10**15 * (number + 1),
                                                      rng), [KEY], CommitRequest("warm", number + 1, "w", {0: number}),
                     SCD1)
    shutil.rmtree(path)


def run_variant(variant: str, writer: DeltaWriter, spark: object | None, pristine: Path, work: Path, rows: int,
                batch: int, batches: int) -> dict:
    path = work / f"{variant}-{rows}"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(pristine, path)
    if variant == "delta-spark-dv":
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DELETION_VECTORS}' = 'true')")  # type: ignore[attr-defined]
    target = DeltaTarget(str(path))
    rng = np.random.default_rng(7)
    alive = np.ones(rows, dtype=bool)
    next_id = rows
    results = []
    for number in range(batches):
        live = np.flatnonzero(alive)
        changed = rng.choice(live, size=batch - batch // 10, replace=False)
        deletes = batch // 10
        new_ids = np.arange(next_id, next_id + batch // 10)
        next_id += len(new_ids)
        alive[changed[:deletes]] = False
        alive = np.concatenate([alive, np.ones(len(new_ids), dtype=bool)])
        ids = np.concatenate([changed, new_ids])
        ops = np.array(["d"] * deletes + ["u"] * (len(changed) - deletes) + ["c"] * len(new_ids), dtype=object)
        order = np.argsort(ids)
        folded = rows_for(ids[order], ops[order], 10**15 * (number + 1), rng)
        before = latest_version(path)
        commit = CommitRequest(f"bench:{variant}", number + 1, "bench", {0: (number + 1) * batch}, (KEY,))
        started, cpu = time.monotonic(), cpu_seconds()
        outcome = writer.merge(target, folded, [KEY], commit, SCD1)
        seconds, cpu = time.monotonic() - started, cpu_seconds() - cpu
        actions = commit_actions(path, before)
        results.append({"seconds": seconds, "cpu_s": cpu, **actions, "files_after": live_files(path),
                        "inserted": outcome.inserted, "updated": outcome.updated, "deleted": outcome.deleted})
        print(f"  {variant} {rows:,} rows, batch {number + 1}: {seconds:.1f} s ({cpu:.1f} CPU s), "
              f"files written {actions['added']}, "
              f"dropped {actions['removed']} (DVs on {actions['dvs']}, "
              f"{actions['bytes_added'] / 2**20:.0f} MiB written), "
              f"{results[-1]['files_after']} files; rows +{outcome.inserted} ~{outcome.updated} -{outcome.deleted}",
              flush=True)
    shutil.rmtree(path, ignore_errors=True)
    return {"variant": variant, "rows": rows, "batches": results,
            "median_s": statistics.median(r["seconds"] for r in results),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000000,10000000", help="table sizes, comma-separated")
    parser.add_argument("--batch", type=int, default=100_000, help="changes per batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    parser.add_argument("--writers", help="alias of --variants")
    parser.add_argument("--target-file-mb", type=int, default=None,
                        help="file layout: target file size of the initial table and of the writers' rewrites "
                             "(table property delta.targetFileSize); default: each writer's own")
    parser.add_argument("--spark-memory", default="3g", help="the local Spark server's driver heap")
    parser.add_argument("--work", default=None, help="directory for the tables (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()
    sizes = [int(s) for s in args.rows.split(",")]
    variants = (args.writers or args.variants).split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="w3-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    with contextlib.ExitStack() as stack:
        spark = None
        rss = stack.enter_context(PeakRss(exclude_pid=-1))
        if any(v.startswith("delta-spark") for v in variants):
            spark = stack.enter_context(spark_session(work, args.spark_memory))
            for pid in server_pids():
                rss.add_root(pid)
        if spark is not None:
            warm_up(spark, work)
        for rows in sizes:
            pristine = work / f"pristine-{rows}"
            shutil.rmtree(pristine, ignore_errors=True)
            seconds = build(pristine, rows, args.target_file_mb)
            size = sum(f.stat().st_size for f in pristine.rglob("*.parquet"))
            print(f"built {rows:,} rows in {seconds:.1f} s: {live_files(pristine)} files, {size / 2**20:.0f} MiB",
                  flush=True)
            for variant in variants:
                writer: DeltaWriter = DeltaRsWriter() if variant == "delta-rs" else DeltaSparkWriter(spark)  # type: ignore[arg-type]
                results.append(run_variant(variant, writer, spark, pristine, work, rows, args.batch, args.batches))
            shutil.rmtree(pristine, ignore_errors=True)
    print(f"\npeak RSS (benchmark + Spark server): {rss.peak / 2**30:.2f} GiB")
    print("\n| variant | rows | s/batch (median) | CPU s/batch | files written / dropped per batch | files given a DV "
          "| MiB written |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        b = r["batches"]
        print(f"| {r['variant']} | {r['rows']:,} | {r['median_s']:.1f} | {r['median_cpu_s']:.1f} | "
              f"{statistics.median(x['added'] for x in b):.0f} / {statistics.median(x['removed'] for x in b):.0f} | "
              f"{statistics.median(x['dvs'] for x in b):.0f} | "
              f"{statistics.median(x['bytes_added'] for x in b) / 2**20:.0f} |")
    if len(sizes) > 1:
        for variant in variants:
            small = next(r for r in results if r["variant"] == variant and r["rows"] == min(sizes))
            large = next(r for r in results if r["variant"] == variant and r["rows"] == max(sizes))
            print(f"{variant}: {max(sizes):,} / {min(sizes):,} rows = {large['median_s'] / small['median_s']:.2f}x "
                  f"({large['median_s']:.1f} s / {small['median_s']:.1f} s a batch); CPU s "
                  f"{large['median_cpu_s'] / small['median_cpu_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "peak_rss": rss.peak, "results": results},
                                              indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
