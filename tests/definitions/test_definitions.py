"""The code location: assets, groups, kinds and the merge job, run for real through Dagster."""

import json
import subprocess
import sys
import uuid

from confluent_kafka import Consumer, TopicPartition
from dagster import AssetCheckKey, AssetKey, DagsterInstance, build_sensor_context, materialize
from deltalake import DeltaTable

from cdc_assets import CdcTranslator
from cdc_assets.catalog import CapturedTable
from cdc_assets.config import parse_config
from cdc_assets.definitions import build_definitions
from tests.support.samples import CONFIG, KEYS, sample_published
from tests.support.schema_changes import COLUMNS, schema_change
from tests.support.topics import new_topic_named, produce


def test_merge_job_applies_the_sample_and_reports_metadata(spark, broker, tmp_path):
    sample_published(broker)
    defs = build_definitions(parse_config(CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path)))

    graph = defs.resolve_asset_graph()
    topics = {AssetKey(["kafka", *key.path]) for key in KEYS}  # each table's topic, an observable source upstream
    assert set(graph.get_all_asset_keys()) == set(KEYS) | topics
    assert all(graph.get(key).parent_keys == {AssetKey(["kafka", *key.path])} for key in KEYS)
    assert all(graph.get(key).automation_condition is not None for key in KEYS)  # automation: eager
    products = graph.get(KEYS[0])
    assert products.group_name == "inventory" and graph.get(KEYS[2]).group_name == "sales"
    assert {"spark", "delta", "kafka"} <= set(products.kinds)

    job = defs.resolve_job_def("cdc_merge_job")
    result = job.execute_in_process()
    assert result.success
    materializations = {m.asset_key: m.metadata for m in result.get_asset_materialization_events()
                        for m in [m.event_specific_data.materialization]}
    assert set(materializations) == set(KEYS)
    products_md = materializations[KEYS[0]]
    assert products_md["rows_inserted"].value == 10 and products_md["tombstones_skipped"].value == 1
    assert products_md["events_read"].value == 16 and products_md["delta_version"].value == 1
    assert products_md["capture_lag_s"].value > 0
    assert products_md["offsets"].value == {"0": {"from": 0, "to": 16, "high_watermark": 16}}
    orders = DeltaTable(str(tmp_path / "server1" / "dbo" / "orders")).to_pyarrow_table().to_pylist()
    assert sorted(row["id"] for row in orders) == [10001, 10003, 10004, 10005]  # 10002 became 10005
    assert next(row for row in orders if row["id"] == 10001)["quantity"] == 9

    # A second run finds nothing new: no events read, nothing changes.
    # The inventory connector's op holds both of its tables: this run selects customers only.
    again = materialize([defs.get_assets_def(KEYS[1])], selection=[KEYS[1]], resources=defs.resources)
    assert {e.asset_key for e in again.get_asset_materialization_events()} == {KEYS[1]}
    metadata = again.asset_materializations_for_node(again.get_asset_materialization_events()[0].node_name)[0].metadata
    assert metadata["events_read"].value == 0
    assert DeltaTable(str(tmp_path / "dbserver1" / "inventory" / "customers")).version() == 1


def test_a_broken_config_is_a_readable_error_at_load(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.format(bootstrap="x:1", root=tmp_path).replace("kind: sqlserver", "kind: sybase"))
    load = subprocess.run([sys.executable, "-c", "from cdc_assets.definitions import defs; defs()"],
                          capture_output=True, text=True, env={"CDC_ASSETS_CONFIG": str(bad), "PATH": ""})
    assert load.returncode != 0
    assert f"{bad}:line 14: connectors.1.kind" in load.stderr


CHECK_NAMES = ("primary_key", "capture_lag", "no_dead_letters", "schema_matches_source")


def test_checks_run_with_the_merge_and_can_fail(spark, broker, tmp_path):
    import pyarrow as pa
    from dagster import AssetSelection
    from deltalake import write_deltalake

    prefix_config = CONFIG.replace("dbserver1", "checks1").replace("server1", "checks2")
    # The demo sample, on topics of this test's own.
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from cdc_assets.demo.broker import PRODUCER_SETTINGS
    from cdc_assets.demo.sample import SAMPLE_TOPICS

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": broker.bootstrap_servers})
    for topic, (partitions, records) in SAMPLE_TOPICS.items():
        renamed = topic.replace("dbserver1", "checks1").replace("server1", "checks2")
        admin.create_topics([NewTopic(renamed, num_partitions=partitions, replication_factor=1)])[renamed].result()
        for key, value in records:
            producer.produce(renamed, key=key, value=value)
    producer.flush(30)
    defs = build_definitions(parse_config(prefix_config.format(bootstrap=broker.bootstrap_servers, root=tmp_path)))
    products = AssetKey(["checks1", "inventory", "products"])
    assert {k.name for k in defs.resolve_asset_graph().get(products).check_keys} == {
        *CHECK_NAMES, "freshness", "unavailable_values_kept"}
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance)
        evaluations = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
        # The merge run evaluates the blocking checks (the unavailable values' on PostgreSQL's tables); the
        # others run on the freshness schedule.
        assert sorted(evaluations) == sorted([
            *((table, "primary_key") for table in ("products", "customers", "orders")),
            *((table, "unavailable_values_kept") for table in ("products", "customers"))])
        assert batch_lines(instance, result.run_id) == []  # one batch a table: its materialization says it all
        assert evaluations[("products", "primary_key")].passed
        assert evaluations[("products", "primary_key")].metadata["rows"].value == 10
        # Each targets the materialization its run made (the UI shows them current).
        latest = instance.fetch_materializations(products, limit=1).records[0]
        assert latest.run_id == result.run_id
        assert {e.target_materialization_data.storage_id for (table, _), e in evaluations.items()
                if table == "products"} == {latest.storage_id}
        # Each check the run selected is an output the op yielded: Dagster logs none as missing.
        assert [entry.user_message for entry in instance.all_logs(result.run_id)
                if "did not yield or return expected outputs" in entry.user_message] == []

        # The scheduled job evaluates the rest against the latest materialization, and they can fail.
        scheduled = defs.resolve_job_def("cdc_freshness_job").execute_in_process(instance=instance)
        assert scheduled.get_asset_materialization_events() == []
        later = {(e.asset_key.path[-1], e.check_name): e for e in scheduled.get_asset_check_evaluations()}
        assert sorted(later) == sorted((table, name) for table in ("products", "customers", "orders")
                                       for name in ("capture_lag", "no_dead_letters", "schema_matches_source",
                                                    "freshness"))
        # The sample's changes were made in 2023: far beyond the default one-hour bound.
        lag = later[("products", "capture_lag")]
        assert not lag.passed and lag.severity.value == "WARN" and lag.metadata["capture_lag_s"].value > 3600
        assert lag.target_materialization_data.storage_id == latest.storage_id
        assert all(e.passed for (_, name), e in later.items() if name != "capture_lag")

        # A duplicated key written behind the pipeline's back fails the blocking check.
        path = str(tmp_path / "checks1" / "inventory" / "products")
        duplicate = DeltaTable(path).to_pyarrow_table().slice(0, 1)
        write_deltalake(path, pa.Table.from_batches(duplicate.to_batches(), duplicate.schema), mode="append")
        check = materialize([*defs.assets, *defs.asset_checks], resources=defs.resources, instance=instance,
                            selection=AssetSelection.checks(AssetCheckKey(products, "primary_key")),
                            raise_on_error=False)
        [evaluation] = check.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.metadata["duplicate_keys"].value == 1
        assert not check.success  # blocking: the step fails


def batch_lines(instance, run_id):
    """The run's per-batch log lines."""
    return [entry.user_message for entry in instance.all_logs(run_id)
            if entry.dagster_event is None and " events read, offsets " in entry.user_message]


def test_a_run_drains_a_backlog_in_micro_batches_up_to_its_limit(spark, broker, tmp_path):
    sample_published(broker)
    group = f"drain-{uuid.uuid4().hex[:8]}"
    config = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path).replace(
        "kafka:\n", f"kafka:\n  group_id: {group}\n") + "batch:\n  max_records: 5\n  max_batches_per_run: 2\n"
    defs = build_definitions(parse_config(config))
    products = defs.get_assets_def(KEYS[0])
    path = str(tmp_path / "dbserver1" / "inventory" / "products")

    def run(run_config=None):
        with DagsterInstance.ephemeral() as instance:
            result = materialize([products], selection=[KEYS[0]], resources=defs.resources, run_config=run_config,
                                 instance=instance)
            lines = batch_lines(instance, result.run_id)
        (event,) = result.get_asset_materialization_events()
        metadata = event.event_specific_data.materialization.metadata
        assert len(lines) == metadata["batches"].value  # several batches: a log line each
        return metadata

    def group_offset() -> int:
        """The consumer group's committed offset (committed once per run, for Kafka lag tools)."""
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
        try:
            (committed,) = consumer.committed([TopicPartition("dbserver1.inventory.products", 0)], timeout=10)
            return committed.offset
        finally:
            consumer.close()

    first = run()  # 16 records: two batches of 5, one commit each, then the run stops behind
    assert first["batches"].value == 2 and first["events_read"].value == 10 and not first["caught_up"].value
    assert first["offsets"].value == {"0": {"from": 0, "to": 10, "high_watermark": 16}}
    assert first["delta_version"].value == DeltaTable(path).version() == 2
    assert group_offset() == 10
    rest = run({"ops": {products.node_def.name: {"config": {"max_batches_per_run": 10}}}})
    assert rest["batches"].value == 2 and rest["events_read"].value == 6 and rest["caught_up"].value
    assert rest["offsets"].value == {"0": {"from": 10, "to": 16, "high_watermark": 16}}
    assert group_offset() == 16
    assert DeltaTable(path).count() == 10  # as one batch leaves it (test above: 10 rows inserted)


def test_a_table_that_fails_to_merge_stops_neither_the_other_tables_of_its_connector_nor_their_checks(
        spark, broker, tmp_path):
    # The tables of a connector share one op: an error stopping one of them (here an event it cannot read)
    # must not hold back the others.
    sample_published(broker)
    broken = f"broken_{uuid.uuid4().hex[:8]}"
    topic = new_topic_named(broker, f"dbserver1.inventory.{broken}")
    produce(broker, topic, [(b'{"id": 1}', b"not json")])
    config = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path).replace(
        "      - name: inventory.customers\n", f"      - name: inventory.customers\n      - name: inventory.{broken}\n")
    defs = build_definitions(parse_config(config))
    broken_key = AssetKey(["dbserver1", "inventory", broken])
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(
            instance=instance, asset_selection=[broken_key, KEYS[0]], raise_on_error=False)
    assert not result.success
    assert {e.asset_key for e in result.get_asset_materialization_events()} == {KEYS[0]}
    evaluated = {(e.asset_key, e.check_name) for e in result.get_asset_check_evaluations()}
    assert (KEYS[0], "primary_key") in evaluated
    assert not any(key == broken_key for key, _ in evaluated)
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error.cause  # the table's own error, under Dagster's step error
    assert error is not None and topic in error.message


class BronzeTranslator(CdcTranslator):
    """A user's translator: every asset under ``bronze``, groups prefixed ``cdc_``."""

    def get_asset_key(self, table: CapturedTable) -> AssetKey:
        return AssetKey(["bronze", *super().get_asset_key(table).path])

    def get_group_name(self, table: CapturedTable) -> str:
        return f"cdc_{super().get_group_name(table)}"


def test_a_subclassed_translator_renames_assets_checks_sensor_requests_and_runs_at_once(spark, broker, tmp_path):
    sample_published(broker)
    prefix = f"tr{uuid.uuid4().hex[:8]}"
    new_topic_named(broker, prefix)  # the connector's schema-change topic
    new_topic_named(broker, f"{prefix}.transaction")
    produce(broker, prefix, [(b'{"databaseName": "TESTDB"}', schema_change("CREATE", COLUMNS))])
    tx = {"id": "00000025:00000d98:00a2", "ts_ms": 0, "event_count": None, "data_collections": None}
    produce(broker, f"{prefix}.transaction", [
        (None, json.dumps({**tx, "status": "BEGIN"}).encode()),
        (None, json.dumps({**tx, "status": "END", "event_count": 1,
                           "data_collections": [{"data_collection": "DB2INST1.ORDERS", "event_count": 1}]}).encode())])
    config = CONFIG.format(bootstrap=broker.bootstrap_servers, root=tmp_path) + f"""\
  - name: db2
    kind: db2
    topic.prefix: {prefix}
    transaction_metadata: true
    signal: {{channel: kafka, topic: {prefix}.signals}}
    include: ['DB2INST1\\.CUST.*']
    tables: [{{name: DB2INST1.ORDERS}}]
"""
    defs = build_definitions(parse_config(config), translator=BronzeTranslator())
    renamed = [AssetKey(["bronze", *key.path]) for key in KEYS]
    orders = AssetKey(["bronze", prefix, "DB2INST1", "ORDERS"])
    graph = defs.resolve_asset_graph()
    tables = {*renamed, orders}
    assert set(graph.get_all_asset_keys()) == tables | {AssetKey(["kafka", *key.path]) for key in tables}
    assert {graph.get(key).group_name for key in graph.get_all_asset_keys()} == {"cdc_inventory", "cdc_sales",
                                                                                "cdc_db2"}
    assert {check.asset_key for check in graph.asset_check_keys} == {*renamed, orders}

    with DagsterInstance.ephemeral() as instance:
        def tick(name):
            return defs.resolve_sensor_def(name).evaluate_tick(build_sensor_context(instance=instance,
                                                                                    definitions=defs))
        [merge] = tick("db2_transaction_sensor").run_requests
        assert merge.asset_selection == [orders]
        # Each request names the checks its merge run evaluates (else Dagster adds the scheduled ones' ops too).
        key_checks = [AssetCheckKey(orders, "primary_key"), AssetCheckKey(orders, "transactions_reconciled")]
        assert merge.asset_check_keys == key_checks
        backfills = tick("snapshot_backfill_sensor").run_requests
        assert [(r.asset_selection, r.asset_check_keys) for r in backfills if r.asset_selection] == [
            ([orders], key_checks)]
        [create] = tick("schema_change_sensor").run_requests
        assert create.run_config["ops"]["apply_schema_change"]["config"]["asset_key"] == [
            "bronze", prefix, "DB2INST1", "CUSTOMERS"]

        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(
            instance=instance, asset_selection=renamed)
        assert result.success
        assert {e.asset_key for e in result.get_asset_materialization_events()} == set(renamed)


SIDE_BY_SIDE = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta: {{root: "{root}", writer: {writer}}}
batch: {{max_records: 3, poll_timeout_s: 10, concurrent_tables: 4}}
checks_after_merge: all
connectors:
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables:
{tables}
"""


def test_tables_merged_side_by_side_commit_their_own_offsets_and_dead_letters(spark, broker, writer, tmp_path):
    # Four tables merged at once, in batches of 3 (several commits each), each with a bad event: every
    # commit must carry its own table's offsets (delta-spark's txn settings live on the shared session)
    # and every bad event must reach the shared dead-letter table (one MERGE of it at a time).
    from cdc_assets.catalog import resolve_tables
    from cdc_assets.demo.events import encode_key, envelope, postgres_source
    from tests.support.merges import read_rows

    prefix = f"side{uuid.uuid4().hex[:8]}"
    names = [f"t{index}" for index in range(4)]
    topics = {}
    for index, name in enumerate(names):
        topic = topics[name] = new_topic_named(broker, f"{prefix}.s.{name}")
        records = [(encode_key({"id": key}),
                    envelope("c", None, {"id": key, "v": f"{name}-{key}"}, postgres_source(100 + key, 0, "s", name),
                             100 + key))
                   for key in range(4 + 2 * index)]
        produce(broker, topic, [*records[:2], (encode_key({"id": 99}), b"not json"), *records[2:]])
    tables = "\n".join(f"      - {{name: s.{name}, on_bad_event: dead_letter}}" for name in names)
    config = parse_config(SIDE_BY_SIDE.format(
        bootstrap=broker.bootstrap_servers, root=tmp_path, writer=writer.name, prefix=prefix, tables=tables))
    with DagsterInstance.ephemeral() as instance:
        # Its blocking primary_key checks fail the run if a table got a key twice.
        result = build_definitions(config).resolve_job_def("cdc_merge_job").execute_in_process(instance=instance)
        assert result.success
    # Each table's checks (all of them after the merge, as configured) see its own dead letter (the run
    # reads the dead-letter table once) and its keys.
    evaluations = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    materialized = {m.asset_key.path[-1]: m.materialization.metadata for m in result.get_asset_materialization_events()}
    for index, name in enumerate(names):
        assert evaluations[(name, "no_dead_letters")].metadata["dead_lettered_events"].value == 1, name
        assert not evaluations[(name, "no_dead_letters")].passed
        assert evaluations[(name, "primary_key")].metadata["rows"].value == 4 + 2 * index
        assert materialized[name]["key_columns"].value == ["id"]
    for index, table in enumerate(resolve_tables(config)):
        progress = writer.read_progress(table.target, table.app_id)
        assert progress is not None and progress.offsets == {0: 5 + 2 * index}, table.name
        assert read_rows(spark, writer, table) == {
            (key,): {"id": key, "v": f"{names[index]}-{key}"} for key in range(4 + 2 * index)}
    dead = DeltaTable(str(tmp_path / "_cdc_assets" / "dead_letter")).to_pyarrow_table().to_pylist()
    assert sorted((r["topic"], r["offset"]) for r in dead) == sorted((topics[name], 2) for name in names)
