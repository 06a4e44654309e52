"""Snapshot signal jobs, schedules and an end-to-end incremental snapshot, on real parts."""

import json
import uuid

import psycopg
import pytest
from dagster import DagsterInstance, build_schedule_context
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.signals import SignalError
from tests.support.merges import captured_table, read_rows, run_batch
from tests.support.snapshots import CONFIG
from tests.support.topics import new_topic, produce, read_topic


def definitions(broker, tmp_path, signal_topic="unused.signals"):
    text = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, signal_topic=signal_topic)
    return build_definitions(parse_config(text))


def run_config(**settings):
    return {"ops": {"send_execute_snapshot": {"config": {"connector": "inventory", **settings}}}}


def test_execute_snapshot_job_sends_audits_and_reports(broker, tmp_path):
    signal_topic = new_topic(broker, "dbserver1.signals")
    defs = definitions(broker, tmp_path, signal_topic)
    result = defs.resolve_job_def("incremental_snapshot_job").execute_in_process(
        run_config=run_config(tables=["inventory.customers"], surrogate_key="id"))
    assert result.success
    sent = read_topic(broker, signal_topic)
    assert sent == [("dbserver1", {"type": "execute-snapshot",
                                   "data": {"data-collections": ["inventory.customers"], "type": "incremental",
                                            "surrogate-key": "id"}})]
    output = result.output_for_node("send_execute_snapshot")
    assert output == f"cdc-assets-{result.run_id}-0"
    audit = DeltaTable(str(tmp_path / "_cdc_assets" / "signals")).to_pyarrow_table().to_pylist()
    assert [(row["id"], row["channel"], row["connector"], row["type"], row["run_id"]) for row in audit] == [
        (output, "kafka", "inventory", "execute-snapshot", result.run_id)]
    assert json.loads(audit[0]["payload"])["data"]["surrogate-key"] == "id"
    [materialization] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert materialization.event_specific_data.metadata["signal_id"].value == output


def test_stop_snapshot_job_without_tables_stops_everything(broker, tmp_path):
    signal_topic = new_topic(broker, "dbserver1.signals")
    defs = definitions(broker, tmp_path, signal_topic)
    result = defs.resolve_job_def("stop_snapshot_job").execute_in_process(
        run_config={"ops": {"send_stop_snapshot": {"config": {"connector": "inventory"}}}})
    assert result.success
    assert read_topic(broker, signal_topic) == [("dbserver1", {"type": "stop-snapshot",
                                                               "data": {"type": "incremental"}})]


def test_invalid_run_config_fails_clearly_and_sends_nothing(broker, tmp_path):
    signal_topic = new_topic(broker, "dbserver1.signals")
    defs = definitions(broker, tmp_path, signal_topic)
    job = defs.resolve_job_def("incremental_snapshot_job")
    for settings, message in [({"tables": []}, "needs at least one data collection"),
                              ({"tables": ["inventory.(x"]}, "is not a valid regex"),
                              ({"tables": ["a.b"], "channel": "source"}, "no 'source' signal channel")]:
        result = job.execute_in_process(run_config=run_config(**settings), raise_on_error=False)
        assert not result.success
        failure = result.get_step_failure_events()[0].event_specific_data.error.cause
        assert failure.cls_name == SignalError.__name__ and message in failure.message
    assert read_topic(broker, signal_topic) == []


def test_schedules_from_config_carry_the_run_config_and_default_status(broker, tmp_path):
    defs = definitions(broker, tmp_path)
    weekly = defs.resolve_schedule_def("inventory_weekly")
    assert weekly.cron_schedule == "0 3 * * 0" and weekly.default_status.value == "STOPPED"
    assert defs.resolve_schedule_def("inventory_nightly").default_status.value == "RUNNING"
    with DagsterInstance.ephemeral() as instance:
        request = weekly.evaluate_tick(build_schedule_context(instance=instance)).run_requests[0]
    assert request.run_config == run_config(tables=["inventory.customers"], additional_condition="region = 'eu'")


def test_incremental_snapshot_reads_never_overwrite_newer_streamed_changes(spark, broker, writer, tmp_path):
    """Scripted end to end: execute-snapshot, then the `r` events a connector emits, interleaved with
    streamed updates to the same keys; the table ends with the newer values."""
    signal_topic = new_topic(broker, "dbserver1.signals")
    definitions(broker, tmp_path, signal_topic).resolve_job_def("incremental_snapshot_job").execute_in_process(
        run_config=run_config(tables=["inventory.customers"]))
    assert read_topic(broker, signal_topic)[0][1]["type"] == "execute-snapshot"

    topic = new_topic(broker, "dbserver1.inventory.customers", partitions=2)
    table = captured_table(topic, tmp_path / "delta")

    def event(op, key, name, lsn, snapshot="false"):
        source = postgres_source(lsn, 1_700_000_000_000 + lsn, "inventory", "customers", snapshot=snapshot)
        return encode_key({"id": key}), envelope(op, None, {"id": key, "name": name}, source, lsn)

    produce(broker, topic, [event("c", k, f"v1-{k}", 10 + k) for k in range(4)])
    run_batch(spark, broker, writer, table)
    # Streamed updates at LSN 200+ land first; the snapshot window read at LSN 150 arrives later in
    # the topic for keys 0 and 1 (and is the only news for keys 2 and 3).
    produce(broker, topic, [event("u", 0, "v2-0", 200), event("u", 1, "v2-1", 201)])
    run_batch(spark, broker, writer, table)
    produce(broker, topic, [event("r", k, f"snap-{k}", 150, snapshot="incremental") for k in range(4)])
    report = run_batch(spark, broker, writer, table)
    assert report.summary.incremental_snapshot_reads == 4
    assert report.summary.last_incremental_snapshot_read_ts.year == 2023
    rows = read_rows(spark, writer, table)
    assert {k[0]: row["name"] for k, row in rows.items()} == {0: "v2-0", 1: "v2-1", 2: "snap-2", 3: "snap-3"}


SIGNAL_JOBS = [  # job, op, run config, what the connector receives
    ("incremental_snapshot_job", "send_execute_snapshot",
     {"tables": ["inventory.customers", "inventory.orders"],
      "additional_conditions": [{"table": "inventory.customers", "filter": "region = 'eu'"},
                                {"table": "inventory.orders", "filter": "total > 10"}]},
     ("execute-snapshot", {"data-collections": ["inventory.customers", "inventory.orders"], "type": "incremental",
                           "additional-conditions": [
                               {"data-collection": "inventory.customers", "filter": "region = 'eu'"},
                               {"data-collection": "inventory.orders", "filter": "total > 10"}]})),
    ("incremental_snapshot_job", "send_execute_snapshot", {"tables": ["inventory.customers"],
                                                           "snapshot_type": "blocking"},
     ("execute-snapshot", {"data-collections": ["inventory.customers"], "type": "blocking"})),
    ("pause_snapshot_job", "send_pause_snapshot", {}, ("pause-snapshot", {"type": "incremental"})),
    ("resume_snapshot_job", "send_resume_snapshot", {}, ("resume-snapshot", {"type": "incremental"})),
    ("stop_snapshot_job", "send_stop_snapshot", {"tables": ["inventory.customers"]},
     ("stop-snapshot", {"data-collections": ["inventory.customers"], "type": "incremental"})),
]


@pytest.mark.parametrize("channel", ["kafka", "source"])
def test_every_signal_job_sends_its_payload_through_each_channel_and_audits_it(broker, postgres, tmp_path,
                                                                               monkeypatch, channel):
    signal_topic = new_topic(broker, "dbserver1.signals")
    table = f"signal_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn(), autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA IF NOT EXISTS debezium; CREATE TABLE debezium.{table} "
                           "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048), "
                           "sent serial)")  # sent: the order of the inserts, for this test only
    monkeypatch.setenv("INVENTORY_SIGNAL_DSN", postgres.dsn())
    text = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, signal_topic=signal_topic).replace(
        f"      topic: {signal_topic}\n",
        f"      topic: {signal_topic}\n      table: debezium.{table}\n      dsn_env: INVENTORY_SIGNAL_DSN\n"
        "      debezium_version: '3.6'\n")
    defs = build_definitions(parse_config(text))
    for job, op, settings, _ in SIGNAL_JOBS:
        result = defs.resolve_job_def(job).execute_in_process(
            run_config={"ops": {op: {"config": {"connector": "inventory", "channel": channel, **settings}}}})
        assert result.success
    if channel == "kafka":
        sent = [(value["type"], value["data"]) for key, value in read_topic(broker, signal_topic)]
    else:
        with psycopg.connect(postgres.dsn()) as connection:
            rows = connection.execute(f"SELECT type, data FROM debezium.{table} ORDER BY sent").fetchall()
        sent = [(kind, json.loads(data)) for kind, data in rows]
    assert sent == [expected for *_, expected in SIGNAL_JOBS]
    audit = DeltaTable(str(tmp_path / "_cdc_assets" / "signals")).to_pyarrow_table().to_pylist()
    assert [(row["channel"], row["type"]) for row in sorted(audit, key=lambda row: row["sent_at"])] == [
        (channel, kind) for *_, (kind, _) in SIGNAL_JOBS]


def test_a_signal_the_connectors_version_lacks_fails_naming_the_version_and_sends_nothing(broker, tmp_path):
    signal_topic = new_topic(broker, "dbserver1.signals")
    text = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, signal_topic=signal_topic).replace(
        f"      topic: {signal_topic}\n", f"      topic: {signal_topic}\n      debezium_version: '1.9'\n")
    result = build_definitions(parse_config(text)).resolve_job_def("pause_snapshot_job").execute_in_process(
        run_config={"ops": {"send_pause_snapshot": {"config": {"connector": "inventory"}}}}, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.cause
    assert "pause-snapshot needs Debezium 2.0 or later" in failure.message
    assert read_topic(broker, signal_topic) == []
