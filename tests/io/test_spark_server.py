"""The local Spark server: shared per settings, replaced when gone, stopped when idle."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from pyspark.sql import SparkSession

from benchmarks.batch_session import w2_batch, w2_layout
from cdc_assets.core import decode_change_events
from cdc_assets.core.apply_modes import apply_mode
from cdc_assets.core.envelope import value_type
from cdc_assets.io import spark_server
from cdc_assets.io.spark import SMALL_BATCH_RECORDS, parsed_from_files, spark_config, spark_records
from cdc_assets.io.spark_server import (
    SMALL_BATCH_SETTINGS,
    SparkServerError,
    _listens,
    connect,
    disconnect,
    ensure_local_server,
    fingerprint,
    running_servers,
    server_dir,
    small_batch_session,
)


def _server(settings):
    return next((state for path, state in running_servers() if path.stem == fingerprint(settings)), None)


def _commands(pid):
    """The command lines of a process's descendants (ones gone meanwhile left out)."""
    commands = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            commands.append(child.cmdline())
    return commands


def test_sessions_with_the_same_settings_share_one_server(spark):
    """The tests' session and every Dagster run of the embedded default talk to one server."""
    url = ensure_local_server(spark_config())
    assert url == ensure_local_server(spark_config())
    state = _server(spark_config())
    assert state is not None and url.endswith(f":{state['port']}")
    assert spark.client._builder.endpoint == f"127.0.0.1:{state['port']}"
    # A long-lived server does not map the class archive (the RSS it would hold).
    jvms = [command for command in _commands(state["pid"]) if command and command[0].endswith("java")]
    assert jvms and not any("SharedArchiveFile" in " ".join(command) for command in jvms)


def test_an_idle_server_stops_itself_and_a_gone_one_is_replaced():
    settings = spark_config(conf={"spark.app.name": "cdc-assets-idle-test"})  # a server of its own
    first = connect(ensure_local_server(settings, idle_timeout_s=1.0))
    assert first.range(5).count() == 5
    disconnect(first)  # no client is connected now: the server idles
    pid, port = _server(settings)["pid"], _server(settings)["port"]
    assert list(server_dir().glob(f"session-{port}-*.lock"))
    deadline = time.monotonic() + 90
    while _server(settings) is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert _server(settings) is None, "an idle server should stop itself"
    assert not list(server_dir().glob(f"session-{port}-*.lock")), "a stopped server's session slots should go"

    # The next session starts a new server; one killed under it is replaced by the next ensure.
    # Started by a process that ignores SIGTERM, which the server inherits: its JVM must not.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        second = connect(ensure_local_server(settings, idle_timeout_s=600))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert second.range(3).count() == 3
    replaced = _server(settings)["pid"]
    assert replaced != pid
    jvms = [child for child in psutil.Process(replaced).children(recursive=True) if child.name() == "java"]
    assert jvms
    os.kill(replaced, signal.SIGKILL)  # the supervisor: its JVM goes with it
    _, alive = psutil.wait_procs(jvms, timeout=60)
    assert not alive, "the JVM of a killed supervisor should stop"
    deadline = time.monotonic() + 30
    while _server(settings) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    third = connect(ensure_local_server(settings, idle_timeout_s=600))
    assert third.range(4).count() == 4
    assert _server(settings)["pid"] != replaced
    disconnect(third)


def test_runs_take_turns_on_the_server_sessions_and_find_them_clean(spark):
    """One after another, runs get the same server session (its compiled code stays warm); at the same
    time, sessions of their own; a setting a killed run left behind is gone."""
    url = ensure_local_server(spark_config())
    first = connect(url)
    first.conf.set("spark.databricks.delta.write.txnVersion", "7")  # as if killed inside a commit
    same_time = connect(url)
    assert len({spark.session_id, first.session_id, same_time.session_id}) == 3
    disconnect(same_time)
    disconnect(first)
    second = connect(url)
    try:
        assert second.session_id == first.session_id
        assert second.conf.get("spark.databricks.delta.write.txnVersion", None) is None
        assert second.range(3).count() == 3
    finally:
        disconnect(second)


def test_a_slot_whose_session_the_server_closed_gets_a_new_one(spark):
    url = ensure_local_server(spark_config())
    first = connect(url)
    closed = first.session_id
    # The server must have the session to close it: one that never ran anything is not there, its release leaves
    # no tombstone and the id is taken again as a new session (the test failed so once, 2026-12-02).
    assert first.range(1).count() == 1
    first.stop()  # releases the server session (as the server does after an hour unused)
    disconnect(first)  # frees the slot
    second = connect(url)
    try:
        assert second.session_id != closed
        assert second.range(2).count() == 2
    finally:
        disconnect(second)


def test_a_run_finding_every_slot_taken_gets_a_session_of_its_own_released_at_its_end(spark):
    url = ensure_local_server(spark_config())
    held = []
    try:
        while True:  # every slot the tests' own session left free
            session = connect(url)
            held.append(session)
            port = url.rsplit(":", 1)[-1]
            slot_ids = {line for path in server_dir().glob(f"session-{port}-*.lock")
                        for line in path.read_text().split()}
            if session.session_id not in slot_ids:
                break
            assert len(held) <= 8, "more slot sessions than slots"
        extra = held.pop()
        assert extra.range(2).count() == 2
        disconnect(extra)
        gone = SparkSession.builder.remote(f"{url}/;session_id={extra.session_id}").create()
        with pytest.raises(Exception, match="SESSION_CLOSED"):
            gone.range(1).count()
        gone.client.close()
    finally:
        for session in held:
            disconnect(session)


def test_a_server_counts_as_started_only_when_its_own_process_listens_on_its_port():
    """A port chosen free can be taken by another process before the JVM binds it (a CI run's demo merged into its
    own broker, which took the port chosen for its Spark server): an answer on the port is not the server's."""
    server = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                               "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                               "print(s.getsockname()[1], flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the port answers
        assert _listens(server, port)
        assert not _listens(other, port)
    finally:
        for process in (server, other):
            process.kill()
            process.wait()


# A stand-in for spark-submit: binds the port of its --conf as the Connect server does, and exits when it cannot.
FAKE_SUBMIT = """\
import socket, sys, time
port = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("spark.connect.grpc.binding.port=")))
server = socket.socket()
try:
    server.bind(("127.0.0.1", port))
except OSError:
    sys.exit(1)
server.listen()
time.sleep(60)
"""


def test_a_server_whose_port_another_process_took_starts_again_on_another_port(tmp_path, monkeypatch):
    submit = tmp_path / "spark-submit"
    submit.write_text(f"#!{sys.executable}\n{FAKE_SUBMIT}")
    submit.chmod(0o755)
    monkeypatch.setattr(spark_server, "_spark_submit", lambda: submit)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], spark_server._free_port()])
        monkeypatch.setattr(spark_server, "_free_port", lambda: next(ports))
        jvm, port = spark_server._start_jvm({}, start_timeout_s=30)
        try:
            assert port != taken.getsockname()[1]
            assert _listens(jvm, port)
        finally:
            jvm.kill()
            jvm.wait()
        # Taken on every attempt: the error names the port and why.
        monkeypatch.setattr(spark_server, "_free_port", lambda: taken.getsockname()[1])
        with pytest.raises(SparkServerError, match=f"port {taken.getsockname()[1]} .another process listens on "
                                                   "its port; attempt 2 of 2"):
            spark_server._start_jvm({}, start_timeout_s=30, attempts=2)


def test_status_and_stop_keep_to_this_checkouts_servers_unless_all(tmp_path, monkeypatch, capsys):
    """Two servers in one server dir, one started by another checkout: ``status``/``stop`` see this
    checkout's only; ``--all`` every one. (Stand-ins: a process each and a listening port each.)"""
    import json
    import socket
    import subprocess
    import sys

    from cdc_assets.io.spark_server import CHECKOUT, main

    monkeypatch.setenv("CDC_SPARK_SERVER_DIR", str(tmp_path))
    servers = {}
    for name, checkout in (("ours", CHECKOUT), ("theirs", "/elsewhere/cdc-assets")):
        # A stand-in that takes SIGTERM whatever signal state the test process hands down to its children.
        # It says when it takes SIGTERM: one sent before (a loaded machine starts Python slowly) would meet the
        # disposition the worker handed down, which an earlier test may have set to ignore it.
        process = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}); "
                                    "signal.signal(signal.SIGTERM, signal.SIG_DFL); print('ready', flush=True); "
                                    "time.sleep(300)"], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        (tmp_path / f"{name}.json").write_text(json.dumps({"pid": process.pid, "port": port, "settings": {},
                                                           "checkout": checkout}))
        servers[name] = (process, listener, port)
    try:
        main(["status"])
        status = capsys.readouterr().out
        assert f":{servers['ours'][2]} " in status and f":{servers['theirs'][2]} " not in status
        assert "1 server(s) of other checkouts left alone" in status
        main(["status", "--all"])
        assert f":{servers['theirs'][2]} " in capsys.readouterr().out

        main(["stop"])
        assert "stopped 1 local Spark server(s) of " in capsys.readouterr().out
        servers["ours"][0].wait(10)  # stopped (stopping reaps it: its exit code is not ours to see)
        assert servers["theirs"][0].poll() is None, "another checkout's server must be left running"
        main(["stop", "--all"])
        servers["theirs"][0].wait(10)
    finally:
        for process, listener, _ in servers.values():
            process.kill()
            process.communicate()
            listener.close()


def _nothing_stored(keys, columns):
    return None


def test_small_batches_are_folded_on_a_session_without_generated_code_kept_with_the_slot(spark, tmp_path):
    """A batch of fewer than SMALL_BATCH_RECORDS records is read, decoded and folded on the run's small-batch
    session (same server, settings reset and set again for each run), a larger one on the run's session;
    both fold a batch to the same rows."""
    url = ensure_local_server(spark_config())
    first = connect(url)
    small = small_batch_session(first)
    try:
        assert small is not None and small.session_id != first.session_id
        small.conf.set("spark.databricks.delta.write.txnVersion", "7")  # as if killed inside a commit
        assert {key: small.conf.get(key) for key in SMALL_BATCH_SETTINGS} == SMALL_BATCH_SETTINGS
        assert first.conf.get("spark.sql.codegen.wholeStage") == "true"
        records = w2_batch(SMALL_BATCH_RECORDS)  # a fifth of them snapshot reads, then changes of every kind
        assert records.num_rows >= SMALL_BATCH_RECORDS
        layout = w2_layout()
        mode = apply_mode("scd1", "postgresql")
        few = records.slice(0, SMALL_BATCH_RECORDS - 1)
        with spark_records(first, few, value_type(layout)) as on_small, \
                spark_records(first, records, value_type(layout)) as on_run:
            assert on_small.sparkSession.session_id == small.session_id
            assert on_run.sparkSession.session_id == first.session_id
            folded_small, summary = mode.rows(decode_change_events(on_small, layout), layout, _nothing_stored)
        assert summary.events == few.num_rows and folded_small.num_rows > 100
        # The same small batch folded on the run's session (generated code) gives the same rows.
        folded_run, same = mode.rows(decode_change_events(
            parsed_from_files(first, few, value_type(layout), tmp_path), layout), layout, _nothing_stored)
        assert same == summary
        assert folded_small.sort_by("id").equals(folded_run.sort_by("id"))
    finally:
        disconnect(first)
    second = connect(url)  # the next run takes the same slot: its small-batch session too, clean
    try:
        again = small_batch_session(second)
        assert again is not None and again.session_id == small.session_id
        assert again.conf.get("spark.databricks.delta.write.txnVersion", None) is None
        assert {key: again.conf.get(key) for key in SMALL_BATCH_SETTINGS} == SMALL_BATCH_SETTINGS
    finally:
        disconnect(second)


def test_a_new_servers_start_timeout_comes_from_the_environment_and_must_be_a_positive_number(monkeypatch):
    monkeypatch.delenv(spark_server.START_TIMEOUT_ENV_VAR, raising=False)
    assert spark_server.start_timeout() == spark_server.DEFAULT_START_TIMEOUT_S
    monkeypatch.setenv(spark_server.START_TIMEOUT_ENV_VAR, "420")
    assert spark_server.start_timeout() == 420.0
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv(spark_server.START_TIMEOUT_ENV_VAR, bad)
        with pytest.raises(SparkServerError, match=f"{spark_server.START_TIMEOUT_ENV_VAR}='{bad}'"):
            spark_server.start_timeout()


def test_a_start_timeout_from_the_environment_bounds_the_client_and_the_supervisor(tmp_path, monkeypatch):
    """No Spark server starts in 2 s: the client gives up then, naming the variable, and the supervisor, told the
    same timeout, gives up on the JVM and leaves nothing running."""
    monkeypatch.setenv(spark_server.SERVER_DIR_ENV_VAR, str(tmp_path / "servers"))
    monkeypatch.setenv(spark_server.START_TIMEOUT_ENV_VAR, "2")
    settings = {**spark_config(), "spark.app.name": f"start-timeout-{os.getpid()}"}
    started = time.monotonic()
    with pytest.raises(SparkServerError, match=f"within 2 s .*{spark_server.START_TIMEOUT_ENV_VAR}"):
        ensure_local_server(settings)
    assert time.monotonic() - started < 30
    # The supervisor alone, as the client starts it: its own check of the JVM gives up after the same 2 s.
    state = tmp_path / "alone.json"
    supervisor = subprocess.run(
        [sys.executable, "-m", "cdc_assets.io.spark_server", "serve", "--state", str(state), "--idle-timeout-s", "60",
         "--start-timeout-s", "2"], input=json.dumps(settings), capture_output=True, text=True, timeout=120)
    assert supervisor.returncode != 0
    assert "within 2 s" in supervisor.stderr and not state.exists()
    deadline = time.monotonic() + 30
    while any(settings["spark.app.name"] in " ".join(p.info["cmdline"] or []) for p in
              psutil.process_iter(["cmdline"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(settings["spark.app.name"] in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]))
