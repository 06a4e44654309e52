"""Topics as observable source assets (cdc_assets.topics) on a real broker: their data versions are their end
offsets, observed by the topics' op or by a sensor tick, and new events in a topic (only they) request the
merge of its table through the table's automation condition."""

from __future__ import annotations

import json
import uuid

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    Definitions,
    build_sensor_context,
    define_asset_job,
    evaluate_automation_conditions,
)

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.kafka import TopicProbe
from cdc_assets.topics import build_topic_sources, topic_data_version, topic_observations
from cdc_assets.translator import CdcTranslator
from tests.support.merges import captured_table
from tests.support.topics import new_topic, produce


def change(key: int) -> tuple[bytes, bytes]:
    """A Debezium create of row ``key``."""
    return encode_key({"id": key}), envelope("c", None, {"id": key}, postgres_source(100 + key, key, "s", "t"), key)


def new_topic_named(broker, topic: str) -> str:
    """A topic of exactly this name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result()
    return topic


def records(start: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(json.dumps({"id": i}).encode(), json.dumps({"op": "c", "after": {"id": i}}).encode())
            for i in range(start, start + count)]


def test_a_topics_data_version_is_its_end_offsets_and_changes_only_with_new_events(broker, tmp_path):
    topic = new_topic(broker, "topics.s.t", partitions=2)
    quiet = new_topic(broker, "quiet.s.t")
    tables = [captured_table(topic, tmp_path), captured_table(quiet, tmp_path)]
    translator = CdcTranslator()
    produce(broker, topic, records(0, 6))
    settings = {"bootstrap.servers": broker.bootstrap_servers, "group.id": "topics-test"}
    with TopicProbe(settings) as probe:
        first = {o.asset_key: o for o in topic_observations(tables, probe, translator)}
        again = {o.asset_key: o for o in topic_observations(tables, probe, translator)}
    key, quiet_key = (translator.get_topic_asset_key(table) for table in tables)
    assert key == AssetKey(["kafka", *translator.get_asset_key(tables[0]).path])
    ends = {int(p): o for p, o in first[key].metadata["end_offsets"].value.items()}
    assert sum(ends.values()) == 6 and set(ends) == {0, 1}
    assert first[key].tags["dagster/data_version"] == topic_data_version(ends)
    assert again[key].tags == first[key].tags and again[quiet_key].tags == first[quiet_key].tags
    produce(broker, topic, records(6, 3))
    with TopicProbe(settings) as probe:
        later = {o.asset_key: o for o in topic_observations(tables, probe, translator,
                                                            recorded={translator.get_asset_key(tables[0]): ends})}
    assert later[key].tags != first[key].tags and later[quiet_key].tags == first[quiet_key].tags
    assert later[key].metadata["events_waiting"].value == 3  # past what the table's materialization recorded
    assert later[quiet_key].metadata["events_waiting"].value == 0  # nothing recorded, nothing in it


def test_the_topics_op_observes_the_selected_topics_with_data_versions(broker, tmp_path):
    topics = [new_topic(broker, f"obs{i}.s.t") for i in range(3)]
    tables = [captured_table(topic, tmp_path) for topic in topics]
    produce(broker, topics[0], records(0, 4))
    sources = build_topic_sources(tables, {"bootstrap.servers": broker.bootstrap_servers, "group.id": "t"})
    instance = DagsterInstance.ephemeral()
    job = define_asset_job("observe_topics", selection=AssetSelection.assets(sources))
    result = Definitions(assets=[sources], jobs=[job]).resolve_job_def("observe_topics").execute_in_process(
        instance=instance)
    assert result.success
    observed = {e.asset_key: e.event_specific_data.asset_observation
                for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"}
    translator = CdcTranslator()
    assert set(observed) == {translator.get_topic_asset_key(table) for table in tables}
    first = observed[translator.get_topic_asset_key(tables[0])]
    assert first.data_version == topic_data_version({0: 4})
    assert first.metadata["events_waiting"].value == 4  # the table was never materialized


AUTOMATED = """\
kafka:
  bootstrap_servers: {bootstrap}
delta:
  root: {root}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables:
      - name: s.busy
      - name: s.quiet
      - name: s.manual
        automation: none
"""


def test_new_events_in_a_topic_and_only_they_request_its_tables_merge(broker, tmp_path):
    """Each tick of the events-waiting sensor observes the topics (the daemon records its observations); the
    tables' eager automation requests a merge of a table whose topic holds new events, none of a quiet one."""
    prefix = f"auto{uuid.uuid4().hex[:8]}"
    for name in ("busy", "quiet", "manual"):
        new_topic_named(broker, f"{prefix}.s.{name}")
    defs = build_definitions(parse_config(AUTOMATED.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                           prefix=prefix)))
    busy, quiet, manual = (AssetKey([prefix, "s", name]) for name in ("busy", "quiet", "manual"))
    sensor = defs.resolve_sensor_def("events_waiting_sensor")
    with DagsterInstance.ephemeral() as instance:
        def tick(cursor=None):
            for event in sensor.evaluate_tick(build_sensor_context(instance=instance, definitions=defs)).asset_events:
                instance.report_runless_asset_event(event)
            result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            return {key for key in (busy, quiet, manual) if result.get_num_requested(key)}, result.cursor

        requested, cursor = tick()
        assert requested == set()  # topics observed for the first time, all empty
        produce(broker, f"{prefix}.s.busy", [change(1)])
        produce(broker, f"{prefix}.s.manual", [change(1)])
        requested, cursor = tick(cursor)
        assert requested == {busy}  # manual: automation none
        requested, cursor = tick(cursor)
        assert requested == set()  # nothing new since: requested once
        produce(broker, f"{prefix}.s.busy", [change(2)])
        requested, cursor = tick(cursor)
        assert requested == {busy}
        assert quiet not in requested
