"""The Delta writer seam: every writer gives the same contents and commit metadata."""

import json

import pytest

from cdc_assets.io.delta import DeltaTarget, DeltaWriterError, select_writer
from tests.support.delta import SCD1, batch, commit


def contents(spark, writer, path):
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    else:
        rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    return sorted((r["My Id"], r["name"], r["_cdc_position"]) for r in rows)


def test_merge_creates_applies_and_records_offsets_in_the_same_commit(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    outcome = writer.merge(target, batch(spark, (1, "a", "c", "01"), (2, "b", "c", "02")), ["My Id"],
                           commit(10, {0: 7, 1: 3}), SCD1)
    assert (outcome.inserted, outcome.updated, outcome.deleted) == (2, 0, 0)
    progress = writer.read_progress(target, "cdc_assets:t")
    assert progress.offsets == {0: 7, 1: 3}
    assert (progress.txn_version, progress.delta_version) == (10, outcome.delta_version)

    outcome = writer.merge(target, batch(spark, (1, "a2", "u", "03"), (2, None, "d", "04"), (3, "c", "c", "05")),
                           ["My Id"], commit(12, {0: 9, 1: 3}), SCD1)
    assert (outcome.inserted, outcome.updated, outcome.deleted) == (1, 1, 1)
    assert contents(spark, writer, target.path) == [(1, "a2", "03"), (3, "c", "05")]


def test_older_or_equal_positions_change_nothing(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    writer.merge(target, batch(spark, (1, "new", "u", "05")), ["My Id"], commit(1, {0: 1}), SCD1)
    writer.merge(target, batch(spark, (1, "old", "u", "04")), ["My Id"], commit(2, {0: 2}), SCD1)
    writer.merge(target, batch(spark, (1, "same position", "u", "05")), ["My Id"], commit(3, {0: 3}), SCD1)
    writer.merge(target, batch(spark, (1, None, "d", "03")), ["My Id"], commit(4, {0: 4}), SCD1)
    assert contents(spark, writer, target.path) == [(1, "new", "05")]
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 4}


def test_a_committed_txn_version_is_not_applied_twice(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    first = writer.merge(target, batch(spark, (1, "a", "c", "01")), ["My Id"], commit(5, {0: 5}), SCD1)
    again = writer.merge(target, batch(spark, (9, "z", "c", "09")), ["My Id"], commit(5, {0: 5}), SCD1)
    assert again.already_applied and again.delta_version == first.delta_version
    assert contents(spark, writer, target.path) == [(1, "a", "01")]


def test_offsets_only_commit_for_a_batch_of_tombstones(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    first = writer.merge(target, batch(spark, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    outcome = writer.commit_progress(target, commit(2, {0: 2}))
    assert outcome.delta_version == first.delta_version + 1
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 2}
    assert contents(spark, writer, target.path) == [(1, "a", "01")]


def test_commit_metadata_is_the_documented_json(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    writer.merge(target, batch(spark, (1, "a", "c", "01")), ["My Id"], commit(4, {2: 4}), SCD1)
    if writer.name == "delta-rs":
        from deltalake import DeltaTable

        latest = DeltaTable(target.path).history(1)[0]
    else:
        latest = spark.sql(f"DESCRIBE HISTORY delta.`{target.path}` LIMIT 1").first().asDict()
    assert json.loads(latest["userMetadata"]) == {
        "cdc_assets": {"app_id": "cdc_assets:t", "version": 4, "topic": "t", "offsets": {"2": 4},
                       "key_columns": [], "source_position": "01"}}


def test_a_writer_sees_the_commits_made_since_it_loaded_the_table(spark, writer, tmp_path):
    target = DeltaTarget(str(tmp_path / "t"))
    writer.merge(target, batch(spark, (1, "a", "c", "01")), ["My Id"], commit(1, {0: 1}), SCD1)
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 1}
    other = select_writer(writer.name, spark)  # another run's
    other.merge(target, batch(spark, (2, "b", "c", "02")), ["My Id"], commit(2, {0: 2}), SCD1)
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 2}
    assert writer.merge(target, batch(spark, (2, "b", "c", "02")), ["My Id"], commit(2, {0: 2}), SCD1).already_applied
    assert contents(spark, writer, target.path) == [(1, "a", "01"), (2, "b", "02")]


def test_tables_are_checkpointed_every_10_commits(spark, writer, tmp_path):
    """delta-spark's default interval, and the one delta-rs gets (``NEW_TABLE_PROPERTIES``; its own is 100): a
    load of the table replays at most 10 JSON commits."""
    target = DeltaTarget(str(tmp_path / "t"))
    for n in range(1, 13):
        writer.merge(target, batch(spark, (n, "a", "c", f"{n:02d}")), ["My Id"], commit(n, {0: n}), SCD1)
    last = json.loads((tmp_path / "t" / "_delta_log" / "_last_checkpoint").read_text())
    assert 9 <= last["version"] <= 12  # delta-rs checkpoints its tenth commit, delta-spark version 10
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 12}


def test_the_local_logs_history_is_what_describe_history_gives(spark, tmp_path):
    """A table both writers committed to (delta-rs first: delta-spark then maps its column names, which delta-rs
    does not evolve), past a checkpoint and a compaction: its log's files give the versions
    and commit metadata Spark's ``DESCRIBE HISTORY`` gives, whole and newest-first limited (what the delta-spark
    writer reads its progress from on a disk it shares with its server)."""
    from cdc_assets.io.delta.log_files import local_log_dir, logged_history

    target = DeltaTarget(str(tmp_path / "t"))
    for n in range(1, 13):
        name = "delta-rs" if n < 5 else "delta-spark"
        select_writer(name, spark).merge(target, batch(spark, (n, "a", "c", f"{n:02d}")), ["My Id"],
                                         commit(n, {0: n}), SCD1)
    select_writer("delta-spark", spark).compact(target, min_files=2)
    log_dir = local_log_dir(f"file://{target.path}")
    assert log_dir == local_log_dir(target.path) == tmp_path / "t" / "_delta_log"
    assert local_log_dir("s3://bucket/t") is None
    for limit in (None, 1, 5):
        suffix = f" LIMIT {limit}" if limit else ""
        described = [(row["version"], row["userMetadata"])
                     for row in spark.sql(f"DESCRIBE HISTORY delta.`{target.path}`{suffix}").collect()]
        logged = [(entry["version"], entry.get("userMetadata")) for entry in logged_history(log_dir, limit) or []]
        assert logged == described
    assert len(described) == 5 and described[0][0] >= 12
    assert logged_history(tmp_path / "none" / "_delta_log", None) is None


def test_auto_takes_delta_rs_on_local_spark_even_with_delta(spark):
    from cdc_assets.io.spark import has_delta

    assert has_delta(spark)  # the embedded default has the jars scripts/setup fetched
    assert select_writer("auto", spark).name == "delta-rs"
    assert select_writer("delta-spark", spark).name == "delta-spark"


def test_delta_spark_without_delta_in_the_session_is_a_clear_error(monkeypatch):
    from cdc_assets.io.spark import DELTA_JARS_ENV_VAR, spark_config
    from cdc_assets.io.spark_server import connect, disconnect, ensure_local_server

    monkeypatch.setenv(DELTA_JARS_ENV_VAR, "")  # set and empty: no Delta jars
    settings = spark_config()
    assert "spark.jars" not in settings and "spark.driver.extraClassPath" not in settings
    session = connect(ensure_local_server(settings, idle_timeout_s=30))
    try:
        with pytest.raises(DeltaWriterError, match="needs a Spark session with Delta"):
            select_writer("delta-spark", session)
        assert select_writer("auto", session).name == "delta-rs"
    finally:
        disconnect(session)


def test_delta_spark_with_deletion_vectors_marks_rows_instead_of_rewriting_files(spark, tmp_path):
    writer = select_writer("delta-spark", spark, deletion_vectors=True)
    target = DeltaTarget(str(tmp_path / "t"))
    writer.merge(target, batch(spark, *[(k, f"v{k}", "c", f"{k:02d}") for k in range(10)]), ["My Id"],
                 commit(1, {0: 10}), SCD1)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{target.path}`").first()
    assert detail["properties"].get("delta.enableDeletionVectors") == "true"
    outcome = writer.merge(target, batch(spark, (1, "v1b", "u", "20"), (2, None, "d", "21"), (10, "v10", "c", "22")),
                           ["My Id"], commit(2, {0: 13}), SCD1)
    assert (outcome.inserted, outcome.updated, outcome.deleted) == (1, 1, 1)
    expected = sorted([(k, f"v{k}", f"{k:02d}") for k in range(10) if k not in (1, 2)]
                      + [(1, "v1b", "20"), (10, "v10", "22")])
    assert contents(spark, writer, target.path) == expected
    log = (tmp_path / "t" / "_delta_log" / f"{outcome.delta_version:020d}.json").read_text()
    assert "deletionVector" in log  # the changed rows were marked, not their file rewritten
    assert writer.read_progress(target, "cdc_assets:t").offsets == {0: 13}
