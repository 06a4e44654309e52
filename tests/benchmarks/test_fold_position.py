"""The fold-position benchmark runs as its docstring says and prints each variant's ratio to the reference."""

from __future__ import annotations

import re
import subprocess
import sys

from benchmarks.fold_position import REFERENCE
from cdc_assets.io.spark_server import jvm_environ


def test_the_fold_position_benchmark_prints_each_variant_against_the_text_position() -> None:
    run = subprocess.run([sys.executable, "-m", "benchmarks.fold_position", "--events", "20000", "--keys", "2000",
                          "--runs", "1"], capture_output=True, text=True, timeout=600, env=jvm_environ())
    assert run.returncode == 0, run.stderr[-3000:]
    for name in (REFERENCE, "binary position", "long position", "hash max, then join"):
        assert re.search(rf"^{name} \| \d+\.\d+ \| \d+\.\d+$", run.stdout, re.MULTILINE), run.stdout
        if name != REFERENCE:
            assert re.search(rf"^{name} / {REFERENCE}: server CPU \d+\.\d+x, wall \d+\.\d+x$", run.stdout,
                             re.MULTILINE), run.stdout
