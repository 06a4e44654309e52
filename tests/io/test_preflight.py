"""``cdc-assets preflight`` and ``cdc_preflight_job`` (issue 62): every connection of a pipeline config checked
against real servers (the session's Kafka broker, moto's S3-API server), each failure made for real: a port no
broker listens on, a topic that does not exist, wrong S3 credentials, a schema registry that is down. And a
merge run against a wrong port fails in a line, in seconds, before a Spark server starts."""

import os
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from dagster import DagsterEventType, DagsterInstance

from cdc_assets.cli import main
from cdc_assets.config import CONFIG_ENV_VAR, DEMO_CONFIG_PATH, PipelineConfig, parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.broker import ApacheKafkaBroker, free_port
from cdc_assets.io.spark_server import SERVER_DIR_ENV_VAR
from cdc_assets.preflight import results_table, run_preflight
from tests.support.docs import doc_blocks
from tests.support.samples import sample_published
from tests.support.topics import new_topic_named

# What issue 62 bounds a whole preflight to when something is down.
WHOLE_RUN_BOUND_S = 15.0

ROOT = Path(__file__).resolve().parents[2]


def _yaml(bootstrap: str, prefix: str, root: str, tables: tuple[str, ...] = ("inventory.customers",),
          delta_extra: str = "", connector_extra: str = "") -> str:
    listed = "\n".join(f"      - name: {table}" for table in tables)
    return f"""
kafka:
  bootstrap_servers: ${{PREFLIGHT_TEST_BROKER:-{bootstrap}}}
delta:
  root: {root}
{delta_extra}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: {prefix}
    signal:
      channel: kafka
      topic: {prefix}.signals
{connector_extra}
    tables:
{listed}
"""


def _config(text: str, tmp_path: Path) -> tuple[PipelineConfig, Path]:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return parse_config(text, source=str(path)), path


@pytest.fixture
def prefix(broker: ApacheKafkaBroker) -> str:
    """A connector's topic prefix of its own, with its tables' and its signal topic on the broker."""
    prefix = f"pf{uuid.uuid4().hex[:8]}"
    topics = {new_topic_named(broker, f"{prefix}.{name}") for name in ("inventory.customers", "inventory.products",
                                                                       "signals")}
    # The broker's metadata names a created topic a moment after the controller has made it.
    admin, deadline = AdminClient({"bootstrap.servers": broker.bootstrap_servers}), time.monotonic() + 30
    while not topics <= set(admin.list_topics(timeout=10).topics) and time.monotonic() < deadline:
        time.sleep(0.1)
    return prefix


def _by_check(results) -> dict[tuple[str, str], tuple[str, str, str]]:
    return {(r.check, r.target): (r.status, r.detail, r.field) for r in results}


def test_a_reachable_deployment_passes_every_check_and_leaves_nothing_behind(broker, prefix, tmp_path, capsys):
    root = tmp_path / "lake" / "cdc"
    text = _yaml(broker.bootstrap_servers, prefix, str(root), ("inventory.customers", "inventory.products"))
    config, path = _config(text, tmp_path)
    results = run_preflight(config)
    table = results_table(results)
    assert [r.status for r in results] == ["ok"] * 4, table
    checks = _by_check(results)
    assert checks[("broker", broker.bootstrap_servers)][1].startswith(f"{broker.bootstrap_servers} answers")
    assert checks[("topics", f"{prefix}.*")][1] == "2 of 2 table topic(s) exist"
    assert checks[("signal channel", f"{prefix}.signals")][0] == "ok"
    assert "wrote and deleted .cdc-preflight-" in checks[("delta root", str(root))][1]
    assert not (tmp_path / "lake").exists()  # the directories the probe made are gone again
    # The command line: the same table, exit status 0.
    assert main(["preflight", "--config", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["check", "target", "result", "detail", "config", "field"]
    assert f"preflight of {path}: all 4 check(s) passed" in printed
    # docs/operations.md's commands as written, from a directory holding its my-pipeline.yaml (and the venv).
    (tmp_path / "my-pipeline.yaml").write_text(text)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    for _, code in doc_blocks(ROOT / "docs" / "operations.md", "Before the first run: preflight"):
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, CONFIG_ENV_VAR: str(path)}, timeout=120)
        assert run.returncode == 0, f"{code}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
        assert run.stdout.count("all 4 check(s) passed") == 2, run.stdout
    assert not (tmp_path / "lake").exists()


def test_the_demo_config_passes_on_the_demo_sample(broker, tmp_path, monkeypatch, capsys):
    """As ``scripts/demo`` leaves it: the sample published, the demo config (the default) loaded as the code
    location loads it."""
    sample_published(broker)
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    monkeypatch.setenv("CDC_KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("CDC_DELTA_ROOT", str(tmp_path / "delta"))
    assert main(["preflight"]) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out
    assert f"preflight of {DEMO_CONFIG_PATH}: all 5 check(s) passed" in printed
    assert "dbserver1.signals" in printed


def test_a_port_no_broker_listens_on_fails_at_once_naming_the_variable_of_the_config_loaded(prefix, tmp_path,
                                                                                          capsys):
    port = free_port()
    config, path = _config(_yaml(f"127.0.0.1:{port}", prefix, str(tmp_path / "lake")), tmp_path)
    started = time.monotonic()
    status = main(["preflight", "--config", str(path)])
    elapsed = time.monotonic() - started
    printed = capsys.readouterr().out
    assert status == 1 and elapsed < WHOLE_RUN_BOUND_S
    broker_row = next(line for line in printed.splitlines() if line.startswith("broker"))
    assert "FAILED" in broker_row and f"no broker answers at 127.0.0.1:{port}" in broker_row
    assert "Connection refused" in broker_row
    assert broker_row.endswith("kafka.bootstrap_servers ($PREFLIGHT_TEST_BROKER)")
    checks = _by_check(run_preflight(config))
    assert checks[("topics", f"{prefix}.*")][0] == "skipped"
    assert checks[("signal channel", f"{prefix}.signals")][0] == "skipped"
    assert checks[("delta root", str(tmp_path / "lake"))][0] == "ok"  # the others are checked all the same
    assert f"preflight of {path}: 1 of 4 check(s) FAILED" in printed


def test_a_table_whose_topic_does_not_exist_fails_naming_the_closest_topics(broker, prefix, tmp_path):
    text = _yaml(broker.bootstrap_servers, prefix, str(tmp_path / "lake"),
                 ("inventory.customers", "inventory.custmers"))
    config, _ = _config(text, tmp_path)
    checks = _by_check(run_preflight(config))
    status, detail, field = checks[("topic", f"{prefix}.inventory.custmers")]
    assert status == "FAILED"
    assert detail.startswith(f"does not exist; the closest topics of prefix '{prefix}': {prefix}.inventory.customers")
    assert field == "connectors[inventory].tables[inventory.custmers] (with topic.prefix)"
    assert checks[("topics", f"{prefix}.*")][:2] == ("ok", "1 of 2 table topic(s) exist")


def test_wrong_credentials_on_the_s3_api_server_fail_the_probe_write(broker, prefix, object_store, tmp_path,
                                                                     monkeypatch):
    bucket = object_store.create_bucket(f"preflight-{uuid.uuid4().hex[:12]}")
    options = "\n".join(f"    {key}: '{value}'" for key, value in {
        **object_store.storage_options(), "secret_access_key_env": "PREFLIGHT_TEST_WRONG_SECRET"}.items())
    text = _yaml(broker.bootstrap_servers, prefix, f"s3://{bucket}/cdc", delta_extra="  storage_options:\n" + options)
    config, _ = _config(text, tmp_path)
    monkeypatch.setenv("PREFLIGHT_TEST_WRONG_SECRET", "not-" + object_store.secret_key)
    started = time.monotonic()
    status, detail, field = _by_check(run_preflight(config))[("delta root", f"s3://{bucket}/cdc")]
    assert time.monotonic() - started < WHOLE_RUN_BOUND_S
    assert status == "FAILED" and detail.startswith(f"cannot write and delete a file under s3://{bucket}/cdc: "), detail
    assert detail.endswith(": 403 Forbidden (SignatureDoesNotMatch)"), detail
    assert field == "delta.root, delta.storage_options"
    # The right key: the probe is written and deleted.
    monkeypatch.setenv("PREFLIGHT_TEST_WRONG_SECRET", object_store.secret_key)
    status, detail, _ = _by_check(run_preflight(config))[("delta root", f"s3://{bucket}/cdc")]
    assert status == "ok", detail
    assert object_store.keys(bucket) == []


def test_a_schema_registry_that_is_down_fails_within_the_bound(broker, prefix, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    text = _yaml(broker.bootstrap_servers, prefix, str(tmp_path / "lake"),
                 connector_extra=f"    format: avro\n    schema_registry:\n      url: {url}")
    config, _ = _config(text, tmp_path)
    started = time.monotonic()
    results = run_preflight(config)
    assert time.monotonic() - started < WHOLE_RUN_BOUND_S
    status, detail, field = _by_check(results)[("schema registry", url)]
    assert status == "FAILED" and detail.startswith(f"{url} did not answer"), detail
    assert field == "connectors[inventory].schema_registry.url"
    assert [r.check for r in results if r.failed] == ["schema registry"]


def test_the_schema_registry_check_names_the_subjects_it_lacks(broker, prefix, schema_registry, tmp_path):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    url = schema_registry.confluent_url
    text = _yaml(broker.bootstrap_servers, prefix, str(tmp_path / "lake"),
                 ("inventory.customers", "inventory.products"),
                 connector_extra=f"    format: avro\n    schema_registry:\n      url: {url}")
    config, _ = _config(text, tmp_path)
    client = SchemaRegistryClient({"url": url})
    value = Schema('{"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}', "AVRO")
    client.register_schema(f"{prefix}.inventory.customers-value", value)
    status, detail, _ = _by_check(run_preflight(config))[("schema registry", url)]
    assert status == "FAILED" and detail.startswith(f"1 of 2 subject(s) missing: {prefix}.inventory.products-value")
    client.register_schema(f"{prefix}.inventory.products-value", value)
    assert _by_check(run_preflight(config))[("schema registry", url)][:2] == (
        "ok", "answers; holds the 2 subject(s) of the topics")


def test_a_source_signal_channel_is_checked_on_its_database(broker, prefix, postgres, tmp_path, monkeypatch):
    """The source channel: the database named by dsn_env answers and has the signal table; a table that is not
    there, and a port no database listens on, fail naming what."""
    dsn = postgres.create_database(f"pf_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE public.debezium_signal (id text PRIMARY KEY, type text, data text)")
    text = _yaml(broker.bootstrap_servers, prefix, str(tmp_path / "lake")).replace(
        f"      channel: kafka\n      topic: {prefix}.signals",
        "      channel: source\n      table: public.debezium_signal\n      dsn_env: PREFLIGHT_TEST_DSN")
    config, _ = _config(text, tmp_path)
    target = "public.debezium_signal ($PREFLIGHT_TEST_DSN)"
    monkeypatch.setenv("PREFLIGHT_TEST_DSN", dsn)
    status, detail, field = _by_check(run_preflight(config))[("signal channel", target)]
    assert status == "ok" and detail.endswith("answers; public.debezium_signal exists"), detail
    assert field == "connectors[inventory].signal.dsn_env, .table"
    config, _ = _config(text.replace("public.debezium_signal", "public.debezium_signals"), tmp_path)
    status, detail, _ = _by_check(run_preflight(config))[("signal channel", target.replace("signal ", "signals "))]
    assert status == "FAILED" and 'relation "public.debezium_signals" does not exist' in detail, detail
    monkeypatch.setenv("PREFLIGHT_TEST_DSN", f"host=127.0.0.1 port={free_port()} dbname=postgres user=nobody")
    started = time.monotonic()
    status, detail, _ = _by_check(run_preflight(config))[("signal channel", target.replace("signal ", "signals "))]
    assert status == "FAILED" and "Connection refused" in detail, detail
    assert time.monotonic() - started < WHOLE_RUN_BOUND_S


def test_the_preflight_job_runs_the_checks_in_a_dagster_run(broker, prefix, tmp_path):
    config, _ = _config(_yaml(broker.bootstrap_servers, prefix, str(tmp_path / "lake")), tmp_path)
    job = build_definitions(config).get_job_def("cdc_preflight_job")
    with DagsterInstance.ephemeral() as instance:
        passed = job.execute_in_process(instance=instance)
        assert passed.success
        output = next(e for e in passed.all_events if e.event_type == DagsterEventType.STEP_OUTPUT)
        assert output.step_output_data.metadata["failed"].value == 0  # the op's output carries the table
        assert "delta root" in output.step_output_data.metadata["checks"].value
        assert "all 4 check(s) passed" in "\n".join(
            e.message or "" for e in instance.all_logs(passed.run_id))

    wrong = free_port()
    config, _ = _config(_yaml(f"127.0.0.1:{wrong}", prefix, str(tmp_path / "lake")), tmp_path)
    job = build_definitions(config).get_job_def("cdc_preflight_job")
    failed = job.execute_in_process(raise_on_error=False)
    assert not failed.success
    failure = failed.get_step_failure_events()[0].step_failure_data
    assert failure.user_failure_data is not None
    description = failure.user_failure_data.description
    assert description.startswith(f"broker 127.0.0.1:{wrong}: no broker answers at 127.0.0.1:{wrong}")
    assert "(config: kafka.bootstrap_servers ($PREFLIGHT_TEST_BROKER))" in description


def test_a_merge_run_against_a_wrong_port_fails_in_a_line_before_any_spark_server_starts(prefix, tmp_path,
                                                                                        monkeypatch):
    servers = tmp_path / "spark-servers"
    servers.mkdir()
    monkeypatch.setenv(SERVER_DIR_ENV_VAR, str(servers))  # cold: no Spark server there
    port = free_port()
    config, path = _config(_yaml(f"127.0.0.1:{port}", prefix, str(tmp_path / "lake")), tmp_path)
    job = build_definitions(config, topics=[]).resolve_job_def("cdc_merge_job")
    started = time.monotonic()
    result = job.execute_in_process(raise_on_error=False)
    elapsed = time.monotonic() - started
    assert not result.success and elapsed <= 5.0, elapsed
    assert list(servers.iterdir()) == []  # no server started, none asked for
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error is not None
    first = error.message.splitlines()[0]
    assert first == (f"dagster._core.definitions.events.Failure: no broker answers at 127.0.0.1:{port} "
                     f"(127.0.0.1:{port}: Connection refused): set the address in kafka.bootstrap_servers in {path} "
                     "(read from PREFLIGHT_TEST_BROKER)")
