"""The benchmarks' peak-RSS sampler counts the process tree it measures (and the roots added to it), and
leaves out the one excluded (and the process itself, when told); their warm-up stops once the server's
JIT compilers use little of its CPU, which they read from a JVM's compiler threads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.measure import PeakRss, jit_cpu, server_cpu, warm_until_steady

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
        # Children of this process from before (a session's broker): counted as well, and taken out below.
        with PeakRss(exclude_pid=excluded.pid, interval_s=0.05, rescan_s=0.2) as before:
            time.sleep(0.3)
        with PeakRss(exclude_pid=excluded.pid, interval_s=0.05, rescan_s=0.2) as rss:
            time.sleep(0.3)
            counted = _holding(size, hold_s=1.5)  # after the first scan of the tree: found by a rescan
            _wait_for_rss(counted, size)
            time.sleep(0.5)
            counted.wait(timeout=20)
        # Beyond this process's own: the counted child (its interpreter's few MB besides), not the excluded one.
        children = rss.peak - rss.peak_python - (before.peak - before.peak_python)
        assert 0.9 * size < children < 1.5 * size
    finally:
        excluded.kill()
        excluded.wait()


def test_an_added_root_is_counted_and_the_process_itself_only_when_told() -> None:
    size = 300 * 2**20
    harness = _holding(size, hold_s=6)  # sampled as the measured process, not counted
    server = _holding(size, hold_s=6)  # no child of the harness: counted once added
    try:
        _wait_for_rss(harness, size)
        _wait_for_rss(server, size)
        with PeakRss(exclude_pid=-1, pid=harness.pid, count_root=False, interval_s=0.05, rescan_s=0.2) as rss:
            time.sleep(0.3)
            assert rss.peak < 0.1 * size  # the harness alone, not counted
            rss.add_root(server.pid)
            time.sleep(0.5)
        assert 0.9 * size < rss.peak < 1.5 * size  # the server, not the harness besides
        assert rss.peak_python > 0.9 * size  # the harness's own, reported apart
    finally:
        for process in (harness, server):
            process.kill()
            process.wait()


def test_the_warm_up_runs_until_the_jit_is_done_or_the_passes_run_out() -> None:
    def runs(server_cpu: list[tuple[float, float]]) -> list[int]:
        made: list[int] = []

        def run(number: int) -> dict:
            made.append(number)
            server, jit = server_cpu[number - 1]
            return {"cpu": {"server": server, "server_jit": jit}}

        warm_until_steady(run, passes=len(server_cpu))
        return made

    assert runs([(80.0, 30.0), (40.0, 9.0), (30.0, 4.0), (28.0, 2.8), (27.0, 1.0)]) == [1, 2, 3, 4]  # 2.8 of 28
    assert runs([(80.0, 30.0), (40.0, 9.0), (30.0, 4.0)]) == [1, 2, 3]  # never done: every pass
    assert runs([(80.0, 5.0), (40.0, 9.0), (30.0, 1.0), (29.0, 1.0)]) == [1, 2, 3]  # not the first run, started cold


_HOT_LOOP = """
public class Hot {
    public static void main(String[] args) {
        long total = 0;
        long until = System.nanoTime() + 3_000_000_000L;
        while (System.nanoTime() < until) {
            for (int i = 0; i < 1_000_000; i++) total += Long.numberOfTrailingZeros(total + i) ^ i;
        }
        System.out.println(total);
    }
}
"""


def test_the_jit_cpu_of_a_running_jvm_is_read_from_its_compiler_threads(tmp_path: Path) -> None:
    java = shutil.which("java")
    assert java, "the benchmarks' machine runs Spark on Java 17+"
    source = tmp_path / "Hot.java"
    source.write_text(_HOT_LOOP)
    # Not this process: a test before this one in the same worker may have started a JVM under it.
    idle = subprocess.Popen(["sleep", "30"])
    try:
        assert jit_cpu(idle.pid) == 0.0  # no JVM in that process
    finally:
        idle.kill()
        idle.wait()
    jvm = subprocess.Popen([java, str(source)], stdout=subprocess.DEVNULL)  # compiles the source, then loops
    try:
        time.sleep(2.5)
        compiled = jit_cpu(jvm.pid)
        total = sum(psutil.Process(jvm.pid).cpu_times()[:2])
        assert 0.0 < compiled < total
        server = server_cpu([jvm.pid])  # as the benchmarks read a local Spark server
        assert compiled <= server["server_jit"] < server["server"]
    finally:
        jvm.kill()
        jvm.wait()
