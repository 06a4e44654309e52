"""The throughput benchmark's object-store leg, run small: W1's no-Spark reference on local disk and under an
``s3://`` root on a private S3-API server in one run, each checked against the oracle, and printed side by side."""

from __future__ import annotations

import re

from tests.support.benchmarks import run_benchmark


def test_w1_runs_on_local_disk_and_on_s3_in_one_run_and_prints_them_side_by_side() -> None:
    stdout = run_benchmark("merge_throughput", "--events", "3000", "--keys", "500", "--batch", "1000", "--runs", "1",
                           "--variants", "no_spark", "--store", "local,s3")
    # Each store's run merged the whole topic into a table equal to the reference fold.
    for name in ("no_spark", "no_spark@s3"):
        assert re.search(rf"^  run 1    {re.escape(name)} +[\d.]+ s oracle OK", stdout, re.MULTILINE), stdout
    # The S3 run's CPU counts the S3-API server's, which served it.
    s3_run = next(line for line in stdout.splitlines() if "no_spark@s3" in line and "oracle OK" in line)
    served = re.search(r"S3-API server ([\d.]+)\)", s3_run)
    assert served and float(served[1]) > 0, s3_run
    side_by_side = stdout.split("Local disk beside S3")[1]
    row = next(line for line in side_by_side.splitlines() if line.startswith("no_spark"))
    # events/s and CPU s on each store, as ratios to no_spark on local disk (1.00x for itself).
    assert re.fullmatch(r"no_spark +[\d,]+ +\(1\.00x\) +[\d.]+ +\(1\.00x\) +[\d,]+ +\([\d.]+x\) +[\d.]+ +\([\d.]+x\)"
                        r" +[\d.]+", row), row
