"""The small-MERGE benchmark runs as its docstring says and prints its ratio to the reference."""

from __future__ import annotations

import re
import subprocess
import sys

from cdc_assets.io.spark_server import jvm_environ


def test_the_small_merge_benchmark_prints_the_defaults_against_the_references() -> None:
    run = subprocess.run([sys.executable, "-m", "benchmarks.small_merges", "--rounds", "1", "--merges", "1"],
                         capture_output=True, text=True, timeout=600, env=jvm_environ())
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("defaults", "reference", "source copied", "run's session"):
        assert re.search(rf"^{name} +server CPU \d+\.\d+ s a MERGE", run.stdout, re.MULTILINE), run.stdout
        if name != "defaults":
            assert re.search(rf"^defaults / {name}: server CPU \d+\.\d+x, wall \d+\.\d+x$", run.stdout,
                             re.MULTILINE), run.stdout
