"""A Kafka Connect distributed worker for tests, as Debezium runs in production: Connect 4.3.0
(``org.apache.kafka.connect.cli.ConnectDistributed``, the jars ``scripts/setup-tests`` puts in
``<venv>/share/cdc-assets/connect``) with Debezium's MariaDB and PostgreSQL connectors as plugins
(``<venv>/share/cdc-assets/connect-plugins``), producing into the tests' broker.

Each worker has its own group and its own config, offset and status topics (named by a random id), so
workers of one session never share state; a worker restarted on the same topics resumes every connector
from its stored offsets. Connectors are managed over the worker's REST API on a free port of 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdc_assets.demo.broker import _die_with_parent, _java, free_port, log4j2_properties
from tests.support.processes import terminate

CONNECT_LIBS = Path(sys.prefix) / "share" / "cdc-assets" / "connect"
CONNECT_PLUGINS = Path(sys.prefix) / "share" / "cdc-assets" / "connect-plugins"
HEAP = "768m"
# Debezium's and the worker's own lifecycle lines at INFO; the clients' chatter (every producer's and
# consumer's config dump, metadata updates) only from WARN.
_LOG4J2 = log4j2_properties("info", {"org.apache.kafka.clients": "warn", "org.apache.kafka.common": "warn",
                                    "org.reflections": "error"})


class ConnectError(RuntimeError):
    """The worker or one of its connectors failed; the message holds the REST answer or the worker's log."""


class ConnectWorker:
    """``with ConnectWorker(broker.bootstrap_servers, work_dir) as worker: worker.register(name, config)``."""

    def __init__(self, bootstrap_servers: str, work_dir: str | Path, worker_id: str | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.work_dir = Path(work_dir)
        self.id = worker_id or f"connect-{uuid.uuid4().hex[:8]}"
        self.topics = {kind: f"{self.id}.{kind}" for kind in ("configs", "offsets", "status")}
        self.log_file = self.work_dir / "connect.log"
        self.port = 0
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The REST API's base URL (changes with each start)."""
        return f"http://127.0.0.1:{self.port}"

    def _properties(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.id,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "config.storage.topic": self.topics["configs"],
            "offset.storage.topic": self.topics["offsets"],
            "status.storage.topic": self.topics["status"],
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            # One broker: a partition each is plenty, and 25 (the default) slows every first start.
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "offset.flush.interval.ms": "1000",  # offsets stored within a second: a kill replays little
            # A restarted worker is a new member: without this its old tasks wait 5 minutes to be reassigned.
            "scheduled.rebalance.max.delay.ms": "0",
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            "plugin.path": str(CONNECT_PLUGINS),
            "plugin.discovery": "service_load",  # REST up in about 9 s instead of 28 s (no class scan)
            "topic.creation.enable": "true",
        }

    def start(self, timeout_s: float = 120) -> ConnectWorker:
        """Start the worker's JVM and wait until its REST API lists connectors (it has joined its group)."""
        if not (CONNECT_LIBS / ".installed").exists() or not (CONNECT_PLUGINS / ".installed").exists():
            raise ConnectError(f"Kafka Connect is not in {CONNECT_LIBS} / {CONNECT_PLUGINS}: run scripts/setup-tests")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.starts += 1
        properties = self.work_dir / "connect-distributed.properties"
        properties.write_text("".join(f"{k}={v}\n" for k, v in self._properties().items()))
        log4j = self.work_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        with self.log_file.open("ab") as log:
            log.write(f"--- start {self.starts} on port {self.port}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [_java(), f"-Xmx{HEAP}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                 f"-Dlog4j2.configurationFile={log4j}", "-cp", str(CONNECT_LIBS / "*"),
                 "org.apache.kafka.connect.cli.ConnectDistributed", str(properties)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive("its REST API")
            try:
                self._request("GET", "/connectors")
                return self
            except (ConnectError, OSError):
                if time.monotonic() > deadline:
                    raise ConnectError(f"Kafka Connect's REST API did not answer in {timeout_s}s:\n"
                                       f"{self.log_tail()}") from None
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the worker gracefully (SIGTERM): its tasks stop and their offsets are stored."""
        if self.process is not None:
            terminate(self.process)
            self.process = None

    def kill(self) -> None:
        """Kill the worker abruptly (SIGKILL): records after its last stored offsets are produced again."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(30)
            self.process = None

    def restart(self, timeout_s: float = 120) -> None:
        """Stop the JVM and start a new one on the same topics: every connector resumes from its offsets."""
        self.stop()
        self.start(timeout_s)

    def _check_alive(self, waiting_for: str) -> None:
        if self.process is None or self.process.poll() is not None:
            raise ConnectError(f"the Kafka Connect worker is not running (waiting for {waiting_for}):\n"
                               f"{self.log_tail()}")

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One REST call; the parsed JSON answer (None when empty). Errors are ``ConnectError`` with the
        status code and Connect's message."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise ConnectError(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc
        return json.loads(text) if text else None

    def _retrying(self, method: str, path: str, body: Mapping[str, Any] | None = None, timeout_s: float = 60) -> Any:
        """A REST call retried while the worker rebalances (409) or answers 500 meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._request(method, path, body)
            except ConnectError as exc:
                transient = f"{method} {path}: 409" in str(exc) or f"{method} {path}: 500" in str(exc)
                if "already exists" in str(exc) or not transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def register(self, name: str, config: Mapping[str, str]) -> dict[str, Any]:
        """Create connector ``name`` (``POST /connectors``); returns Connect's answer."""
        return self._retrying("POST", "/connectors", {"name": name, "config": dict(config)})

    def delete(self, name: str) -> None:
        """Delete connector ``name`` (its offsets stay in the offset topic; absent: nothing to do)."""
        try:
            self._retrying("DELETE", f"/connectors/{name}")
        except ConnectError as exc:
            if f"DELETE /connectors/{name}: 404" not in str(exc):
                raise

    def stop_connector(self, name: str) -> None:
        """Stop connector ``name`` (``PUT /connectors/<name>/stop``): its tasks shut down and their offsets are
        stored; ``resume`` starts them again from there, as after a restart, without touching other connectors."""
        self._retrying("PUT", f"/connectors/{name}/stop")

    def pause(self, name: str) -> None:
        """Pause connector ``name`` and its tasks."""
        self._retrying("PUT", f"/connectors/{name}/pause")

    def resume(self, name: str) -> None:
        """Resume connector ``name`` (paused or stopped)."""
        self._retrying("PUT", f"/connectors/{name}/resume")

    def status(self, name: str) -> dict[str, Any]:
        """``GET /connectors/<name>/status``: the connector's and each task's state (and trace when failed)."""
        return self._retrying("GET", f"/connectors/{name}/status")

    def offsets(self, name: str) -> dict[str, Any]:
        """``GET /connectors/<name>/offsets``: the source offsets the worker has stored for the connector."""
        return self._retrying("GET", f"/connectors/{name}/offsets")

    def wait_running(self, name: str, timeout_s: float = 120) -> dict[str, Any]:
        """Wait until connector ``name`` and all its tasks (at least one) run in this worker's current JVM; a failure
        is raised with its trace."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while True:
            self._check_alive(f"connector {name}")
            try:
                status = self.status(name)
            except ConnectError as exc:
                if f"/connectors/{name}/status: 404" not in str(exc):
                    raise
            parts = [status.get("connector", {}), *status.get("tasks", [])]
            if any(part.get("state") == "FAILED" for part in parts):
                trace = next((part["trace"] for part in parts if "trace" in part), status)
                raise ConnectError(f"connector {name} failed: {trace}")
            # Only this JVM's states count: after a restart the status topic still says RUNNING for the old one.
            if status.get("tasks") and all(part.get("state") == "RUNNING" for part in parts) and \
                    {part.get("worker_id") for part in parts} == {f"127.0.0.1:{self.port}"}:
                return status
            if time.monotonic() > deadline:
                raise ConnectError(f"connector {name} not running after {timeout_s}s: {status}\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 80) -> str:
        """The end of the worker's log (Debezium's lines included)."""
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ConnectWorker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
