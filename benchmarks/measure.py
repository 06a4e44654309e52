"""Measuring helpers shared by the benchmarks."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class PeakRss:
    """Samples the RSS of a process (default: this one) and all its children (the JVM) in a thread;
    the process ``exclude_pid`` and its descendants (the local broker: the test harness, not the
    project) are left out. ``count_root=False`` leaves the process itself out too (a harness whose
    children are what is measured); ``add_root`` counts another process with its descendants (the
    local Spark server, which is no child of the runs it serves), sampled at the same moments.

    The RSS is sampled every ``interval_s``, the process tree found again every ``rescan_s``: finding
    it reads every process's /proc entry, and five times a second that took about 1 CPU s of a loaded
    W1 run (py-spy) from the run it measured."""

    def __init__(self, exclude_pid: int, interval_s: float = 0.2, pid: int | None = None, rescan_s: float = 1.0,
                 count_root: bool = True):
        self._exclude = exclude_pid
        self._pid = pid
        self._count_root = count_root
        self._roots: list[int] = []
        self.peak = 0
        self.peak_python = 0  # the process itself, counted or not
        self._interval = interval_s
        self._rescan = rescan_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add_root(self, pid: int) -> None:
        """Count process ``pid`` and its descendants too, from the next scan of the tree on."""
        self._roots.append(pid)

    def _tree(self, me: psutil.Process) -> list[psutil.Process]:
        """``me``'s descendants and the added roots with theirs, less the excluded process and its own."""
        found = {p.pid: p for p in me.children(recursive=True)}
        for pid in list(self._roots):
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                found.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        found.pop(me.pid, None)
        if self._exclude < 0:
            return list(found.values())
        excluded = {self._exclude}
        with contextlib.suppress(psutil.Error):
            excluded |= {p.pid for p in psutil.Process(self._exclude).children(recursive=True)}
        return [p for pid, p in found.items() if pid not in excluded]

    def _run(self) -> None:
        me = psutil.Process(self._pid)
        tree: list[psutil.Process] = []
        rescan_at = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= rescan_at:
                tree = self._tree(me)
                rescan_at = time.monotonic() + self._rescan
            python = me.memory_info().rss
            total = python if self._count_root else 0
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    total += process.memory_info().rss
            self.peak = max(self.peak, total)
            self.peak_python = max(self.peak_python, python)
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# A warm-up run in which the server's JIT compilers used at most this share of its CPU ends the warm-up.
JIT_SHARE = 0.10
_COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre")  # HotSpot's, as Linux names them (15 characters)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc's CPU times


def jit_cpu(pid: int) -> float:
    """CPU seconds so far of the JIT compiler threads of process ``pid`` and its descendants (0 where
    none runs a HotSpot JVM): what a JVM still spends on compiling its own hot code."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            for task in Path(f"/proc/{process.pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    if (task / "comm").read_text().strip() in _COMPILER_THREADS:
                        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid`` and its descendants (0 where it has ended), those that have
    ended and been waited for included: a JVM's Python workers come and go during a measurement."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return sum(_with_ended_children(p.cpu_times()) for p in [root, *root.children(recursive=True)])
    return 0.0


def _with_ended_children(times: Any) -> float:
    """User and system seconds of a process and of its children that ended (``psutil``'s ``cpu_times``)."""
    return float(times.user + times.system + times.children_user + times.children_system)


def run_cpu() -> float:
    """CPU seconds so far of this process and its descendants (a JVM it started), the local Spark servers
    and their descendants excepted: a run's own CPU, beside the server's (``server_cpu``)."""
    from cdc_assets.io.spark_server import running_servers

    servers = {state["pid"] for _, state in running_servers()}
    me = psutil.Process()
    tree = [me, *(p for p in me.children(recursive=True)
                  if p.pid not in servers and not servers & {a.pid for a in p.parents()})]
    return sum(sum(p.cpu_times()[:2]) for p in tree)


def server_cpu(pids: Iterable[int]) -> dict[str, float]:
    """CPU seconds so far of the local Spark servers ``pids`` with their descendants (``server``), and of
    that, their JIT compilers' (``server_jit``)."""
    pids = list(pids)
    return {"server": sum(process_cpu(pid) for pid in pids), "server_jit": sum(jit_cpu(pid) for pid in pids)}


def used_since(before: Mapping[str, float], now: Mapping[str, float]) -> dict[str, float]:
    """The CPU seconds of each part of ``before`` used until ``now``."""
    return {part: now[part] - before[part] for part in before}


def warm_until_steady(run: Callable[[int], dict], passes: int) -> list[dict]:
    """Calls ``run(number)`` (1, 2, ...) until the server's JIT compilers used at most ``JIT_SHARE`` of its
    CPU in a run (``result["cpu"]["server_jit"]`` of ``result["cpu"]["server"]``), at most ``passes``
    times; the results in order.

    The local Spark server's JIT keeps compiling Spark's planning and the decode and fold for many runs
    after its start (docs/performance.md): a run measured on a server that still compiles pays for that, a
    deployment's long-lived server, which compiled its hot code long ago, does not."""
    results: list[dict] = []
    for number in range(1, passes + 1):
        results.append(run(number))
        cpu = results[-1]["cpu"]
        if number > 1 and cpu["server_jit"] <= JIT_SHARE * cpu["server"]:
            break
    return results


@contextlib.contextmanager
def own_spark_server(prefix: str) -> Iterator[tuple[SparkSession, list[int]]]:
    """A session on a local Spark server of the benchmark's own, on the embedded default's settings (in a
    temporary server directory: no other run's server is measured or reused), and the server's pids for
    ``server_cpu``; the server is stopped at the end."""
    from cdc_assets.io.spark import spark_config
    from cdc_assets.io.spark_server import (
        SERVER_DIR_ENV_VAR,
        connect,
        disconnect,
        ensure_local_server,
        running_servers,
        stop_all,
    )

    previous = os.environ.get(SERVER_DIR_ENV_VAR)
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        os.environ[SERVER_DIR_ENV_VAR] = str(Path(work) / "spark-servers")
        try:
            session = connect(ensure_local_server(spark_config()))
            try:
                yield session, [state["pid"] for _, state in running_servers()]
            finally:
                disconnect(session)
        finally:
            stop_all()
            # The caller's server directory again, not one just deleted.
            if previous is None:
                os.environ.pop(SERVER_DIR_ENV_VAR)
            else:
                os.environ[SERVER_DIR_ENV_VAR] = previous
