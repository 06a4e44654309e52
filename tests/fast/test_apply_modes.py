"""Apply modes as objects: their hidden columns, MERGE clauses and the placeholder rule, without Spark."""

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from cdc_assets.core.apply_modes import Documents, apply_mode, keep_unavailable
from cdc_assets.core.fold import BatchSummary
from cdc_assets.io.delta import quote_datafusion, quote_spark


def names(mode):
    return [field.name for field in mode.hidden_fields]


def test_each_mode_owns_its_hidden_columns():
    assert names(apply_mode("scd1")) == ["_cdc_op", "_cdc_position", "_cdc_source_ts"]
    assert names(apply_mode("soft_delete")) == ["_cdc_op", "_cdc_position", "_cdc_source_ts", "_cdc_deleted"]
    assert names(apply_mode("scd2")) == ["_cdc_op", "_cdc_valid_from", "_cdc_valid_from_ts", "_cdc_valid_to",
                                         "_cdc_valid_to_ts", "_cdc_current"]


def test_scd1_deletes_and_replaces_only_with_newer_positions():
    plan = apply_mode("scd1").merge_plan(["My Id"], ["My Id", "v", "_cdc_op", "_cdc_position"], quote_spark)
    assert plan.condition == "t.`My Id` = s.`My Id`"
    assert [(c.action, c.predicate) for c in plan.matched] == [
        ("delete", "s._cdc_op = 'd' AND s._cdc_position > t._cdc_position"),
        ("update", "s._cdc_position > t._cdc_position")]
    assert [(c.action, c.predicate) for c in plan.not_matched] == [("insert", "s._cdc_op <> 'd'")]


def test_soft_delete_marks_deletes_and_keeps_deleted_keys():
    plan = apply_mode("soft_delete").merge_plan(["id"], ["id", "v"], quote_datafusion)
    mark = plan.matched[0]
    assert mark.action == "update" and mark.predicate.startswith("s._cdc_op = 'd'")
    assert set(mark.assignments or {}) == {'"_cdc_deleted"', '"_cdc_op"', '"_cdc_position"', '"_cdc_source_ts"'}
    assert [(c.action, c.predicate, c.assignments) for c in plan.not_matched] == [("insert", None, None)]


def test_scd2_inserts_versions_once_and_closes_the_current_one_without_its_helper_columns():
    mode = apply_mode("scd2")
    plan = mode.merge_plan(["id"], ["id", "v", "_cdc_valid_from", "_merge_kind", "_merge_close_at"], quote_spark)
    assert "t._cdc_valid_from = s._cdc_valid_from" in plan.condition
    assert "t._cdc_current AND t._cdc_valid_from < s._merge_close_at" in plan.condition
    assert plan.matched[0].assignments == {"_cdc_valid_to": "s._merge_close_at",
                                           "_cdc_valid_to_ts": "s._merge_close_ts", "_cdc_current": "false"}
    assert list(plan.not_matched[0].assignments or {}) == ["`id`", "`v`", "`_cdc_valid_from`"]
    assert not mode.evolves_schema and not mode.folds_ahead and mode.current_column == "_cdc_current"


def test_mongodb_documents_merge_as_their_mode_but_are_never_folded_ahead():
    for name in ("scd1", "soft_delete", "scd2"):
        documents, base = apply_mode(name, "mongodb"), apply_mode(name)
        assert isinstance(documents, Documents) and documents.name == name and not documents.folds_ahead
        assert documents.hidden_fields == base.hidden_fields
        assert (documents.evolves_schema, documents.current_column, documents.changed_at_column) == (
            base.evolves_schema, base.current_column, base.changed_at_column)
        assert documents.merge_plan(["id"], ["id"], quote_spark) == base.merge_plan(["id"], ["id"], quote_spark)
    assert apply_mode("scd1").folds_ahead and apply_mode("soft_delete").folds_ahead
    with pytest.raises(ValueError, match="unknown apply mode 'scd3'"):
        apply_mode("scd3")


SUMMARY = BatchSummary(events=3, creates=0, updates=3, deletes=0, snapshot_reads=0, incremental_snapshot_reads=0,
                       last_incremental_snapshot_read_ts=None, max_source_ts=datetime.now(timezone.utc),
                       median_key_source_ts=None, bad_events=())


def folded(*rows):
    return pa.Table.from_pylist([{"id": i, "big": big, "_cdc_unavailable": left} for i, big, left in rows],
                                schema=pa.schema([("id", pa.int64()), ("big", pa.string()),
                                                  ("_cdc_unavailable", pa.list_(pa.string()))]))


def test_a_placeholder_keeps_the_stored_value_and_a_never_seen_one_stays_null_and_counted():
    asked = []

    def stored(keys, columns):
        asked.append((keys["id"].to_pylist(), list(columns)))
        return pa.table({"id": [1], "big": ["stored text"]})

    rows, summary = keep_unavailable(folded((1, None, ["big"]), (2, None, ["big"]), (3, "new", [])), SUMMARY,
                                     ["id"], stored)
    assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "big": "stored text"}, {"id": 2, "big": None}, {"id": 3, "big": "new"}]
    assert (summary.unavailable_kept, summary.unavailable_never_seen) == (1, 1)
    assert asked == [([1, 2], ["id", "big"])]  # only the keys that need it, only the columns left unavailable


def test_scd2_takes_a_placeholder_from_the_current_version_only():
    def stored(keys, columns):
        assert columns == ["id", "big", "_cdc_current"]
        return pa.table({"id": [1, 1], "big": ["closed", "current"], "_cdc_current": [False, True]})

    rows, summary = keep_unavailable(folded((1, None, ["big"])), SUMMARY, ["id"], stored, "_cdc_current")
    assert rows.to_pylist() == [{"id": 1, "big": "current"}] and summary.unavailable_kept == 1


def test_no_placeholder_reads_nothing():
    def stored(keys, columns):
        raise AssertionError("the table was read")

    rows, summary = keep_unavailable(folded((1, "x", []), (2, "y", None)), SUMMARY, ["id"], stored)
    assert rows.column_names == ["id", "big"] and summary is SUMMARY
