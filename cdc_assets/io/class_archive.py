"""A class-data-sharing (CDS) archive for the local Spark JVM, so short runs start warm.

Every local JVM (the local Spark server's, or a run's own) spends seconds loading and
verifying Spark's classes before the first batch. A dynamic CDS archive holds those classes already
parsed: made once per installation (``scripts/setup`` does it) by running one small merge through
the project's own decode and fold in a JVM that dumps its loaded classes at exit, then mapped by
every later JVM (``spark_config`` adds the option when the archive exists; a JVM whose version or
classpath no longer matches the archive ignores it and starts as before).

    python -m cdc_assets.io.class_archive [--force]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_assets.core import decode_change_events, derive_layout, fold_batch, value_type
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.spark import JAVA_OPTIONS, class_archive_path, spark_config, spark_records

_DUMP_ENV_VAR = "CDC_CLASS_ARCHIVE_DUMP"


def _workload() -> None:
    """One small batch through the merge path's Spark work: JSON hand-over, decode, fold, Arrow."""
    events = [(encode_key({"id": i % 50}), envelope("u" if i >= 50 else "c", None,
                                                    {"id": i % 50, "name": f"n{i}", "qty": i},
                                                    postgres_source(1000 + i, 1_700_000_000_000 + i, "public", "t"),
                                                    1_700_000_000_000 + i, with_schema=i % 2 == 0))
              for i in range(200)]
    records = pa.table({"partition": pa.array([0] * len(events), pa.int32()),
                        "offset": pa.array(range(len(events)), pa.int64()),
                        "key": pa.array([k for k, _ in events], pa.binary()),
                        "value": pa.array([v for _, v in events], pa.binary())})
    layout = derive_layout("postgresql", records["key"].to_pylist(), records["value"].to_pylist(), (), {}, None)
    settings = spark_config()
    # The runtime's JVM options plus the dump, so the archive is made by a JVM like the ones that map it.
    options = f"{settings.get(JAVA_OPTIONS, '')} -XX:ArchiveClassesAtExit={os.environ[_DUMP_ENV_VAR]}"
    spark = SparkSession.builder.config(map={**settings, JAVA_OPTIONS: options.strip()}).getOrCreate()
    with spark_records(spark, records, value_type(layout)) as frame:
        fold_batch(decode_change_events(frame, layout), layout)
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    jvm.stdin.close()  # the gateway JVM exits on EOF, dumping the archive on its way out
    jvm.wait()


def build(path: Path) -> Path:
    """Run the workload in a JVM that dumps its classes to ``path`` when it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        dump = Path(scratch) / path.name
        env = {**os.environ, _DUMP_ENV_VAR: str(dump)}
        subprocess.run([sys.executable, "-m", "cdc_assets.io.class_archive", "--workload"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not dump.exists():
            raise RuntimeError(f"the JVM wrote no class archive to {dump}")
        dump.replace(path)  # atomic: a concurrent JVM maps the old archive or the new one, never half of one
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild even if the archive exists")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        _workload()
        return
    path = class_archive_path()
    if path.exists() and not args.force:
        print(f"class archive: {path} (exists)")
        return
    print(f"class archive: {build(path)}")


if __name__ == "__main__":
    main()
