"""Column choices without Spark: validated at load, applied to a layout, to a schema change's columns, and
counted apart from placeholders when an ignored update null is filled."""

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import ConfigError, parse_config
from cdc_assets.core.apply_modes import apply_mode, keep_unavailable
from cdc_assets.core.columns import EVERY_COLUMN, ColumnChoices
from cdc_assets.core.fold import BatchSummary
from cdc_assets.core.layout import ChangeEventLayout, LayoutError
from cdc_assets.core.schema_change import TableChange
from cdc_assets.core.schema_evolution import AnnouncedChange, RegistryEntry, incarnation_columns, plan_evolution
from cdc_assets.io.delta import quote_spark

CONFIG = """\
kafka: {bootstrap_servers: 127.0.0.1:9092}
delta: {root: /data/delta}
connectors:
  - name: inventory
    kind: KIND
    topic.prefix: dbserver1
    tables:
      - name: inventory.customers
        key_columns: [id]
CHOICES
"""


def config(choices: str, kind: str = "postgresql"):
    return parse_config(CONFIG.replace("KIND", kind).replace("CHOICES", choices))


def test_the_choices_reach_the_captured_table():
    [table] = resolve_tables(config("        exclude_columns: [ssn]\n        ignore_null_updates: [email]"))
    assert table.merge.column_choices == ColumnChoices(exclude=("ssn",), ignore_null_updates=("email",))
    [table] = resolve_tables(config("        include_columns: [name]\n        ignore_null_updates: true"))
    assert table.merge.column_choices == ColumnChoices(include=("name",), ignore_null_updates=True)
    [table] = resolve_tables(config(""))
    assert table.merge.column_choices == EVERY_COLUMN


@pytest.mark.parametrize(("choices", "problem"), [
    ("        include_columns: [a]\n        exclude_columns: [b]", "include_columns and exclude_columns exclude"),
    ("        exclude_columns: [id]", r"exclude_columns names key column\(s\) \['id'\]"),
    ("        include_columns: []", "include_columns must name at least one column"),
    ("        exclude_columns: [a, a]", r"exclude_columns names columns more than once: \['a'\]"),
    ("        ignore_null_updates: [id]", r"ignore_null_updates names key column\(s\) \['id'\]"),
    ("        exclude_columns: [a]\n        ignore_null_updates: [a]", r"does not keep"),
    ("        include_columns: [a]\n        ignore_null_updates: [b]", r"\['b'\] that the table does not keep"),
    ("        track_history_columns: [a]", "are for apply_mode scd2 \\(this table's is scd1\\)"),
    ("        apply_mode: scd2\n        track_history_columns: [a]\n        track_history_except_columns: [b]",
     "track_history_columns and track_history_except_columns exclude each other"),
    ("        apply_mode: scd2\n        on_truncate: apply\n        track_history_columns: [a]", "on_truncate: apply"),
    ("        apply_mode: scd2\n        track_history_except_columns: [id]", r"names key column\(s\) \['id'\]"),
    ("        apply_mode: scd2\n        exclude_columns: [a]\n        track_history_columns: [a]", "does not keep"),
])
def test_inconsistent_choices_are_refused_at_load_naming_the_line(choices, problem):
    with pytest.raises(ConfigError, match=problem) as error:
        config(choices)
    assert "connectors.0.tables.0" in str(error.value) and "line " in str(error.value)


def test_scd2_choices_reach_the_captured_table():
    [table] = resolve_tables(config("        apply_mode: scd2\n        track_history_except_columns: [seen_at]"))
    assert table.merge.column_choices == ColumnChoices(track_history_except=("seen_at",))


def test_documents_take_no_column_choices():
    with pytest.raises(ConfigError, match="mongodb rows are whole documents"):
        config("        ignore_null_updates: true", kind="mongodb")


LAYOUT = ChangeEventLayout("postgresql", ("id",), T.StructType([T.StructField(n, T.StringType())
                                                                for n in ("id", "name", "ssn", "email")]))
SHOWN = LAYOUT.row_type.fieldNames()  # the columns the newest event shows


def test_a_layout_keeps_the_chosen_columns_and_lists_the_ignored_nulls():
    narrowed = ColumnChoices(exclude=("ssn",), ignore_null_updates=True).applied_to(LAYOUT)
    assert narrowed.row_type.fieldNames() == ["id", "name", "email"]
    assert narrowed.ignored_nulls == ("name", "email") and narrowed.unchanged_columns == ["name", "email"]
    narrowed = ColumnChoices(include=("email",), ignore_null_updates=("email",)).applied_to(LAYOUT)
    assert narrowed.row_type.fieldNames() == ["id", "email"] and narrowed.ignored_nulls == ("email",)
    assert EVERY_COLUMN.applied_to(LAYOUT) is LAYOUT


def test_the_untracked_columns_are_the_kept_ones_not_tracked():
    assert ColumnChoices(track_history=("name",)).applied_to(LAYOUT).untracked == ("ssn", "email")
    assert ColumnChoices(exclude=("ssn",), track_history_except=("email",)).applied_to(LAYOUT).untracked == (
        "email",)
    with pytest.raises(LayoutError, match=r"\['phone'\]"):
        ColumnChoices(track_history=("phone",)).applied_to(LAYOUT, SHOWN)


def test_scd2_updates_the_current_version_in_place_only_where_versions_say_so():
    columns = ["id", "v", "_cdc_op", "_cdc_position", "_cdc_valid_from", "_cdc_valid_from_ts", "_cdc_valid_to",
               "_cdc_current", "_merge_kind", "_merge_close_at", "_merge_in_place"]
    plan = apply_mode("scd2").merge_plan(["id"], columns, quote_spark)
    close, in_place = plan.matched
    assert close.predicate == "s._merge_kind = 'close'"
    assert in_place.predicate == "s._merge_kind = 'version' AND s._merge_in_place"
    assert list(in_place.assignments or {}) == ["`id`", "`v`", "`_cdc_op`", "`_cdc_position`", "`_cdc_valid_to`",
                                                 "`_cdc_current`"]  # the version keeps its start
    untracked = apply_mode("scd2").merge_plan(["id"], [c for c in columns if c != "_merge_in_place"], quote_spark)
    assert len(untracked.matched) == 1


def test_an_unknown_column_is_refused_only_where_the_events_show_the_columns():
    choices = ColumnChoices(include=("name", "phone"))
    with pytest.raises(LayoutError, match=r"column\(s\) \['phone'\] that the table's events do not have"):
        choices.applied_to(LAYOUT, SHOWN)
    assert choices.applied_to(LAYOUT, None).row_type.fieldNames() == ["id", "name"]
    with pytest.raises(LayoutError, match=r"exclude_columns names key column\(s\) \['id'\]"):
        ColumnChoices(exclude=("id",)).applied_to(LAYOUT, None)  # keys known without the events' columns


def test_a_column_gone_from_the_newest_event_is_unknown_though_the_table_has_it():
    """A tracked column renamed at the source: the layout (the Delta table's columns with the events') still
    has it, the newest event does not, so the choice would apply to nothing: refused, naming it."""
    with pytest.raises(LayoutError, match=r"\['name'\]"):
        ColumnChoices(track_history=("name",)).applied_to(LAYOUT, ("id", "full_name", "ssn", "email"))


def test_exclude_columns_may_name_a_column_the_source_does_not_have_yet():
    narrowed = ColumnChoices(exclude=("ssn", "added_later")).applied_to(LAYOUT, SHOWN)
    assert narrowed.row_type.fieldNames() == ["id", "name", "email"]


def test_a_schema_change_adds_no_column_the_table_does_not_keep():
    columns = T.StructType([T.StructField(n, T.LongType()) for n in ("id", "name", "ssn")])
    change = TableChange("ALTER", "inventory.customers", ("id",), columns)
    announced = AnnouncedChange("inventory", change, "p2", "dbserver1", 0, 2)
    history = [RegistryEntry("inventory", "inventory.customers", "active", ("id",), columns, "ALTER", "p2",
                             "dbserver1", 0, 2)]
    before = T.StructType([T.StructField(n, T.LongType()) for n in ("id", "name", "_cdc_op")])
    choices = ColumnChoices(exclude=("ssn",))
    assert plan_evolution(announced, history, before, {}, choices).columns.fieldNames() == []
    assert plan_evolution(announced, history, before, {}).columns.fieldNames() == ["ssn"]
    created = plan_evolution(announced, history, None, {}, choices).columns.fieldNames()
    assert created[:2] == ["id", "name"] and "ssn" not in created
    assert "ssn" not in incarnation_columns(history, "scd1", choices).fieldNames()


SUMMARY = BatchSummary(events=2, creates=0, updates=2, deletes=0, snapshot_reads=0, incremental_snapshot_reads=0,
                       last_incremental_snapshot_read_ts=None, max_source_ts=datetime.now(timezone.utc),
                       median_key_source_ts=None, bad_events=())


def test_an_ignored_null_is_filled_from_the_table_and_never_counted_as_a_lost_value():
    rows = pa.Table.from_pylist([{"id": 1, "email": None, "_cdc_unavailable": ["email"]},
                                 {"id": 2, "email": None, "_cdc_unavailable": ["email"]}],
                                schema=pa.schema([("id", pa.int64()), ("email", pa.string()),
                                                  ("_cdc_unavailable", pa.list_(pa.string()))]))

    def stored(keys, columns):
        return pa.table({"id": [1], "email": ["kept@example.com"]})

    filled, summary = keep_unavailable(rows, SUMMARY, ["id"], stored, ignored_nulls=["email"])
    assert sorted(filled.to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "email": "kept@example.com"},
                                                                 {"id": 2, "email": None}]
    # A check fails on values never seen (a lost TOAST value): an ignored null with no row is the update's own.
    assert (summary.unavailable_kept, summary.unavailable_never_seen, summary.null_updates_from_table) == (0, 0, 2)
