"""Servers the tests start as child processes."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path

from typing_extensions import Self

from cdc_assets.demo.broker import free_port


def terminate(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Stop ``process`` gracefully (SIGTERM, so it stores what it must: offsets, data files), killing it
    only if it has not ended after ``timeout_s``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


class LocalServer:
    """A server on a free local port, run from a fresh directory (``server.log`` there) that ``stop`` removes;
    subclasses start ``_process`` in ``start`` and return ``self``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.directory: Path | None = None
        self._process: subprocess.Popen | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def _answers(self) -> bool:
        """Whether the server accepts connections (no request: some servers count them)."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
            return True
        except OSError:
            return False

    def log(self) -> str:
        """The server's output so far."""
        path = self.directory / "server.log" if self.directory else None
        return path.read_text(errors="replace")[-4000:] if path and path.exists() else ""

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self._process is not None:
            terminate(self._process, timeout_s=10)
            self._process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
