"""The benchmarks' peak-RSS sampler counts the process tree it measures, and leaves out the one excluded."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from benchmarks.measure import PeakRss

_HOLD = "import time; block = bytearray({size}); block[::4096] = b'x' * len(block[::4096]); time.sleep({hold})"


def _holding(size: int, hold_s: float) -> subprocess.Popen[bytes]:
    """A child process that touches ``size`` bytes and keeps them for ``hold_s`` seconds."""
    return subprocess.Popen([sys.executable, "-c", _HOLD.format(size=size, hold=hold_s)])


def _wait_for_rss(process: subprocess.Popen[bytes], size: int) -> None:
    deadline = time.monotonic() + 20
    while psutil.Process(process.pid).memory_info().rss < size and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_child_started_after_sampling_began_is_counted_and_an_excluded_one_is_not() -> None:
    size = 300 * 2**20
    excluded = _holding(size, hold_s=6)
    try:
        _wait_for_rss(excluded, size)
        with PeakRss(exclude_pid=excluded.pid, interval_s=0.05, rescan_s=0.2) as rss:
            time.sleep(0.3)
            counted = _holding(size, hold_s=1.5)  # after the first scan of the tree: found by a rescan
            _wait_for_rss(counted, size)
            time.sleep(0.5)
            counted.wait(timeout=20)
        # Beyond this process's own: the counted child (its interpreter's few MB besides), not the excluded one.
        children = rss.peak - rss.peak_python
        assert 0.9 * size < children < 1.5 * size
    finally:
        excluded.kill()
        excluded.wait()
