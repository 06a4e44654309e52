"""The embedded demo: a local broker, the sample published, ``cdc_merge_job`` run, the tables printed.

Run through ``scripts/demo`` (which sets up the environment first):

    scripts/demo                  # fresh broker and Delta root under .cdc-demo/, merge, print rows, stop all
    scripts/demo --ui             # the same, then the Dagster UI on it (broker kept up) until Ctrl-C
    scripts/demo --changes        # while --ui runs: publish a round of changes to merge from the UI
    scripts/demo --changes --merge  # ... and run cdc_merge_job on them from here

Each plain or ``--ui`` run starts from a fresh ``.cdc-demo/`` (or ``$CDC_DEMO_DIR``), so it can run any
number of times in a row.
The sample's events are dated a few minutes before publishing, so every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import load_config
from cdc_assets.demo.broker import ApacheKafkaBroker, free_port, port_free
from cdc_assets.demo.sample import publish_changes, publish_sample
from cdc_assets.io.spark_server import running_servers, stop_servers

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("CDC_DEMO_DIR") or ROOT / ".cdc-demo").resolve()  # the tests give theirs
# Written while ``--ui`` runs: where its broker listens and how many change rounds were published.
RUNNING = STATE / "running.json"
SHOWN_ROWS = 4
DAGSTER_YAML = """\
# The demo's Dagster instance (scripts/demo). A pool limit of 1: two runs never merge one table at once.
concurrency:
  pools:
    default_limit: 1
# No onboarding dialog over the UI's first page.
nux:
  enabled: false
"""


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def demo_env(bootstrap_servers: str) -> dict[str, str]:
    """The environment of the demo's Dagster processes: its broker, Delta root and Dagster home."""
    env = {**os.environ, "CDC_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers, "CDC_DELTA_ROOT": str(STATE / "delta"),
           "DAGSTER_HOME": str(STATE / "dagster_home")}
    env.pop("CDC_ASSETS_CONFIG", None)  # the bundled demo config
    return env


def start_runs(env: Mapping[str, str], jobs: list[str], wait: bool = False) -> subprocess.Popen[str]:
    """``jobs`` of the code location in one process (``cdc_assets.demo.runs``), recorded in the demo's Dagster
    home, so the UI shows them; Dagster's logs go to ``runs.log``. ``wait``: it imports Dagster and the pipeline
    and starts the local Spark server at once, and runs the jobs when ``go`` tells it to."""
    with (STATE / "runs.log").open("a") as log:
        return subprocess.Popen([sys.executable, "-m", "cdc_assets.demo.runs", *(["--wait"] if wait else []), *jobs],
                                env=dict(env), cwd=ROOT, stdin=subprocess.PIPE if wait else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=log, text=True)


def go(runs: subprocess.Popen[str]) -> None:
    """Let the runs of ``start_runs(..., wait=True)`` begin, once their process has created the instance's storage
    (``ready``): only then may another process, ``dagster dev``, open it. A process that ended before says why in
    ``finish_runs``."""
    assert runs.stdin is not None and runs.stdout is not None
    with suppress(BrokenPipeError):  # it ended meanwhile
        if runs.stdout.readline() == "ready\n":
            runs.stdin.write("go\n")
        runs.stdin.close()


def finish_runs(runs: subprocess.Popen[str]) -> bool:
    """Print each run's ``<job> succeeded`` as it ends; on a failure, the end of Dagster's log and what failed."""
    assert runs.stdout is not None
    failed = []
    for line in runs.stdout:
        if line.endswith(" succeeded\n"):
            print(line, end="", flush=True)
        else:
            failed.append(line)
    if runs.wait() == 0:
        return True
    print((STATE / "runs.log").read_text()[-10000:])
    print("".join(failed) or f"the demo's runs failed (exit code {runs.returncode})", file=sys.stderr, end="")
    return False


def stop_runs(runs: subprocess.Popen[str]) -> None:
    """Wait for the runs' process to end (a run interrupted by Ctrl-C ends first): a Spark server it was starting
    must have written its state before the demo stops the servers it started."""
    if runs.stdin is not None and not runs.stdin.closed:
        runs.stdin.close()  # no runs: the process ends once the Spark server it started answers
    try:
        runs.wait(120)
    except subprocess.TimeoutExpired:
        runs.kill()
        runs.wait(10)


def print_tables(env: Mapping[str, str]) -> None:
    """Each table's first rows, row count, Delta version and path, and how to query them."""
    os.environ.update(CDC_KAFKA_BOOTSTRAP_SERVERS=env["CDC_KAFKA_BOOTSTRAP_SERVERS"],
                      CDC_DELTA_ROOT=env["CDC_DELTA_ROOT"])
    tables = resolve_tables(load_config())
    for table in tables:
        delta = DeltaTable(table.target.path)
        # delta-rs's own reader, as the line printed below: pyarrow's dataset scanner left threads that aborted
        # the interpreter at its exit ("terminate called without an active exception", apache/arrow#34314),
        # one process in about 150 here, even with use_threads=False.
        rows = pa.table(QueryBuilder().register("t", delta).execute("SELECT * FROM t").read_all()).to_pandas()
        visible = [column for column in rows.columns if not column.startswith("_cdc_")]
        print(f"\n{table.topic}: {len(rows)} rows, Delta version {delta.version()}, {table.target.path}")
        print(rows[visible].sort_values(visible[0]).head(SHOWN_ROWS).to_string(index=False))
    path = os.path.relpath(tables[0].target.path)
    print(f"""
Query them (columns starting _cdc_ are the pipeline's: positions, offsets, versions):
  python -c "import pyarrow as pa; from deltalake import DeltaTable, QueryBuilder; print(pa.table(QueryBuilder()\
.register('t', DeltaTable('{path}')).execute('SELECT * FROM t').read_all()).to_pandas())"
  Spark SQL (delta-spark):  SELECT * FROM delta.`{path}`""")


@contextmanager
def _recorded(broker: ApacheKafkaBroker) -> Iterator[None]:
    RUNNING.write_text(json.dumps({"bootstrap_servers": broker.bootstrap_servers, "rounds": 0}))
    try:
        yield
    finally:
        RUNNING.unlink(missing_ok=True)


def _wait_for_ui(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/server_info", timeout=2)
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dagster dev did not start; its log: {log}\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


def start_ui(env: Mapping[str, str], port: int) -> subprocess.Popen[bytes]:
    """``dagster dev`` on 127.0.0.1, started (``serve_ui`` waits for it and stops it)."""
    with (STATE / "dagster_dev.log").open("wb") as out:
        return subprocess.Popen(
            [_bin("dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def serve_ui(process: subprocess.Popen[bytes], env: Mapping[str, str], port: int) -> None:
    """Wait for ``start_ui``'s ``dagster dev`` to answer, say where it is, and keep it until Ctrl-C or SIGTERM
    (``stop_ui`` then stops it)."""
    log = STATE / "dagster_dev.log"
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_ui(process, url, log)
        print(f"""
Dagster UI: {url}   (log {os.path.relpath(log)}; Ctrl-C stops the UI, the broker and the Spark server)
In another terminal, make changes (inserts, updates, deletes, a primary-key change) and watch them flow:
  scripts/demo --changes            then "Materialize all" in the UI (Assets > Global asset lineage)
  scripts/demo --changes --merge    or run cdc_merge_job from here
Or point your own Dagster at the demo:
  export DAGSTER_HOME={env["DAGSTER_HOME"]} CDC_KAFKA_BOOTSTRAP_SERVERS={env["CDC_KAFKA_BOOTSTRAP_SERVERS"]} \\
         CDC_DELTA_ROOT={env["CDC_DELTA_ROOT"]}""", flush=True)
        while process.poll() is None:
            time.sleep(1)
        print(f"dagster dev exited with {process.returncode}; see {log}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nstopping the Dagster UI, the broker and the Spark server ...", flush=True)


def stop_ui(process: subprocess.Popen[bytes], while_stopping: Callable[[], None]) -> None:
    """Stop ``start_ui``'s ``dagster dev`` and its processes, running ``while_stopping`` meanwhile: what else
    the demo stops stops beside it, as the UI takes seconds to."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # dagster dev stops its webserver, daemon and code servers
    try:
        while_stopping()
    finally:
        if process.poll() is None:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def run_demo(ui: bool, ui_port: int, broker_port: int) -> int:
    """A fresh ``.cdc-demo/``: broker, sample, ``cdc_merge_job``, tables; then the UI if ``ui``."""
    if _running_demo() is not None:
        print(f"a demo with the UI is running on this {STATE}: stop it (Ctrl-C) first, or make changes on it "
              "with --changes", file=sys.stderr)
        return 2
    if ui and not port_free(ui_port):
        print(f"port {ui_port} is taken: pass --port", file=sys.stderr)
        return 2
    shutil.rmtree(STATE, ignore_errors=True)
    (STATE / "dagster_home").mkdir(parents=True)
    (STATE / "dagster_home" / "dagster.yaml").write_text(DAGSTER_YAML)
    # Ctrl-C (even when started with SIGINT ignored, as in the background) and SIGTERM stop all it started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: _interrupt())
    servers_before = {state["pid"] for _, state in running_servers(this_checkout=True)}
    broker = ApacheKafkaBroker(STATE / "broker", broker_port if port_free(broker_port) else free_port())
    env = demo_env(broker.bootstrap_servers)
    # One observation of each topic, so the asset graph shows them before any sensor is turned on; before the
    # merge, which records the versions it read: the tables show in sync with their topics. Their process
    # imports Dagster and starts the Spark server while the broker starts and the sample is published.
    runs = start_runs(env, ["cdc_observe_topics_job", "cdc_merge_job"], wait=True)
    ui_process: subprocess.Popen[bytes] | None = None

    def stop_spark_and_broker() -> None:
        # Both take seconds to stop controlled: side by side.
        broker_stopping = threading.Thread(target=broker.stop, name="broker-stop")
        broker_stopping.start()
        # The demo's runs started this checkout's Spark server: it goes with the rest. One that ran before stays.
        if stop_servers([(path, state) for path, state in running_servers(this_checkout=True)
                         if state["pid"] not in servers_before]):
            print("stopped the local Spark server the demo started", flush=True)
        broker_stopping.join()

    try:
        broker.start()
        published = publish_sample(broker.bootstrap_servers)
        print(f"local broker on {broker.bootstrap_servers}; published {published}", flush=True)
        go(runs)
        if ui:  # dagster dev loads while the runs merge
            ui_process = start_ui(env, ui_port)
        if not finish_runs(runs):
            return 1
        print_tables(env)
        if ui_process is not None:
            with _recorded(broker):
                serve_ui(ui_process, env, ui_port)
    except KeyboardInterrupt:
        pass
    finally:
        stop_runs(runs)
        if ui_process is not None:
            stop_ui(ui_process, while_stopping=stop_spark_and_broker)
        else:
            stop_spark_and_broker()
        if servers_before:
            print(f"{len(servers_before)} local Spark server(s) of this checkout that ran before the demo keep "
                  "running until idle; to stop them: python -m cdc_assets.io.spark_server stop")
    return 0


def _interrupt() -> None:
    raise KeyboardInterrupt


def _running_demo() -> dict | None:
    """What the running ``--ui`` demo recorded (None: none runs, or one was killed and its broker is gone)."""
    try:
        running = json.loads(RUNNING.read_text())
    except (OSError, ValueError):
        return None
    host, _, port = running["bootstrap_servers"].rpartition(":")
    with socket.socket() as sock:
        return running if sock.connect_ex((host, int(port))) == 0 else None


def make_changes(merge: bool) -> int:
    """Publish the next round of changes to the broker of the running ``--ui`` demo; merge them if ``merge``."""
    running = _running_demo()
    if running is None:
        print("no demo is running: start one with `scripts/demo --ui` (in another terminal)", file=sys.stderr)
        return 2
    running["rounds"] += 1
    published = publish_changes(running["bootstrap_servers"], running["rounds"])
    RUNNING.write_text(json.dumps(running))
    print(f"change round {running['rounds']}: published {published} to {running['bootstrap_servers']}")
    if not merge:
        print('now "Materialize all" in the UI (or: scripts/demo --changes --merge next time)')
        return 0
    env = demo_env(running["bootstrap_servers"])
    if not finish_runs(start_runs(env, ["cdc_merge_job"])):
        return 1
    print_tables(env)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ui", action="store_true", help="then run the Dagster UI on the demo until Ctrl-C")
    parser.add_argument("--port", type=int, default=int(os.environ.get("CDC_DEMO_UI_PORT") or 3000),
                        help="the UI's port (default $CDC_DEMO_UI_PORT or 3000)")
    parser.add_argument("--broker-port", type=int, default=int(os.environ.get("CDC_DEMO_BROKER_PORT") or 9092),
                        help="the broker's port if free (default $CDC_DEMO_BROKER_PORT or 9092, the demo "
                             "config's default), else any")
    parser.add_argument("--changes", action="store_true",
                        help="publish a round of changes to the running --ui demo's broker")
    parser.add_argument("--merge", action="store_true", help="with --changes: run cdc_merge_job on them")
    args = parser.parse_args(argv)
    if args.changes:
        return make_changes(args.merge)
    return run_demo(args.ui, args.port, args.broker_port)


if __name__ == "__main__":
    sys.exit(main())
