"""The compaction job on real parts: merges leave small files, a real Dagster run of
``cdc_compaction_job`` bin-packs them, and the next merge resumes exactly from the offsets committed
before the OPTIMIZE commit (both writers)."""

import time
import uuid

from dagster import DagsterInstance, build_schedule_context

from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.delta import DeltaRsWriter, DeltaTarget
from tests.support.topics import new_topic_named, produce

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: {writer}}}
batch: {{max_records: 2, poll_timeout_s: 10}}
compaction: {{min_files: 3}}
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: s.orders}}]
"""


def change(op, key, value, lsn):
    source = postgres_source(lsn, int(time.time() * 1000), "s", "orders")
    before = {"id": key, "v": None} if op != "c" else None
    return encode_key({"id": key}), envelope(op, before, None if op == "d" else {"id": key, "v": value}, source, lsn)


def data_files(spark, writer, path):
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        return len(DeltaTable(path).file_uris())
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])


def rows(spark, writer, path):
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        found = DeltaTable(path).to_pyarrow_table(columns=["id", "v"]).to_pylist()
    else:
        found = [r.asDict() for r in spark.read.format("delta").load(path).select("id", "v").collect()]
    return {r["id"]: r["v"] for r in found}


def test_compaction_between_merges_keeps_the_offsets_and_the_next_merge_resumes_exactly(spark, broker, writer,
                                                                                          tmp_path):
    prefix = f"compact{uuid.uuid4().hex[:8]}"
    topic = new_topic_named(broker, f"{prefix}.s.orders")
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path,
                                                        writer=writer.name, prefix=prefix)))
    merge = defs.resolve_job_def("cdc_merge_job")
    compaction = defs.resolve_job_def("cdc_compaction_job")
    target = DeltaTarget(str(tmp_path / prefix / "s" / "orders"))
    path, app_id = target.path, f"cdc_assets:{topic}"

    produce(broker, topic, [change("c", k, f"v{k}", 10 + k) for k in range(8)])
    assert merge.execute_in_process().success  # 4 batches of 2 inserts: 4 commits, a file each at least
    progress = writer.read_progress(target, app_id)
    assert progress is not None and progress.offsets == {0: 8}
    before = data_files(spark, writer, path)
    assert before >= 4

    result = compaction.execute_in_process()
    assert result.success
    assert result.output_for_node("shop_compact") == 1
    assert data_files(spark, writer, path) == 1
    after = writer.read_progress(target, app_id)
    assert after == progress  # the OPTIMIZE commit recorded nothing: the batch commit before it still counts

    # Below the threshold now: a second run commits nothing.
    version = after.delta_version + 1
    assert compaction.execute_in_process().output_for_node("shop_compact") == 0
    assert writer.compact(target, 3).delta_version == version  # type: ignore[union-attr]

    produce(broker, topic, [change("u", 1, "v1b", 30), change("d", 2, None, 31), change("c", 9, "v9", 32)])
    run = merge.execute_in_process()
    assert run.success
    [materialization] = run.get_asset_materialization_events()
    metadata = materialization.event_specific_data.materialization.metadata
    assert metadata["events_read"].value == 3  # exactly the new events: none read again, none skipped
    assert writer.read_progress(target, app_id).offsets == {0: 11}  # type: ignore[union-attr]
    expected = {k: f"v{k}" for k in range(8)} | {1: "v1b", 9: "v9"}
    del expected[2]
    assert rows(spark, writer, path) == expected


def test_compaction_schedule_is_daily_and_stopped_by_default(broker, tmp_path):
    defs = build_definitions(parse_config(CONFIG.replace("compaction: {{min_files: 3}}\n", "").format(
        bootstrap=broker.bootstrap_servers, root=tmp_path, writer="delta-rs", prefix="unused")))
    schedule = defs.resolve_schedule_def("cdc_compaction_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.default_status.value == "STOPPED"
    assert schedule.job_name == "cdc_compaction_job"
    with DagsterInstance.ephemeral() as instance:
        request = schedule.evaluate_tick(build_schedule_context(instance=instance)).run_requests[0]
    assert request.run_config == {}  # the ops' min_files default: the config's (32)
    op_config = defs.resolve_job_def("cdc_compaction_job").graph.node_named("shop_compact").definition.config_schema
    assert op_config.config_type.fields["min_files"].default_value == 32
    assert DeltaRsWriter().compact(DeltaTarget(str(tmp_path / "none")), 1) is None
