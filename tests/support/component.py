"""The component's example dg project (examples/dg_project): copied for a test, and served by `dg dev`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


EXAMPLE = ROOT / "examples" / "dg_project"


DG = Path(sys.executable).parent / "dg"


def copy_of_example(tmp_path: Path) -> Path:
    """A copy of the example project in ``tmp_path`` (a test may break its defs.yaml)."""
    copy = tmp_path / "dg_project"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    return copy


@contextlib.contextmanager
def dg_dev(project: Path, tmp_path: Path) -> Iterator[tuple[str, list[dict]]]:
    """`dg dev` on ``project`` as its user starts it, until the block ends: yields the UI's URL and its
    asset nodes, once its GraphQL serves them."""
    from cdc_assets.demo.broker import free_port

    port = free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{project / 'src'}:{ROOT}", "DAGSTER_HOME": str(home),
           "CDC_DELTA_ROOT": str(tmp_path / "delta")}
    env.pop("CDC_ASSETS_CONFIG", None)
    dev = subprocess.Popen([str(DG), "dev", "--host", "127.0.0.1", "--port", str(port)], cwd=project, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    query = json.dumps({"query": "{ assetNodes { assetKey { path } groupName } }"}).encode()
    nodes = None
    try:
        deadline = time.monotonic() + 180
        while nodes is None and time.monotonic() < deadline and dev.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=query,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    nodes = json.load(response)["data"]["assetNodes"] or None
            except (OSError, KeyError, TypeError):
                time.sleep(1)
        assert nodes is not None, f"dg dev did not serve the assets (exit code {dev.poll()})"
        yield f"http://127.0.0.1:{port}", nodes
    finally:
        os.killpg(dev.pid, signal.SIGTERM)
        try:
            dev.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)


# The example's two tables (the demo's PostgreSQL tables) and their topics, all in the group its translation names.
EXAMPLE_TABLES = {"dbserver1/inventory/customers", "dbserver1/inventory/products"}
EXAMPLE_GROUP = "bronze_inventory"
