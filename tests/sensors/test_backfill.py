"""The backfill sensor: tables with a missing or empty Delta target get a merge run, and a snapshot run
where the topic cannot fill them."""

import json
import uuid

import pyarrow as pa
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable, write_deltalake

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.support.snapshots import CONFIG


def test_missing_target_requests_snapshot_and_merge_once_then_again_when_empty(broker, tmp_path):
    # A prefix of its own: the session's broker may hold the demo's dbserver1 topics (a topic that can fill
    # the table asks for no snapshot).
    prefix = f"bf{uuid.uuid4().hex[:8]}"
    text = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path, signal_topic="s").replace(
        "topic.prefix: dbserver1", f"topic.prefix: {prefix}")
    defs = build_definitions(parse_config(text))
    sensor = defs.resolve_sensor_def("snapshot_backfill_sensor")
    with DagsterInstance.ephemeral() as instance:
        first = sensor.evaluate_tick(build_sensor_context(instance=instance))
        assert [(r.job_name, r.run_key) for r in first.run_requests] == [
            ("incremental_snapshot_job", f"snapshot-backfill:{prefix}.inventory.customers"),
            ("cdc_merge_job", f"snapshot-backfill:{prefix}.inventory.customers:merge")]
        assert first.run_requests[0].run_config["ops"]["send_execute_snapshot"]["config"]["tables"] == [
            "inventory.customers"]
        assert [k.path for k in first.run_requests[1].asset_selection] == [[prefix, "inventory", "customers"]]

        # Re-evaluated with the advanced cursor: nothing new is requested.
        again = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=first.cursor))
        assert again.run_requests == [] and json.loads(again.cursor) == [f"{prefix}.inventory.customers"]

        # Once the table has rows it leaves the cursor; emptied again, it is requested again.
        path = str(tmp_path / prefix / "inventory" / "customers")
        write_deltalake(path, pa.table({"id": [1]}))
        filled = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=again.cursor))
        assert filled.run_requests == [] and json.loads(filled.cursor) == []
        DeltaTable(path).delete()
        emptied = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=filled.cursor))
        assert len(emptied.run_requests) == 2


def test_the_merge_alone_where_the_topic_holds_the_whole_history_a_snapshot_only_where_it_cannot(broker, tmp_path):
    """A first deployment: the topic that still holds its history from offset 0 fills its table with
    the merge alone; the one whose start retention removed, and the one not created yet, need a snapshot."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.topics import new_topic, produce

    prefix = new_topic(broker, "bf").replace(".", "_")
    topics = {name: f"{prefix}.s.{name}" for name in ("whole", "retained", "absent")}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for name in ("whole", "retained"):
        admin.create_topics([NewTopic(topics[name], num_partitions=1, replication_factor=1)])[topics[name]].result()
        produce(broker, topics[name], [(b'{"id": 1}', b'{"op": "c"}'), (b'{"id": 2}', b'{"op": "c"}')])
    # Retention deleted the start of one topic: its low watermark moves past 0.
    [deleted] = admin.delete_records([TopicPartition(topics["retained"], 0, 1)]).values()
    deleted.result()
    config = f"""\
kafka: {{bootstrap_servers: "{broker.bootstrap_servers}"}}
delta: {{root: "{tmp_path}"}}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: {prefix}
    signal: {{channel: kafka, topic: {prefix}.signals}}
    tables: [{{name: s.whole}}, {{name: s.retained}}, {{name: s.absent}}]
"""
    defs = build_definitions(parse_config(config))
    sensor = defs.resolve_sensor_def("snapshot_backfill_sensor")
    with DagsterInstance.ephemeral() as instance:
        tick = sensor.evaluate_tick(build_sensor_context(instance=instance))
    assert sorted((r.job_name, r.run_key) for r in tick.run_requests) == sorted([
        ("cdc_merge_job", f"snapshot-backfill:{topics['whole']}:merge"),
        ("incremental_snapshot_job", f"snapshot-backfill:{topics['retained']}"),
        ("cdc_merge_job", f"snapshot-backfill:{topics['retained']}:merge"),
        ("incremental_snapshot_job", f"snapshot-backfill:{topics['absent']}"),
        ("cdc_merge_job", f"snapshot-backfill:{topics['absent']}:merge"),
    ])
