"""The demo's parts: the sample published twice; rounds of changes newer than the sample and each other;
checks that cannot evaluate (no materialization, no broker) say why instead of passing or failing the run.
The demo itself, end to end, runs as the docs' tour (tests/demo/test_docs_first_hour.py)."""

import json
import subprocess
import time
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.broker import free_port
from cdc_assets.demo.sample import change_round, publish_sample, sample_topics
from tests.support.samples import CONFIG

ROOT = Path(__file__).resolve().parents[2]


def test_the_sample_can_be_published_again(broker):
    """Publishing it again is no error (no TOPIC_ALREADY_EXISTS) and publishes nothing twice."""
    publish_sample(broker.bootstrap_servers)  # the first time, unless another test of the session did it
    again = publish_sample(broker.bootstrap_servers)
    assert again == {topic: 0 for topic in sample_topics(0)}


def test_change_rounds_are_newer_than_the_sample_and_each_other():
    sample = sample_topics(0)
    for topic, records in change_round(1, now_ms=10).items():
        assert topic in sample and records
    first, second = change_round(1, now_ms=10), change_round(2, now_ms=10)
    orders = [json.loads(value)["payload"]["source"]["commit_lsn"] for _, value in second["server1.dbo.orders"]
              if value is not None]
    assert orders == sorted(orders) and orders[0] > json.loads(first["server1.dbo.orders"][-1][1])["payload"][
        "source"]["commit_lsn"]


def test_checks_that_cannot_evaluate_say_why(broker, tmp_path):
    """Before any merge, no check claims to pass; with no broker, the freshness checks say so within seconds
    of the probe's timeout instead of failing the run."""
    config = CONFIG.replace("dbserver1", "nomat1").replace("server1", "nomat2")
    defs = build_definitions(parse_config(config.format(bootstrap=broker.bootstrap_servers, root=tmp_path)))
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_freshness_job").execute_in_process(instance=instance)
        assert result.success
        evaluations = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
        lag = evaluations[("products", "capture_lag")]
        assert not lag.passed and "no materialization yet" in lag.description
        assert lag.severity.value == "WARN"
        assert {name for _, name in evaluations} == {"capture_lag", "no_dead_letters", "schema_matches_source",
                                                     "freshness"}
        assert not [check for check, e in evaluations.items() if e.passed]
        assert all("no materialization yet" in e.description for (_, name), e in evaluations.items()
                   if name != "freshness")
        assert "does not exist" in evaluations[("products", "freshness")].description  # no topic either

    closed = free_port()
    offline = build_definitions(parse_config(config.format(bootstrap=f"127.0.0.1:{closed}", root=tmp_path)))
    with DagsterInstance.ephemeral() as instance:
        started = time.monotonic()
        result = offline.resolve_job_def("cdc_freshness_job").execute_in_process(instance=instance)
        assert result.success, "a broker that does not answer is a check result, not a failed run"
        assert time.monotonic() - started < 60
        freshness = [e for e in result.get_asset_check_evaluations() if e.check_name == "freshness"]
        assert len(freshness) == 3 and not any(e.passed for e in freshness)
        assert all(f"127.0.0.1:{closed}" in e.description and "is the broker running" in e.description
                   for e in freshness)


def test_the_broker_command_runs_until_ctrl_c_and_keeps_its_topics_in_its_data_dir(tmp_path):
    """``python -m cdc_assets.demo.broker``: a broker that stays up for the tour's own Dagster; a second
    start on the same data dir finds the topics of the first; a taken port is refused with a clear message."""
    import os
    import signal
    import sys

    from confluent_kafka.admin import AdminClient

    port = free_port()
    command = [sys.executable, "-m", "cdc_assets.demo.broker", "--port", str(port), "--data-dir", str(tmp_path)]
    for start in (1, 2):
        broker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert broker.stdout is not None
            first = broker.stdout.readline()
            assert first.startswith(f"Apache Kafka on 127.0.0.1:{port}"), first + broker.stdout.read()
            assert f"export CDC_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}" in broker.stdout.readline()
            if start == 1:
                publish_sample(f"127.0.0.1:{port}")
                taken = subprocess.run(command, capture_output=True, text=True, timeout=60)
                assert taken.returncode == 2 and f"port {port} on 127.0.0.1 is taken" in taken.stderr
            else:
                admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})  # outlives the broker
                topics = admin.list_topics(timeout=10).topics
                assert set(sample_topics(0)) <= set(topics)
                assert publish_sample(f"127.0.0.1:{port}") == {topic: 0 for topic in sample_topics(0)}
        finally:
            broker.send_signal(signal.SIGINT)  # Ctrl-C
            assert broker.wait(60) == 0


def _processes_naming(path: Path) -> list[str]:
    """The command lines of running processes that name ``path`` (a local Spark server's names its state file)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if str(path) in command:
            found.append(command)
    return found


def test_the_plain_demo_stops_what_it_started(tmp_path, monkeypatch):
    """`scripts/demo` ends with nothing of its own running: its broker, and the local Spark server its merge run
    started (in a server directory of its own, so that other servers on the machine do not count). It leaves
    an instance whose UI opens without the onboarding dialog, on a graph where every topic has been observed."""
    import os
    import sys

    from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR, running_servers

    servers, broker_port = tmp_path / "spark", free_port()
    env = {**os.environ, "CDC_DEMO_DIR": str(tmp_path / "demo"), "CDC_DEMO_BROKER_PORT": str(broker_port),
           SERVER_DIR_ENV_VAR: str(servers), "CDC_VENV": sys.prefix}
    env.pop("CDC_ASSETS_CONFIG", None)
    run = subprocess.run([str(ROOT / "scripts" / "demo")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "cdc_merge_job succeeded" in run.stdout
    assert list(servers.glob("*.log")), "the merge ran on a local Spark server of the demo's"
    assert "stopped the local Spark server the demo started" in run.stdout
    monkeypatch.setenv(SERVER_DIR_ENV_VAR, str(servers))
    assert running_servers() == [] and _processes_naming(servers) == []
    import socket

    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", broker_port)) != 0, "its broker still listens"

    assert "cdc_observe_topics_job succeeded" in run.stdout
    with DagsterInstance.from_config(str(tmp_path / "demo" / "dagster_home")) as instance:
        assert not instance.nux_enabled, "the UI would open with Dagster's onboarding dialog"
        for topic, (_, records) in sample_topics(0).items():
            key = AssetKey(["kafka", *topic.split(".")])
            [observed] = instance.fetch_observations(AssetRecordsFilter(asset_key=key), limit=5).records
            ends = json.loads(observed.event_log_entry.asset_observation.tags["dagster/data_version"])
            assert sum(ends.values()) == len(records), (topic, ends)
