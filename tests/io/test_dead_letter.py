"""The dead-letter table as a merge run's checks read it: once for all their tables, again after a commit."""

from datetime import datetime, timezone

import pyarrow as pa
from deltalake import DeltaTable

from cdc_assets.checks import RunReads
from cdc_assets.core.envelope import undecodable_value
from cdc_assets.core.fold import BadEvent
from cdc_assets.io.dead_letter import DEAD_LETTER_SCHEMA, dead_letter_rows, write_dead_letters
from cdc_assets.io.delta import DeltaTarget
from cdc_assets.resources import DeltaResource


def _rows(*coordinates: tuple[str, int]) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([
        {"topic": topic, "partition": 0, "offset": offset, "key": b"k", "value": b"not json", "error": "bad",
         "table": topic.rsplit(".", 1)[-1], "dead_lettered_at": now} for topic, offset in coordinates],
        schema=DEAD_LETTER_SCHEMA)


def test_run_reads_count_dead_letters_per_topic_and_see_later_commits(tmp_path):
    # A run's checks share one read; a table merged after the first check may add dead letters, and its
    # own check must count them.
    target = DeltaTarget(str(tmp_path / "dead_letter"))
    reads = RunReads(DeltaResource(root=str(tmp_path), writer="delta-rs"))
    assert reads.dead_letters(target) == {}
    write_dead_letters(target, _rows(("p.s.a", 0)))
    assert reads.dead_letters(target) == {"p.s.a": 1}
    assert reads.dead_letters(target) == {"p.s.a": 1}  # unchanged: the counts of the first read
    write_dead_letters(target, _rows(("p.s.b", 4), ("p.s.a", 7)))
    assert reads.dead_letters(target) == {"p.s.a": 2, "p.s.b": 1}


def test_a_record_a_format_could_not_read_is_dead_lettered_as_it_was_in_kafka(tmp_path):
    """A record the Avro rule could not read reaches the fold as a bad event standing in for it; its dead letter
    keeps the key and value bytes as they were in Kafka (to replay once the cause is fixed) and the reason."""
    wire_key, wire_value = b"\x00\x00\x00\x00\x07\x0e", b"\x00\x00\x0f\x12\x06\x02"
    stand_in = undecodable_value("Avro value of p.s.a[1] at offset 8: schema id 987654 is unknown", wire_key,
                                 wire_value)
    events = pa.table({"partition": pa.array([1, 1], pa.int32()), "offset": pa.array([7, 8], pa.int64()),
                       "key": pa.array([b'{"id":1}', stand_in], pa.binary()),
                       "value": pa.array([b'{"op":"x"}', stand_in], pa.binary())})
    rows = dead_letter_rows("p.s.a", "a", events, [BadEvent(offset=7, partition=1, reason="unknown op 'x'"),
                                                   BadEvent(offset=8, partition=1, reason="no op")])
    assert rows.select(["offset", "key", "value", "error"]).to_pylist() == [
        {"offset": 7, "key": b'{"id":1}', "value": b'{"op":"x"}', "error": "unknown op 'x'"},
        {"offset": 8, "key": wire_key, "value": wire_value,
         "error": "Avro value of p.s.a[1] at offset 8: schema id 987654 is unknown"}]
    write_dead_letters(DeltaTarget(str(tmp_path / "dead_letter")), rows)
    stored = DeltaTable(str(tmp_path / "dead_letter")).to_pyarrow_table().sort_by("offset")
    assert stored.select(["key", "value"]).to_pylist()[1] == {"key": wire_key, "value": wire_value}
