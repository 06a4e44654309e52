"""cdc_merge_job on a real Spark cluster: a standalone master and worker from the pyspark distribution,
and a Spark Connect server of the test's own on that cluster. Both writers, on the demo sample's events,
must give the Delta tables (rows and commit metadata) that the embedded default gives."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyspark
import pytest
import yaml
from deltalake import DeltaTable

from cdc_assets.io.spark import spark_config
from cdc_assets.io.spark_server import CONNECT_SERVER_CLASS, jvm_environ
from tests.support.samples import sample_published

SPARK_BIN = Path(pyspark.__file__).parent / "bin"
TABLES = ("dbserver1/inventory/products", "dbserver1/inventory/customers", "server1/dbo/orders")
CONNECTORS = [
    {"name": "inventory", "kind": "postgresql", "topic.prefix": "dbserver1",
     "tables": [{"name": "inventory.products"}, {"name": "inventory.customers"}]},
    {"name": "sales", "kind": "sqlserver", "topic.prefix": "server1", "tables": [{"name": "dbo.orders"}]},
]
# Small enough to share 2 cores and the machine's memory with other test runs.
CLUSTER_CONF = {"spark.executor.memory": "1g", "spark.cores.max": "1", "spark.sql.shuffle.partitions": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.pyspark.python": sys.executable,
                "spark.eventLog.enabled": "true", "spark.eventLog.compress": "false"}
# 127.0.0.2 is this machine, but not an address the project takes for its own local server: the
# session is treated as remote, as a Spark Connect server elsewhere would be.
CONNECT_HOST = "127.0.0.2"


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def _env(**extra: str) -> dict[str, str]:
    """This environment for a JVM or a run of its own: not a Spark Connect client (as the test process may be)."""
    return jvm_environ(SPARK_LOCAL_IP="127.0.0.1", MALLOC_ARENA_MAX="2", **extra)


class Processes:
    """Processes started in sessions of their own, each stopped with everything it started."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, command: list[str], env: Mapping[str, str]) -> subprocess.Popen:
        with (self.logs / f"{name}.log").open("w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                       start_new_session=True)
        self.started.append(process)
        return process

    def wait_for(self, name: str, process: subprocess.Popen, ready, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                log = (self.logs / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} did not start (exit code {process.poll()}):\n{log}")
            time.sleep(0.5)

    def stop_all(self) -> None:
        for process in reversed(self.started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # the group: a worker's executors too
        for process in reversed(self.started):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    started = Processes(tmp_path_factory.mktemp("cluster-logs"))
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="module")
def cluster(processes: Processes, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A standalone Spark cluster on 127.0.0.1: one master, one worker of 1 core and 1 GB; its master URL."""
    port, ui_port = _free_port(), _free_port()
    master = processes.start("master", [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.master.Master",
                                        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
                             _env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",  # no fixed port 6066
                                  SPARK_DAEMON_MEMORY="256m"))
    processes.wait_for("master", master, lambda: _answers("127.0.0.1", port))
    url = f"spark://127.0.0.1:{port}"
    work = tmp_path_factory.mktemp("worker")
    worker = processes.start("worker", [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                                        "--host", "127.0.0.1", "--webui-port", str(_free_port()), "--cores", "1",
                                        "--memory", "1g", "--work-dir", str(work), url],
                             _env(SPARK_DAEMON_MEMORY="256m"))

    def registered() -> bool:
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(
                f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            return json.load(answer).get("aliveworkers", 0) == 1
        return False

    processes.wait_for("worker", worker, registered)
    return url


@pytest.fixture(scope="module")
def connect_server(processes: Processes, cluster: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A Spark Connect server of the test's own (not the project's local server), with Delta, on the
    cluster; its URL and event log directory."""
    events = tmp_path_factory.mktemp("connect-events")
    port = _free_port(CONNECT_HOST)
    settings = {**spark_config(cluster, conf={**CLUSTER_CONF, "spark.eventLog.dir": events.as_uri()}),
                "spark.connect.grpc.binding.address": CONNECT_HOST, "spark.connect.grpc.binding.port": str(port)}
    command = [str(SPARK_BIN / "spark-submit"), "--class", CONNECT_SERVER_CLASS]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    server = processes.start("connect-server", command, _env())
    processes.wait_for("connect-server", server, lambda: _answers(CONNECT_HOST, port))
    return f"sc://{CONNECT_HOST}:{port}", events


def run_merge_job(root: Path, bootstrap: str, spark: Mapping[str, object], writer: str) -> None:
    """``cdc_merge_job`` through Dagster's CLI in a process of its own, on a pipeline YAML of the sample's
    connectors (``CDC_ASSETS_CONFIG``) with these Spark settings and writer, into ``root``."""
    root.mkdir(parents=True)
    config = {"kafka": {"bootstrap_servers": bootstrap}, "spark": dict(spark),
              "delta": {"root": str(root / "delta"), "writer": writer}, "connectors": CONNECTORS}
    (root / "pipeline.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (root / "dagster_home").mkdir()
    dagster = Path(sys.executable).parent / "dagster"
    env = _env(CDC_ASSETS_CONFIG=str(root / "pipeline.yaml"), DAGSTER_HOME=str(root / "dagster_home"))
    run = subprocess.run([str(dagster), "job", "execute", "-m", "cdc_assets.definitions", "-j", "cdc_merge_job"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, f"cdc_merge_job failed:\n{run.stdout[-4000:]}\n{run.stderr[-6000:]}"


def tables(root: Path) -> dict[str, tuple[list[dict], dict, dict]]:
    """Per table: its rows in key order, the last commit's ``userMetadata`` and the last commit."""
    found = {}
    for name in TABLES:
        table = DeltaTable(str(root / "delta" / name))
        rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda row: json.dumps(row, default=str))
        last = table.history(1)[0]
        found[name] = (rows, json.loads(last["userMetadata"]), last)
    return found


def written_by(commit: Mapping[str, object]) -> str:
    """Which writer made a commit, from what Delta records of the engine."""
    if "delta-rs" in str(commit.get("clientVersion", "")):
        return "delta-rs"
    assert "Delta-Lake" in str(commit.get("engineInfo", "")), commit
    return "delta-spark"


def handed_over_in_spark(events: Path) -> None:
    """The runs' plans (Spark's event log) read the records from ``createDataFrame`` (a local relation, its
    ``from_json`` folded into it), never from the local hand-over's scratch directory (``<tmp>/cdc-batch-*``)."""
    logs = "".join(path.read_text() for path in events.rglob("*") if path.is_file())
    assert "SparkListenerSQLExecutionStart" in logs and "LocalTableScan" in logs, f"no such plans under {events}"
    assert "/cdc-batch-" not in logs, "a run handed records over through scratch files"


@pytest.fixture(scope="module")
def reference(broker, spark, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What the embedded default (local Spark server, writer auto: delta-rs) makes of the sample; the run
    shares the test session's local server (``spark``), as runs share it in production."""
    sample_published(broker)
    root = tmp_path_factory.mktemp("reference") / "run"
    run_merge_job(root, broker.bootstrap_servers, {}, "auto")
    made = tables(root)
    assert {written_by(commit) for _, _, commit in made.values()} == {"delta-rs"}
    assert sum(len(rows) for rows, _, _ in made.values()) > 0
    return made


def equal_to_reference(made: dict, reference: dict, writer: str) -> None:
    for name, (rows, metadata, commit) in made.items():
        expected_rows, expected_metadata, _ = reference[name]
        assert written_by(commit) == writer, name
        assert metadata == expected_metadata, name
        assert rows == expected_rows, name


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_merge_job_on_a_standalone_cluster(broker, cluster, reference, writer, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    run_merge_job(tmp_path / "run", broker.bootstrap_servers,
                  {"master": cluster, "conf": {**CLUSTER_CONF, "spark.eventLog.dir": events.as_uri()}}, writer)
    handed_over_in_spark(events)
    equal_to_reference(tables(tmp_path / "run"), reference, writer)


def test_merge_job_through_a_spark_connect_server_of_its_own(broker, connect_server, reference, tmp_path):
    url, events = connect_server
    # writer auto: a remote session with Delta takes delta-spark
    run_merge_job(tmp_path / "run", broker.bootstrap_servers, {"remote": url}, "auto")
    handed_over_in_spark(events)
    equal_to_reference(tables(tmp_path / "run"), reference, "delta-spark")
