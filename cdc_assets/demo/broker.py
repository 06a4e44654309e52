"""A local single-node Apache Kafka (KRaft) for the demo, the tests and the benchmarks.

Runs the ``org.apache.kafka`` jars that ``scripts/setup`` puts in ``<venv>/share/cdc-assets/kafka``
(``KAFKA_LIBS``) on 127.0.0.1, on a free port with a fresh log dir, and stops with the context.

    python -m cdc_assets.demo.broker [--port 9092] [--data-dir DIR]   # runs until Ctrl-C
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

KAFKA_LIBS = Path(sys.prefix) / "share" / "cdc-assets" / "kafka"
HEAP = "512m"
# Settings for one node on a laptop or CI runner: every internal topic has one replica (and one
# partition, so a first group commit does not wait for 50 partitions to be created), groups form at
# once. Topics a producer names are created, as Kafka's default and Debezium's signal topics expect.
_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}
# For the producers of the demo, the tests and the benchmarks: a partition keeps the order records were
# produced in even when a write is retried (a new topic's partitions refuse writes for a moment, until
# the broker has taken their lead), as with Kafka Connect's producers, which Debezium runs on.
PRODUCER_SETTINGS = {"enable.idempotence": True}


def produce_waiting(producer: Producer, topic: str, key: bytes | None, value: bytes | None,
                    wait_s: float = 0.1, **options: Any) -> None:
    """``producer.produce``, waiting for room while the producer's queue is full (bulk loads)."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, **options)
            return
        except BufferError:
            producer.poll(wait_s)
def log4j2_properties(root_level: str, levels: Mapping[str, str] | None = None) -> str:
    """A log4j 2 properties config for a Kafka JVM: one console appender (its output goes to the process's log
    file), the root logger at ``root_level`` and the named loggers at ``levels``."""
    lines = ["status = error", "appender.out.type = Console", "appender.out.name = out",
             "appender.out.layout.type = PatternLayout", "appender.out.layout.pattern = [%d] %p %m (%c)%n",
             f"rootLogger.level = {root_level}", "rootLogger.appenderRef.out.ref = out"]
    for number, (name, level) in enumerate((levels or {}).items()):
        lines += [f"logger.l{number}.name = {name}", f"logger.l{number}.level = {level}"]
    return "\n".join(lines) + "\n"


# Kafka logs through log4j 2; only warnings and errors go to the broker's log file.
_LOG4J2 = log4j2_properties("warn")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if found is None:
        raise RuntimeError("no java on PATH: Apache Kafka needs Java 17+ (scripts/setup installs it)")
    return found


def _classpath() -> str:
    if not any(KAFKA_LIBS.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Apache Kafka's jars are not in {KAFKA_LIBS}: run scripts/setup (it fetches them)")
    return str(KAFKA_LIBS / "*")


def _die_with_parent() -> None:
    """Run in the broker's process before Java starts: the kernel sends it SIGTERM when the thread
    that started it ends, so a test run or benchmark killed outright leaves no broker behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _cluster_id() -> str:
    """A random KRaft cluster id (Kafka's ``Uuid``: 16 bytes, URL-safe base64 without padding)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # as Kafka's own ids: one starting with "-" reads as an option
            return cluster_id


class ApacheKafkaBroker:
    """``with ApacheKafkaBroker() as broker: broker.bootstrap_servers``.

    ``data_dir`` holds the configuration, the KRaft log dir and ``broker.log``; a broker started
    again on the same ``data_dir`` (and ``port``) keeps its topics and offsets. The broker stops when
    the thread that started it ends.
    """

    def __init__(self, data_dir: str | Path | None = None, port: int | None = None):
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="cdc-kafka-"))
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the broker's JVM, while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the broker's JVM runs."""
        return self._process is not None and self._process.poll() is None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, main_class: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [_java(), f"-Xmx{HEAP}", f"-Xms{HEAP}", "-Djava.awt.headless=true",
                 f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                 "-cp", _classpath(), main_class, *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with_parent)

    def _configure(self) -> Path:
        """Write this start's ``server.properties`` (ports may differ between starts); format the log
        dir the first time."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        logs = self.data_dir / "kraft-logs"
        controller = free_port()
        settings = {
            **_SETTINGS,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "log.dirs": str(logs),
        }
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        if not (logs / "meta.properties").exists():
            log = self.data_dir / "format.log"
            formatting = self._run("kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config),
                                   log=log)
            if formatting.wait(120) != 0:
                raise RuntimeError(f"formatting Kafka's log dir failed ({formatting.returncode}): {log.read_text()}")
        return config

    def start(self, timeout_s: float = 90.0) -> ApacheKafkaBroker:
        """Start the broker and wait until it answers metadata requests."""
        config = self._configure()
        self._process = self._run("kafka.Kafka", str(config), log=self.data_dir / "broker.log")
        deadline = time.monotonic() + timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Apache Kafka exited with {self._process.returncode}; "
                                   f"see {self.data_dir}/broker.log")
            try:
                if admin.list_topics(timeout=1).brokers:
                    return self
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Apache Kafka did not answer on {self.bootstrap_servers} within {timeout_s}s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker: SIGTERM (a controlled shutdown), SIGKILL after ``timeout_s``. Removes the
        data dir if this object made it."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(10)
        self._process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafkaBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Run a broker in the foreground until Ctrl-C (or SIGTERM); its topics stay in ``--data-dir``."""
    parser = argparse.ArgumentParser(description="A local single-node Apache Kafka on 127.0.0.1, until Ctrl-C.")
    parser.add_argument("--port", type=int, default=9092, help="its port (default 9092, the demo config's default)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keeps its topics between starts (default: a temporary dir, removed on exit)")
    args = parser.parse_args(argv)
    if not port_free(args.port):
        print(f"port {args.port} on 127.0.0.1 is taken (another broker?): pass --port", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a controlled stop, as Ctrl-C
    # Ctrl-C stops it even when started in the background of a shell, which leaves SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with ApacheKafkaBroker(args.data_dir, args.port) as broker:
        print(f"Apache Kafka on {broker.bootstrap_servers} (data {broker.data_dir}); Ctrl-C stops it.\n"
              f"  export CDC_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", flush=True)
        try:
            while broker.running:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        if not broker.running:
            print(f"Apache Kafka exited; see {broker.data_dir}/broker.log", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
