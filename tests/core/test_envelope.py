"""Decoding envelopes and keys, with and without the schema/payload wrapper, and bad events."""

import json

import pyarrow as pa
import pytest

from cdc_assets.core import decode_change_events, derive_layout, fold_batch
from cdc_assets.core.envelope import undecodable_value, value_type
from cdc_assets.core.layout import LayoutError
from cdc_assets.demo.events import encode_key, envelope, postgres_source, sqlserver_source
from cdc_assets.io.spark import parsed_from_files

SOURCE = postgres_source(100, 1_700_000_000_000, "inventory", "products")


def fold(events, layout):
    """Folded rows (as dicts) and the batch summary."""
    rows, summary = fold_batch(events, layout)
    return rows.to_pylist(), summary


def decode(hand_over, kind, records, **layout_options):
    layout = derive_layout(kind, [k for k, _ in records if k], [v for _, v in records if v], **layout_options)
    return layout, decode_change_events(hand_over(records, layout), layout)


def test_wrapped_and_bare_values_decode_to_the_same_rows(hand_over):
    row = {"id": 7, "name": "hammer", "weight": 0.75}
    bare = (encode_key({"id": 7}), envelope("c", None, row, SOURCE, 1))
    wrapped = (encode_key({"id": 7}, with_schema=True), envelope("c", None, row, SOURCE, 1, with_schema=True))
    for records in ([bare], [wrapped]):
        _, events = decode(hand_over, "postgresql", records)
        got = events.select("id", "name", "weight", "_cdc_op", "_cdc_error").first().asDict()
        assert got == {"id": 7, "name": "hammer", "weight": 0.75, "_cdc_op": "c", "_cdc_error": None}


def test_connect_schema_gives_the_column_types(hand_over):
    record = (encode_key({"id": 1}, with_schema=True),
              envelope("r", None, {"id": 1, "qty": 3, "price": 1.5, "ok": True}, SOURCE, 1, with_schema=True))
    layout, events = decode(hand_over, "postgresql", [record])
    assert {f.name: f.dataType.simpleString() for f in layout.row_type.fields} == {
        "id": "bigint", "qty": "bigint", "price": "double", "ok": "boolean"}
    assert events.select("qty", "ok").first().asDict() == {"qty": 3, "ok": True}


def test_numbers_sent_as_strings_parse_into_their_declared_type(hand_over):
    # Seed 004's incremental snapshot read: {"pk": "1", "value": "New data"}, ts_ms as a string.
    value = json.dumps({"before": None, "after": {"pk": "1", "value": "New data"},
                        "source": {"snapshot": "incremental", "change_lsn": "00000025:00000d08:0025",
                                   "commit_lsn": "00000025:00000d08:0025", "ts_ms": "1620393591654"},
                        "op": "r", "ts_ms": "1620393591654", "transaction": None}).encode()
    _, events = decode(hand_over, "db2", [(encode_key({"pk": 1}), value)], configured_columns={"pk": "int",
                                                                                           "value": "string"})
    row = events.first()
    assert (row["pk"], row["value"], row["_cdc_snapshot"], row["_cdc_error"]) == (1, "New data", "incremental", None)
    assert row["_cdc_source_ts"].year == 2021


@pytest.mark.parametrize("wrapped_key", [False, True])
def test_delete_without_before_image_takes_its_key_from_the_record_key(hand_over, wrapped_key):
    # PostgreSQL REPLICA IDENTITY DEFAULT: the delete names no row in its value.
    key = encode_key({"id": 111}, with_schema=wrapped_key)
    records = [(key, envelope("c", None, {"id": 111, "name": "x"}, SOURCE, 1)),
               (key, envelope("d", None, None, {**SOURCE, "lsn": 200}, 2))]
    layout, events = decode(hand_over, "postgresql", records)
    rows, summary = fold(events, layout)
    assert [(r["id"], r["_cdc_op"]) for r in rows] == [(111, "d")]
    assert (summary.creates, summary.deletes, summary.events) == (1, 1, 2)


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"after": {"id": 1}, "source": {}}', "envelope has no 'op' field"),
    (json.dumps({"op": "x", "after": {"id": 1}, "source": {}}).encode(), "unknown op 'x'"),
    (json.dumps({"op": "u", "after": None, "before": None, "source": {}}).encode(), "op 'u' has no after image"),
    (json.dumps({"op": "c", "after": {"id": 1, "qty": "many"}, "source": {}}).encode(),
     "column 'qty' value does not fit type bigint"),
])
def test_bad_events_are_flagged_with_their_reason(hand_over, value, reason):
    good = (encode_key({"id": 1}), envelope("c", None, {"id": 1, "qty": 2}, SOURCE, 1))
    records = [good, (encode_key({"id": 1}), value)]
    layout, events = decode(hand_over, "postgresql", records, configured_columns={"id": "bigint", "qty": "bigint"})
    rows, summary = fold(events, layout)
    assert [(e.offset, e.reason) for e in summary.bad_events] == [(1, reason)]
    assert summary.creates == 1
    assert [(r["id"], r["qty"]) for r in rows] == [(1, 2)]  # a bad event never wins the fold


def test_missing_key_is_flagged(hand_over):
    records = [(None, envelope("c", None, {"name": "no id"}, SOURCE, 1))]
    layout = derive_layout("postgresql", [], [records[0][1]], configured_keys=["id"])
    rows, summary = fold(decode_change_events(hand_over(records, layout), layout), layout)
    assert rows == [] and summary.bad_events[0].reason.startswith("cannot extract key column(s) ['id']")


def test_no_key_anywhere_is_a_layout_error():
    with pytest.raises(LayoutError, match="set key_columns"):
        derive_layout("postgresql", [], [envelope("c", None, {"a": 1}, SOURCE, 1)])


def test_a_record_that_could_not_be_read_names_no_column():
    # An Avro record with an unknown schema id stands in as ``undecodable_value`` for key and value: its members
    # are not key columns or row columns, whichever record of the sample is newest.
    unread = undecodable_value("Avro key of t[0] at offset 9: schema id 7 is unknown", b"\x00\x00\x00\x00\x07",
                               b"\x00\x00\x00\x00\x08")
    layout = derive_layout("postgresql", [encode_key({"id": 1}), unread],
                           [envelope("c", None, {"id": 1, "a": 2}, SOURCE, 1), unread])
    assert (layout.key_columns, layout.row_type.fieldNames()) == (("id",), ["id", "a"])
    with pytest.raises(LayoutError, match="set key_columns"):
        derive_layout("postgresql", [unread], [unread])
    with pytest.raises(LayoutError, match="no event names any column"):
        derive_layout("postgresql", [unread], [unread], configured_keys=["id"])


def test_sqlserver_primary_key_change_in_one_batch_removes_the_old_key(hand_over):
    old, new = {"id": 1, "v": "a"}, {"id": 2, "v": "a"}
    src = sqlserver_source("00000027:00000758:0005", "00000027:00000758:0003", 1, 5, "dbo", "t")
    records = [(encode_key({"id": 1}), envelope("d", old, None, src, 5)),
               (encode_key({"id": 1}), None),
               (encode_key({"id": 2}), envelope("c", None, new, {**src, "event_serial_no": 2}, 5))]
    records = [r for r in records if r[1] is not None]
    layout, events = decode(hand_over, "sqlserver", records)
    rows, _ = fold(events, layout)
    assert sorted((r["id"], r["_cdc_op"]) for r in rows) == [(1, "d"), (2, "c")]


@pytest.mark.parametrize("kind", ["postgresql", "sqlserver", "db2", "mysql", "oracle"])
def test_the_decode_of_the_fast_hand_over_is_one_generated_stage(spark, capsys, tmp_path, kind):
    # from_json and higher-order functions have no generated code: one use of either in the decode
    # (the record key, PostgreSQL's sequence, an SQL Server LSN) kept the whole decode out of
    # whole-stage code generation, copying every row between the hand-over, the decode and the fold.
    # Handed over to the run's session itself: a batch this small is folded on the small-batch session,
    # which generates no code (``spark_server.SMALL_BATCH_SETTINGS``).
    key = encode_key({"id": 1})
    value = envelope("c", None, {"id": 1, "name": "x"}, {"ts_ms": 1}, 1)
    layout = derive_layout(kind, [key], [value])
    table = pa.table({"partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64()),
                      "key": pa.array([key], pa.binary()), "value": pa.array([value], pa.binary())})
    events = decode_change_events(parsed_from_files(spark, table, value_type(layout), tmp_path, exact=False), layout)
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # so that the plan shows its code generation
    capsys.readouterr()
    try:
        events.explain()
        plan = capsys.readouterr().out
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    operators = [line.lstrip(" +-:") for line in plan.splitlines()
                 if line.lstrip(" +-:").startswith(("Project", "*(", "Filter"))]
    assert operators and all(op.startswith("*(1) ") for op in operators), plan
