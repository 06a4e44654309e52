"""Where the suite's time goes, printed after the run: worker time per folder, per module and per xdist worker.

CI's limit is the wall time of the busier worker, so the summary shows each worker's total beside the
modules' (each test's set-up, call and tear-down, as pytest reports them to the controller)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest


class SuiteTiming:
    """Collects test reports' durations in the process that prints the summary (xdist's controller)."""

    def __init__(self) -> None:
        self.by_module: dict[str, float] = defaultdict(float)
        self.by_worker: dict[str, float] = defaultdict(float)
        self.tests_by_module: dict[str, set[str]] = defaultdict(set)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.by_module[module] += report.duration
        self.tests_by_module[module].add(report.nodeid)
        node: Any = getattr(report, "node", None)
        worker = node.workerinput.get("workerid", "?") if node is not None else "main"
        self.by_worker[worker] += report.duration

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.by_module:
            return
        by_folder: dict[str, float] = defaultdict(float)
        tests_by_folder: dict[str, int] = defaultdict(int)
        for module, seconds in self.by_module.items():
            folder = module.rsplit("/", 1)[0]
            by_folder[folder] += seconds
            tests_by_folder[folder] += len(self.tests_by_module[module])
        write = terminalreporter.write_line
        terminalreporter.section("worker time (set-up + call + tear-down)")
        for worker, seconds in sorted(self.by_worker.items()):
            write(f"worker {worker}: {seconds:8.1f} s")
        for folder, seconds in sorted(by_folder.items(), key=lambda item: -item[1]):
            write(f"{folder:40s} {tests_by_folder[folder]:4d} tests {seconds:8.1f} s")
        write("slowest modules:")
        for module, seconds in sorted(self.by_module.items(), key=lambda item: -item[1])[:20]:
            write(f"  {module:60s} {len(self.tests_by_module[module]):3d} tests {seconds:8.1f} s")


def register(config: pytest.Config) -> None:
    """Add the summary in the process that reports (not in xdist's workers)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteTiming(), "cdc-suite-timing")
