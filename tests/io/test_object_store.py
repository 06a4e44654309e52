"""Delta tables on S3-compatible object storage, for both writers, against a real S3-API server (moto's,
``tests/support/objectstore.py``): the writer seam, the pipeline's own tables and ``cdc_merge_job`` end to end give
what they give on local disk. One server and one S3-enabled local Spark server serve the whole module."""

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_assets.config import ConfigError, parse_config
from cdc_assets.definitions import build_definitions
from cdc_assets.demo.events import encode_key, envelope, postgres_source
from cdc_assets.io.delta import DeltaRsWriter, DeltaSparkWriter, DeltaTarget, MergeOutcome
from cdc_assets.io.delta.table import open_table
from cdc_assets.io.registry import read_history, record_change
from cdc_assets.io.signals import SnapshotSignal, audit_signal
from cdc_assets.io.spark import extra_jars_dir, spark_config
from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server, running_servers
from cdc_assets.io.storage import StorageConfigError, delta_rs_options, spark_path, spark_settings
from cdc_assets.io.transactions import TransactionLog, ingest_transactions
from tests.support.delta import SCD1, batch, commit, table_rows, writer_named, writer_run
from tests.support.merges import race_after_fold
from tests.support.objectstore import ACCESS_KEY_ENV, SECRET_KEY_ENV, ObjectStore
from tests.support.samples import KEYS, sample_published
from tests.support.topics import new_topic, new_topic_named, produce
from tests.support.transactions import tx_event


@pytest.fixture(scope="module")
def s3_spark(object_store: ObjectStore) -> Iterator[SparkSession]:
    """A session on the local Spark server for an S3 root of the module's store: the settings a run with
    such a ``delta`` config gets (so the Dagster runs below share this server)."""
    session = connect(ensure_local_server(spark_config(delta_root="s3://any/cdc",
                                                       storage_options=object_store.storage_options())))
    yield session
    disconnect(session)


@pytest.fixture
def bucket(object_store: ObjectStore) -> str:
    """A fresh bucket of the module's store."""
    return object_store.create_bucket(f"lake-{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["delta-rs", "delta-spark"])
def s3_writer(request: pytest.FixtureRequest) -> str:
    return request.param


def test_the_writer_suite_on_s3_gives_what_it_gives_on_local_disk(s3_spark, object_store, bucket, s3_writer,
                                                                  tmp_path):
    writer = writer_named(s3_writer, s3_spark)
    on_s3 = writer_run(s3_spark, writer, DeltaTarget(f"s3://{bucket}/t", object_store.storage_options()))
    on_disk = writer_run(s3_spark, writer, DeltaTarget(str(tmp_path / "t")))
    assert on_s3 == on_disk
    assert on_s3[-1] == [(1, "a2", "u", "03", None), (3, "c", "c", "05", None)]
    assert on_s3[2][3]  # the repeated batch was recognised, not applied
    log = object_store.keys(bucket, "t/_delta_log/")
    assert [key for key in log if key.endswith(".json")] == [f"t/_delta_log/{v:020d}.json" for v in range(4)]


def test_both_writers_read_each_others_tables_on_s3(s3_spark, object_store, bucket):
    # One config, two writers: a table delta-rs made is merged by delta-spark, and the other way round.
    options = object_store.storage_options()
    target = DeltaTarget(f"s3://{bucket}/shared", options)
    rs, spark_writer = DeltaRsWriter(), DeltaSparkWriter(s3_spark)
    rs.merge(target, batch(s3_spark, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    spark_writer.merge(target, batch(s3_spark, (2, "b", "c", "02")), ["My Id"], commit(2, {0: 2}), SCD1)
    assert rs.read_progress(target, "cdc_assets:t").offsets == {0: 2}
    # delta-rs gives the history Spark does (the delta-spark writer reads it through delta-rs on a store).
    described = [(row["version"], row["userMetadata"])
                 for row in s3_spark.sql(f"DESCRIBE HISTORY delta.`{spark_path(target.path)}`").collect()]
    table = open_table(target)
    assert table is not None
    assert [(entry["version"], entry.get("userMetadata")) for entry in table.history()] == described
    assert spark_writer.read_progress(target, "cdc_assets:t").offsets == {0: 2}
    assert table_rows(s3_spark, rs, target) == table_rows(s3_spark, spark_writer, target) == [
        (1, "a", "c", "01", None), (2, "b", "c", "02", None)]
    # The server's JVM read the S3 connector where set-up put it: no copy in its temporary directory (672 MB with
    # the AWS SDK bundle), which a killed JVM leaves behind (``jar_settings``).
    jars = [f.path for f in _s3_server_jvm(object_store).open_files() if f.path.endswith(".jar")]
    assert any(Path(jar).parent == extra_jars_dir("s3") and "bundle-" in jar for jar in jars), jars
    assert not any("/userFiles-" in jar for jar in jars), jars


def _s3_server_jvm(store: ObjectStore) -> psutil.Process:
    """The JVM of the local Spark server for ``store`` (``s3_spark``'s): the child of its supervisor."""
    (state,) = [state for _, state in running_servers()
                if state["settings"].get("spark.hadoop.fs.s3a.endpoint") == store.endpoint]
    (jvm,) = psutil.Process(state["pid"]).children()
    return jvm


def test_a_delta_rs_commit_prepared_before_another_reached_the_table_is_refused(object_store, bucket):
    # Two runs of one table: the later commit was prepared on the version before the other's. The store's
    # put-if-absent (If-None-Match) refuses it, so one version is never committed twice and nothing is lost.
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    from cdc_assets.io.delta import commit_properties

    target = DeltaTarget(f"s3://{bucket}/t", object_store.storage_options())
    options = delta_rs_options(target.storage_options)
    writer = DeltaRsWriter()
    writer.merge(target, batch(None, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    prepared = DeltaTable(target.path, storage_options=options)
    writer.merge(target, batch(None, (2, "b", "c", "02")), ["My Id"], commit(2, {0: 2}), SCD1)
    with pytest.raises(CommitFailedError):
        write_deltalake(prepared, batch(None, (3, "c", "c", "03")), mode="append",
                        commit_properties=commit_properties(commit(3, {0: 3})))
    table = DeltaTable(target.path, storage_options=options)
    assert [json.loads(entry["userMetadata"])["cdc_assets"]["version"] for entry in table.history()
            if "userMetadata" in entry] == [2, 1]
    assert sorted(row["My Id"] for row in table.to_pyarrow_table().to_pylist()) == [1, 2]


def test_wrong_keys_are_refused_by_the_store(object_store, bucket, monkeypatch):
    # The server checks signatures: a writer given other keys than the store's fails, so the tests
    # above show that the keys named by environment variable reach the store.
    target = DeltaTarget(f"s3://{bucket}/t", object_store.storage_options())
    monkeypatch.setenv(SECRET_KEY_ENV, "not-the-secret")
    with pytest.raises(Exception, match=r"(?i)privileges|signature|forbidden|403"):
        DeltaRsWriter().merge(target, batch(None, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    monkeypatch.delenv(SECRET_KEY_ENV)
    with pytest.raises(StorageConfigError, match=f"secret_access_key_env: environment variable {SECRET_KEY_ENV} "
                                                 "is not set"):
        DeltaRsWriter().read_progress(target, "cdc_assets:t")


def test_the_pipelines_own_tables_live_under_an_s3_root(broker, object_store, bucket):
    root, options = f"s3://{bucket}/cdc", object_store.storage_options()
    columns = T.StructType([T.StructField("id", T.LongType())])
    registry = f"{root}/_cdc_assets/schema_registry"
    for change, offset in (("CREATE", 4), ("ALTER", 9)):
        record_change(registry, options, connector="c", table="s.t", change=change, primary_keys=("id",),
                      columns=columns, source_position="00", topic="c.schema", partition=0, offset=offset,
                      run_id="r")
    assert [entry.change for entry in read_history(registry, options)[("c", "s.t")]] == ["CREATE", "ALTER"]

    audit = f"{root}/_cdc_assets/signals"
    sent = audit_signal(audit, options, SnapshotSignal("sig-1", "execute-snapshot", ("s.t",)), "kafka", "c", "r")
    stored = DeltaTable(audit, storage_options=delta_rs_options(options)).to_pyarrow_table().to_pylist()
    assert [(row["id"], row["payload"]) for row in stored] == [(sent["id"], sent["payload"])]

    tx_topic = new_topic_named(broker, f"{new_topic(broker, 'txs3').replace('.', '_')}.transaction")
    end = tx_event("END", "581", {"s.a": 2})
    produce(broker, tx_topic, [tx_event("BEGIN", "581"), end])
    log = TransactionLog(tx_topic, DeltaTarget(f"{root}/_cdc_assets/transactions/{tx_topic}", options), "postgresql")
    from cdc_assets.io.kafka import KafkaSource

    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdc-tests"})
    try:
        assert ingest_transactions(source, log) == 2
        assert ingest_transactions(source, log) == 0  # recorded once: the log's own offsets say so
    finally:
        source.close()
    commit_lsn = int(json.loads(end[1])["id"].split(":")[1])  # the END's place in commit order
    assert [(position, collections) for position, _, collections in log.ends_after(-1)] == [(commit_lsn, {"s.a": 2})]
    assert object_store.keys(bucket, "cdc/_cdc_assets/transactions/")  # on the store, not on local disk


JOB_CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
delta:
  root: "s3://{bucket}/cdc"
  writer: {writer}
  storage_options: {options}
connectors:
  - name: inventory
    kind: postgresql
    topic.prefix: dbserver1
    tables: [{{name: inventory.products}}, {{name: inventory.customers}}]
  - name: sales
    kind: sqlserver
    topic.prefix: server1
    tables: [{{name: dbo.orders}}]
  - name: shop
    kind: postgresql
    topic.prefix: {prefix}
    tables: [{{name: s.t, on_bad_event: dead_letter}}]
"""


@pytest.mark.parametrize("writer_name", ["auto", "delta-spark"])
def test_merge_job_end_to_end_on_s3(s3_spark, broker, object_store, bucket, writer_name):
    sample_published(broker)
    prefix = f"shop{uuid.uuid4().hex[:8]}"
    topic = new_topic_named(broker, f"{prefix}.s.t")
    produce(broker, topic, [(encode_key({"id": key}), envelope("c", None, {"id": key, "v": f"v{key}"},
                                                               postgres_source(100 + key, 0, "s", "t"), 100 + key))
                            for key in range(3)] + [(encode_key({"id": 99}), b"not json")])
    options = object_store.storage_options()
    config = parse_config(JOB_CONFIG.format(bootstrap=broker.bootstrap_servers, bucket=bucket, writer=writer_name,
                                            options=json.dumps(options), prefix=prefix))
    defs = build_definitions(config)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance)
    assert result.success
    metadata = {m.asset_key: m.materialization.metadata for m in result.get_asset_materialization_events()}
    products = metadata[KEYS[0]]
    assert products["rows_inserted"].value == 10 and products["tombstones_skipped"].value == 1
    assert products["events_read"].value == 16 and products["delta_version"].value == 1
    assert products["offsets"].value == {"0": {"from": 0, "to": 16, "high_watermark": 16}}

    read = delta_rs_options(options)
    orders = DeltaTable(f"s3://{bucket}/cdc/server1/dbo/orders", storage_options=read).to_pyarrow_table().to_pylist()
    assert sorted(row["id"] for row in orders) == [10001, 10003, 10004, 10005]  # 10002 became 10005
    assert next(row for row in orders if row["id"] == 10001)["quantity"] == 9
    shop = DeltaTable(f"s3://{bucket}/cdc/{prefix}/s/t", storage_options=read).to_pyarrow_table().to_pylist()
    assert sorted((row["id"], row["v"]) for row in shop) == [(0, "v0"), (1, "v1"), (2, "v2")]
    dead = DeltaTable(f"s3://{bucket}/cdc/_cdc_assets/dead_letter", storage_options=read).to_pyarrow_table()
    assert [(row["topic"], row["offset"]) for row in dead.to_pylist()] == [(topic, 3)]
    history = DeltaTable(f"s3://{bucket}/cdc/server1/dbo/orders", storage_options=read).history(1)[0]
    ends = {partition: read["to"] for partition, read in metadata[KEYS[2]]["offsets"].value.items()}
    assert json.loads(history["userMetadata"])["cdc_assets"]["offsets"] == ends
    # The writer asked for made the commit: Spark names itself in engineInfo, delta-rs in clientVersion.
    committer = history.get("engineInfo", "") if writer_name == "delta-spark" else history.get("clientVersion", "")
    assert ("Spark" if writer_name == "delta-spark" else "delta-rs") in committer, history


def test_storage_config_is_refused_at_load_naming_the_field():
    def load(delta: str) -> None:
        parse_config(f"kafka: {{bootstrap_servers: x}}\ndelta: {delta}\n"
                     "connectors: [{name: c, kind: postgresql, topic.prefix: p, tables: [{name: s.t}]}]\n", "p.yaml")

    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.secret_access_key carries a secret")):
        load("{root: 's3://lake/cdc', storage_options: {access_key_id_env: A, secret_access_key: inline}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.secret_access_key_env is missing")):
        load(f"{{root: 's3://lake/cdc', storage_options: {{access_key_id_env: {ACCESS_KEY_ENV}}}}}")
    with pytest.raises(ConfigError, match="an ADLS root needs a credential"):
        load("{root: 'abfss://c@acct.dfs.core.windows.net/cdc'}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.account_name is missing")):
        load("{root: 'abfss://c/cdc', storage_options: {account_key_env: K}}")
    with pytest.raises(ConfigError, match=re.escape("delta.storage_options.tenant_id is missing")):
        load("{root: 'abfss://c@acct.dfs.core.windows.net/cdc', "
             "storage_options: {client_secret_env: S, client_id: i}}")
    load("{root: 'gs://bucket/cdc', storage_options: {service_account_path: /etc/key.json}}")
    # Options of how commits reach S3 that delta-rs 1.x ignores, or that would leave it no safe commit.
    for option in ("AWS_S3_LOCKING_PROVIDER: dynamodb", "aws_s3_allow_unsafe_rename: 'true'",
                   "conditional_put: disabled"):
        with pytest.raises(ConfigError, match=re.escape(f"delta.storage_options.{option.split(':')[0]}: ")
                           + ".*Commits to S3 are conditional puts"):
            load(f"{{root: 's3://lake/cdc', storage_options: {{{option}}}}}")
    load("{root: 's3://lake/cdc', storage_options: {conditional_put: etag}}")


def test_azure_and_gcs_settings_for_spark_name_secrets_by_environment_variable_only():
    abfss = spark_settings("abfss://c@acct.dfs.core.windows.net/cdc", {"account_key_env": "AZ_KEY"})
    assert abfss == {"spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "${env.AZ_KEY}"}
    oauth = spark_settings("abfss://c@acct.dfs.core.windows.net/cdc",
                           {"client_id": "app", "tenant_id": "ten", "client_secret_env": "AZ_SECRET"},
                           session_level=True)
    host = "acct.dfs.core.windows.net"
    assert oauth[f"fs.azure.account.oauth2.client.secret.{host}"] == "${env.AZ_SECRET}"
    assert oauth[f"fs.azure.account.oauth2.client.endpoint.{host}"] == \
        "https://login.microsoftonline.com/ten/oauth2/token"
    gcs = spark_settings("gs://bucket/cdc", {"service_account_path": "/etc/key.json"})
    assert gcs["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == "/etc/key.json"
    assert spark_settings("/tmp/lake", {}) == {} and spark_path("s3://b/t") == "s3a://b/t"


def test_only_sessions_for_an_s3_root_get_the_s3_connector_and_its_settings(object_store):
    options = object_store.storage_options()
    local_disk, on_s3 = spark_config(delta_root="/tmp/lake"), spark_config(delta_root="s3://b/cdc",
                                                                           storage_options=options)
    classpath = "spark.driver.extraClassPath"  # a local JVM runs the executors: no copies (``jar_settings``)
    assert "hadoop-aws" not in local_disk[classpath] and not any("s3a" in key for key in local_disk)
    assert "hadoop-aws-" in on_s3[classpath] and "bundle-" in on_s3[classpath] and "spark.jars" not in on_s3
    on_cluster = spark_config(master="spark://h:7077", delta_root="s3://b/cdc", storage_options=options)
    assert "hadoop-aws-" in on_cluster["spark.jars"] and classpath not in on_cluster  # shipped to its executors
    assert on_s3["spark.hadoop.fs.s3a.endpoint"] == object_store.endpoint
    assert on_s3["spark.hadoop.fs.s3a.access.key"] == "${env." + ACCESS_KEY_ENV + "}"
    assert object_store.secret_key not in json.dumps(on_s3)  # names only, never a secret
    # A remote Spark Connect server brings its own jars, and takes the settings per session.
    remote = spark_config(remote="sc://spark:15002", delta_root="s3://b/cdc", storage_options=options)
    assert "spark.jars" not in remote and remote["fs.s3a.path.style.access"] == "true"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "storage.md"


def test_the_storage_docs_configs_load_and_the_s3_one_works_as_written(object_store, monkeypatch):
    # Every config block of docs/storage.md loads; the S3 one, pointed at this store by the variables it
    # reads, commits a batch to s3://lake/cdc as written.
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert len(blocks) == 3
    monkeypatch.setenv("S3_ENDPOINT", object_store.endpoint)
    monkeypatch.setenv("S3_ACCESS_KEY_ID", object_store.access_key)
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", object_store.secret_key)
    configs = [parse_config(block, "docs/storage.md") for block in blocks]
    s3 = configs[0].delta
    assert s3.root == "s3://lake/cdc"
    object_store.create_bucket("lake")
    target = DeltaTarget(f"{s3.root}/t", s3.storage_options)
    DeltaRsWriter().merge(target, batch(None, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    assert DeltaRsWriter().read_progress(target, "cdc_assets:t").offsets == {0: 1}
    assert spark_settings(s3.root, s3.storage_options)["spark.hadoop.fs.s3a.secret.key"] == \
        "${env.S3_SECRET_ACCESS_KEY}"


def test_two_delta_spark_runs_of_one_process_racing_on_s3_commit_a_batch_once(s3_spark, broker, object_store,
                                                                             bucket):
    # Two runs in one process (threads, each with its own session) fold the same batch of one table on S3, then
    # commit at once: their commits take turns (one session's txn settings at a time), and Delta skips the
    # later MERGE, whose app transaction version the table already holds: it reports the batch applied, so
    # no offsets are committed twice and the table is the fold of every event. (Runs in processes of their
    # own race below, on both writers.)

    from cdc_assets.catalog import CapturedTable
    from cdc_assets.config import BatchLimits
    from cdc_assets.io.kafka import KafkaSource
    from cdc_assets.merge import merge_micro_batch
    from tests.support.samples import events

    topic = new_topic(broker, "races3.s.t")
    produce(broker, topic, events(0, 50, topic_key=lambda i: i))
    options = object_store.storage_options()
    table = CapturedTable(connector="test", kind="postgresql", topic_prefix=topic.split(".")[0], name="s.t",
                          topic=topic, target=DeltaTarget(f"s3://{bucket}/t", options))
    server = ensure_local_server(spark_config(delta_root="s3://any/cdc", storage_options=options))

    def run() -> MergeOutcome:
        session = connect(server)
        source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "races3"})
        try:
            writer = writer_named("delta-spark", session)
            return merge_micro_batch(session, source, writer, table, BatchLimits()).outcome
        finally:
            source.close()
            disconnect(session)

    run()
    produce(broker, topic, events(50, 50, topic_key=lambda i: i % 50))
    outcomes: list[MergeOutcome] = []
    race_after_fold(lambda: outcomes.append(run()))
    assert sorted(outcome.already_applied for outcome in outcomes) == [False, True], outcomes
    delta = DeltaTable(table.target.path, storage_options=delta_rs_options(table.target.storage_options))
    versions = [json.loads(entry["userMetadata"])["cdc_assets"]["version"] for entry in reversed(delta.history())
                if entry.get("userMetadata")]
    assert versions == [50, 100]  # each batch's offsets committed once, in order
    rows = delta.to_pyarrow_table(columns=["id", "v"]).to_pylist()
    assert sorted((row["id"], row["v"]) for row in rows) == [(i, 50 + i) for i in range(50)]


RACE_WORKER = Path(__file__).resolve().parents[1] / "support" / "race_worker.py"


@pytest.mark.parametrize("writer_name", ["delta-rs", "delta-spark"])
def test_two_run_processes_racing_on_s3_commit_a_batch_once(s3_spark, broker, object_store, bucket, writer_name,
                                                            tmp_path):
    # As two Dagster runs: two processes, each with its own session on the one local Spark server (delta-spark
    # commits through its JVM), fold the same batch and commit at once.
    import subprocess
    import sys

    from tests.support.samples import events

    topic = new_topic(broker, "raceproc.s.t")
    produce(broker, topic, events(0, 50, topic_key=lambda i: i))
    options = object_store.storage_options()
    server = ensure_local_server(spark_config(delta_root="s3://any/cdc", storage_options=options))
    path = f"s3://{bucket}/t"

    def race(barrier: Path, racers: int) -> list[dict]:
        barrier.mkdir()
        command = [sys.executable, str(RACE_WORKER), "--bootstrap", broker.bootstrap_servers, "--topic", topic,
                   "--path", path, "--storage-options", json.dumps(options), "--writer", writer_name,
                   "--spark", server, "--barrier", str(barrier), "--racers", str(racers)]
        runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(racers)]
        outputs = [run.communicate(timeout=600) for run in runs]
        failures = [[line[:500] for line in err.splitlines() if "Error" in line or "Exception" in line][-3:]
                    for _, err in outputs]
        assert all(run.returncode == 0 for run in runs), failures
        return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    assert race(tmp_path / "first", 1) == [{"applied": True, "already_applied": False}]
    produce(broker, topic, events(50, 50, topic_key=lambda i: i % 50))
    outcomes = race(tmp_path / "second", 2)
    assert sum(o.get("applied", False) for o in outcomes) == 1, outcomes
    assert all(o.get("already_applied") or "nothing of this batch was committed" in o.get("error", "")
               for o in outcomes if not o.get("applied")), outcomes
    delta = DeltaTable(path, storage_options=delta_rs_options(options))
    versions = [json.loads(entry["userMetadata"])["cdc_assets"]["version"] for entry in reversed(delta.history())
                if entry.get("userMetadata")]
    assert versions == [50, 100]
    rows = delta.to_pyarrow_table(columns=["id", "v"]).to_pylist()
    assert sorted((row["id"], row["v"]) for row in rows) == [(i, 50 + i) for i in range(50)]


CRASH_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "crash_trials.py"


def test_crash_trials_on_s3_with_delta_spark_lose_and_duplicate_nothing(s3_spark, object_store, bucket, tmp_path):
    # benchmarks/crash_trials.py's S3 leg on delta-spark (tests/merge/test_resilience.py runs delta-rs's): SIGKILL at
    # named points and at random moments timed from the worker's progress, a rerun, the table checked against the
    # reference fold. The MERGE runs in the local Spark server, which outlives the killed worker: the module's,
    # already warm, since the trials' tables live on the module's store.
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(CRASH_SCRIPT), "--store", "s3", "--writer", "delta-spark",
                          "--s3-root", f"s3://{bucket}", "--s3-options", json.dumps(object_store.storage_options()),
                          "--trials", "2", "--events", "1500", "--batch", "500", "--work-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "tables under s3://" in run.stdout and "writer delta-spark" in run.stdout
    assert "2 of 2 trials passed" in run.stdout
    inside = re.search(r"^(\d+) of (\d+) random kills landed inside the work$", run.stdout, re.MULTILINE)
    assert inside and int(inside[1]) >= 1, run.stdout
