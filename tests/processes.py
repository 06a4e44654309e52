"""Servers the tests start as child processes."""

from __future__ import annotations

import signal
import subprocess


def terminate(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Stop ``process`` gracefully (SIGTERM, so it stores what it must: offsets, data files), killing it
    only if it has not ended after ``timeout_s``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
