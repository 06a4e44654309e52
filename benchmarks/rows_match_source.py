"""What ``rows_match_source`` costs on a large table, beside the plainest look at the same table: ``SELECT count(*)``
in the source database and a count of the Delta table in Spark, in the same run.

A PostgreSQL table of ``--rows`` rows (``generate_series``: bigint key, text, numeric(12, 2), timestamptz) and
its Delta table with the same rows in the types Debezium's events of them land in (written with delta-rs
directly: the benchmark measures the check, not the capture). The check (``cdc_assets.io.reconcile.reconcile``,
as the asset check runs it, on the project's local Spark server) runs ``--runs`` times, then the two counts; for
each it prints wall seconds and CPU seconds of this process, of the Spark server (with its JVM) and of the
database (its postmaster's process tree, when the server runs on this machine and its data directory is
readable), and the check's ratios to the counts.

    python -m benchmarks.rows_match_source --rows 10000000           # a private PostgreSQL of its own
    python -m benchmarks.rows_match_source --rows 1000000 --dsn "host=... dbname=... user=..."
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from benchmarks.large_tables import server_pids, spark_session
from benchmarks.measure import process_cpu
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.io.reconcile import DeltaSide, PostgresSource, reconcile

TABLE = "public.items"
CHUNK = 1_000_000
BASE_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                    ("at", pa.timestamp("us", tz="UTC")), ("_cdc_op", pa.string()), ("_cdc_position", pa.string())])


def load_source(dsn: str, rows: int) -> float:
    """The source table of ``rows`` rows, analysed; seconds taken."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {TABLE}")
        connection.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, name text, amount numeric(12, 2), "
                           "at timestamptz)")
        connection.execute(f"INSERT INTO {TABLE} SELECT g, 'item ' || g, (g %% 100000) / 100.0, "
                           "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' "
                           "FROM generate_series(1, %s) g", (rows,))
        connection.execute(f"VACUUM ANALYZE {TABLE}")
    return time.monotonic() - started


def delta_chunk(first: int, last: int) -> pa.Table:
    """Rows ``first``..``last`` as the source holds them, in the Delta types of Debezium's values."""
    ids = np.arange(first, last + 1, dtype=np.int64)
    key = pa.array(ids)
    cents = ids % 100_000
    amount = pc.cast(pc.binary_join_element_wise(
        pc.cast(pa.array(cents // 100), pa.string()),
        pc.utf8_lpad(pc.cast(pa.array(cents % 100), pa.string()), 2, "0"), "."), pa.decimal128(12, 2))
    n = len(ids)
    return pa.Table.from_arrays([
        key, pc.binary_join_element_wise("item", pc.cast(key, pa.string()), " "), amount,
        pa.array(BASE_US + ids * 1_000_000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(["r"] * n), pa.array(["0" * 40] * n)], schema=SCHEMA)


def build_delta(path: Path, rows: int) -> float:
    """The Delta table of the same rows, written in chunks of ``CHUNK``; seconds taken."""
    started = time.monotonic()
    for first in range(1, rows + 1, CHUNK):
        write_deltalake(str(path), delta_chunk(first, min(rows, first + CHUNK - 1)), mode="append")
    return time.monotonic() - started


def postmaster(dsn: str) -> psutil.Process | None:
    """The source server's postmaster, when it runs on this machine and its data directory is readable."""
    import psycopg

    with psycopg.connect(dsn) as connection:
        row = connection.execute("SELECT current_setting('data_directory')").fetchone()
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        assert row is not None
        return psutil.Process(int((Path(str(row[0])) / "postmaster.pid").read_text().split()[0]))
    return None


def database_cpu(server: psutil.Process | None) -> float | None:
    """CPU seconds so far of the postmaster, its children that ended (backends, parallel workers: it reaps them)
    and those alive."""
    if server is None:
        return None
    with contextlib.suppress(psutil.Error):
        total = sum(server.cpu_times()[:4])  # user, system, and of its reaped children
        for child in server.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
        return total
    return None


def measured(what: Callable[[], Any], server: psutil.Process | None) -> tuple[Any, dict[str, float | None]]:
    """``what()``'s answer, with its wall seconds and the CPU seconds of this process, of the Spark server and of
    the database."""
    def now() -> dict[str, float | None]:
        return {"process": sum(psutil.Process().cpu_times()[:2]),
                "spark": sum(process_cpu(pid) for pid in server_pids()), "database": database_cpu(server)}

    before, started = now(), time.monotonic()
    answer = what()
    wall = time.monotonic() - started
    time.sleep(0.5)  # the postmaster reaps the closed backend: its CPU then counts among the postmaster's children's
    after = now()
    spent: dict[str, float | None] = {"wall": wall}
    for part, value in before.items():
        later = after[part]
        spent[part] = later - value if value is not None and later is not None else None
    return answer, spent


def cpu_total(spent: dict[str, float | None]) -> float:
    """The CPU seconds of every part measured."""
    return sum(value for part, value in spent.items() if part != "wall" and value is not None)


def line(name: str, spent: dict[str, float | None]) -> str:
    parts = "  ".join(f"{part} {value:8.2f}" if value is not None else f"{part}      n/a"
                      for part, value in spent.items())
    return f"{name:<22} {parts}  cpu {cpu_total(spent):8.2f}"


@contextlib.contextmanager
def source_dsn(dsn: str | None) -> Iterator[str]:
    """``dsn``, else a database of a private PostgreSQL of the benchmark's own (stopped afterwards)."""
    if dsn is not None:
        yield dsn
        return
    from tests.support.postgres import PostgresServer

    with PostgresServer() as server:
        yield server.create_database("rows_match_source_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--buckets", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="check runs (the first pays the server's warm-up)")
    parser.add_argument("--dsn", help="a PostgreSQL database to create public.items in (default: a private server)")
    parser.add_argument("--spark-memory", default="2g")
    parser.add_argument("--work", type=Path, help="directory for the Delta table (default: a temporary one)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rms-bench-")))
        dsn = stack.enter_context(source_dsn(args.dsn))
        path = work / "items"
        print(f"rows {args.rows:,}  buckets {args.buckets}  source load {load_source(dsn, args.rows):.1f} s  "
              f"delta build {build_delta(path, args.rows):.1f} s", flush=True)
        spark = stack.enter_context(spark_session(work, args.spark_memory))
        server = postmaster(dsn)

        def check() -> Any:
            source = PostgresSource(dsn)
            delta = DeltaSide(spark, str(path), apply_mode("scd1", "postgresql"))  # type: ignore[arg-type]
            try:
                return reconcile(source, delta, TABLE, ["id"], buckets=args.buckets)
            finally:
                delta.close()
                source.close()

        def source_count() -> int:
            import psycopg

            with psycopg.connect(dsn) as connection:
                row = connection.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
            assert row is not None
            return int(row[0])

        def delta_count() -> int:
            return int(spark.read.format("delta").load(str(path)).count())  # type: ignore[attr-defined]

        checks = []
        for number in range(1, args.runs + 1):
            result, spent = measured(check, server)
            if not result.passed or result.source_rows != args.rows or result.delta_rows != args.rows:
                raise SystemExit(f"the check did not find the tables equal: {result}")
            print(line(f"check run {number}", spent) + f"  (source_s {result.source_s:.2f}, delta_s "
                  f"{result.delta_s:.2f}, side_by_side_s {result.side_by_side_s:.2f})", flush=True)
            checks.append(spent)
        counted, source_spent = measured(source_count, server)
        delta_counted, delta_spent = measured(delta_count, server)
        assert counted == delta_counted == args.rows, (counted, delta_counted)
        print(line("SELECT count(*) source", source_spent))
        print(line("count() Delta (Spark)", delta_spent))
        last = checks[-1]
        print(f"last check / source count:  wall {last['wall'] / source_spent['wall']:.1f}x  "  # type: ignore[operator]
              f"cpu {cpu_total(last) / max(cpu_total(source_spent), 0.01):.1f}x")
        print(f"last check / Delta count:   wall {last['wall'] / delta_spent['wall']:.1f}x  "  # type: ignore[operator]
              f"cpu {cpu_total(last) / max(cpu_total(delta_spent), 0.01):.1f}x")


if __name__ == "__main__":
    main()
