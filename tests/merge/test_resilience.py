"""Broker outages, secrets kept out of logs and metadata, and crash safety under SIGKILL."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.config import BatchLimits
from cdc_assets.demo.broker import ApacheKafkaBroker, free_port
from cdc_assets.io.kafka import KafkaSource, SourceError
from cdc_assets.merge import merge_micro_batch
from tests.support.merges import captured_table, race_after_fold, read_rows
from tests.support.samples import events
from tests.support.topics import new_topic, produce

ROOT = Path(__file__).resolve().parents[2]


def test_broker_down_fails_clearly_moves_nothing_and_resumes_exactly(spark, writer, tmp_path):
    data_dir, port = tmp_path / "broker", free_port()
    broker = ApacheKafkaBroker(data_dir, port).start()
    try:
        topic = new_topic(broker, "outage.s.t")
        produce(broker, topic, events(0, 10))
        table = captured_table(topic, tmp_path / "delta")
        source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "outage"}, retries=2,
                             backoff_s=0.2)
        limits = BatchLimits(poll_timeout_s=5)
        merge_micro_batch(spark, source, writer, table, limits)
        source.close()
        before = writer.read_progress(table.target, table.app_id)
        broker.stop()
        # The next run (a new consumer, as each Dagster run has) finds the broker down.
        source = KafkaSource({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "outage"}, retries=2,
                             backoff_s=0.2)
        with pytest.raises(SourceError, match=rf"cannot reach Kafka at 127\.0\.0\.1:{port}"):
            merge_micro_batch(spark, source, writer, table, limits)
        assert writer.read_progress(table.target, table.app_id) == before
        source.close()
        broker = ApacheKafkaBroker(data_dir, port).start()
        produce(broker, topic, events(10, 5))
        source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "outage"})
        report = merge_micro_batch(spark, source, writer, table, limits)
        source.close()
        assert report.raw.start_offsets == before.offsets and report.events_read == 5
        assert {k[0]: r["v"] for k, r in read_rows(spark, writer, table).items()} == {i: 10 + i for i in range(5)}
    finally:
        broker.stop()


def test_secrets_never_reach_run_logs_or_metadata(spark, broker, tmp_path, monkeypatch):
    from cdc_assets.config import parse_config
    from cdc_assets.definitions import build_definitions

    secret = "s3cr3t-Pa55word-for-the-test"
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", secret)
    monkeypatch.setenv("TEST_KAFKA_USER", "cdc")
    topic = new_topic(broker, "secretdb.s.t")
    produce(broker, topic, events(0, 5))
    config = parse_config(f"""\
kafka:
  bootstrap_servers: {broker.bootstrap_servers}
  security_protocol: PLAINTEXT
  sasl_username_env: TEST_KAFKA_USER
  sasl_password_env: TEST_KAFKA_PASSWORD
delta: {{root: "{tmp_path}"}}
connectors:
  - {{name: secretdb, kind: postgresql, topic.prefix: {topic.split('.')[0]}, tables: [{{name: s.t, topic: {topic}}}]}}
""")
    defs = build_definitions(config)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("cdc_merge_job").execute_in_process(instance=instance)
        assert result.success
        logs = [str(entry.dagster_event or entry.user_message) + entry.user_message
                for entry in instance.all_logs(result.run_id)]
        run = instance.get_run_by_id(result.run_id)
    assert logs and not any(secret in line for line in logs)
    assert secret not in json.dumps(run.run_config, default=str) and secret not in str(run.tags)
    metadata = [m.metadata for m in (e.event_specific_data.materialization
                                     for e in result.get_asset_materialization_events())]
    assert metadata and secret not in str(metadata)
    assert secret not in repr(defs.resources["kafka"])


CRASH_SCRIPT = ROOT / "benchmarks" / "crash_trials.py"


@pytest.mark.parametrize(("store", "trials", "events", "batch"), [("local", 3, 3000, 1000), ("s3", 2, 1500, 500)])
def test_sigkill_at_random_points_loses_and_duplicates_nothing(tmp_path, store, trials, events, batch):
    """The CI-sized run of benchmarks/crash_trials.py (20 trials there), on local disk and on S3 (a
    private S3-API server the script starts): random kills are timed from the worker's own progress,
    so at least one lands inside the work (a fold, a MERGE or a commit, or the read of a batch)."""
    run = subprocess.run([sys.executable, str(CRASH_SCRIPT), "--store", store, "--trials", str(trials),
                          "--events", str(events), "--batch", str(batch), "--work-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{trials} of {trials} trials passed" in run.stdout
    inside = re.search(r"^(\d+) of (\d+) random kills landed inside the work$", run.stdout, re.MULTILINE)
    assert inside and int(inside[1]) >= 1, run.stdout
    if store == "s3":
        assert "tables under s3://" in run.stdout


def test_two_concurrent_merges_of_one_table_never_commit_the_same_offsets(spark, broker, tmp_path):
    from deltalake import DeltaTable

    from cdc_assets.io.delta import DeltaRsWriter, DeltaWriterError

    topic = new_topic(broker, "conc.s.t")
    produce(broker, topic, events(0, 50, topic_key=lambda i: i))
    table = captured_table(topic, tmp_path)
    writer = DeltaRsWriter()
    source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "conc"})
    merge_micro_batch(spark, source, writer, table, BatchLimits())
    source.close()
    produce(broker, topic, events(50, 50, topic_key=lambda i: i % 50))

    outcomes: list[object] = []

    def run() -> None:
        source = KafkaSource({"bootstrap.servers": broker.bootstrap_servers, "group.id": "conc"})
        try:
            outcomes.append(merge_micro_batch(spark, source, writer, table, BatchLimits()).outcome)
        except DeltaWriterError as exc:
            outcomes.append(exc)
        finally:
            source.close()

    race_after_fold(run, timeout_s=120)
    errors = [o for o in outcomes if isinstance(o, DeltaWriterError)]
    applied = [o for o in outcomes if not isinstance(o, DeltaWriterError) and not o.already_applied]
    assert len(applied) == 1 and len(outcomes) == 2
    assert all("nothing of this batch was committed" in str(e) for e in errors)
    versions = [json.loads(h["userMetadata"])["cdc_assets"]["version"] for h in DeltaTable(table.target.path).history()
                if h.get("userMetadata")]
    assert sorted(versions) == sorted(set(versions)) == [50, 100]
    assert {k[0]: r["v"] for k, r in read_rows(spark, writer, table).items()} == {i: 50 + i for i in range(50)}
