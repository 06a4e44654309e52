"""The embedded demo: start a local broker, publish the sample, run ``cdc_merge_job``, print the tables.

Run through ``scripts/demo`` (which sets up the environment first). Each run starts from a fresh
broker and Delta root under ``.cdc-demo/``, so it can run any number of times in a row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from deltalake import DeltaTable

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import load_config
from cdc_assets.demo.broker import ApacheKafkaBroker
from cdc_assets.demo.sample import publish_sample

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".cdc-demo"


def main() -> int:
    shutil.rmtree(STATE, ignore_errors=True)
    (STATE / "dagster_home").mkdir(parents=True)
    with ApacheKafkaBroker(STATE / "broker") as broker:
        published = publish_sample(broker.bootstrap_servers)
        print(f"local broker on {broker.bootstrap_servers}; published {published}")
        env = {**os.environ, "CDC_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
               "CDC_DELTA_ROOT": str(STATE / "delta"), "DAGSTER_HOME": str(STATE / "dagster_home")}
        env.pop("CDC_ASSETS_CONFIG", None)
        run = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
                              "cdc_assets.definitions", "-j", "cdc_merge_job"], env=env, cwd=ROOT,
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout[-5000:], run.stderr[-5000:], sep="\n")
            print("cdc_merge_job failed", file=sys.stderr)
            return 1
        os.environ.update(CDC_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers, CDC_DELTA_ROOT=str(STATE / "delta"))
        print(f"\ncdc_merge_job succeeded\n{'table':<36} {'rows':>5} {'version':>8}  path")
        for table in resolve_tables(load_config()):
            delta = DeltaTable(table.target.path)
            print(f"{table.topic:<36} {delta.count():>5} {delta.version():>8}  {table.target.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
