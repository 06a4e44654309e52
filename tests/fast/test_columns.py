"""Column choices without Spark: validated at load, applied to a layout, to a schema change's columns, and
counted apart from placeholders when an ignored update null is filled."""

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from cdc_assets.catalog import resolve_tables
from cdc_assets.config import ConfigError, parse_config
from cdc_assets.core.apply_modes import keep_unavailable
from cdc_assets.core.columns import EVERY_COLUMN, ColumnChoices
from cdc_assets.core.fold import BatchSummary
from cdc_assets.core.layout import ChangeEventLayout, LayoutError
from cdc_assets.core.schema_change import TableChange
from cdc_assets.core.schema_evolution import AnnouncedChange, RegistryEntry, incarnation_columns, plan_evolution

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
    assert table.column_choices == ColumnChoices(exclude=("ssn",), ignore_null_updates=("email",))
    [table] = resolve_tables(config("        include_columns: [name]\n        ignore_null_updates: true"))
    assert table.column_choices == ColumnChoices(include=("name",), ignore_null_updates=True)
    [table] = resolve_tables(config(""))
    assert table.column_choices == EVERY_COLUMN


@pytest.mark.parametrize(("choices", "problem"), [
    ("        include_columns: [a]\n        exclude_columns: [b]", "include_columns and exclude_columns exclude"),
    ("        exclude_columns: [id]", r"exclude_columns names key column\(s\) \['id'\]"),
    ("        include_columns: []", "include_columns must name at least one column"),
    ("        exclude_columns: [a, a]", r"exclude_columns names columns more than once: \['a'\]"),
    ("        ignore_null_updates: [id]", r"ignore_null_updates names key column\(s\) \['id'\]"),
    ("        exclude_columns: [a]\n        ignore_null_updates: [a]", r"does not keep"),
    ("        include_columns: [a]\n        ignore_null_updates: [b]", r"\['b'\] that the table does not keep"),
])
def test_inconsistent_choices_are_refused_at_load_naming_the_line(choices, problem):
    with pytest.raises(ConfigError, match=problem) as error:
        config(choices)
    assert "connectors.0.tables.0" in str(error.value) and "line " in str(error.value)


def test_documents_take_no_column_choices():
    with pytest.raises(ConfigError, match="mongodb rows are whole documents"):
        config("        ignore_null_updates: true", kind="mongodb")


LAYOUT = ChangeEventLayout("postgresql", ("id",), T.StructType([T.StructField(n, T.StringType())
                                                                for n in ("id", "name", "ssn", "email")]))


def test_a_layout_keeps_the_chosen_columns_and_lists_the_ignored_nulls():
    narrowed = ColumnChoices(exclude=("ssn",), ignore_null_updates=True).applied_to(LAYOUT)
    assert narrowed.row_type.fieldNames() == ["id", "name", "email"]
    assert narrowed.ignored_nulls == ("name", "email") and narrowed.unchanged_columns == ["name", "email"]
    narrowed = ColumnChoices(include=("email",), ignore_null_updates=("email",)).applied_to(LAYOUT)
    assert narrowed.row_type.fieldNames() == ["id", "email"] and narrowed.ignored_nulls == ("email",)
    assert EVERY_COLUMN.applied_to(LAYOUT) is LAYOUT


def test_an_unknown_column_is_refused_only_where_the_events_show_the_columns():
    choices = ColumnChoices(exclude=("ssn", "phone"))
    with pytest.raises(LayoutError, match=r"column\(s\) \['phone'\] that the table's events do not have"):
        choices.applied_to(LAYOUT)
    assert choices.applied_to(LAYOUT, shown=False).row_type.fieldNames() == ["id", "name", "email"]
    with pytest.raises(LayoutError, match=r"exclude_columns names key column\(s\) \['id'\]"):
        ColumnChoices(exclude=("id",)).applied_to(LAYOUT, shown=False)  # keys known without the events' columns


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
