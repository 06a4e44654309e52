"""A local Kafka-protocol broker (noida-db) for the demo, the tests and the benchmarks.

Starts on 127.0.0.1 with a free port and a fresh data dir, and stops with the context.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary() -> str:
    beside_python = Path(sys.executable).parent / "noida-db"
    found = str(beside_python) if beside_python.exists() else shutil.which("noida-db")
    if found is None:
        raise RuntimeError("noida-db is not installed: pip install noida-db (it is in the dev extra)")
    return found


def _group_alive(group: int) -> bool:
    """Whether any process of the process group is still running (zombies do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


class LocalBroker:
    """``with LocalBroker() as broker: broker.bootstrap_servers``."""

    def __init__(self, data_dir: str | Path | None = None, port: int | None = None):
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="cdc-broker-"))
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the broker's process group leader, while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> LocalBroker:
        """Start the broker and wait until it answers metadata requests."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 - lives as long as the process
        self._process = subprocess.Popen(
            [_binary(), "start", "--data-dir", str(self.data_dir), "--only", "kafka",
             "--host", "127.0.0.1", "--kafka-port", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"noida-db exited with {self._process.returncode}; see {self.data_dir}/broker.log")
            try:
                admin.list_topics(timeout=1)
                return self
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"noida-db did not answer on {self.bootstrap_servers} within {timeout_s}s")

    def stop(self) -> None:
        """Stop the broker (and remove its data dir if this object made it)."""
        if self._process is not None and self._process.poll() is None:
            # The noida-db entry point is a wrapper that runs the real binary as its child: signal the
            # whole process group, or the broker outlives the wrapper.
            group = self._process.pid
            os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _group_alive(group) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _group_alive(group):
                os.killpg(group, signal.SIGKILL)
            self._process.wait(10)
        self._process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
