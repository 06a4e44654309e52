"""Dagster's creation of a ``cdc_merge_job`` run over many tables: what a quiet run pays before its op starts.

Creating a run stores, one event each, an ``ASSET_MATERIALIZATION_PLANNED`` per selected table and an
``ASSET_CHECK_EVALUATION_PLANNED`` per selected check (each table's blocking ones): 600 events over 200 tables of
``benchmarks.many_tables``' connector. In a deployment the webserver (a launch from the UI) or the daemon (a
schedule, sensor or backfill) creates the run, before the run worker starts. This times ``create_run_for_job``
alone, with no broker (the pipeline config names an address nothing listens on; the definitions load reads no
storage), ``--repeat`` times on one instance per variant, each in a fresh process:

- ``--storage``: sqlite (Dagster's default under a fresh ``DAGSTER_HOME``) or postgres (a private PostgreSQL
  server, fsync on, ``tests/support/postgres.py``), comma-separated;
- ``--event-batch-size``: the process's ``DAGSTER_EVENT_BATCH_SIZE``, comma-separated (0: Dagster's default);
- ``--connections``: postgres's, new (each statement on a new connection, as the daemon and a run's own process
  have them) or pooled (as the webserver has them: ``DagsterInstance.optimize_for_webserver``), comma-separated.

Prints each creation's wall and CPU seconds, the events stored, and the storage calls that stored them
(``store_event`` and ``store_event_batch``).

    python -m benchmarks.run_creation [--tables 200] [--storage sqlite,postgres] [--event-batch-size 0,1000]
                                      [--connections new,pooled] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.many_tables import BATCH_SIZE_ENV_VAR, quiet_storage, storages, write_config
from benchmarks.measure import run_cpu

ROOT = Path(__file__).resolve().parent.parent


def create_runs(work: Path, tables: int, repeat: int, storage_url: str | None, pooled: bool) -> list[dict]:
    """``repeat`` creations of a ``cdc_merge_job`` run over ``tables`` tables on one fresh instance (SQLite under
    ``work``, else Dagster's PostgreSQL storage at ``storage_url``, its connection ``pooled`` as the webserver's):
    each one's wall and CPU seconds, the events stored by type, and the storage calls made. Sets
    ``CDC_ASSETS_CONFIG`` (the definitions' config) in this process."""
    config = write_config(work, "127.0.0.1:9", tables, work / "delta", "delta-rs")
    os.environ["CDC_ASSETS_CONFIG"] = str(config)
    from dagster import DagsterInstance
    from dagster._core.execution.api import create_execution_plan

    from cdc_assets.config import load_config
    from cdc_assets.definitions import build_definitions

    job = build_definitions(load_config(config)).resolve_job_def("cdc_merge_job")
    (work / "home").mkdir()
    instance = DagsterInstance.local_temp(
        str(work / "home"), {"storage": {"postgres": {"postgres_url": storage_url}}} if storage_url else None)
    if pooled:
        instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=20)
    calls: Counter[str] = Counter()
    storage = instance.event_log_storage
    for name in ("store_event", "store_event_batch"):
        method = getattr(storage, name)

        def counted(*args: object, _name: str = name, _method: object = method) -> object:
            calls[_name] += 1
            return _method(*args)  # type: ignore[operator]

        setattr(storage, name, counted)
    plan = create_execution_plan(job)
    runs = []
    for _ in range(repeat):
        calls.clear()
        cpu, started = run_cpu(), time.perf_counter()
        run = instance.create_run_for_job(job_def=job, execution_plan=plan, run_config={})
        runs.append({"wall_s": time.perf_counter() - started, "cpu_s": run_cpu() - cpu, "calls": dict(calls),
                     "events": dict(Counter(entry.get_dagster_event().event_type_value
                                            for entry in instance.all_logs(run.run_id)))})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3, help="runs created on each variant's instance")
    parser.add_argument("--storage", type=storages, default=["sqlite", "postgres"],
                        help="the instance's storage, comma-separated: sqlite, postgres")
    parser.add_argument("--event-batch-size", type=lambda text: [int(n) for n in text.split(",")], default=[0, 1000],
                        help=f"the creating process's {BATCH_SIZE_ENV_VAR}, comma-separated")
    parser.add_argument("--connections", type=lambda text: [part == "pooled" for part in text.split(",")],
                        default=[False, True], help="postgres's connections, comma-separated: new (a new one for "
                        "each statement, as the daemon's and run workers'), pooled (as the webserver's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--pooled", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        work = Path(tempfile.mkdtemp(prefix="cdc-run-creation-"))
        print("RESULT " + json.dumps(create_runs(work, args.tables, args.repeat, args.child or None, args.pooled)),
              flush=True)
        return
    with contextlib.ExitStack() as stack:
        server = quiet_storage(stack) if "postgres" in args.storage else None
        variants = [(storage, size, pooled) for storage in args.storage for size in args.event_batch_size
                    for pooled in (args.connections if storage == "postgres" else (False,))]
        print(f"creating a cdc_merge_job run over {args.tables} tables, {args.repeat} times a variant")
        for number, (storage, size, pooled) in enumerate(variants):
            url = ""
            if server is not None and storage == "postgres":
                server.create_database(f"creation_{number}")
                url = f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/creation_{number}"
            done = subprocess.run([sys.executable, "-m", "benchmarks.run_creation", "--tables", str(args.tables),
                                   "--repeat", str(args.repeat), "--child", url] + (["--pooled"] if pooled else []),
                                  capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, BATCH_SIZE_ENV_VAR: str(size)})
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"{storage} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            label = f"{storage}{' (pooled, as the webserver)' if pooled else ''}, {BATCH_SIZE_ENV_VAR}={size}"
            for run in json.loads(lines[-1].removeprefix("RESULT ")):
                events = sum(run["events"].values())
                print(f"  {label}: {run['wall_s']:.2f} s ({run['cpu_s']:.2f} CPU s, "
                      f"{1000 * run['cpu_s'] / events:.1f} CPU ms an event), {events} events stored by "
                      + ", ".join(f"{count} {name}" for name, count in sorted(run["calls"].items())), flush=True)


if __name__ == "__main__":
    main()
