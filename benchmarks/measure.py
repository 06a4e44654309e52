"""Measuring helpers shared by the benchmarks."""

from __future__ import annotations

import contextlib
import threading

import psutil


class PeakRss:
    """Samples the RSS of a process (default: this one) and all its children (the JVM) in a thread;
    the local broker (the test harness, not the project) is left out."""

    def __init__(self, exclude_pid: int, interval_s: float = 0.2, pid: int | None = None):
        self._exclude = exclude_pid
        self._pid = pid
        self.peak = 0
        self.peak_python = 0
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process(self._pid)
        while not self._stop.is_set():
            total = python = me.memory_info().rss
            for process in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if process.pid != self._exclude and self._exclude not in {p.pid for p in process.parents()}:
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
