"""Benchmarks run small, so that they cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(module: str, *args: str, timeout_s: float = 600) -> str:
    """What ``python -m benchmarks.<module> <args>`` printed; it must exit 0."""
    run = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=timeout_s)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout
