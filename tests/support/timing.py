"""Where the suite's time goes, printed after the run: worker time per folder, per module and per xdist worker,
how busy the machine's cores were, and the disk's free space.

CI's limit is the wall time of the busier worker, so the summary shows each worker's total beside the
modules' (each test's set-up, call and tear-down, as pytest reports them to the controller). The cores' use
says whether another worker could help: with both cores busy, it would only slow the others down."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

# Where each test process records the CPU its local Spark servers used (``record_spark_servers``), for the summary.
SPARK_CPU_ENV_VAR = "CDC_TEST_SPARK_CPU_FILE"
# Where each test process records how long its module- and session-scoped fixtures took to start and to stop
# (``FixtureTiming``): a server started or stopped slowly shows up there, not under any one test.
FIXTURE_TIMES_ENV_VAR = "CDC_TEST_FIXTURE_TIMES_FILE"
# Where each test process records the CPU its local Spark servers used during each module (``SparkCpuByModule``):
# the suite is bound by the servers' CPU, and a module's wall time alone does not say how much of it is theirs.
MODULE_SPARK_CPU_ENV_VAR = "CDC_TEST_MODULE_SPARK_CPU_FILE"


class SuiteTiming:
    """Collects test reports' durations in the process that prints the summary (xdist's controller)."""

    def __init__(self) -> None:
        self.by_module: dict[str, float] = defaultdict(float)
        self.by_worker: dict[str, float] = defaultdict(float)
        self.tests_by_module: dict[str, set[str]] = defaultdict(set)
        self.started = (time.monotonic(), _cpu_ticks())
        self.disk = DiskWatch()

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
        (wall_started, (busy_started, idle_started)), (busy, idle) = self.started, _cpu_ticks()
        busy_cpu = (busy - busy_started) / _TICKS
        if busy + idle > busy_started + idle_started:
            share = (busy - busy_started) / (busy + idle - busy_started - idle_started)
            write(f"cores busy: {share:.0%} of {os.cpu_count()} over {time.monotonic() - wall_started:.0f} s")
        for folder, seconds in sorted(by_folder.items(), key=lambda item: -item[1]):
            write(f"{folder:40s} {tests_by_folder[folder]:4d} tests {seconds:8.1f} s")
        write(self.disk.summary())
        spark = _spark_servers_cpu()
        if spark is not None:
            servers, cpu, jit = spark
            write(f"local Spark servers at the end: {servers}, {cpu:.0f} CPU s ({cpu / (busy_cpu or cpu):.0%} of the "
                  f"machine's), of which their JIT compilers {jit:.0f} s")
        fixtures = _fixture_times()
        if fixtures:
            write("slowest module and session fixtures (set-up, tear-down):")
            for (name, phase), seconds in fixtures[:10]:
                write(f"  {name:60s} {phase:9s} {seconds:8.1f} s")
        spark_by_module: dict[str, float] = defaultdict(float)
        for entry in _recorded(MODULE_SPARK_CPU_ENV_VAR):
            spark_by_module[entry["module"]] += entry["cpu"]
        write("slowest modules (worker time; their local Spark servers' CPU):")
        for module, seconds in sorted(self.by_module.items(), key=lambda item: -item[1])[:20]:
            write(f"  {module:60s} {len(self.tests_by_module[module]):3d} tests {seconds:8.1f} s "
                  f"{spark_by_module.get(module, 0.0):8.1f} Spark CPU s")


class DiskWatch:
    """The free space of the temporary directory's file system, sampled through the run: where the servers' data,
    the Delta tables and the JVMs' temporary files go. A run on CI once failed when that disk filled up."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.started = time.monotonic()
        self.first = self.lowest = self._free()
        self.lowest_at = 0.0
        threading.Thread(target=self._watch, args=(every_s,), name="disk-watch", daemon=True).start()

    @staticmethod
    def _free() -> int:
        return shutil.disk_usage(tempfile.gettempdir()).free

    def _watch(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            free = self._free()
            if free < self.lowest:
                self.lowest, self.lowest_at = free, time.monotonic() - self.started

    def summary(self) -> str:
        """One line: the free space at the start, at its lowest (and when) and at the end."""
        gb = 1024 ** 3
        return (f"disk ({tempfile.gettempdir()}): {self.first / gb:.1f} GB free at the start, "
                f"{self.lowest / gb:.1f} GB at the lowest (after {self.lowest_at:.0f} s), "
                f"{self._free() / gb:.1f} GB at the end")


def _cpu_ticks() -> tuple[int, int]:
    """The machine's busy and idle (idle and I/O wait) CPU ticks since boot, from ``/proc/stat``; zeros elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, idle


def record_spark_servers() -> None:
    """Append the CPU seconds (and their JIT compilers') of this test process's running local Spark servers to the
    summary's file: called before the servers stop, so a server that stopped itself earlier is not counted."""
    from benchmarks.measure import jit_cpu, process_cpu
    from cdc_assets.io.spark_server import running_servers

    where = os.environ.get(SPARK_CPU_ENV_VAR)
    if not where:
        return
    with open(where, "a") as out:
        for _, state in running_servers():
            out.write(json.dumps({"cpu": process_cpu(state["pid"]), "jit": jit_cpu(state["pid"])}) + "\n")


def _recorded(variable: str) -> list[dict[str, Any]]:
    """The entries the test processes appended to the JSON-lines file ``variable`` names (none where it names none)."""
    where = os.environ.get(variable)
    if not where or not os.path.exists(where):
        return []
    return [json.loads(line) for line in Path(where).read_text().splitlines() if line.strip()]


def _spark_servers_cpu() -> tuple[int, float, float] | None:
    """The number of servers recorded, their CPU seconds and their JIT compilers'; None where none was."""
    entries = _recorded(SPARK_CPU_ENV_VAR)
    if not entries:
        return None
    return len(entries), sum(e["cpu"] for e in entries), sum(e["jit"] for e in entries)


class FixtureTiming:
    """Times the set-up and tear-down of module- and session-scoped fixtures in each test process, appending them
    to ``FIXTURE_TIMES_ENV_VAR``'s file: their tear-down otherwise counts towards whichever test happens to be last."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.stopping: dict[int, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
        if fixturedef.scope not in ("module", "session"):
            return (yield)
        started = time.monotonic()
        try:
            return (yield)
        finally:
            self._record(fixturedef, request, "set-up", time.monotonic() - started)
            # Finalizers run last-added first: this one marks the start of the fixture's own tear-down.
            fixturedef.addfinalizer(lambda: self.stopping.__setitem__(id(fixturedef), time.monotonic()))

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
        started = self.stopping.pop(id(fixturedef), None)
        if started is not None:
            self._record(fixturedef, request, "tear-down", time.monotonic() - started)

    def _record(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest, phase: str,
                seconds: float) -> None:
        name = fixturedef.argname if fixturedef.scope == "session" else f"{request.node.nodeid}::{fixturedef.argname}"
        with open(self.where, "a") as out:
            out.write(json.dumps({"name": name, "phase": phase, "seconds": seconds}) + "\n")


class SparkCpuByModule:
    """Appends, in each test process, the CPU seconds its local Spark servers (the Dagster runs' included: they share
    them) used while each module ran to ``MODULE_SPARK_CPU_ENV_VAR``'s file. A server that stops within a module
    takes its last seconds with it; the session's main servers run to the end."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.seen: dict[int, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if nextitem is None:  # the session's servers stop in this tear-down: measured before it
            self._record(item)
        try:
            return (yield)
        finally:
            if nextitem is not None and nextitem.path != item.path:  # after the module's fixtures' tear-down
                self._record(item)

    def _record(self, item: pytest.Item) -> None:
        from benchmarks.measure import process_cpu
        from cdc_assets.io.spark_server import running_servers

        used = 0.0
        for _, state in running_servers():
            cpu = process_cpu(state["pid"])
            used += max(0.0, cpu - self.seen.get(state["pid"], 0.0))  # a reused pid's count starts again
            self.seen[state["pid"]] = cpu
        with open(self.where, "a") as out:
            out.write(json.dumps({"module": item.nodeid.split("::", 1)[0], "cpu": used}) + "\n")


def _fixture_times() -> list[tuple[tuple[str, str], float]]:
    """Every process's fixture set-ups and tear-downs, summed per fixture and phase, slowest first."""
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for entry in _recorded(FIXTURE_TIMES_ENV_VAR):
        totals[(entry["name"], entry["phase"])] += entry["seconds"]
    return sorted(totals.items(), key=lambda item: -item[1])


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def register(config: pytest.Config) -> None:
    """Add the summary in the process that reports (not in xdist's workers), and name the files where the test
    processes (xdist's workers inherit the environment) record their Spark servers' CPU and their fixtures' times."""
    if not hasattr(config, "workerinput"):
        files = ((SPARK_CPU_ENV_VAR, "cdc-test-spark-cpu-"), (FIXTURE_TIMES_ENV_VAR, "cdc-test-fixtures-"),
                 (MODULE_SPARK_CPU_ENV_VAR, "cdc-test-module-spark-cpu-"))
        for variable, prefix in files:
            handle, path = tempfile.mkstemp(prefix=prefix, suffix=".jsonl")
            os.close(handle)
            os.environ[variable] = path
        config.pluginmanager.register(SuiteTiming(), "cdc-suite-timing")
    if os.environ.get(FIXTURE_TIMES_ENV_VAR):
        config.pluginmanager.register(FixtureTiming(os.environ[FIXTURE_TIMES_ENV_VAR]), "cdc-fixture-timing")
    if os.environ.get(MODULE_SPARK_CPU_ENV_VAR):
        config.pluginmanager.register(SparkCpuByModule(os.environ[MODULE_SPARK_CPU_ENV_VAR]), "cdc-module-spark-cpu")
