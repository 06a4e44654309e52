"""The demo's Dagster runs, in one process of their own (``examples/demo.py`` starts it).

    python -m cdc_assets.demo.runs [--wait] JOB...

Runs each job of the code location (``cdc_assets.definitions``, as ``dagster job execute -m`` loads it) in
order on the instance of ``$DAGSTER_HOME``, printing ``<job> succeeded`` or ``<job> failed`` on stdout, Dagster's
logs on stderr; stops at the first failure. One process for all of them imports Dagster and the pipeline once.
``--wait``: it imports them, and starts the local Spark server the runs will use (the embedded default), at once,
opens the instance (creating its storage) and prints ``ready``, then waits for a line on stdin before the first
run, so the demo starts it beside its broker, and starts ``dagster dev`` only once the instance's storage exists:
two processes creating one SQLite storage at once fail ("table alembic_version already exists").
"""

from __future__ import annotations

import argparse
import sys
import threading

from dagster import DagsterInstance, execute_job
from dagster._core.definitions.reconstruct import ReconstructableRepository

from cdc_assets.config import load_config
from cdc_assets.resources import build_resources

CODE_LOCATION = "cdc_assets.definitions"


def start_spark_server() -> threading.Thread:
    """Start the local Spark server of the pipeline's runs (if they use one) in a thread: its JVM starts while
    the caller does other work, and a run that asks for it meanwhile waits for the same start. A failed start
    leaves its traceback on stderr; the run that needs the server then says why it cannot start."""
    thread = threading.Thread(target=lambda: build_resources(load_config())["spark"].start_local_server(),
                              name="spark-server-start")
    thread.start()
    return thread


def run_jobs(instance: DagsterInstance, jobs: list[str]) -> bool:
    """Each of ``jobs`` in order, as ``dagster job execute -m cdc_assets.definitions -j JOB`` runs it."""
    repository = ReconstructableRepository.for_module(CODE_LOCATION, "defs")
    for job in jobs:
        with execute_job(repository.get_reconstructable_job(job), instance, raise_on_error=False) as result:
            print(f"{job} {'succeeded' if result.success else 'failed'}", flush=True)
            if not result.success:
                return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the demo's Dagster jobs in one process.")
    parser.add_argument("--wait", action="store_true",
                        help="start the local Spark server, then wait for a line on stdin before the first run")
    parser.add_argument("jobs", nargs="+")
    args = parser.parse_args(argv)
    server = start_spark_server() if args.wait else None
    with DagsterInstance.get() as instance:
        if server is not None:
            print("ready", flush=True)
            if not sys.stdin.readline():  # the demo gave up before its sample was published: no runs, and the
                server.join()             # server started is its to stop
                return 1
        return 0 if run_jobs(instance, args.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
