"""The merge schedule asks for runs of the tables with new events only: a quiet tick launches nothing."""

import uuid

from dagster import AssetKey, DagsterInstance, RunRequest, build_schedule_context, instance_for_test

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.kafka import TopicProbe
from tests.support.topics import new_topic_named, produce

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: delta-rs}}
merge_schedule: {{cron: "*/5 * * * *"}}
connectors:
  - name: quiet
    kind: postgresql
    topic.prefix: {prefix}
    tables:
      - name: s.busy
      - name: s.calm
"""


def changes(first: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` creates of keys from ``first``, as the PostgreSQL connector writes them."""
    return [(encode_key({"id": i}), envelope("c", None, {"id": i, "v": f"v{i}"}, postgres_source(i, i, "s", "t"), i))
            for i in range(first, first + count)]


def test_a_tick_requests_the_tables_with_new_events_and_a_quiet_tick_none(spark, broker, tmp_path):
    prefix = f"quiet{uuid.uuid4().hex[:8]}"
    busy, calm = (new_topic_named(broker, f"{prefix}.s.{name}", partitions=3) for name in ("busy", "calm"))
    produce(broker, busy, changes(1, 30))
    produce(broker, calm, changes(1, 10))
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        prefix=prefix)))
    schedule = defs.get_schedule_def("cdc_merge_schedule")
    job = defs.resolve_job_def("cdc_merge_job")
    keys = {name: AssetKey([prefix, "s", name]) for name in ("busy", "calm")}

    def tick(instance: DagsterInstance) -> RunRequest | str | None:
        data = schedule.evaluate_tick(build_schedule_context(instance=instance))
        return data.run_requests[0] if data.run_requests else data.skip_message

    with instance_for_test() as instance:
        first = tick(instance)  # nothing merged yet: every table
        assert isinstance(first, RunRequest) and set(first.asset_selection) == set(keys.values())
        assert job.execute_in_process(instance=instance, asset_selection=first.asset_selection).success
        assert tick(instance) == "all 2 tables are caught up: no new events in their topics"

        produce(broker, busy, changes(31, 5))
        busy_tick = tick(instance)
        assert isinstance(busy_tick, RunRequest) and busy_tick.asset_selection == [keys["busy"]]
        assert {check.asset_key for check in busy_tick.asset_check_keys} == {keys["busy"]}
        assert job.execute_in_process(instance=instance, asset_selection=busy_tick.asset_selection).success
        assert isinstance(tick(instance), str)


def test_a_probe_reads_every_topic_s_end_offsets_at_once(broker):
    prefix = f"ends{uuid.uuid4().hex[:8]}"
    two, empty = new_topic_named(broker, f"{prefix}.a", partitions=2), new_topic_named(broker, f"{prefix}.b")
    produce(broker, two, changes(1, 7), partition=1)
    produce(broker, two, changes(8, 2), partition=0)
    with TopicProbe({"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe"}) as probe:
        assert probe.end_offsets([two, empty, f"{prefix}.missing"]) == {two: {0: 2, 1: 7}, empty: {0: 0}}
