"""Freshness now, on real parts: a stalled pipeline (events waiting past the bound) fails, a quiet
source whose connector sends heartbeats passes, a connector whose heartbeats stopped fails; the
checks run on their own schedule's job, and a sensor observes the events waiting."""

import io
import json
import struct
import time
import uuid
from datetime import datetime, timezone

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from dagster import AssetKey, DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.broker import PRODUCER_SETTINGS
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.avro import SchemaRegistrySettings, record_decoder
from cdc_assets.io.freshness import FreshnessProbe
from cdc_assets.io.kafka import SourceError
from tests.support.processes import free_port
from tests.support.topics import new_topic_named, produce

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
freshness_schedule: {{cron: "* * * * *"}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    max_heartbeat_age_s: 60
    tables: [{{name: s.orders, max_capture_lag_s: 2}}]
"""


def change(key, lsn):
    source = postgres_source(lsn, int(time.time() * 1000), "s", "orders")
    return encode_key({"id": key}), envelope("c", None, {"id": key, "v": lsn}, source, lsn)


def heartbeat(broker, prefix, age_s=0.0):
    """A heartbeat as the connector sends it, stamped ``age_s`` seconds ago."""
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    producer.produce(f"__debezium-heartbeat.{prefix}", key=encode_key({"serverName": prefix}),
                     value=b'{"ts_ms": 0}', timestamp=int((time.time() - age_s) * 1000))
    assert producer.flush(30) == 0


def freshness(defs, instance):
    """Run the freshness job as its schedule would, and return the freshness check's evaluation (the job
    also runs the table checks that merge runs leave to it)."""
    result = defs.resolve_job_def("cdc_freshness_job").execute_in_process(instance=instance)
    assert result.success
    assert result.get_asset_materialization_events() == []  # checks only: nothing is merged
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "freshness"]
    return evaluation


def test_stalled_pipeline_fails_quiet_source_with_heartbeats_passes_dead_connector_fails(spark, broker, tmp_path):
    prefix = f"fresh{uuid.uuid4().hex[:8]}"
    topic = new_topic_named(broker, f"{prefix}.s.orders", partitions=2)
    new_topic_named(broker, f"__debezium-heartbeat.{prefix}")
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        prefix=prefix)))
    key = AssetKey([prefix, "s", "orders"])
    assert defs.resolve_schedule_def("cdc_freshness_schedule").job_name == "cdc_freshness_job"
    with DagsterInstance.ephemeral() as instance:
        # Stalled: events reach the broker, no merge runs for longer than the bound.
        produce(broker, topic, [change(k, 10 + k) for k in range(5)])
        heartbeat(broker, prefix)
        time.sleep(3)
        stalled = freshness(defs, instance)
        assert not stalled.passed and "the pipeline is stalled" in stalled.description
        assert stalled.metadata["events_waiting"].value == 5 and stalled.metadata["behind_s"].value > 2

        # The sensor observes the backlog between merges, on the table's topic, with the topic's data version.
        sensor = defs.resolve_sensor_def("events_waiting_sensor")
        [observation] = sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs)).asset_events
        assert observation.asset_key == AssetKey(["kafka", *key.path])
        assert observation.metadata["events_waiting"].value == 5
        assert sum(json.loads(observation.tags["dagster/data_version"]).values()) == 5

        # Merged, then quiet: nothing waits and the connector's heartbeat is recent.
        assert defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance).success
        assert DeltaTable(str(tmp_path / prefix / "s" / "orders")).count() == 5
        time.sleep(3)  # longer than the bound: a quiet source is not a stale table
        heartbeat(broker, prefix)
        quiet = freshness(defs, instance)
        assert quiet.passed and "the source is quiet" in quiet.description
        assert quiet.metadata["events_waiting"].value == 0 and quiet.metadata["heartbeat_age_s"].value < 60
        assert defs.resolve_assets_def(key).specs_by_key[key].freshness_policy is not None

    # Quiet, but the connector's newest heartbeat is ten minutes old: it stopped.
    with DagsterInstance.ephemeral() as instance:
        dead_prefix = f"dead{uuid.uuid4().hex[:8]}"
        new_topic_named(broker, f"{dead_prefix}.s.orders")
        new_topic_named(broker, f"__debezium-heartbeat.{dead_prefix}")
        heartbeat(broker, dead_prefix, age_s=600)
        dead_defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers,
                                                                 root=tmp_path / "dead", prefix=dead_prefix)))
        dead = freshness(dead_defs, instance)
        assert not dead.passed and "the connector has stopped" in dead.description
        assert dead.metadata["heartbeat_age_s"].value >= 600


def test_one_probe_looks_at_topic_after_topic(broker):
    """One consumer serves a whole check run or sensor tick: each topic's answer is its own, whichever
    topic it looked at before, and a missing topic leaves the probe usable."""
    prefix = f"probe{uuid.uuid4().hex[:8]}"
    a = new_topic_named(broker, f"{prefix}.s.a", partitions=2)
    b = new_topic_named(broker, f"{prefix}.s.b")
    empty = new_topic_named(broker, f"{prefix}.s.empty")
    base_ms = 1_700_000_000_000

    def event(key, ms):
        source = postgres_source(key, base_ms + ms, "s", "t")
        return encode_key({"id": key}), envelope("c", None, {"id": key}, source, key)

    produce(broker, a, [event(k, 1000 * k) for k in range(4)], partition=0)
    produce(broker, a, [event(k, 500 * k) for k in range(3)], partition=1)
    produce(broker, b, [event(k, 7000 + k) for k in range(5)])
    heartbeat(broker, prefix)

    def newest(ms):
        return datetime.fromtimestamp((base_ms + ms) / 1000, timezone.utc)

    with FreshnessProbe({"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe"}) as probe:
        whole = probe.table_freshness(a, None)
        assert (whole.events_waiting, whole.newest_source_time) == (7, newest(3000))
        assert whole.waiting_since is not None and whole.behind_s < 60
        partly = probe.table_freshness(b, {0: 2})
        assert (partly.events_waiting, partly.newest_source_time) == (3, newest(7004))
        assert probe.table_freshness(empty, None).events_waiting == 0
        with pytest.raises(SourceError, match="does not exist"):
            probe.table_freshness(f"{prefix}.s.missing", None)
        one_left = probe.table_freshness(a, {0: 4, 1: 2})
        assert (one_left.events_waiting, one_left.newest_source_time) == (1, newest(1000))
        assert probe.table_freshness(a, {0: 4, 1: 3}).events_waiting == 0
        assert probe.retained_offsets(b) == {0: (0, 5)}
        beat = probe.last_heartbeat(prefix)
        assert beat is not None and (datetime.now(timezone.utc) - beat).total_seconds() < 60
        assert probe.last_heartbeat(f"{prefix}-none") is None


def test_the_newest_source_time_of_an_avro_topic_is_read_through_the_registry(broker, schema_registry):
    """A connector in Avro: the probe reads the newest waiting event's ``source.ts_ms`` through the registry
    (raw, the wire format has none), and a registry it cannot reach leaves the time unknown, not the check failed."""
    topic = new_topic_named(broker, f"probeavro{uuid.uuid4().hex[:8]}.s.t")
    schema = {"type": "record", "name": "Envelope", "namespace": topic, "fields": [
        {"name": "op", "type": "string"},
        {"name": "after", "type": ["null", {"type": "record", "name": "Value", "fields": [
            {"name": "id", "type": "int"}]}], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                    "fields": [{"name": "ts_ms", "type": "long"}, {"name": "lsn", "type": "long"}]}}]}
    schema_id = SchemaRegistryClient({"url": schema_registry.confluent_url}).register_schema(
        f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
    base_ms = 1_700_000_000_000
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    for n in range(3):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(schema),
                                   {"op": "c", "after": {"id": n}, "source": {"ts_ms": base_ms + n, "lsn": n}})
        producer.produce(topic, value=struct.pack(">bI", 0, schema_id) + body.getvalue(), partition=0)
    assert producer.flush(30) == 0

    settings = {"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe"}
    with FreshnessProbe(settings) as probe:
        assert probe.table_freshness(topic, None).newest_source_time is None
        read = probe.table_freshness(topic, None, record_decoder(SchemaRegistrySettings(schema_registry.confluent_url)))
        assert (read.events_waiting, read.newest_source_time) == (
            3, datetime.fromtimestamp((base_ms + 2) / 1000, timezone.utc))
        nowhere = SchemaRegistrySettings(f"http://127.0.0.1:{free_port()}/apis/ccompat/v7")
        unreachable = probe.table_freshness(topic, None, record_decoder(nowhere))
        assert (unreachable.events_waiting, unreachable.newest_source_time) == (3, None)
