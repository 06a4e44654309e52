"""dagster-daemon for real, on the deployment example's instance (examples/deploy/dagster.yaml: PostgreSQL
storage, the queued run coordinator, pools): with the events-waiting sensor and the automation condition
sensor on, new events in a topic lead to a merge run of its table and nothing else does, and after a restart
of the daemon the sensors go on from their stored state (no second run for the same events). The commands
are docs/operations.md's ("Deploying with the daemon"), run as written from DAGSTER_HOME, which holds
workspace.yaml."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.scheduler.instigation import InstigatorState, InstigatorTick, InstigatorType, TickStatus
from dagster._daemon.asset_daemon import asset_daemon_cursor_from_instigator_serialized_cursor
from deltalake import DeltaTable

from cdc_assets.config import load_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from sensors.drift_repair import REPAIR_TAG, STEP_TAG
from tests.support.docs import doc_blocks
from tests.support.postgres import PostgresServer
from tests.support.reconcile import SlotAdvancer, merged_world, source_row
from tests.support.topics import new_topic_named, produce

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deploy" / "dagster.yaml"
LOCATION = ROOT / "tests" / "support" / "daemon_location.py"
COMMANDS = [line for _, code in doc_blocks(ROOT / "docs" / "operations.md", "Deploying with the daemon")
            for line in code.splitlines() if line.strip()]
SENSORS = ("events_waiting_sensor", "default_automation_condition_sensor")
DONE = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}

PIPELINE = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{running: false}}  # so every run in the instance is one the automation launched
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables:
      - name: s.busy
      - name: s.quiet
      - name: s.calm
"""

WORKSPACE = f"""\
load_from:
  - python_file:
      relative_path: {LOCATION}
      working_directory: {ROOT}
      location_name: cdc_daemon_test
"""


def change(key: int) -> tuple[bytes, bytes]:
    """A Debezium create of row ``key``, as the PostgreSQL connector writes it."""
    return encode_key({"id": key}), envelope("c", None, {"id": key, "v": f"v{key}"},
                                             postgres_source(100 + key, key, "s", "busy"), key)


def wait_for(what: str, condition: Callable[[], object], timeout_s: float, daemon: Daemon) -> object:
    """Poll ``condition`` until it returns something true; fail naming ``what`` (with the daemon's log)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if daemon.process is not None and daemon.process.poll() is not None:
            pytest.fail(f"dagster-daemon exited ({daemon.process.returncode}) waiting for {what}:\n{daemon.log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout_s:.0f} s; daemon log:\n{daemon.log()}")
        time.sleep(1)


class Daemon:
    """``dagster-daemon run`` on the workspace in ``home``, in its own process group (its code server and run
    workers with it), stopped as an operator stops it: SIGTERM, then waiting."""

    def __init__(self, home: Path, env: dict[str, str], command: str) -> None:
        self.home, self.env, self.command = home, env, command
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.home / f"daemon-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(shlex.split(self.command), cwd=self.home, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait_s)
                # Its code server and run workers share the group: none may outlive the daemon.
                os.killpg(process.pid, signal.SIGKILL)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
            return

    def log(self) -> str:
        path = self.home / f"daemon-{self.starts}.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else "(no log)"


def deploy(postgres: PostgresServer, home: Path, pipeline: str, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """A fresh DAGSTER_HOME ``home`` holding the deployment example's dagster.yaml as it is, its PostgreSQL
    database and ``pipeline`` (the config's text); the environment points at them (the instance is then
    ``DagsterInstance.get()``). Returns the (not yet started) daemon, run with the environment as it is now."""
    home.mkdir()
    shutil.copy(EXAMPLE, home / "dagster.yaml")
    (home / "workspace.yaml").write_text(WORKSPACE)
    (home / "pipeline.yaml").write_text(pipeline)
    database = postgres.create_database(f"dagster_{uuid.uuid4().hex[:8]}")
    settings = dict(part.split("=", 1) for part in database.split())
    url = (f"postgresql+psycopg2://{settings['user']}@{settings['host']}:{settings['port']}/{settings['dbname']}")
    for name, value in {"DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_URL": url,
                        "CDC_ASSETS_CONFIG": str(home / "pipeline.yaml")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # the venv's CLIs
    return Daemon(home, dict(os.environ), next(line for line in COMMANDS if line.startswith("dagster-daemon ")))


@pytest.fixture
def deployment(broker, postgres: PostgresServer, spark, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DagsterInstance, Daemon, str]]:
    """``deploy`` with a pipeline of three tables on new topics; yields the instance, the daemon and the topic
    prefix."""
    prefix = f"daemon{uuid.uuid4().hex[:8]}"
    for name in ("busy", "quiet", "calm"):
        new_topic_named(broker, f"{prefix}.s.{name}")
    daemon = deploy(postgres, tmp_path / "dagster_home", PIPELINE.format(
        bootstrap=broker.bootstrap_servers, root=tmp_path / "lake", prefix=prefix), monkeypatch)
    with DagsterInstance.get() as instance:
        try:
            yield instance, daemon, prefix
        finally:
            daemon.stop()


def start_sensor(instance: DagsterInstance, daemon: Daemon, name: str) -> None:
    """Turn sensor ``name`` on with the documented `dagster sensor start`; the instance then has it running."""
    command = next(line for line in COMMANDS if line.startswith(f"dagster sensor start {name} "))
    result = subprocess.run(shlex.split(command), cwd=daemon.home, env=daemon.env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert sensor_states(instance)[name].is_running


def sensor_states(instance: DagsterInstance) -> dict[str, InstigatorState]:
    """The stored state of each sensor, by name."""
    return {state.instigator_name: state for state in instance.all_instigator_state(
        instigator_type=InstigatorType.SENSOR)}


def ticks_since(instance: DagsterInstance, name: str, after: float) -> list[InstigatorTick]:
    """The finished ticks of sensor ``name`` since ``after``; a failed one fails the test with its error."""
    state = sensor_states(instance)[name]
    ticks = [tick for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, after=after)
             if tick.status != TickStatus.STARTED]
    for tick in ticks:
        if tick.status == TickStatus.FAILURE:
            pytest.fail(f"{name} tick failed: {tick.error}")
    return ticks


def settled(instance: DagsterInstance, after: float, ticks: int = 2) -> Callable[[], bool]:
    """True once each sensor has finished ``ticks`` ticks since ``after`` and no run is queued or running."""
    def check() -> bool:
        busy = instance.get_runs(filters=RunsFilter(statuses=[s for s in DagsterRunStatus if s not in DONE]))
        return not busy and all(len(ticks_since(instance, name, after)) >= ticks for name in SENSORS)
    return check


def automation_evaluation(instance: DagsterInstance) -> int:
    """The evaluation id in the automation sensor's stored cursor (0: none stored yet), read as the asset
    daemon stores it (compressed; Dagster has no public reader)."""
    data = sensor_states(instance)["default_automation_condition_sensor"].instigator_data
    cursor = getattr(data, "cursor", None)
    return asset_daemon_cursor_from_instigator_serialized_cursor(cursor, None).evaluation_id if cursor else 0


def merge_runs(instance: DagsterInstance) -> list:
    """Every run in the instance, oldest first."""
    return list(reversed(instance.get_runs()))


def delta_ids(instance: DagsterInstance, key: AssetKey) -> list[int]:
    """The ids in ``key``'s Delta table, found where its latest materialization says it is."""
    event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None, f"{key} was never materialized"
    path = event.asset_materialization.metadata["delta_path"].value
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def test_the_daemon_merges_a_table_on_new_events_alone_and_resumes_after_a_restart(broker, deployment):
    instance, daemon, prefix = deployment
    assert [" ".join(shlex.split(line)[:2]) for line in COMMANDS] == ["dagster sensor", "dagster-daemon run",
                                                                      "dagster sensor"]
    busy, quiet, calm = (AssetKey([prefix, "s", name]) for name in ("busy", "quiet", "calm"))
    # The topics observed first (as docs/operations.md advises): had the automation's first evaluation come
    # before the first observation, that observation would count as new data and merge every table once.
    start_sensor(instance, daemon, "events_waiting_sensor")
    started = time.time()
    daemon.start()
    wait_for("a first observation of the topics",
             lambda: ticks_since(instance, "events_waiting_sensor", started), 150, daemon)
    start_sensor(instance, daemon, "default_automation_condition_sensor")
    # Empty topics observed, the automation evaluated on them: nothing to merge.
    wait_for("first ticks of both sensors", settled(instance, time.time()), 120, daemon)
    assert merge_runs(instance) == []

    produce(broker, f"{prefix}.s.busy", [change(key) for key in (1, 2, 3)])
    first = wait_for("a finished merge run", lambda: [run for run in merge_runs(instance) if run.status in DONE],
                     180, daemon)
    assert [run.status for run in first] == [DagsterRunStatus.SUCCESS], daemon.log()
    run = first[0]
    assert set(run.asset_selection or ()) == {busy}  # not the quiet tables
    assert run.tags.get("dagster/from_automation_condition") == "true"
    assert delta_ids(instance, busy) == [1, 2, 3]
    evaluations_before = automation_evaluation(instance)
    assert evaluations_before > 0
    daemon.stop()
    restarted = time.time()
    daemon.start()
    wait_for("ticks after the restart", settled(instance, restarted), 150, daemon)
    # The automation went on from its stored cursor: neither the events already merged, nor the merge's own
    # materialization (handled before or after the restart), nor the quiet topics request a run.
    assert [r.run_id for r in merge_runs(instance)] == [run.run_id]
    assert instance.get_latest_materialization_event(quiet) is None
    assert instance.get_latest_materialization_event(calm) is None
    # Its evaluations are numbered on from the stored cursor's, not from a fresh one's.
    assert automation_evaluation(instance) >= evaluations_before + 2

    produce(broker, f"{prefix}.s.busy", [change(key) for key in (4, 5)])
    second = wait_for("a second finished merge run",
                      lambda: [r for r in merge_runs(instance)[1:] if r.status in DONE], 180, daemon)
    assert [r.status for r in second] == [DagsterRunStatus.SUCCESS], daemon.log()
    assert set(second[0].asset_selection or ()) == {busy}
    wait_for("ticks after the second merge", settled(instance, time.time()), 120, daemon)
    assert len(merge_runs(instance)) == 2  # exactly one run for the new events
    assert delta_ids(instance, busy) == [1, 2, 3, 4, 5]
    assert instance.get_latest_materialization_event(quiet) is None


DRIFT_PIPELINE = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{running: false}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    signal: {{channel: source, table: inventory.debezium_signal, dsn_env: {dsn_env}}}
    tables: [{{name: inventory.items, key_columns: [id, region], path: "{path}"}}]
    rows_match_source: {{buckets: 16, settle_timeout_s: 120}}
"""


def test_the_daemon_runs_the_drift_repair_sensor_which_requests_the_targeted_snapshot(
        broker, postgres: PostgresServer, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """drift_repair_sensor under dagster-daemon, started as docs/operations.md says: a failed rows_match_source
    evaluation in the instance becomes one incremental_snapshot_job run, launched by the daemon, whose signal
    selects the drifted key alone in the source's signal table. (tests/conformance/test_drift_repair_real.py
    follows a repair to its end with Debezium; here, that the daemon ticks the sensor and launches its run.)"""
    command = "dagster sensor start drift_repair_sensor -w workspace.yaml"
    assert f"`{command}`" in (ROOT / "docs" / "operations.md").read_text()
    world = merged_world(postgres, broker, tmp_path, "daemonrepair",
                         "CREATE TABLE inventory.debezium_signal (id varchar(64) PRIMARY KEY, "
                         "type varchar(32) NOT NULL, data varchar(2048))")
    monkeypatch.setenv("DAEMON_REPAIR_DSN", world.dsn)
    prefix = world.prefix  # type: ignore[attr-defined]
    daemon = deploy(postgres, tmp_path / "dagster_home", DRIFT_PIPELINE.format(
        bootstrap=broker.bootstrap_servers, root=tmp_path, prefix=prefix, dsn_env="DAEMON_REPAIR_DSN",
        path=world.target.path), monkeypatch)
    DeltaTable(world.target.path).update(updates={"name": "'by hand'"}, predicate="id = 17")  # the drift
    with DagsterInstance.get() as instance, SlotAdvancer(world):
        try:
            # The check, failed, in the deployment's instance (as a run the UI or its schedule launched).
            checked = build_definitions(load_config()).resolve_job_def("shop_rows_match_source_job") \
                .execute_in_process(instance=instance)
            [failed] = checked.get_asset_check_evaluations()
            assert not failed.passed and "drifted_ranges" in failed.metadata, failed.description

            result = subprocess.run(shlex.split(command), cwd=daemon.home, env=daemon.env, capture_output=True,
                                    text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            daemon.start()
            snapshot_runs = RunsFilter(job_name="incremental_snapshot_job", statuses=list(DONE))
            wait_for("the repair's snapshot run, finished", lambda: instance.get_runs(snapshot_runs), 180, daemon)
            [run] = instance.get_runs(snapshot_runs)
            assert run.status == DagsterRunStatus.SUCCESS, daemon.log()
            check = AssetCheckKey(AssetKey([prefix, "inventory", "items"]), "rows_match_source")
            assert run.tags[STEP_TAG] == "snapshot" and run.tags[REPAIR_TAG].startswith(
                f"{check.to_user_string()}:"), run.tags
            [(data,)] = world.connection.execute(
                "SELECT data FROM inventory.debezium_signal WHERE type = 'execute-snapshot'").fetchall()
            [condition] = json.loads(data)["additional-conditions"]
            selected = world.connection.execute(
                f"SELECT id, region FROM inventory.items WHERE {condition['filter']}").fetchall()
            assert selected == [(17, source_row(17)["region"])], condition  # the drifted key alone
        finally:
            daemon.stop()
    world.connection.close()
