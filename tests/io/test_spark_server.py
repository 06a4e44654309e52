"""The local Spark server: shared per settings, replaced when gone, stopped when idle."""

import contextlib
import os
import signal
import time

import psutil

from cdc_assets.io.spark import spark_config
from cdc_assets.io.spark_server import connect, ensure_local_server, fingerprint, running_servers


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
    first.stop()  # the session is released; the server idles
    pid = _server(settings)["pid"]
    deadline = time.monotonic() + 90
    while _server(settings) is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert _server(settings) is None, "an idle server should stop itself"

    # The next session starts a new server; one killed under it is replaced by the next ensure.
    second = connect(ensure_local_server(settings, idle_timeout_s=600))
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
    third.stop()
