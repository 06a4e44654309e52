"""The demo's Dagster UI, waited for until it serves."""

from __future__ import annotations

import subprocess


def until_ui(demo: subprocess.Popen, port: int) -> str:
    """What `scripts/demo --ui` printed up to its "Dagster UI: <url>" line, which must name ``port``."""
    assert demo.stdout is not None
    output = []
    for line in demo.stdout:
        output.append(line)
        if line.startswith("Dagster UI: "):
            break
    text = "".join(output)
    assert f"Dagster UI: http://127.0.0.1:{port}" in text, text[-5000:]
    return text
